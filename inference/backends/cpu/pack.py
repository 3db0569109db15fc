"""Quantized weights for the CPU backend: GGML blocks / MLX groups -> lane layout.

Codes, scales and biases per group of 32 come from :func:`formats.affine.block_groups` (the
one decoder of GGML blocks into affine groups, exact for Q4_0/Q4_1/Q4_K/Q5_*/Q8_0/Q3_K);
Q6_K, whose scales cover 16 weights, from ``quants.q6_k_fields`` (``SUB16``).
4-bit types keep 4 bits a weight, 5-bit types (Q5_0, Q5_1, Q5_K, MLX 5-bit) a 4-bit code
plus a bit in a plane of high bits (``layout`` docstring), Q6_K a 4-bit code plus two
planes; other types take 8. Scales
and biases stay float16 where
the file has them so (Q4_1, MLX with float16 scales: ``AFFINE_F16``; Q4_0, Q5_0, Q8_0's
``d``: ``SYMMETRIC_F16``), else float32; Q4_K and Q5_K keep the file's 6-bit scales and
mins and float16 ``d``, ``dmin`` (``SUPER6``: a Q4_K scale is a float16 times a 6-bit
integer, not a float16), the float16s once a super-block (``layout``: the super rows).

8-bit codes are signed whatever the type (one kernel per code width, so a model's first
load compiles fewer of them): MLX's unsigned 8-bit codes ``c`` become ``c - 128`` with the
bias moved by ``128 * scale`` (in float32: one rounding of at most 2^-24 of the new
bias), as Q8_0's are.

Memory rule: a tensor is packed only if its packed size is at most ``MAX_GROWTH`` times
its bytes in the file (Q4_0 1.0x, Q4_1 1.0x, Q4_K 1.03x, Q5_0 1.0x, Q5_1 1.0x, Q5_K
1.02x, Q6_K 1.0x, Q8_0 1.0x, MLX 4- and 5-bit with float16 scales 1.0x, 8-bit 1.18x).
Other types (Q3_K, Q2_K, F16, BF16, 3/6-bit MLX) stay as raw file bytes (1.0x):
:mod:`.raw` reads the GGML ones and the floats block by block; MLX's are dequantized
by NumPy a chunk of rows at a time (slow); they are views of the file's memory map, so
only the pages read are resident.

A first load packs GGML types with :mod:`.pack_kernels` (one pass over the file's bytes,
~0.6-1 GB/s a core against NumPy's 0.06-0.3 GB/s; the same bytes as :func:`_pack`, the
NumPy packing kept as the layout's reference and for MLX).

Packed weights are kept on disk (:class:`PackStore`), in a folder beside the kernel cache
(:mod:`inference.formats.cache`) keyed by the model file's identity (resolved path, size,
modification time, a digest of its header) and this layout's version: a model's first load
packs and writes them, later loads map the packed file instead of packing, as fast as
mapping the model file itself.
The store is mapped copy-on-write: pages stay shared with the page cache; where the kernel
can, they are all mapped in at the load's end (:meth:`PackStore.populate`), not faulted in
one by one by the first prefill. Opening the store maps none: until the load has loaded its
kernels and dropped the compiler's code pages, the store's pages would only add to its peak.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends.base import host_memory
from inference.backends.cpu.features import last_level_cache
from inference.backends.cpu.layout import (
    AFFINE,
    AFFINE_F16,
    GROUP,
    LANES,
    SPLIT,
    SUB16,
    SUPER6,
    SUPER_GROUPS,
    SYMMETRIC,
    SYMMETRIC_F16,
    block_rows,
    super_blocks,
    super_words,
)
from inference.backends.cpu.pack_kernels import TYPE_CODES, pack_rows
from inference.backends.cpu.raw import CODE, dequant_rows, run_size
from inference.errors import InvalidInputError
from inference.files import anonymous, read_whole
from inference.formats.affine import block_groups
from inference.formats.cache import key_path
from inference.formats.quants import (
    BLOCK_TYPES,
    _k_scale_min,
    dequantize_raw,
    q6_k_fields,
    unpack_mlx,
)
from inference.formats.tensor import TensorData, map_of, release_array_pages
from inference.threads import usable_cores
from inference.units import parse_bytes

MAX_GROWTH = 1.5
FOUR_BIT = frozenset({"Q4_0", "Q4_1", "Q4_K"})
FIVE_BIT = frozenset({"Q5_0", "Q5_1", "Q5_K"})
# Symmetric types store no bias row: w = scale * (code - zero). Q8_0 codes stay int8.
SYMMETRIC_ZERO = {"Q4_0": 8.0, "Q5_0": 16.0, "Q8_0": 0.0}
CODE_BITS = (4, 5, 6, 8)  # a block's codes take as many float32 rows (4 * bits bytes a lane)
_ROWS_PER_STEP = 1024  # repack this many rows at once: bounds the uint8-per-code temporary


@dataclass
class PackedWeight:
    """An (out, in) matrix in lane blocks (see :mod:`.layout`); rows padded to whole
    tiles of ``LANES`` with zero scales."""

    # float32: (tiles * K/32, R, LANES) blocks of code bytes, scale[, bias]; SUB16 and
    # SUPER6: (n,), the blocks' bytes then the super rows (layout docstring)
    data: np.ndarray
    bits: int  # 4, 5, 6 (Q6_K) or 8
    zero: float  # SYMMETRIC: w = scale * (code - zero)
    shape: tuple[int, int]  # logical (out, in)
    kind: int = SYMMETRIC  # how a block holds its scales (layout docstring)

    def __post_init__(self) -> None:
        code_type = np.int8 if self.bits == 8 else np.uint8  # module docstring
        if self.kind in SPLIT:
            n = -(-self.shape[0] // LANES) * (self.shape[1] // GROUP)
            flat = self.data.reshape(-1).view(np.uint8)
            cut = n * block_rows(self.bits, self.kind) * LANES
            self.flat = flat[:cut]  # the blocks' bytes (prefetched by the kernels)
            self.codes = self.flat.view(code_type).reshape(n, -1, LANES)
            # the super rows, where the kernels read the other kinds' float scales
            self.blocks = flat[cut:].view(np.float32).reshape(
                n // super_blocks(self.kind), 1, super_words(self.kind))
        else:
            n = self.data.shape[0]
            self.blocks = self.data
            self.codes = self.data.view(code_type).reshape(n, -1, LANES)
            self.flat = self.data.reshape(-1).view(np.uint8)
        self.halves = self.blocks.view(np.uint16)
        # The planes of high bits after the nibbles: 5-bit codes (n, 4, LANES), 6-bit
        # (n, 2, 4, LANES): bit 4's plane, then bit 5's; else None. The kernels specialise
        # on its type (layout.code_rows).
        self.high = (self.codes[:, 16:20] if self.bits == 5 else
                     self.codes[:, 16:24].reshape(n, 2, 4, LANES) if self.bits == 6 else None)

    @property
    def scale_only_int8(self) -> bool:
        """8-bit signed codes with a scale and no bias (Q8_0, Q6_K): w = scale * code."""
        return self.bits == 8 and (
            self.kind == SUB16 or (self.kind in (SYMMETRIC, SYMMETRIC_F16) and self.zero == 0))

    @property
    def groups(self) -> int:
        return self.shape[1] // GROUP

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class RawWeight:
    """A matrix kept as its file bytes (types without a packed form within the memory rule),
    read by the :mod:`.raw` kernels (``code``); other types (MLX 3/5/6-bit) and row
    lengths that are no whole number of the kernels' blocks are dequantized by NumPy."""

    raw: np.ndarray  # (out, bytes_per_row) uint8, or float16/float32 (out, in)
    qtype: str
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        fits = self.qtype in CODE and self.shape[1] % run_size(self.qtype) == 0
        self.code: int | None = CODE[self.qtype] if fits else None
        self.bytes = self.raw.view(np.uint8).reshape(self.shape[0], -1) if fits else None

    def rows(self, r0: int, r1: int) -> np.ndarray:
        if self.code is None:
            return dequantize_raw(self.raw[r0:r1], self.qtype).reshape(r1 - r0, self.shape[1])
        out = np.empty((r1 - r0, self.shape[1]), dtype=np.float32)
        dequant_rows(self.bytes, self.code, r0, r1, out)
        return out

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)


