"""The emulator itself: it must catch the mistakes CUDA leaves undefined, not run them.

Each test launches a deliberately faulty kernel (faulty.cu) the way a bug would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.cuda.plan import Launch
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.emulator.module import EmulatedModule, EmulatorError

FAULTY = Path(__file__).with_name("faulty.cu")


class FaultyDevice(EmulatedDevice):
    def _load(self, module: str) -> EmulatedModule:
        return EmulatedModule(FAULTY)


@pytest.fixture(scope="module")
def mod() -> EmulatedModule:
    return EmulatedModule(FAULTY)


def _launch(dev: EmulatedDevice, name: str, grid: int, block: int, args: tuple) -> None:
    dev.launch("faulty", name, Launch((grid, 1, 1), (block, 1, 1)), args)


def test_block_sum_with_barrier_is_right() -> None:
    dev = FaultyDevice(check_races=True)
    x = dev.to_device(np.arange(256, dtype=np.float32))
    out = dev.zeros((1,), np.float32)
    _launch(dev, "block_sum", 1, 256, (x, out, np.int32(1)))
    assert out[0] == np.arange(256).sum()


def test_missing_syncthreads_reads_poison() -> None:
    # Without the barrier warp 0 reads partial sums other warps have not written yet:
    # shared memory starts as NaN bytes, so the result is NaN rather than a near miss.
    dev = FaultyDevice()
    x = dev.to_device(np.ones(256, np.float32))
    out = dev.zeros((1,), np.float32)
    _launch(dev, "block_sum", 1, 256, (x, out, np.int32(0)))
    assert np.isnan(out[0])


def test_missing_syncthreads_is_a_race() -> None:
    dev = FaultyDevice(check_races=True)
    x = dev.to_device(np.ones(256, np.float32))
    out = dev.zeros((1,), np.float32)
    with pytest.raises(EmulatorError, match="order threads run between barriers"):
        _launch(dev, "block_sum", 1, 256, (x, out, np.int32(0)))


def test_block_that_reads_another_blocks_output_is_a_race() -> None:
    dev = FaultyDevice()
    y = dev.zeros((50,), np.float32)
    _launch(dev, "chain_across_blocks", 50, 32, (y,))
    np.testing.assert_array_equal(y, np.arange(1, 51))  # grid order happens to work
    dev = FaultyDevice(check_races=True)
    with pytest.raises(EmulatorError, match="blocks run in the grid"):
        _launch(dev, "chain_across_blocks", 50, 32, (dev.zeros((50,), np.float32),))


@pytest.mark.parametrize("grid", [(1, 1, 1), (7, 1, 1), (64, 1, 1), (5, 3, 2), (1, 9, 4)])
def test_shuffled_block_order_runs_every_block_once(grid: tuple, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    from tests.kernels.emulator import module as emu

    n = int(np.prod(grid))
    for seed in (1, 2, 977, 2**40 + 3):
        monkeypatch.setattr(emu, "block_seed", seed)
        dev = FaultyDevice()
        y = dev.empty((n,), np.float32)
        dev.launch("faulty", "block_ids", Launch(grid, (32, 1, 1)), (y,))
        np.testing.assert_array_equal(y, np.arange(n))


def test_right_block_size_covers_everything() -> None:
    dev = FaultyDevice()
    x = dev.to_device(np.arange(1024, dtype=np.float32))
    y = dev.empty((1024,), np.float32)
    _launch(dev, "scale_superblocks_64", 4, 64, (x, y, np.float32(2)))
    np.testing.assert_array_equal(y, 2 * np.arange(1024))


def test_too_small_block_leaves_poisoned_holes() -> None:
    dev = FaultyDevice()
    x = dev.to_device(np.arange(1024, dtype=np.float32))
    y = dev.empty((1024,), np.float32)
    _launch(dev, "scale_superblocks_64", 4, 32, (x, y, np.float32(2)))
    assert np.isnan(y).sum() == 512  # the elements no thread wrote are still NaN


def test_too_large_block_writes_past_the_buffer() -> None:
    dev = FaultyDevice()
    x = dev.to_device(np.arange(1024 + 256, dtype=np.float32))[:1024]
    y = dev.empty((1024,), np.float32)
    with pytest.raises(EmulatorError, match="illegal memory access|wrote outside"):
        _launch(dev, "scale_superblocks_64", 4, 128, (x, y, np.float32(2)))


def test_divergent_syncthreads(mod: EmulatedModule) -> None:
    with pytest.raises(EmulatorError, match="divergent barrier"):
        mod.get_function("divergent_barrier")((1,), (64,), (np.zeros(64, np.float32),))


def test_full_mask_shuffle_on_a_partial_warp(mod: EmulatedModule) -> None:
    x = np.ones(48, np.float32)
    y = np.zeros(1, np.float32)
    mod.get_function("warp_sum")((1,), (32,), (x, y))
    assert y[0] == 32
    with pytest.raises(EmulatorError, match="do not exist or have returned"):
        mod.get_function("warp_sum")((1,), (48,), (x, y))


def test_launch_bounds_and_device_limits(mod: EmulatedModule) -> None:
    y = np.zeros(2048, np.float32)
    mod.get_function("bounded")((1,), (128,), (y,))
    with pytest.raises(EmulatorError, match="__launch_bounds__"):
        mod.get_function("bounded")((1,), (256,), (y,))
    with pytest.raises(EmulatorError, match="1024 threads"):
        mod.get_function("takes_int")((1,), (2048,), (y, np.int32(1)))
    with pytest.raises(EmulatorError, match="shared memory"):
        mod.get_function("takes_int")((1,), (32,), (y, np.int32(1)), shared_mem=49 * 1024)


def test_shared_memory_starts_poisoned(mod: EmulatedModule) -> None:
    y = np.zeros(64, np.float32)
    mod.get_function("read_unwritten_shared")((2,), (64,), (y,))
    assert np.isnan(y).all()


def test_scalar_arguments_must_match_the_kernel(mod: EmulatedModule) -> None:
    y = np.zeros(32, np.float32)
    mod.get_function("takes_int")((1,), (32,), (y, np.int32(5)))
    assert (y[:5] == 5).all() and (y[5:] == 0).all()
    for wrong in (5, np.int64(5), np.float32(5)):
        with pytest.raises(TypeError, match="numpy.int32"):
            mod.get_function("takes_int")((1,), (32,), (y, wrong))
    with pytest.raises(TypeError, match="takes 2 arguments"):
        mod.get_function("takes_int")((1,), (32,), (y,))


def test_warp_barrier_abandoned_by_its_lanes(mod: EmulatedModule) -> None:
    with pytest.raises(EmulatorError, match="wait for it"):
        mod.get_function("lone_syncwarp")((1,), (32,), (np.zeros(32, np.float32),))


def test_misaligned_vector_load(mod: EmulatedModule) -> None:
    x = np.zeros(256, np.float32)
    y = np.zeros(32, np.float32)
    mod.get_function("vector_load")((1,), (32,), (x, y, np.int32(4)))
    with pytest.raises(EmulatorError, match="misaligned 16-byte"):
        mod.get_function("vector_load")((1,), (32,), (x, y, np.int32(1)))


# --- the emulated CUDA surface against NumPy ------------------------------------------------

PROBES = Path(__file__).with_name("emu_probes.cu")


@pytest.fixture(scope="module")
def probes() -> EmulatedModule:
    return EmulatedModule(PROBES)


def _special_floats() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(2000) * 10.0 ** rng.integers(-9, 6, 2000),  # subnormal .. overflow
        [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, 1e-8, 2.0**-24,
         2.0**-25, 3 * 2.0**-26, 1 + 2.0**-11, 1 + 3 * 2.0**-11],
    ]).astype(np.float32)
    return x


def test_half_conversion_rounds_like_numpy(probes: EmulatedModule) -> None:
    x = _special_floats()
    h, back = np.zeros(x.size, np.uint16), np.zeros(x.size, np.float32)
    grid = (-(-x.size // 256),)
    probes.get_function("convert_half")(grid, (256,), (x, h, back, np.int32(x.size)))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.array_equal(h[~nan], want.view(np.uint16)[~nan])  # round to nearest even
    assert np.isnan(back[nan]).all()
    assert np.array_equal(back[~nan], want[~nan].astype(np.float32))


def test_bfloat16_conversion_rounds_to_nearest_even(probes: EmulatedModule) -> None:
    x = _special_floats()
    b, back = np.zeros(x.size, np.uint16), np.zeros(x.size, np.float32)
    grid = (-(-x.size // 256),)
    probes.get_function("convert_bf16")(grid, (256,), (x, b, back, np.int32(x.size)))
    u = x.view(np.uint32).astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(b[~nan], want[~nan])
    assert np.array_equal(back[~nan], (want[~nan].astype(np.uint32) << 16).view(np.float32))
    assert np.isnan(back[nan]).all()


def test_warp_shuffles_and_ballot(probes: EmulatedModule) -> None:
    x = np.arange(32, dtype=np.float32) * 10
    out = np.zeros(5 * 32, np.float32)
    probes.get_function("shuffles")((1,), (32,), (x, out))
    lane = np.arange(32)
    np.testing.assert_array_equal(out[0:32], x[5])
    np.testing.assert_array_equal(out[32:64], x[np.where(lane >= 3, lane - 3, lane)])
    np.testing.assert_array_equal(out[64:96], x[np.where(lane + 3 < 32, lane + 3, lane)])
    np.testing.assert_array_equal(out[96:128], x[lane ^ 1])
    assert (out[128:] == float(0xAAAAAAAA)).all()


def test_dp4a_signed_and_unsigned(probes: EmulatedModule) -> None:
    # Four byte products plus c, bytes as int8 (int overload) or uint8 (unsigned overload),
    # the 32-bit sum wrapping as the hardware's does.
    rng = np.random.default_rng(4)
    n = 1000
    a, b, c = (rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for _ in range(3))
    c[:4] = [2**31 - 1, -2**31, 0, -1]
    a[:4] = b[:4] = 0x7F7F7F7F
    out = np.zeros(2 * n, np.int32)
    probes.get_function("dp4a")((4,), (256,), (a, b, c, out, np.int32(n)))
    s8 = lambda v: v.view(np.int8).reshape(n, 4).astype(np.int64)  # noqa: E731
    u8 = lambda v: v.view(np.uint8).reshape(n, 4).astype(np.int64)  # noqa: E731
    want_s = ((s8(a) * s8(b)).sum(1) + c) & 0xFFFFFFFF
    want_u = ((u8(a) * u8(b)).sum(1) + c.view(np.uint32)) & 0xFFFFFFFF
    assert np.array_equal(out[:n].view(np.uint32), want_s.astype(np.uint32))
    assert np.array_equal(out[n:].view(np.uint32), want_u.astype(np.uint32))


def test_atomics_across_blocks(probes: EmulatedModule) -> None:
    x = np.random.default_rng(1).integers(0, 17, 5000).astype(np.int32)
    hist, mx = np.zeros(17, np.int32), np.zeros(1, np.int32)
    probes.get_function("histogram")((-(-x.size // 128),), (128,), (x, hist, mx, np.int32(x.size)))
    assert np.array_equal(hist, np.bincount(x, minlength=17)) and mx[0] == x.max()


# --- the host-transfer log ----------------------------------------------------------------

def test_implicit_host_reads_of_device_arrays_are_logged() -> None:
    # What CuPy turns into a synchronising device-to-host copy, the emulator logs, on
    # buffers and on anything computed from them (views, ufuncs, reductions, concatenate).
    dev = EmulatedDevice()
    x = dev.to_device(np.arange(4, dtype=np.float32))
    y = np.concatenate([x * 2, x[::-1]])
    dev.transfers.clear()
    assert float(x[1]) == 1.0
    assert int(y.max()) == 6
    assert y.tolist() == [0, 2, 4, 6, 3, 2, 1, 0]
    assert x.reshape(2, 2).get().tolist() == [[0, 1], [2, 3]]  # .get() is the copy
    assert bool(x[0] == 0)
    assert x.sum().item() == 6
    repr(x)
    assert [(n, label) for _, n, label in dev.transfers.events] == [
        (4, "implicit float()"), (4, "implicit int()"), (32, "implicit tolist()"),
        (16, "implicit get()"), (1, "implicit bool()"), (4, "implicit item()"),
        (16, "implicit repr()")]
    dev.transfers.clear()
    host = dev.to_host(x, "explicit")
    float(host[0])  # a host copy is NumPy's: nothing more to log
    assert dev.transfers.events == [("d2h", 16, "explicit")]
