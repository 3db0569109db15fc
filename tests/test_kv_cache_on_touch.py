"""The cpu backend's KV buffers take resident memory as rows are written, not when a reply's
whole capacity is made; a cache made for a whole reply and one grown in steps hold and
return the same rows."""

import ctypes
import mmap
import sys

import numpy as np
import pytest

from inference.backends.base import keep_freed_heap
from inference.backends.cpu.backend import ON_TOUCH_BYTES, CpuBackend, zeros_on_touch
from inference.kv_cache import KVCache

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore: Linux")


def resident_pages(a: np.ndarray) -> int:
    """Pages of ``a``'s memory that are resident (mincore)."""
    page = mmap.PAGESIZE
    start = a.ctypes.data // page * page
    n = (a.ctypes.data + a.nbytes - start + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(n * page), vec) == 0
    return sum(v & 1 for v in vec)


def mapped(a: np.ndarray) -> bool:
    """Whether ``a``'s memory is an mmap of its own."""
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return isinstance(a.obj if isinstance(a, memoryview) else a, mmap.mmap)


@linux
def test_a_reply_sized_cache_is_resident_only_where_written():
    # Freed heap that np.zeros would take (and clear in full) below the mmap threshold.
    keep_freed_heap()
    held = [np.ones(4 << 20, np.float32) for _ in range(4)]
    del held
    shape = (1, 8, 4096, 64)  # Llama 3.2 1B: one layer's keys for 4,096 tokens, 8 MiB
    k = CpuBackend().kv_zeros(shape)
    assert k.shape == shape and k.dtype == np.float32 and k.flags.writeable
    assert resident_pages(k) == 0
    k[:, :, :16] = 1.0  # 16 rows of each head: one page per head
    assert resident_pages(k) == 8
    assert k[:, :, 16:].max() == 0 and k[:, :, :16].min() == 1


def test_small_buffers_come_from_the_heap_and_every_buffer_is_zero():
    small = zeros_on_touch((ON_TOUCH_BYTES // 8,), np.float32)
    big = zeros_on_touch((3, ON_TOUCH_BYTES // 4), np.float16)
    assert not mapped(small) and mapped(big)
    assert not small.any() and not big.any() and big.dtype == np.float16


@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_a_cache_made_for_the_reply_equals_one_grown_in_steps(kv_dtype):
    B = CpuBackend()
    B.use_kv_dtype(kv_dtype)
    rng = np.random.default_rng(0)
    whole = KVCache(B, 2, max_len=4096)  # 2 MiB a buffer: mapped on touch
    grown = KVCache(B, 2)  # 256 rows at a time, from the heap
    for t in (37, 1, 1, 300, 1):
        k = rng.standard_normal((1, 8, t, 64)).astype(np.float32)
        v = rng.standard_normal((1, 8, t, 64)).astype(np.float32)
        for layer in range(2):
            a = whole.update(layer, k.astype(kv_dtype), v.astype(kv_dtype))
            b = grown.update(layer, k.astype(kv_dtype), v.astype(kv_dtype))
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
        whole.advance(t)
        grown.advance(t)
    assert mapped(whole.keys[0]) and whole.keys[0].shape[2] == 4096
    assert grown.keys[0].shape[2] == 512
