"""scripts/bench_kernels.py runs (here on the emulator: its figures mean something on a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_kernels.py"


@pytest.mark.slow
def test_bench_script_smoke() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--emulator", "--repeats", "1"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("mul_mat_vec Q4_K") for line in lines)
    assert any(line.startswith("rms_norm") for line in lines)


def test_bench_script_without_gpu_says_why() -> None:
    from kernels.cuda.device import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is present: the real benchmark would run")
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and reason in r.stdout
