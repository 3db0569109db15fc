"""Process-wide settings the engine makes for speed: OpenBLAS on the calling thread only
(inference/__init__; the cpu backend shares work out itself), and freed NumPy temporaries
reused rather than mapped afresh (keep_freed_heap, applied by load_model)."""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys

import numpy as np
import pytest

from inference.backends.base import keep_freed_heap, trim_host_heap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blas_threads_seen(env: dict[str, str]) -> str:
    code = ("import inference, numpy, threadpoolctl; print(max(p['num_threads'] for p in "
            "threadpoolctl.threadpool_info() if p['user_api'] == 'blas'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip()


def test_blas_runs_on_the_calling_thread_unless_the_user_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _blas_threads_seen(env) == "1"
    assert _blas_threads_seen({**env, "OPENBLAS_NUM_THREADS": "2"}) == "2"


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc",
                    reason="mallopt is glibc's")
def test_freed_temporaries_are_reused_not_faulted_in_again():
    pages = (40 << 20) // resource.getpagesize()

    def faults_of_a_layer() -> int:
        """Ten 4 MB activations alive at once, then freed, as a prefill layer's are."""
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held = [np.ones(1 << 20, dtype=np.float32) for _ in range(10)]  # every page written
        del held
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    assert keep_freed_heap()
    faults_of_a_layer()  # the first maps the heap's pages
    # Reused: the same pages again (a few faults of the interpreter's own). glibc's own
    # thresholds give 40 MB of free heap back at once, so all 10,240 pages fault again.
    assert faults_of_a_layer() < pages // 10
    trim_host_heap()  # returned on demand all the same
