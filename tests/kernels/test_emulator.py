"""The emulator itself: it must catch the mistakes CUDA leaves undefined, not run them.

Each test launches a deliberately faulty kernel (faulty.cu) the way a bug would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.cuda.device import EmulatedDevice
from kernels.cuda.plan import Launch
from kernels.emulator.module import EmulatedModule, EmulatorError

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
    with pytest.raises(EmulatorError, match="order threads run"):
        _launch(dev, "block_sum", 1, 256, (x, out, np.int32(0)))


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
