"""The spinning worker thread of prefill share-outs (inference/backends/cpu/threads.py) and
the cpu backend's `linears` composite built on it."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from inference.backends.cpu import CpuBackend
from inference.backends.cpu import threads as cpu_share
from inference.backends.numpy_backend import NumpyBackend
from tests.bundled import random_tensor


def test_parts_run_on_the_worker_thread_while_it_spins_and_after_it_slept():
    w = cpu_share.SpinWorker("test-share")
    seen: list[tuple[int, int, str]] = []

    def part(a: int, b: int) -> None:
        seen.append((a, b, threading.current_thread().name))

    for i in range(50):  # back to back: taken while spinning
        w.start(part, i, i + 1)
        w.join()
    time.sleep(0.05)  # far past the spin: asleep on its condition now
    assert w._sleeping
    w.start(part, 7, 9)
    w.join()
    assert seen == [(i, i + 1, "test-share") for i in range(50)] + [(7, 9, "test-share")]
    w.close()
    w._thread.join(timeout=10)
    assert not w._thread.is_alive()


def test_a_failing_part_raises_on_the_caller_and_the_worker_lives_on():
    w = cpu_share.SpinWorker()

    def bad(a: int, b: int) -> None:
        raise ValueError(f"part {a}-{b} failed")

    w.start(bad, 1, 2)
    with pytest.raises(ValueError, match="part 1-2 failed"):
        w.join()
    out = []
    w.start(lambda a, b: out.append(a + b), 2, 3)
    w.join()
    assert out == [5]
    w.close()


def test_a_parked_worker_sleeps_between_parts_and_still_runs_them():
    """Parked (other processes busy), the worker spins for nothing: asleep right after each
    part, and the caller asleep while it waits; every part still runs, in order."""
    w = cpu_share.SpinWorker("test-parked")
    w.park(True)
    seen = []
    for i in range(20):
        w.start(lambda a, b: seen.append(a), i, i + 1)
        w.join()
        deadline = time.monotonic() + 5
        while not w._sleeping:  # asleep at once, not after a spin of SPIN loads
            assert time.monotonic() < deadline
            time.sleep(0.001)
    assert seen == list(range(20))
    w.park(False)
    assert (w.spin, w.join_spin) == (cpu_share.SPIN, cpu_share.JOIN_SPIN)
    w.close()


def test_spin_while_returns_the_new_value_or_gives_up():
    state = np.array([3, 0], dtype=np.int64)
    assert cpu_share.spin_while(state, 0, 3, 1000) == 3  # unchanged: after 1000 loads
    assert cpu_share.spin_while(state, 0, 2, 1000) == 3  # differs: at once


def test_linears_of_mixed_types_share_one_prefill_and_match_numpy():
    """q/k/v of different types (Q4_0, Q5_1, raw Q3_K) with biases: one share-out; each
    result as the NumPy backend's within sgemm rounding (rtol 1e-5 of the output scale,
    as every prefill product in tests/test_backend_cpu.py), over the activations the
    product took: quantized for the integer kernels (4/5-bit on AVX-512 VNNI) and the integer
    GEMM (4/8-bit on AVX2), float for dequant+sgemm."""
    import numba

    from tests.test_cpu_idot import _dequantized

    b = CpuBackend()
    b.set_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    n = NumpyBackend()
    ts = [random_tensor(q, rows, 512, seed=i)
          for i, (q, rows) in enumerate([("Q4_0", 640), ("Q5_1", 96), ("Q3_K", 200)])]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 30, 512)).astype(np.float32)
    biases = [rng.standard_normal(t.shape[0]).astype(np.float32) for t in ts]
    biases[1] = None
    ws = [b.weight(t) for t in ts]
    got = b.linears(x, [(w, bias) for w, bias in zip(ws, biases, strict=True)])
    xq = _dequantized(x[0], b.activations)[None] if b.activations != "float" else x
    for y, w, t, bias in zip(got, ws, ts, biases, strict=True):
        want = n.linear(xq if b._prefill_route(w) != "dequant" else x, n.weight(t), bias)
        assert y.shape == want.shape == (1, 30, t.shape[0])
        np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_a_backend_let_go_of_stops_its_helper_threads():
    import gc

    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: no worker threads")
    b = CpuBackend(activations="float")  # dequantize + sgemm: the workers share it out
    b.set_threads(2)
    w = b.weight(random_tensor("Q4_0", 1024, 512, seed=1))
    b.linear(np.ones((20, 512), dtype=np.float32), w)  # a prefill product: shared out
    threads = [worker._thread for worker in b._pool]
    assert threads and all(t.is_alive() for t in threads)
    del b, w
    gc.collect()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