def _groups(t: TensorData, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows r0..r1 as codes (rows, K) uint8 and scale/bias (rows, K/32) float32."""
    n = t.shape[-1]
    if t.qtype == "MLX":
        x = t.extra
        gs = int(x["group_size"])
        codes = unpack_mlx(np.asarray(t.data[r0:r1]), int(x["bits"]))
        s, z = (_f32(np.asarray(x[k][r0:r1])) for k in ("scales", "biases"))
        if x["bits"] == 8:  # signed codes (module docstring): c*s + z = (c-128)*s + (z+128s)
            codes, z = (codes ^ np.uint8(0x80)).view(np.int8), z + np.float32(128) * s
        # Groups of 64/128 become 2/4 groups of 32 with the same scale and bias.
        return codes, np.repeat(s, gs // GROUP, axis=1), np.repeat(z, gs // GROUP, axis=1)
    bt = BLOCK_TYPES[t.qtype]
    raw = np.ascontiguousarray(t.data[r0:r1]).view(np.uint8).reshape(-1, bt.type_size)
    codes, s, z = block_groups(raw, t.qtype)
    if t.qtype == "Q8_0":  # back to signed codes, bias -128d + 128d = 0: no cancellation
        codes, z = (codes ^ np.uint8(0x80)).view(np.int8), np.zeros_like(z)
    rows = r1 - r0
    per = bt.block_size // GROUP
    s = np.broadcast_to(s, (len(raw), per)).reshape(rows, n // GROUP)
    z = np.broadcast_to(z, (len(raw), per)).reshape(rows, n // GROUP)
    return codes.reshape(rows, n), s, z


def _q6_k_groups(t: TensorData, r0: int, r1: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K rows r0..r1 as int8 codes (rows, K) and, per group of 32, its two int8 scales
    packed in one int16 (low byte: codes 0-15) and its float16 d as uint16 bits."""
    bt = BLOCK_TYPES["Q6_K"]
    raw = np.ascontiguousarray(t.data[r0:r1]).view(np.uint8).reshape(-1, bt.type_size)
    q, sc, d = q6_k_fields(raw)
    rows, groups = r1 - r0, t.shape[1] // GROUP
    pair = (sc[:, 0::2].view(np.uint8).astype(np.int32)
            | (sc[:, 1::2].view(np.uint8).astype(np.int32) << 8)).astype(np.int16)
    dbits = np.repeat(d.astype(np.float16).view(np.uint16), 8, axis=1)  # 8 groups per block
    return q.reshape(rows, -1), pair.reshape(rows, groups), dbits.reshape(rows, groups)


def _k_groups(t: TensorData, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K rows r0..r1 (``SUPER6``) as codes (rows, K) uint8 and, per group of 32,
    its 6-bit scale and min packed in one int16 (low byte: the scale) and the float16 bits
    its block's row keeps: the super-block's d in its first group, dmin in its second."""
    bt = BLOCK_TYPES[t.qtype]
    raw = np.ascontiguousarray(t.data[r0:r1]).view(np.uint8).reshape(-1, bt.type_size)
    codes, _, _ = block_groups(raw, t.qtype)
    sc, mn = _k_scale_min(raw[:, 4:16])
    pair = (sc.astype(np.int32) | (mn.astype(np.int32) << 8)).astype(np.int16)
    dbits = np.zeros((len(raw), SUPER_GROUPS), dtype=np.uint16)
    dbits[:, :2] = raw[:, 0:4].view(np.uint16)  # d, dmin: the block's first 4 bytes
    rows, groups = r1 - r0, t.shape[1] // GROUP
    return codes.reshape(rows, -1), pair.reshape(rows, groups), dbits.reshape(rows, groups)


def _f32(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.uint16:  # bfloat16 bit patterns
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def packed_nbytes(t: TensorData) -> int | None:
    """Bytes :func:`pack` makes of ``t`` (whole tiles of ``LANES`` rows), or None if ``t``
    is kept as its file bytes."""
    bits = packed_bits(t)
    if bits is None:
        return None
    return 4 * int(np.prod(_data_shape(t, bits, _kind(t))))


def _data_shape(t: TensorData, bits: int, kind: int) -> tuple[int, ...]:
    """The float32 shape of a PackedWeight's ``data`` for ``t`` in ``bits``-bit codes."""
    nblk = -(-t.shape[0] // LANES) * (t.shape[1] // GROUP)
    if kind in SPLIT:
        return (nblk * block_rows(bits, kind) * LANES // 4
                + nblk // super_blocks(kind) * super_words(kind),)
    return (nblk, bits + (2 if kind == AFFINE else 1), LANES)


def packed_bits(t: TensorData) -> int | None:
    """4, 5, 6 or 8 if ``t`` is packed under the memory rule, else None."""
    if len(t.shape) != 2 or t.shape[1] % GROUP:
        return None
    if t.qtype == "MLX":
        bits = int(t.extra["bits"])
        return bits if bits in CODE_BITS else None
    if t.qtype not in BLOCK_TYPES or BLOCK_TYPES[t.qtype].is_float:
        return None
    bits = (4 if t.qtype in FOUR_BIT else 5 if t.qtype in FIVE_BIT
            else 6 if t.qtype == "Q6_K" else 8)
    file_bytes = t.shape[0] * BLOCK_TYPES[t.qtype].row_bytes(t.shape[1])
    tiles = -(-t.shape[0] // LANES)  # the bytes of the rows, less the last tile's padding
    packed = 4 * np.prod(_data_shape(t, bits, _kind(t))) * t.shape[0] / (tiles * LANES)
    return bits if packed <= MAX_GROWTH * file_bytes else None


def _kind(t: TensorData) -> int:
    if t.qtype in SYMMETRIC_ZERO:
        return SYMMETRIC_F16  # the file's float16 d, kept so
    if t.qtype == "Q6_K":
        return SUB16  # a scale per 16 weights: kept exact, not requantized
    if t.qtype in ("Q4_K", "Q5_K"):
        return SUPER6  # the file's 6-bit scales and float16 d, dmin: one row, exact
    if t.qtype in ("Q4_1", "Q5_1") or (t.qtype == "MLX" and int(t.extra["bits"]) != 8 and all(
            np.asarray(t.extra[k]).dtype == np.float16 for k in ("scales", "biases"))):
        return AFFINE_F16  # float16 in the file: exact in half the room
    return AFFINE


def pack(t: TensorData) -> PackedWeight | RawWeight:
    bits = packed_bits(t)
    n_out, k = t.shape
    if bits is None:
        return RawWeight(_own(np.asarray(t.data)), t.qtype, (n_out, k))
    store = getattr(_active, "store", None)
    if store is not None:
        hit = store.get(t)
        if hit is not None:
            return hit
    w = _pack_shared(t, bits)
    if store is not None:
        store.put(t, w)
    return w


# --- packing on every free core: which rows pack where --------------------------------------
# Weights one worker packs at a time: spans of whole tiles of LANES rows. GGML types: the
# span's file bytes written by the kernel (nogil) straight into its tiles of the tensor's
# blocks; MLX: packed by _pack alone and copied into place (NumPy releases the GIL in the
# large array operations). Rows pack independently, so the bytes are those of one _pack
# over the whole tensor.
SPAN_WEIGHTS = 1 << 21
SHARED_MIN_WEIGHTS = 1 << 18  # smaller tensors pack in a few ms: on the calling thread
# While spans pack, threads hand over the GIL after this many seconds (Python's default:
# 0.005): the workers' Python between array operations waits less for one another.
SWITCH_INTERVAL = 0.0005
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_switching = 0  # packs running with SWITCH_INTERVAL (under _pool_lock)
_switch_before = 0.0


def pack_workers() -> int:
    """Threads that pack a tensor's spans: the cores this process may run on."""
    return usable_cores()


def _span_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(pack_workers(), thread_name_prefix="pack")
        return _pool


@contextlib.contextmanager
def _short_switches() -> Iterator[None]:
    global _switching, _switch_before
    with _pool_lock:
        if not _switching:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_before, SWITCH_INTERVAL))
        _switching += 1
    try:
        yield
    finally:
        with _pool_lock:
            _switching -= 1
            if not _switching:
                sys.setswitchinterval(_switch_before)


def _span_rows(t: TensorData, workers: int) -> int:
    """Rows of ``t`` in one span: whole tiles of LANES, at most about SPAN_WEIGHTS weights,
    and at most a ``workers``-th of the rows (a small model's tensors share out too)."""
    n_out, k = t.shape
    share = -(-n_out // workers)
    return max(LANES, min(SPAN_WEIGHTS // k, share + -share % LANES) // LANES * LANES)


def _rows(t: TensorData, sources: list[tuple[int, np.ndarray]], r0: int, r1: int
          ) -> TensorData:
    """Rows r0..r1 of ``t`` as a tensor of their own, from ``sources`` (its data as
    (first row, rows) pieces, one after another); MLX's per-row scales and biases cut the
    same way."""
    pieces = [a[max(r0 - s0, 0):r1 - s0] for s0, a in sources if s0 < r1 and s0 + len(a) > r0]
    data = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    extra = {k: v[r0:r1] if isinstance(v, np.ndarray) and v.ndim and len(v) == t.shape[0]
             else v for k, v in t.extra.items()}
    return TensorData(t.name, (r1 - r0, t.shape[1]), t.qtype, data, extra)


def _sources(t: TensorData) -> list[tuple[int, np.ndarray]]:
    """``t``'s data as (first row, rows) pieces: a stacked tensor's parts as they are (no
    joined copy; each part's own data made here, once), else its data whole."""
    parts = getattr(t, "parts", ())
    if not parts:
        return [(0, t.data)]
    out, r0 = [], 0
    for p in parts:
        out.append((r0, p.data))
        r0 += p.shape[0]
    return out


def _pack_shared(t: TensorData, bits: int) -> PackedWeight:
    """:func:`_pack` of ``t``, its spans of rows shared among :func:`pack_workers` threads
    (one span: packed on this thread). GGML types are packed by :func:`.pack_kernels.pack_rows`
    straight from the file's bytes into the tensor's blocks; others (MLX) by :func:`_pack`."""
    n_out, k = t.shape
    workers = pack_workers()
    step = _span_rows(t, workers)
    one = n_out <= step or workers < 2 or n_out * k < SHARED_MIN_WEIGHTS
    code = TYPE_CODES.get(t.qtype)
    if code is not None:
        return _pack_file_rows(t, bits, code, n_out if one else step)
    if one:
        return _pack(t, bits)
    sources = _sources(t)
    spans = [(r0, min(n_out, r0 + step)) for r0 in range(0, n_out, step)]
    groups, tiles = k // GROUP, -(-n_out // LANES)
    made: list[np.ndarray] = []  # the tensor's blocks, made by the first span packed
    lock = threading.Lock()

    def span(rows: tuple[int, int]) -> tuple[int, float, int]:
        part = _pack(_rows(t, sources, *rows), bits)
        with lock:
            if not made:
                made.append(np.empty((tiles * groups, *part.data.shape[1:]), np.float32))
        b0 = rows[0] // LANES * groups
        made[0][b0:b0 + len(part.data)] = part.data  # on the worker: copies in parallel
        return part.bits, part.zero, part.kind

    with _short_switches():
        (bits_, zero, kind), *_ = _span_pool().map(span, spans)
    return PackedWeight(made[0], bits_, zero, (n_out, k), kind)


def _pack_file_rows(t: TensorData, bits: int, code: int, step: int) -> PackedWeight:
    """``t`` (a GGML type of :data:`.pack_kernels.TYPE_CODES`) packed by the kernel, spans of
    ``step`` rows (whole tiles) on the pool's threads, each writing its own tiles' blocks."""
    n_out, k = t.shape
    kind = _kind(t)
    w = PackedWeight(np.empty(_data_shape(t, bits, kind), np.float32), bits,
                     SYMMETRIC_ZERO.get(t.qtype, 0.0), (n_out, k), kind)
    out8 = w.codes.view(np.uint8)
    sources = _sources(t)

    def span(rows: tuple[int, int]) -> None:
        data = np.ascontiguousarray(_rows(t, sources, *rows).data)
        pack_rows(data.view(np.uint8).reshape(rows[1] - rows[0], -1), code, out8, w.blocks,
                  rows[0])

    if step >= n_out:
        span((0, n_out))
    else:
        list(_span_pool().map(span, [(r0, min(n_out, r0 + step))
                                     for r0 in range(0, n_out, step)]))
    return w


def _pack(t: TensorData, bits: int, kind: int | None = None) -> PackedWeight:
    """``t`` in lane blocks of its :func:`_kind` (or ``kind``: AFFINE for any type
    :func:`formats.affine.block_groups` decodes). Q6_K with ``bits`` 8: int8 codes
    ``q - 32`` (``SUB16``'s 8-bit form, the tests' reference for the 6-bit one)."""
    n_out, k = t.shape
    groups = k // GROUP
    kind = _kind(t) if kind is None else kind
    c = bits  # rows of codes
    w = PackedWeight(np.zeros(_data_shape(t, bits, kind), np.float32), bits,
                     SYMMETRIC_ZERO.get(t.qtype, 0.0), (n_out, k), kind)
    blocks = w.blocks
    code_bytes = w.codes.view(np.uint8)
    halves = w.halves.view(np.float16)  # (n, R, 2 * LANES); SUB16/SUPER6 super rows
    for r0 in range(0, n_out, _ROWS_PER_STEP):  # _ROWS_PER_STEP is a multiple of LANES
        r1 = min(n_out, r0 + _ROWS_PER_STEP)
        q, s, z = (_q6_k_groups if kind == SUB16 else _k_groups if kind == SUPER6
                   else _groups)(t, r0, r1)
        pad = -(r1 - r0) % LANES
        if pad:
            q, s, z = (np.pad(a, ((0, pad), (0, 0))) for a in (q, s, z))
        nt = len(q) // LANES
        q = q.view(np.uint8).reshape(nt, LANES, groups, GROUP).transpose(0, 2, 3, 1)
        if bits == 6:  # q - 32 as int8 bytes -> q (0..63), modulo 256
            q = q + np.uint8(32)
        if bits != 8:
            q = _nibbles_and_high_bits(q, bits - 4) if bits > 4 else _nibbles(q)
        b0, b1 = r0 // LANES * groups, (r0 // LANES + nt) * groups
        code_bytes[b0:b1, : q.shape[2]] = q.reshape(b1 - b0, -1, LANES)
        s, z = (a.reshape(nt, LANES, groups).transpose(0, 2, 1).reshape(-1, LANES)
                for a in (s, z))
        if kind in (SUB16, SUPER6):  # s: two bytes as one int16; z: float16 bits
            pairs = np.ascontiguousarray(s, "<i2")  # one tile: s is a strided view
            code_bytes[b0:b1, 4 * c:4 * c + 2] = pairs.view(np.uint8).reshape(
                -1, LANES, 2).transpose(0, 2, 1)
            # z per block: the super-block's d (SUPER6: d, dmin) in its first (two) groups
            z16 = z.astype(np.uint16).view(np.float16).reshape(-1, SUPER_GROUPS, LANES)
            sb = slice(b0 // SUPER_GROUPS, b1 // SUPER_GROUPS)
            halves[sb, 0, :LANES] = z16[:, 0]
            if kind == SUPER6:
                halves[sb, 0, LANES:] = z16[:, 1]
        elif kind == SYMMETRIC_F16:
            s16 = s.astype(np.float16)
            if not np.array_equal(s16, s):
                raise AssertionError(f"{t.name}: scales not exact in float16")
            halves[b0:b1, 0, :LANES] = s16
        elif kind == AFFINE_F16:
            s16, z16 = s.astype(np.float16), z.astype(np.float16)
            if not (np.array_equal(s16, s) and np.array_equal(z16, z)):
                raise AssertionError(f"{t.name}: scales not exact in float16")
            halves[b0:b1, c, :LANES], halves[b0:b1, c, LANES:] = s16, z16
        else:
            blocks[b0:b1, c] = s
            if kind == AFFINE:
                blocks[b0:b1, c + 1] = z
    return w


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(tiles, groups, 32 codes, LANES) < 16 -> 16 bytes: code j low, code j + 16 high."""
    return q[:, :, :16] | (q[:, :, 16:] << np.uint8(4))


def _nibbles_and_high_bits(q: np.ndarray, planes: int = 1) -> np.ndarray:
    """Codes of ``4 + planes`` bits -> the 16 nibble bytes of :func:`_nibbles`, then 4
    bytes of high bits a plane: bit p of byte 16 / 17 / 18 / 19 is bit 4 of code 2p /
    2p+1 / 2p+16 / 2p+17, bytes 20-23 the same for bit 5. Codes j and j+1 sit in adjacent
    nibble rows, so the integer kernels, which interleave two rows, interleave bytes 16
    and 17 (or 18 and 19) to the same pairs."""
    weights = (np.uint8(1) << np.arange(8, dtype=np.uint8))[:, None]
    rows = []
    for k in range(planes):
        top = (q >> np.uint8(4 + k)) & np.uint8(1)
        rows += [(top[:, :, first::2][:, :, :8] * weights).sum(axis=2, dtype=np.uint8)
                 for first in (0, 1, 16, 17)]
    return np.concatenate([_nibbles(q & np.uint8(15)), np.stack(rows, axis=2)], axis=2)


def unpack(w: PackedWeight) -> np.ndarray:
    """Back to a float32 (out, in) matrix (tests and small fallbacks)."""
    c = w.bits  # rows of codes
    q = w.codes[:, : GROUP if w.bits == 8 else 16].astype(np.int32)
    if w.bits != 8:
        q = np.concatenate([q & 15, q >> 4], axis=1)
    if w.bits in (5, 6):
        hb = w.codes[:, 16:16 + 4 * (w.bits - 4)].astype(np.int32)  # (blocks, 4 a plane, LANES)
        p = np.arange(8)[None, :, None]
        for k in range(w.bits - 4):  # plane k: bit 4 + k
            top = np.empty_like(q)
            for i, first in enumerate((0, 1, 16, 17)):
                top[:, first:first + 16:2] = (hb[:, 4 * k + i:4 * k + i + 1] >> p) & 1
            q = q | (top << (4 + k))
        if w.bits == 6:
            q = q - 32  # Q6_K's signed q - 32
    if w.kind in (SUB16, SUPER6):  # each block's super row (d, then SUPER6's dmin)
        sup = np.repeat(w.halves[:, 0].view(np.float16).astype(np.float32), SUPER_GROUPS, 0)
    if w.kind == SUPER6:
        sc = w.codes[:, 4 * c:4 * c + 2].astype(np.float32)  # (blocks, 2, LANES)
        s = (sup[:, :LANES] * sc[:, 0])[:, None, :]
        z = -(sup[:, LANES:] * sc[:, 1])[:, None, :]
    elif w.kind == SUB16:
        d = sup[:, :LANES]
        sc = w.codes[:, 4 * c:4 * c + 2].view(np.int8).astype(np.float32)  # (blocks, 2, LANES)
        s = np.repeat(d[:, None, :] * sc, 16, axis=1)  # d * scale, then * q: as the file
        z = None  # no bias: a zero code keeps its product's sign, as the file's -0.0
    elif w.kind == SYMMETRIC_F16:
        s = w.halves[:, 0, None, :LANES].view(np.float16).astype(np.float32)
        z = -w.zero * s
    elif w.kind == AFFINE_F16:
        h = w.blocks.view(np.float16)[:, c].astype(np.float32)
        s, z = h[:, None, :LANES], h[:, None, LANES:]
    else:
        s = w.blocks[:, c][:, None, :]
        z = w.blocks[:, c + 1][:, None, :] if w.kind == AFFINE else -w.zero * s
    v = q.astype(np.float32) * s  # (blocks, 32, LANES)
    if z is not None:
        v = v + z
    tiles = len(v) // w.groups
    v = v.reshape(tiles, w.groups, GROUP, LANES).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(v.reshape(tiles * LANES, w.shape[1])[: w.shape[0]])


# --- the store of packed weights on disk ---------------------------------------------------
# The layout's version: a change to PackedWeight's blocks, LANES or GROUP changes it.
LAYOUT_VERSION = f"5-{LANES}-{GROUP}"
ALIGN = 64  # bytes: each tensor's blocks start on a cache line
MIN_STORE_BYTES = 32 << 20  # smaller models pack in well under a second
FREE_MARGIN = 1 << 30  # a store is written only where this much disk stays free after it
_active = threading.local()  # .store: the PackStore of the load running on this thread
# The stores of all models together are kept within this many bytes (the least recently
# used go first): ``INFERDESK_WEIGHT_CACHE_MAX`` (bytes, or with a K/M/G/T suffix; 0 keeps
# none), else DEFAULT_CAP. A store is ~1.0-1.3x its model file, and dropping one costs
# only a repack at that model's next load.
CAP_ENV = "INFERDESK_WEIGHT_CACHE_MAX"
DEFAULT_CAP = 20 << 30


def store_cap() -> int:
    """The byte cap on all stores together (CAP_ENV; a value it cannot read: the default)."""
    text = os.environ.get(CAP_ENV, "")
    if not text.strip():
        return DEFAULT_CAP
    try:
        return parse_bytes(text)
    except ValueError:
        return DEFAULT_CAP


@dataclass
class StoreEntry:
    """One model's store on disk, as :func:`stores` lists it."""

    folder: Path
    nbytes: int
    last_used: float  # seconds since the epoch: written, or last mapped by a load
    model: str | None  # the model file it was packed from (None: not recorded)
    current: bool = True  # in this version's LAYOUT_VERSION (else no load of ours reads it)


def stores() -> list[StoreEntry]:
    """The complete stores under the cache root: those of another layout first (a load of
    this version never reads them), then least recently used first."""
    folder = key_path("packed", "")
    if folder is None or not folder.parent.is_dir():
        return []
    out = []
    for d in folder.parent.iterdir():
        index = d / "index.json"
        try:
            used = index.stat().st_mtime
            size = (d / "packed.bin").stat().st_size + index.stat().st_size
        except OSError:  # being written (a .writing- folder), or cut short
            continue
        model, layout = _recorded(index)
        out.append(StoreEntry(d, size, used, model, layout == LAYOUT_VERSION))
    return sorted(out, key=lambda e: (e.current, e.last_used))


def _recorded(index: Path) -> tuple[str | None, str | None]:
    """The model file and the layout a store's index records (None: not recorded)."""
    try:
        head = json.loads(index.read_text())
        model, layout = head.get("__model__"), head.get("__layout__")
    except (OSError, ValueError, AttributeError):
        return None, None
    return (model if isinstance(model, str) else None,
            layout if isinstance(layout, str) else None)


def evict(room: int, keep: Path | None = None, cap: int | None = None) -> list[Path]:
    """Remove stores in :func:`stores`' order (another layout's, then the least recently
    used; never ``keep``) until they all take at most ``cap`` (None: :func:`store_cap`)
    less ``room`` bytes; the folders removed."""
    entries = stores()
    total = sum(e.nbytes for e in entries)
    limit = store_cap() if cap is None else cap
    gone = []
    for e in (e for e in entries if e.folder != keep):
        if total + room <= limit:
            break
        shutil.rmtree(e.folder, ignore_errors=True)  # a process mapping it keeps its pages
        total -= e.nbytes
        gone.append(e.folder)
    return gone


WRITING = ".writing-"  # a store being written: WRITING<writer's pid>-<random>
STALE_WRITING_S = 3600.0  # a writing folder untouched this long is left over (a pid reused)


def _writing_folder(parent: Path) -> Path:
    """A new folder for a store being written, named after this process."""
    return Path(tempfile.mkdtemp(prefix=f"{WRITING}{os.getpid()}-", dir=parent))


def _writer_gone(name: str) -> bool:
    """Whether the process named in a writing folder's name has ended (unnamed: unknown)."""
    pid = name[len(WRITING):].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: running
        return False
    return False


def sweep_unfinished(parent: Path, now: float | None = None) -> list[Path]:
    """Remove the writing folders under ``parent`` a killed load left: their writer is gone,
    or nothing in them changed for :data:`STALE_WRITING_S`; the folders removed."""
    now = time.time() if now is None else now
    try:
        found = [d for d in parent.iterdir() if d.name.startswith(WRITING)]
    except OSError:
        return []
    gone = []
    for d in found:
        try:
            touched = max(p.stat().st_mtime for p in (d, *d.iterdir()))
        except OSError:  # removed meanwhile by its writer
            continue
        if _writer_gone(d.name) or now - touched > STALE_WRITING_S:
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d)
    return gone


# Linux's madvise(MADV_POPULATE_READ) (5.14+; Python 3.11 names no constant for it).
MADV_POPULATE_READ = 22


def _populate(m: mmap.mmap) -> None:
    """Map every page of the store now (read, no copy), where the kernel can: the first
    prefill would otherwise fault them in one by one. Measured on the AMD EPYC guest: a
    fresh Llama 3.2 1B prefill's first touches of its packed weights took ~0.46 s (the
    second prefill 1.6 s against the first's 2.1 s; its tied 128k-row output head 128 ms
    against 13); populating Gemma 3 4B's 3.2 GB store took 0.10 s, Phi-3.5's 0.2-0.3 s."""
    if os.uname().sysname == "Linux":
        with contextlib.suppress(OSError):  # an older kernel: the pages fault in as read
            m.madvise(MADV_POPULATE_READ)


WEIGHTS_ENV = "INFERDESK_CPU_WEIGHTS"  # "memory" or "mapped"; unset: memory where it fits
WEIGHT_PLACES = ("memory", "mapped")
# What a store read into memory leaves available, at least: the KV cache, activations and
# the rest of the machine (and a tenth of the RAM, whichever is more).
KEEP_AVAILABLE = 2 << 30


def in_memory(size: int) -> bool:
    """Whether a model's weights, ``size`` bytes, are read into this process's memory
    ("memory") rather than mapped from the page cache ("mapped"): ``INFERDESK_CPU_WEIGHTS``
    if set, else memory when they are larger than the CPU's largest cache and the machine's
    available memory keeps :data:`KEEP_AVAILABLE` (or a tenth of the RAM) besides. Within
    the cache the read would only cost load time (0.06-0.1 s for SmolLM2's 96 MB store).

    Why: a decode step streams every weight once, and on the KVM guest measured here the
    page cache's pages stream at about half the speed of a process's own: the same 2 GB
    store read at 5.5-6.2 GB/s a core mapped, 8.8-10.0 in unadvised anonymous pages and
    11.1-13.1 in huge ones (2 threads: 11.5-12.2 against 16.9-18.9 and 22.1-24.6), and
    Llama 3.2 3B's decode step took 226-261 ms mapped against 142-167 in memory
    (docs/cpu-backend.md, "Where the weights live"). The read costs ~0.25-0.8 s a GB on
    two cores from the page cache; mapped, memory pressure can drop the
    pages and a model larger than the free memory still loads."""
    choice = os.environ.get(WEIGHTS_ENV, "").strip().lower()
    if choice:
        if choice not in WEIGHT_PLACES:
            raise InvalidInputError(f"{WEIGHTS_ENV} must be one of "
                                    f"{', '.join(WEIGHT_PLACES)}, not {choice!r}")
        return choice == "memory"
    if size <= last_level_cache():  # a decode reads it from the cache, wherever it lives
        return False
    try:
        total, available = host_memory()
    except Exception:  # noqa: BLE001 - no figure for the free memory: map, as is safe
        return False
    return size + max(KEEP_AVAILABLE, total // 10) <= available


def _own(a: np.ndarray) -> np.ndarray:
    """File bytes kept in their layout (a view of the model file's map): copied into this
    process's memory where :func:`in_memory` says so, as a store's bytes are (the file's pages
    under it then leave the resident memory), else ``a``, its pages mapped from the page
    cache."""
    m = map_of(a)
    if not in_memory(len(m) if m is not None else a.nbytes):  # the whole file decides
        return a
    out = anonymous(a.nbytes).view(a.dtype).reshape(a.shape)
    np.copyto(out, a)
    release_array_pages(a)  # the copy's source pages go now, not at the load's next release
    return out


class PackStore:
    """The packed weights of one model file: read from ``packed.bin`` when a complete store
    exists, else collected as the load packs them and written at its end. An opened store
    is mapped; where :func:`in_memory` says so, :meth:`populate` then reads it into the
    process's memory and moves the weights it gave out there."""

    def __init__(self, folder: Path, model: str | None = None) -> None:
        self.folder = folder
        self.model = model  # the model file's path, recorded in the index (stores())
        self.index: dict[str, Any] = {}
        # The store's bytes: mapped, or (after populate) read into this process's memory.
        self.map: np.ndarray | mmap.mmap | None = None
        self.in_memory = False
        self.given: list[tuple[PackedWeight, int]] = []  # weights get() made, at their offset
        self.new: list[tuple[str, dict[str, Any], PackedWeight]] = []
        self.stream: _Stream | None = None  # packed.bin being written as the load packs
        self.missed = False
        try:
            self.index = json.loads((folder / "index.json").read_text())
            self.index.pop("__model__", None)
            self.index.pop("__layout__", None)
            with open(folder / "packed.bin", "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != self.index.pop("__bytes__", -1) or not size:
                    raise ValueError("a store cut short")
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            with contextlib.suppress(OSError):  # used now: the last to go (evict)
                os.utime(folder / "index.json")
        except FileNotFoundError:
            self.index, self.map = {}, None
        except (OSError, ValueError, TypeError, AttributeError):  # unreadable: written anew
            self.index, self.map = {}, None
            shutil.rmtree(folder, ignore_errors=True)
        else:
            self.in_memory = in_memory(size)

    def populate(self) -> None:
        """Make an opened store resident: read into this process's memory where
        :func:`in_memory` said so, the weights :meth:`get` gave out moved onto that copy and
        the map let go; else every page of the map mapped in now (:func:`_populate`). A store
        this load packs and writes is resident already. The load calls it last: the peak of
        a load then holds the store or the compiler's pages and the load's temporaries, not
        both; until then the weights read the map, so nothing reads bytes not yet read."""
        if not isinstance(self.map, mmap.mmap):
            return
        if self.in_memory:
            try:
                own = read_whole(self.folder / "packed.bin", usable_cores())
            except OSError:  # the map stays, as good as before
                own = None
            if own is not None and own.nbytes == len(self.map):
                for w, offset in self.given:
                    w.data = np.frombuffer(own, np.float32, w.data.size, offset).reshape(
                        w.data.shape)
                    w.__post_init__()
                self.map, self.given = own, []
                return
        _populate(self.map)

    @staticmethod
    def _key(t: TensorData, bits: int) -> dict[str, Any]:
        return {"qtype": t.qtype, "shape": list(t.shape), "bits": bits, "kind": _kind(t)}

    def get(self, t: TensorData) -> PackedWeight | None:
        if self.map is None:
            return None
        e = self.index.get(t.name)
        bits = packed_bits(t)
        if e is None or bits is None or e["key"] != self._key(t, bits):
            self.missed = True  # another layout of the file: not rewritten by this load
            return None
        n = int(np.prod(e["blocks"]))
        blocks = np.frombuffer(self.map, np.float32, n, e["offset"]).reshape(e["blocks"])
        w = PackedWeight(blocks, bits, SYMMETRIC_ZERO.get(t.qtype, 0.0), tuple(t.shape),
                         _kind(t))
        if self.in_memory and isinstance(self.map, mmap.mmap):
            self.given.append((w, e["offset"]))
        return w

    def put(self, t: TensorData, w: PackedWeight) -> None:
        if self.map is None and all(name != t.name for name, _, _ in self.new):
            self.new.append((t.name, self._key(t, w.bits), w))
            if self.stream is None and _aligned(self.new) >= MIN_STORE_BYTES:
                self.stream = _Stream(self.folder.parent, self.new)
            if self.stream is not None:
                self.stream.send(len(self.new))

    def write(self) -> None:
        """The collected weights as a complete store (written aside, then renamed in): the
        file the load streamed as it packed, else written now from memory."""
        stream, self.stream = self.stream, None
        total = _aligned(self.new)
        tmp = None if stream is None else stream.finish(len(self.new))
        try:
            if self.map is not None or self.missed or not self.new or total < MIN_STORE_BYTES:
                return
            if total > store_cap():
                return
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            evict(total, keep=self.folder)
            if tmp is None:
                if shutil.disk_usage(self.folder.parent).free < total + FREE_MARGIN:
                    return
                tmp = Path(_writing_folder(self.folder.parent))
                with open(tmp / "packed.bin", "wb") as f:
                    for _, _, w in self.new:
                        _append(f, w)
            index: dict[str, Any] = {"__model__": self.model, "__layout__": LAYOUT_VERSION}
            offset = 0
            for name, key, w in self.new:
                offset += -offset % ALIGN
                index[name] = {"key": key, "offset": offset, "blocks": list(w.data.shape)}
                offset += w.data.nbytes
            index["__bytes__"] = offset
            (tmp / "index.json").write_text(json.dumps(index))
            os.rename(tmp, self.folder)  # fails if another process wrote it first: kept
            evict(0, keep=self.folder)  # its index counted too
        except OSError:
            pass
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def discard(self) -> None:
        """Nothing written: a load that stopped (the file streamed so far removed)."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.finish(0)
        self.new.clear()


def _aligned(new: list[tuple[str, dict[str, Any], PackedWeight]]) -> int:
    """Bytes of ``packed.bin`` holding these weights, each started on ALIGN."""
    return sum(-(-w.data.nbytes // ALIGN) * ALIGN for _, _, w in new)


def _append(f: Any, w: PackedWeight) -> None:
    f.write(b"\0" * (-f.tell() % ALIGN))
    f.write(memoryview(np.ascontiguousarray(w.data)).cast("B"))


class _Stream:
    """A ``packed.bin`` written on a thread of its own while the load packs: the first
    ``send`` weights of ``items`` (the store's list, appended to as the load packs), in its
    order, in a ``.writing-`` folder under ``parent`` (a folder :func:`stores` never lists;
    PackStore.write renames it in). The disk's writes then overlap packing instead of
    following it. It stops writing, and :meth:`finish` gives no folder, where the disk would
    keep less than FREE_MARGIN free, the weights pass the store cap or a write fails."""

    def __init__(self, parent: Path, items: list[tuple[str, dict[str, Any], PackedWeight]]
                 ) -> None:
        self.parent = parent
        self.items = items
        self.cond = threading.Condition()
        self.sent = 0  # weights of items to write
        self.closed = False
        self.written = 0
        self.failed = False
        self.tmp: Path | None = None
        self.thread = threading.Thread(target=self._run, name="pack-store", daemon=True)
        self.thread.start()

    def send(self, n: int) -> None:
        with self.cond:
            self.sent = n
            self.cond.notify()

    def finish(self, n: int) -> Path | None:
        """Writes the first ``n`` items (0: stops now), waits, and gives the folder whose
        ``packed.bin`` holds them all, or None (the folder removed)."""
        with self.cond:
            self.sent, self.closed = n, True
            self.cond.notify()
        self.thread.join()
        if n and not self.failed and self.written == n:
            return self.tmp
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return None

    def _run(self) -> None:
        cap, total = store_cap(), 0
        f = None
        try:
            while True:
                with self.cond:
                    while self.written >= self.sent and not self.closed:
                        self.cond.wait()
                    if self.written >= self.sent:
                        return
                w = self.items[self.written][2]
                total += -(-w.data.nbytes // ALIGN) * ALIGN
                if f is None:
                    self.parent.mkdir(parents=True, exist_ok=True)
                if total > cap or shutil.disk_usage(self.parent).free < (
                        w.data.nbytes + FREE_MARGIN):
                    self.failed = True
                    return
                if f is None:
                    self.tmp = Path(_writing_folder(self.parent))
                    f = open(self.tmp / "packed.bin", "wb")  # noqa: SIM115 (closed below)
                _append(f, w)
                self.written += 1
        except OSError:
            self.failed = True
        finally:
            if f is not None:
                f.close()


@contextlib.contextmanager
def pack_store(identity: str | None) -> Iterator[PackStore | None]:
    """Within the block, :func:`pack` on this thread reads packed weights from the store of
    the model file ``identity`` names (its path, size, modification time and header
    digest), or packs them and, if the whole load packed, writes the store at the end. No
    store without an identity or a cache folder."""
    folder = key_path("packed", f"{identity}|{LAYOUT_VERSION}")
    if identity is None or folder is None:
        yield None
        return
    sweep_unfinished(folder.parent)
    store = PackStore(folder, identity.split("|", 1)[0])
    before, _active.store = getattr(_active, "store", None), store
    try:
        yield store
    except BaseException:
        store.discard()
        raise
    finally:
        _active.store = before
    store.write()
    store.new.clear()
