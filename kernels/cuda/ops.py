"""Checked entry points: validate dtype and layout, plan the launch, launch, return output.

Each function takes a :class:`~kernels.cuda.device.Device` and device arrays (CuPy arrays,
or NumPy buffers under the emulator) and allocates its output on that device. Nothing
here copies between host and device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.cuda import blas, plan, table
from kernels.cuda.device import Device, first_line
from kernels.cuda.table import HALF_TYPES, TYPES, KernelType, mmv_kernel, q8_1_row_bytes
from kernels.errors import KernelLoadError, LaunchError

i32, i64, f32 = np.int32, np.int64, np.float32


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise LaunchError(msg)


def _f32_contig(x: Any, what: str) -> None:
    if x.dtype != np.float32:  # the message only when it fails: a decode step checks ~100
        raise LaunchError(f"{what} must be float32, got {x.dtype}")
    _need(x.flags.c_contiguous, f"{what} must be C-contiguous")


@dataclass
class QuantMatrix:
    """A 2-D weight on the device in its GGML layout: (rows, row_bytes) uint8 blocks, or a
    plain (rows, cols) float32/float16 array for F32/F16, uint16 bit patterns for BF16."""

    data: Any
    qtype: str
    rows: int
    cols: int

    @property
    def kt(self) -> KernelType:
        return TYPES[self.qtype]

    @property
    def row_bytes(self) -> int:
        return self.kt.row_bytes(self.cols)


def upload_matrix(dev: Device, data: np.ndarray, qtype: str, shape: tuple[int, int],
                  label: str = "weight") -> QuantMatrix:
    """Host weight (TensorData layout) -> device QuantMatrix; the load-time copy."""
    _need(qtype in TYPES, f"the CUDA kernels have no {qtype} type")
    rows, cols = shape
    kt = TYPES[qtype]
    _need(cols % kt.qk == 0, f"{qtype} rows need whole blocks of {kt.qk}, got {cols} columns")
    dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}.get(qtype, np.uint8)
    host = np.ascontiguousarray(np.asarray(data).view(dtype).reshape(rows, -1))
    _need(host.nbytes == rows * kt.row_bytes(cols), f"{label}: {host.nbytes} bytes, expected "
          f"{rows * kt.row_bytes(cols)} for {qtype} {shape}")
    return QuantMatrix(dev.to_device(host, label), qtype, rows, cols)


def quantize_q8_1(dev: Device, x: Any) -> Any:
    """(batch, cols) float32, cols % 32 == 0 -> (batch, q8_1_row_bytes(cols)) uint8 q8_1
    blocks (quants.cuh), each row 16-byte aligned."""
    _f32_contig(x, "x")
    _need(x.ndim == 2 and x.shape[1] % 32 == 0, f"q8_1 needs (batch, 32k) floats, got {x.shape}")
    stride = q8_1_row_bytes(x.shape[1])
    xq = dev.empty((x.shape[0], stride), np.uint8)
    dev.launch("mmv", "quantize_q8_1", plan.plan_quantize_q8_1(x.shape[1], x.shape[0], dev.limits),
               (x, xq, i32(x.shape[1]), i64(stride)))
    return xq


def dp4a_applies(dev: Device, w: QuantMatrix) -> bool:
    """Whether mul_mat_vec takes the integer path for w: its type has one, and its data
    starts 16-byte aligned (the kernel loads aligned 16-byte words around each row)."""
    return w.kt.dp4a and dev.address(w.data) % 16 == 0


def half_vector_applies(dev: Device, w: QuantMatrix) -> bool:
    """Whether mul_mat_vec takes the 16-bit vector kernel (mul_mat_vec_h_*) for w: F16 or
    BF16, rows of whole 8-byte words (cols % 4 == 0) and the data 16-byte aligned."""
    return w.qtype in HALF_TYPES and w.cols % 4 == 0 and dev.address(w.data) % 16 == 0


def _epilogue(w: QuantMatrix, batch: int, bias: Any | None, residual: Any | None) -> None:
    if bias is not None:
        _f32_contig(bias, "bias")
        _need(bias.shape == (w.rows,), f"bias {bias.shape} does not match {w.rows} rows")
    if residual is not None:
        _f32_contig(residual, "residual")
        _need(residual.size == batch * w.rows,
              f"residual {residual.shape} does not match ({batch}, {w.rows})")


def mul_mat_vec(dev: Device, w: QuantMatrix, x: Any, q8_1: bool = True,
                tile: int | None = None, *, bias: Any | None = None,
                residual: Any | None = None) -> Any:
    """(batch, cols) float32 -> (batch, rows) float32, + bias (rows,) and + residual
    (batch, rows) where given, added in the kernel's epilogue (mmv.cu mmv_store_tile) with
    the rounding of separate adds: (x @ w.T + bias) + residual.

    With q8_1 (default) and a weight type that has one, x is quantized to q8_1 and the
    integer kernel (mul_mat_vec_q_*) runs: what reaches memory bandwidth on every GPU since
    sm_61 (__dp4a), at the cost of rounding x to 8 bits per 32-value block (relative error
    <= 1/254 of each block's max |x|). Otherwise, and for F32/F16/BF16, the float
    kernel (mul_mat_vec_*), exact to float32 rounding. F16/BF16 weights take the 16-bit
    vector kernel (mul_mat_vec_h_*: 8-byte weight and 16-byte x loads, float32 sums) where
    :func:`half_vector_applies`, else the float kernel. Each kernel reads each weight once
    per `tile` rows of x (default: plan.mmv_tile(batch); tests force 1 to compare)."""
    _f32_contig(x, "x")
    _need(x.ndim == 2 and x.shape[1] == w.cols,
          f"x {x.shape} does not match weight {w.cols} columns")
    batch = x.shape[0]
    if q8_1 and dp4a_applies(dev, w):
        return mul_mat_vec_q8_1(dev, w, quantize_q8_1(dev, x), batch, tile,
                                bias=bias, residual=residual)
    _epilogue(w, batch, bias, residual)
    tile = plan.mmv_tile(batch) if tile is None else tile
    if dev.address(x) % 16:  # the quantized and 16-bit kernels read x as float4
        x = x.copy()
    y = dev.empty((batch, w.rows), np.float32)
    launch = plan.plan_mul_mat_vec(w.kt, w.cols, w.rows, batch, dev.limits, tile)
    if half_vector_applies(dev, w):
        dev.launch("mmv", mmv_kernel(w.kt, tile, "h"), launch,
                   (w.data, x, y, i32(w.cols), i32(w.rows), i32(batch), bias, residual))
    else:
        dev.launch("mmv", mmv_kernel(w.kt, tile), launch,
                   (w.data, x, y, i32(w.cols), i32(w.rows), i64(w.row_bytes), i32(batch),
                    bias, residual))
    return y


def mul_mat_vec_q8_1(dev: Device, w: QuantMatrix, xq: Any, batch: int,
                     tile: int | None = None, *, bias: Any | None = None,
                     residual: Any | None = None) -> Any:
    """The integer mat-vec (mul_mat_vec_q_*) of x already in q8_1 rows (batch,
    q8_1_row_bytes(w.cols)) uint8 -- from :func:`quantize_q8_1` or a kernel that ends in
    q8_1 (:func:`rms_norm_q8_1`, :func:`gated_q8_1`) -- with mul_mat_vec's epilogue.
    Needs :func:`dp4a_applies`."""
    _need(dp4a_applies(dev, w), f"{w.qtype} weights here have no integer mat-vec")
    stride = q8_1_row_bytes(w.cols)
    _need(xq.dtype == np.uint8 and xq.shape == (batch, stride) and xq.flags.c_contiguous
          and dev.address(xq) % 16 == 0, f"xq must be ({batch}, {stride}) aligned q8_1 rows")
    _epilogue(w, batch, bias, residual)
    tile = plan.mmv_tile(batch) if tile is None else tile
    y = dev.empty((batch, w.rows), np.float32)
    launch = plan.plan_mul_mat_vec_q(w.kt, w.cols, w.rows, batch, dev.limits, tile)
    dev.launch("mmv", mmv_kernel(w.kt, tile, "q"), launch,
               (w.data, xq, y, i32(w.cols), i32(w.rows), i64(w.row_bytes), i64(stride),
                i32(batch), bias, residual))
    return y


# bfloat16 as uint16 bit patterns (NumPy and CuPy have none): the high 16 bits of a float32.
# BF16 weights, the bfloat16 KV cache and the bfloat16 prefill scratch all hold it.
BF16 = blas.BF16
_DQ_SUFFIX = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", BF16: "bf16"}


def dequantize(dev: Device, w: QuantMatrix, dtype: Any = np.float32, ids: Any = None,
               out: Any = None) -> Any:
    """Rows of w (all, or ids[i] for each i) as float32, float16 or bfloat16 (BF16 bits),
    (n, cols), rounded to nearest even. `out` may be a preallocated buffer (prefill reuses
    one scratch for every weight)."""
    suffix = _DQ_SUFFIX.get(np.dtype(dtype))
    _need(suffix is not None, f"dequantize to {dtype} is not supported")
    if ids is not None:
        _need(ids.dtype == np.int32 and ids.ndim == 1 and ids.flags.c_contiguous,
              "ids must be a contiguous int32 vector")
    n = w.rows if ids is None else ids.shape[0]
    if out is None:
        out = dev.empty((n, w.cols), dtype)
    _need(out.shape == (n, w.cols) and out.dtype == np.dtype(dtype) and out.flags.c_contiguous,
          "dequantize output buffer has the wrong shape or dtype")
    _need(dev.address(out) % 16 == 0, "dequantize output must start 16-byte aligned")
    launch = plan.plan_dequantize(w.kt, w.cols, n, dev.limits)
    dev.launch("dequant", f"dequantize_{w.kt.suffix}_{suffix}", launch,
               (w.data, ids, out, i32(w.cols), i32(n), i32(w.rows), i64(w.row_bytes)))
    return out


def gemm_16(dev: Device, x: Any, w: Any, out: Any = None) -> Any:
    """y (t, rows) float32 = x (t, k) @ w (rows, k).T for 16-bit x and w of one type (float16,
    or BF16 bits), with float32 products and sums: cublasGemmEx, CUBLAS_COMPUTE_32F (the
    emulator's stand-in follows the same contract)."""
    _need(x.dtype == w.dtype and np.dtype(x.dtype) in (np.dtype(np.float16), BF16),
          f"gemm_16 takes float16 or bfloat16 operands of one type, got {x.dtype}, {w.dtype}")
    _need(x.ndim == 2 and w.ndim == 2 and x.shape[1] == w.shape[1],
          f"x {x.shape} does not match w {w.shape}")
    _need(x.flags.c_contiguous and w.flags.c_contiguous, "gemm_16 operands must be C-contiguous")
    y = dev.empty((x.shape[0], w.shape[0]), np.float32) if out is None else out
    _f32_contig(y, "gemm_16 output")
    _need(y.shape == (x.shape[0], w.shape[0]), f"output {y.shape} does not match")
    dev.gemm_ex(blas.row_major_nt(x, w, y), w, x, y)
    return y


def get_rows(dev: Device, table: QuantMatrix, ids: Any) -> Any:
    """Embedding gather: (n,) int32 ids -> (n, cols) float32, from any table type."""
    return dequantize(dev, table, np.float32, ids=ids)


def _norm_rows(x: Any, w: Any) -> tuple[int, int]:
    _f32_contig(x, "x")
    _f32_contig(w, "weight")
    n = x.shape[-1]
    _need(w.shape == (n,), f"weight {w.shape} does not match rows of {n}")
    return n, x.size // n


def rms_norm(dev: Device, x: Any, w: Any, eps: float) -> Any:
    n, rows = _norm_rows(x, w)
    y = dev.empty(x.shape, np.float32)
    dev.launch("norm", "rms_norm_f32", plan.plan_rows(n, rows, dev.limits),
               (x, w, y, i32(n), i32(rows), f32(eps)))
    return y


def rms_norm_q8_1(dev: Device, x: Any, w: Any, eps: float) -> Any:
    """:func:`rms_norm` of (..., n) rows (n % 32 == 0) as the q8_1 rows (rows,
    q8_1_row_bytes(n)) the next integer mat-vec reads: the bytes of quantize_q8_1(rms_norm(x))
    in one launch (norm.cu rms_norm_q8_1)."""
    n, rows = _norm_rows(x, w)
    _need(n % table.Q8_1_QK == 0, f"q8_1 rows need whole blocks of 32 values, got {n}")
    stride = q8_1_row_bytes(n)
    xq = dev.empty((rows, stride), np.uint8)
    dev.launch("norm", "rms_norm_q8_1", plan.plan_rows(n, rows, dev.limits),
               (x, w, xq, i32(n), i32(rows), f32(eps), i64(stride)))
    return xq


def rms_norm_add_rms_norm_q8_1(dev: Device, y: Any, res: Any, w_post: Any, w_pre: Any,
                               eps: float) -> tuple[Any, Any]:
    """(h, xq): h = res + rms_norm(y, w_post) and xq = rms_norm_q8_1(h, w_pre) of (rows, n)
    rows, in one launch (norm.cu; Gemma 2/3's norm after attention, the residual and the
    pre-MLP norm): the bits of the three launches."""
    n, rows = _norm_rows(y, w_post)
    _f32_contig(res, "residual")
    _need(res.shape == y.shape, f"residual {res.shape} != {y.shape}")
    _f32_contig(w_pre, "weight")
    _need(w_pre.shape == (n,), f"weight {w_pre.shape} does not match rows of {n}")
    _need(n % table.Q8_1_QK == 0, f"q8_1 rows need whole blocks of 32 values, got {n}")
    stride = q8_1_row_bytes(n)
    h = dev.empty(y.shape, np.float32)
    xq = dev.empty((rows, stride), np.uint8)
    dev.launch("norm", "rms_norm_add_rms_norm_q8_1", plan.plan_rows(n, rows, dev.limits),
               (y, res, w_post, w_pre, h, xq, i32(n), i32(rows), f32(eps), i64(stride)))
    return h, xq


def layer_norm(dev: Device, x: Any, w: Any, b: Any | None, eps: float) -> Any:
    _f32_contig(x, "x")
    _f32_contig(w, "weight")
    n = x.shape[-1]
    _need(w.shape == (n,), f"weight {w.shape} does not match rows of {n}")
    if b is not None:
        _f32_contig(b, "bias")
        _need(b.shape == (n,), f"bias {b.shape} does not match rows of {n}")
    rows = x.size // n
    y = dev.empty(x.shape, np.float32)
    dev.launch("norm", "layer_norm_f32", plan.plan_rows(n, rows, dev.limits),
               (x, w, b, y, i32(n), i32(rows), f32(eps)))
    return y


def softmax(dev: Device, scores: Any, scale: float = 1.0, *, nq: int | None = None,
            causal_offset: int | None = None, key_mask: Any | None = None,
            window: int | None = None) -> Any:
    """Softmax over the last axis of (batch, ..., q, keys) scores.

    Query i (= row index mod nq; nq defaults to scores.shape[-2]) sees keys j <=
    causal_offset + i, and with a window only j > causal_offset + i - window; key_mask is
    (batch, keys), 0 hides a key. All are applied on the device from these integers; no
    mask tensor is built.
    """
    _need(window is None or (window > 0 and causal_offset is not None),
          "a window needs a causal offset and at least one key")
    _f32_contig(scores, "scores")
    keys = scores.shape[-1]
    rows = scores.size // keys
    nq = scores.shape[-2] if nq is None else nq
    batch = scores.shape[0]
    if key_mask is not None:
        _f32_contig(key_mask, "key_mask")
        _need(key_mask.shape == (batch, keys), f"key_mask {key_mask.shape} != ({batch}, {keys})")
    y = dev.empty(scores.shape, np.float32)
    dev.launch("softmax", "softmax_f32", plan.plan_rows(keys, rows, dev.limits),
               (scores, y, i32(keys), i32(rows), i32(rows // batch), i32(nq), f32(scale),
                i32(-1 if causal_offset is None else causal_offset), key_mask,
                i32(0 if window is None else window)))
    return y


def rope(dev: Device, x: Any, offset: int, theta: float, *, neox: bool = True,
         seq_axis: int = -2, freq_factors: Any | None = None) -> Any:
    """Rotate head vectors of a contiguous (..., seq, ..., head_dim) array; positions are
    offset + index along seq_axis. freq_factors (head_dim/2,) divides each pair's frequency
    (scaled RoPE); None means all ones."""
    _f32_contig(x, "x")
    d = x.shape[-1]
    _need(d % 2 == 0, f"rope needs an even head_dim, got {d}")
    if freq_factors is not None:
        _f32_contig(freq_factors, "freq_factors")
        _need(freq_factors.shape == (d // 2,),
              f"freq_factors {freq_factors.shape} != ({d // 2},)")
    axis = seq_axis % x.ndim
    _need(axis < x.ndim - 1, "seq_axis must not be the head_dim axis")
    seq = x.shape[axis]
    seq_div = int(np.prod(x.shape[axis + 1:-1], dtype=np.int64))
    pairs = x.size // 2
    y = dev.empty(x.shape, np.float32)
    dev.launch("rope", "rope_f32", plan.plan_elementwise(pairs, dev.limits),
               (x, y, i32(d), i64(pairs), i32(seq), i32(seq_div), i32(offset), f32(theta),
                i32(1 if neox else 0), freq_factors))
    return y


def rope_kv(dev: Device, qkv: Any, k_cache: Any, v_cache: Any, pos: Any, row: Any,
            theta: float, heads: int, kv_heads: int, *, neox: bool = True,
            freq_factors: Any | None = None) -> Any:
    """RoPE fused into the KV-cache write (kv_store.cuh rope_kv_*), for one new token per
    sequence: qkv (batch, (heads + 2 kv_heads) * head_dim) float32, the q/k/v mat-vec's
    output. q and k are rotated at position pos[0]; k and v are written into row row[0] of
    the caches (batch, kv_heads, capacity, head_dim; float32, float16 or bfloat16, see
    :func:`kv_layout`); returns q rotated, (batch, heads, 1, head_dim). pos and row are
    (1,) int32 device buffers (a captured step writes them before each replay; row differs
    from pos only in a sliding layer's ring). One launch for two ropes and two row writes."""
    for a, what in ((pos, "pos"), (row, "row")):
        _need(a.dtype == np.int32 and a.shape == (1,), f"{what} must be a (1,) int32 buffer")
    _f32_contig(qkv, "qkv")
    _, _, (sb, sh, ss) = kv_layout(k_cache, v_cache)
    b, kvh, _, d = k_cache.shape
    _need(kvh == kv_heads and heads % kv_heads == 0 and d % 2 == 0,
          f"cache {k_cache.shape} does not fit {heads} heads over {kv_heads} kv heads")
    _need(qkv.ndim == 2 and qkv.shape == (b, (heads + 2 * kv_heads) * d),
          f"qkv {qkv.shape} is not ({b}, {(heads + 2 * kv_heads) * d})")
    if freq_factors is not None:
        _f32_contig(freq_factors, "freq_factors")
        _need(freq_factors.shape == (d // 2,), f"freq_factors {freq_factors.shape} != ({d // 2},)")
    q = dev.empty((b, heads, 1, d), np.float32)
    dev.launch(*ROPE_KV[np.dtype(k_cache.dtype)], plan.plan_rope_kv(heads, kvh, d, b, dev.limits),
               (qkv, q, k_cache, v_cache, i32(heads), i32(kvh), i32(d), i64(sb), i64(sh),
                i64(ss), pos, row, f32(theta), i32(1 if neox else 0), freq_factors))
    return q


# A bfloat16 KV cache holds BF16 bit patterns, as BF16 weights do. A uint16 cache is always
# bfloat16.
KV_BF16 = BF16
# The attention kernel for each KV cache element type: (module, kernel). The float16 and
# bfloat16 caches (kv_f16.cu, kv_bf16.cu) are widened as read and accumulated in float32.
KV_KERNELS = {np.dtype(np.float32): ("attention", "attn_f32"),
              np.dtype(np.float16): ("kv_f16", "attn_kv_f16"),
              KV_BF16: ("kv_bf16", "attn_kv_bf16")}


# The caches the q/k/v mat-vec writes from its epilogue (mul_mat_vec_q_rope_kv_<type>_<cache>).
QKV_ROPE_KV = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", KV_BF16: "bf16"}


def qkv_rope_kv(dev: Device, w: QuantMatrix, xq: Any, k_cache: Any, v_cache: Any, pos: Any,
                row: Any, theta: float, heads: int, kv_heads: int, *, bias: Any | None = None,
                neox: bool = True, freq_factors: Any | None = None,
                qk_norms: tuple[Any, Any] | None = None, eps: float = 1e-6,
                done: Any | None = None) -> Any:
    """The q/k/v mat-vec of x's q8_1 rows with :func:`rope_kv` in its epilogue (mmv.cu
    mul_mat_vec_q_rope_kv_*): one launch, the results of mul_mat_vec_q8_1(bias=...) then
    rope_kv bit for bit. w is the stacked [q; k; v] weight; the caches float32, float16 or
    bfloat16 (:data:`QKV_ROPE_KV`). qk_norms: (q_norm,
    k_norm), (head_dim,) float32 each: every q and k head RMS-normed (eps) before RoPE, as
    rms_norm over the heads' rows (Qwen3, Gemma 3), within float32 rounding of it (the sum
    of squares in another order); ``done`` then holds batch * (heads + kv_heads) zeroed
    uint32 counters (:func:`tail_counters`; left zeroed), else new ones. Returns q rotated,
    (batch, heads, 1, head_dim)."""
    for a, what in ((pos, "pos"), (row, "row")):
        _need(a.dtype == np.int32 and a.shape == (1,), f"{what} must be a (1,) int32 buffer")
    _need(np.dtype(k_cache.dtype) in QKV_ROPE_KV,
          f"the q/k/v mat-vec writes float32, float16 or bfloat16 caches, not {k_cache.dtype}")
    _, _, (sb, sh, ss) = kv_layout(k_cache, v_cache)
    b, kvh, _, d = k_cache.shape
    _need(kvh == kv_heads and heads % kv_heads == 0 and d % 2 == 0
          and w.rows == (heads + 2 * kv_heads) * d,
          f"weight {w.rows} rows and cache {k_cache.shape} do not fit {heads} heads")
    _need(dp4a_applies(dev, w), f"{w.qtype} weights here have no integer mat-vec")
    stride = q8_1_row_bytes(w.cols)
    _need(xq.dtype == np.uint8 and xq.shape == (b, stride) and xq.flags.c_contiguous
          and dev.address(xq) % 16 == 0, f"xq must be ({b}, {stride}) aligned q8_1 rows")
    _epilogue(w, b, bias, None)
    if freq_factors is not None:
        _f32_contig(freq_factors, "freq_factors")
        _need(freq_factors.shape == (d // 2,), f"freq_factors {freq_factors.shape} != ({d // 2},)")
    launch = plan.plan_mul_mat_vec_q(w.kt, w.cols, w.rows, b, dev.limits, 1)
    qn = kn = stage = None
    if qk_norms is not None:
        qn, kn = qk_norms
        for a, what in ((qn, "q_norm"), (kn, "k_norm")):
            _f32_contig(a, what)
            _need(a.shape == (d,), f"{what} {a.shape} != ({d},)")
        # a block's rows lie in one head: the head's last block norms it (mmv.cu)
        _need(d % launch.block[1] == 0 and d // 2 <= launch.block[1] * 32,
              f"head_dim {d} is not whole blocks of rows, a pair a thread")
        done = _counters(dev, done, b * (heads + kv_heads))
        stage = dev.empty((b, w.rows), np.float32)
    q = dev.empty((b, heads, 1, d), np.float32)
    name = f"mul_mat_vec_q_rope_kv_{w.kt.suffix}_{QKV_ROPE_KV[np.dtype(k_cache.dtype)]}"
    dev.launch("mmv", name, launch,
               (w.data, xq, q, k_cache, v_cache, i32(w.cols), i64(w.row_bytes), i64(stride),
                bias, i32(heads), i32(kvh), i32(d), i64(sb), i64(sh), i64(ss), pos, row,
                f32(theta), i32(1 if neox else 0), freq_factors, qn, kn, f32(eps), stage,
                done if qk_norms is not None else None))
    return q


def tail_counters(dev: Device, n: int) -> Any:
    """n zeroed uint32 counters for the kernels that finish in their grid's last block
    (mmv.cu last_block_of: each leaves its counters zeroed, so one buffer serves every such
    launch of a step, eager or replayed). Allocate outside a captured step."""
    return dev.zeros((n,), np.uint32)


def _counters(dev: Device, done: Any | None, n: int) -> Any:
    if done is None:
        return tail_counters(dev, n)
    _need(done.dtype == np.uint32 and done.ndim == 1 and done.size >= n
          and done.flags.c_contiguous, f"done must hold >= {n} uint32 counters")
    return done


def mul_mat_vec_q8_1_norm_add(dev: Device, w: QuantMatrix, xq: Any, batch: int, norm: Any,
                              eps: float, residual: Any, done: Any | None = None) -> Any:
    """residual + rms_norm(W x, norm, eps) of x's q8_1 rows in one launch (mmv.cu
    mul_mat_vec_q_norm_add_*: Gemma 2/3's norms after attention and MLP): the unfused
    mul_mat_vec_q8_1, rms_norm and add within float32 rounding (the sum of squares in
    another order). ``done``: >= batch zeroed uint32 counters (:func:`tail_counters`)."""
    _need(dp4a_applies(dev, w), f"{w.qtype} weights here have no integer mat-vec")
    stride = q8_1_row_bytes(w.cols)
    _need(xq.dtype == np.uint8 and xq.shape == (batch, stride) and xq.flags.c_contiguous
          and dev.address(xq) % 16 == 0, f"xq must be ({batch}, {stride}) aligned q8_1 rows")
    _epilogue(w, batch, None, residual)
    _need(residual is not None, "the norm's output joins a residual")
    _f32_contig(norm, "norm")
    _need(norm.shape == (w.rows,), f"norm {norm.shape} != ({w.rows},)")
    done = _counters(dev, done, batch)
    y = dev.empty((batch, w.rows), np.float32)
    launch = plan.plan_mul_mat_vec_q(w.kt, w.cols, w.rows, batch, dev.limits, 1)
    dev.launch("mmv", f"mul_mat_vec_q_norm_add_{w.kt.suffix}", launch,
               (w.data, xq, y, i32(w.cols), i32(w.rows), i64(w.row_bytes), i64(stride), norm,
                f32(eps), residual, done))
    return y


# RoPE fused into the KV-cache write, per cache element type: (module, kernel).
ROPE_KV = {np.dtype(np.float32): ("step", "rope_kv_f32"),
           np.dtype(np.float16): ("kv_f16", "rope_kv_f16"),
           KV_BF16: ("kv_bf16", "rope_kv_bf16")}


def to_bf16_bits(xp: Any, x: Any) -> Any:
    """float32 -> bfloat16 bit patterns (uint16) on xp's arrays: rounded to nearest even,
    overflow to inf, NaN to 0x7FC0; kv_bf16.cu's store_f32 bit for bit."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    r = (u + xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1))) >> xp.uint32(16)
    return xp.where((u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000), xp.uint32(0x7FC0),
                    r).astype(xp.uint16)


def kv_as_f32(xp: Any, a: Any) -> Any:
    """A K/V cache view as float32 (exact: bfloat16 bits shifted up, half widened)."""
    if a.dtype == KV_BF16:
        return (a.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)
    return a.astype(xp.float32, copy=False)


def kv_layout(k: Any, v: Any) -> tuple[str, str, tuple[int, int, int]]:
    """(module, kernel, strides in elements over batch/head/position) of a K/V cache view:
    float32, float16 or bfloat16 (KV_BF16), contiguous head_dim, the same shape and layout
    for k and v."""
    _need(k.shape == v.shape and k.strides == v.strides and k.dtype == v.dtype,
          "k and v must share shape, dtype and layout")
    _need(k.ndim == 4, f"k/v must be (batch, kv_heads, n_kv, head_dim), got {k.shape}")
    _need(k.dtype in KV_KERNELS and k.strides[-1] == k.itemsize,
          f"k/v must be float32, float16 or bfloat16 with contiguous head_dim, got {k.dtype}")
    _need(all(s % k.itemsize == 0 for s in k.strides), "k/v strides are not whole elements")
    module, kernel = KV_KERNELS[np.dtype(k.dtype)]
    return module, kernel, tuple(s // k.itemsize for s in k.strides[:3])


def attention(dev: Device, q: Any, k: Any, v: Any, scale: float, *,
              causal_offset: int | None = None, key_mask: Any | None = None,
              window: int | None = None, softcap: float | None = None,
              q8_1: bool = False) -> Any:
    """Masked softmax(q k^T * scale) v without a score matrix (see attention.cu).

    q (batch, heads, t, D) contiguous; k, v (batch, kv_heads, n_kv, D) views of the cache,
    float32, float16 or bfloat16 (see :func:`kv_layout`);
    key_mask (batch, n_kv), 0 hides a key. Query i sees keys j <= causal_offset + i (all
    keys when None) and, with a window, only j > causal_offset + i - window. Returns
    (batch, heads, t, D). Scratch: only split-K partials, plan.AttentionPlan.scratch_bytes,
    which grows with t (rows) and never with t * n_kv. With q8_1 (decode: t = 1, D % 32
    == 0) the output is the o_proj mat-vec's q8_1 rows instead, (batch,
    q8_1_row_bytes(heads * D)) uint8: the bytes of quantize_q8_1 of the float output,
    written by the attention kernel (or its combine), not by a launch of its own.
    """
    _f32_contig(q, "q")
    _need(window is None or (window > 0 and causal_offset is not None),
          "a window needs a causal offset and at least one key")
    _need(softcap is None or softcap > 0, "softcap must be positive")
    b, h, t, d = q.shape
    module, kernel, (sb, sh, ss) = kv_layout(k, v)
    kb, kvh, n_kv, kd = k.shape
    _need(kb == b and kd == d and h % kvh == 0, f"q {q.shape} does not fit k {k.shape}")
    if key_mask is not None:
        _need(key_mask.dtype == np.float32 and key_mask.shape == (b, n_kv)
              and key_mask.strides[-1] == 4, "key_mask must be float32 (batch, n_kv)")
    rows = (h // kvh) * t
    kernel, p = attention_plan(dev, kernel, k, v, rows, n_kv, b * kvh)
    xq = attention_q8_1(dev, q) if q8_1 else None
    out = None if q8_1 else dev.empty(q.shape, np.float32)
    part, part_ml = attention_scratch(dev, p, b * kvh * rows, d)
    dev.launch(module, kernel, p.main,
               (q, k, v, out, part, part_ml, i32(d), i32(rows), i32(t), i32(n_kv), i32(kvh),
                i64(sb), i64(sh), i64(ss), f32(scale), f32(softcap or 0.0),
                i32(-1 if causal_offset is None else causal_offset), i32(window or 0),
                key_mask, i64(0 if key_mask is None else key_mask.strides[0] // 4),
                xq, i64(0 if xq is None else xq.shape[1])))
    attention_combine(dev, p, part, part_ml, out, rows, d, kvh, xq)
    return out if xq is None else xq


def attention_q8_1(dev: Device, q: Any) -> Any:
    """The q8_1 output rows of a decode attention over q (batch, heads, 1, D), D % 32 == 0
    (attn_q8_1_block in attention.cuh)."""
    b, h, t, d = q.shape
    _need(t == 1 and d % table.Q8_1_QK == 0,
          f"attention writes q8_1 rows for one query of whole 32-value blocks, got {q.shape}")
    return dev.empty((b, q8_1_row_bytes(h * d)), np.uint8)


def attention_plan(dev: Device, kernel: str, k: Any, v: Any, rows: int, n_kv: int,
                   kv_blocks: int) -> tuple[str, plan.AttentionPlan]:
    """(kernel, plan) for ``rows`` query rows per kv head over ``n_kv`` keys: the decode
    kernel (attn_vec_*, see attention.cuh) where it applies -- at most ATTN_MAX_ROWS rows, a
    head_dim it has a width E for, K/V rows starting on E-element boundaries (its vector
    loads) -- else the tiled kernel ``kernel`` (prefill)."""
    d = k.shape[-1]
    e = plan.attn_vec_width(d)
    if e is not None and rows <= table.ATTN_MAX_ROWS:
        align = min(16, e * k.itemsize)
        if all(dev.address(a) % align == 0 for a in (k, v)) and all(
                s % align == 0 for s in k.strides[:3]):
            return (f"{kernel.replace('attn_', 'attn_vec_', 1)}_e{e}",
                    plan.plan_attention_vec(d, rows, n_kv, kv_blocks, dev.limits))
    return kernel, plan.plan_attention(d, rows, n_kv, kv_blocks, dev.limits)


def attention_scratch(dev: Device, p: plan.AttentionPlan, rows: int, d: int
                      ) -> tuple[Any, Any]:
    """The split-K partials (accumulators, then max and sum per row), or (None, None)."""
    if p.combine is None:
        return None, None
    return (dev.empty((p.splits * rows * d,), np.float32),
            dev.empty((p.splits * rows * 2,), np.float32))


def attention_combine(dev: Device, p: plan.AttentionPlan, part: Any, part_ml: Any, out: Any,
                      rows: int, d: int, kv_heads: int = 1, xq: Any | None = None) -> None:
    """Merge the splits into out, or (xq, from :func:`attention_q8_1`) into q8_1 rows."""
    if p.combine is not None:
        dev.launch("attention", "attn_combine_f32", p.combine,
                   (part, part_ml, out, i32(d), i32(rows), i32(p.splits), i32(kv_heads), xq,
                    i64(0 if xq is None else xq.shape[1])))


@dataclass
class DecoderLayer:
    """One decoder layer's weights and switches for :func:`decode_layer`: the Llama block of
    inference/models/llama.py (Llama, Mistral, Qwen2, Phi-3, Gemma 1; with q_norm/k_norm
    Qwen3; with post_attn_norm/post_mlp_norm and a softcap Gemma 2, all three Gemma 3).
    qkv and gate_up are stacked ([q; k; v] and [gate; up] rows), as Weights.linears stacks
    them. ``done``: tail_counters for the kernels that finish in their last block (>=
    batch * (heads + kv_heads)), allocated with the layer: None allocates them per call."""

    attn_norm: Any  # (hidden,) float32
    qkv: QuantMatrix
    o: QuantMatrix
    mlp_norm: Any
    gate_up: QuantMatrix
    down: QuantMatrix
    heads: int
    kv_heads: int
    eps: float
    theta: float
    scale: float  # attention's score scale
    qkv_bias: Any | None = None  # ((heads + 2 kv_heads) * head_dim,) float32
    act: str = "silu_mul"  # a key of GATED_Q8_1
    neox: bool = True
    freq_factors: Any | None = None
    softcap: float | None = None
    window: int | None = None  # a sliding layer: attention sees the last ``window`` keys
    q_norm: Any | None = None  # (head_dim,) float32, with k_norm
    k_norm: Any | None = None
    post_attn_norm: Any | None = None  # (hidden,) float32, with post_mlp_norm
    post_mlp_norm: Any | None = None
    done: Any | None = None

    def shape(self, attention_splits: int = 1) -> plan.LayerShape:
        """The switches plan.decode_layer_kernels counts launches by."""
        return plan.LayerShape(qk_norm=self.q_norm is not None,
                               sandwich_norms=self.post_attn_norm is not None,
                               gelu=self.act != "silu_mul", attention_splits=attention_splits)


def decode_layer(dev: Device, layer: DecoderLayer, x: Any, k_cache: Any, v_cache: Any,
                 pos: Any, position: int, attend: Callable[[Any, Any, Any], Any] | None = None,
                 row: Any | None = None) -> Any:
    """The fused decode step of one layer for one new token of each of x's rows (batch,
    hidden), RoPE at the position held on the device in pos, (1,) int32: the launches of
    plan.decode_layer_kernels, in that order. K/V go to cache row ``position`` (held in
    ``row``, default pos: a sliding layer's row is its position past the layer's start) of
    the caches (batch, kv_heads, capacity, head_dim), and attention reads rows
    0..position (the last ``layer.window`` of them on a sliding layer). Returns the layer's
    output, (batch, hidden). Needs q8_1 mat-vecs (:func:`dp4a_applies`) for every weight
    and widths in whole q8_1 blocks; the caches float32, float16 or bfloat16.
    ``attend(q, k_cache, v_cache)``, if given, replaces the attention launch and returns
    o_proj's q8_1 rows (a captured step's, which reads the row from the device:
    step.attention with q8_1=True)."""
    b = x.shape[0]
    row = pos if row is None else row
    xq = rms_norm_q8_1(dev, x, layer.attn_norm, layer.eps)
    rope = dict(neox=layer.neox, freq_factors=layer.freq_factors)
    qk = None if layer.q_norm is None else (layer.q_norm, layer.k_norm)
    done = layer.done
    if done is None and (qk is not None or layer.post_mlp_norm is not None):
        done = tail_counters(dev, b * (layer.heads + layer.kv_heads))
    q = qkv_rope_kv(dev, layer.qkv, xq, k_cache, v_cache, pos, row, layer.theta, layer.heads,
                    layer.kv_heads, bias=layer.qkv_bias, qk_norms=qk, eps=layer.eps, done=done,
                    **rope)
    if attend is not None:
        aq = attend(q, k_cache, v_cache)
    else:
        keys = (slice(None), slice(None), slice(0, position + 1))
        window = layer.window if layer.window is not None and position + 1 > layer.window \
            else None
        aq = attention(dev, q, k_cache[keys], v_cache[keys], layer.scale,
                       causal_offset=position, window=window, softcap=layer.softcap,
                       q8_1=True)
    if layer.post_attn_norm is None:
        h = mul_mat_vec_q8_1(dev, layer.o, aq, b, residual=x)
        hq = rms_norm_q8_1(dev, h, layer.mlp_norm, layer.eps)
    else:
        h, hq = rms_norm_add_rms_norm_q8_1(dev, mul_mat_vec_q8_1(dev, layer.o, aq, b), x,
                                           layer.post_attn_norm, layer.mlp_norm, layer.eps)
    gu = mul_mat_vec_q8_1(dev, layer.gate_up, hq, b)
    m = gated_q8_1(dev, layer.act, gu)
    if layer.post_mlp_norm is None:
        return mul_mat_vec_q8_1(dev, layer.down, m, b, residual=h)
    return mul_mat_vec_q8_1_norm_add(dev, layer.down, m, b, layer.post_mlp_norm, layer.eps, h,
                                     done)


def _gated(dev: Device, kernel: str, gate: Any, up: Any) -> Any:
    """act(gate) * up elementwise, ``kernel`` one of unary.cu's gated kernels."""
    _f32_contig(gate, "gate")
    _f32_contig(up, "up")
    _need(gate.shape == up.shape, f"gate {gate.shape} != up {up.shape}")
    y = dev.empty(gate.shape, np.float32)
    dev.launch("unary", kernel, plan.plan_elementwise(gate.size, dev.limits),
               (gate, up, y, i64(gate.size)))
    return y


def silu_mul(dev: Device, gate: Any, up: Any) -> Any:
    return _gated(dev, "silu_mul_f32", gate, up)


def gelu_tanh_mul(dev: Device, gate: Any, up: Any) -> Any:
    return _gated(dev, "gelu_tanh_mul_f32", gate, up)


# The gated activations that end in q8_1 rows (unary.cu), by the float op's name.
GATED_Q8_1 = {"silu_mul": "silu_mul_q8_1", "gelu_tanh_mul": "gelu_tanh_mul_q8_1"}


def gated_q8_1(dev: Device, act: str, gate_up: Any) -> Any:
    """act(gate) * up (act: a key of GATED_Q8_1) of a gate/up mat-vec's output (batch, 2n),
    gate the first n columns and up the last (n % 32 == 0), as the q8_1 rows (batch,
    q8_1_row_bytes(n)) the down projection reads: quantize_q8_1 of the float op's output,
    bit for bit, in one launch."""
    _need(act in GATED_Q8_1, f"no gated activation {act!r} ends in q8_1")
    _f32_contig(gate_up, "gate_up")
    _need(gate_up.ndim == 2 and gate_up.shape[1] % (2 * table.Q8_1_QK) == 0,
          f"gate_up must be (batch, 2n) with n % 32 == 0, got {gate_up.shape}")
    batch, n = gate_up.shape[0], gate_up.shape[1] // 2
    stride = q8_1_row_bytes(n)
    xq = dev.empty((batch, stride), np.uint8)
    flat = gate_up.reshape(-1)
    dev.launch("unary", GATED_Q8_1[act], plan.plan_quantize_q8_1(n, batch, dev.limits),
               (flat, flat[n:], xq, i32(n), i64(2 * n), i64(stride)))
    return xq


def gelu(dev: Device, x: Any) -> Any:
    _f32_contig(x, "x")
    y = dev.empty(x.shape, np.float32)
    dev.launch("unary", "gelu_f32", plan.plan_elementwise(x.size, dev.limits), (x, y, i64(x.size)))
    return y


def argmax(dev: Device, x: Any, checked: bool = False) -> Any:
    """(rows, cols) float32 -> (rows,) int32 on the device: each row's first maximum, NaN
    skipped; ``checked``: -1 for a row holding a NaN or an infinity (the sampler's id for
    logits that are not finite, without a separate check)."""
    _f32_contig(x, "x")
    cols = x.shape[-1]
    rows = x.size // cols
    out = dev.empty((rows,), np.int32)
    dev.launch("argmax", "argmax_f32", plan.plan_argmax(cols, rows, dev.limits),
               (x, out, i32(cols), i32(checked)))
    return out


def self_test(dev: Device, x: Any) -> Any:
    """(n <= 32,) float32 -> float(half(x)) * 2 + index + 32: see selftest.cu."""
    _f32_contig(x, "x")
    _need(x.ndim == 1, "the self-test takes a vector")
    y = dev.empty(x.shape, np.float32)
    dev.launch("selftest", "selftest_f16", plan.plan_self_test(x.shape[0], dev.limits),
               (x, y, i32(x.shape[0])))
    return y


def check_device(dev: Device) -> str | None:
    """None if the self-test kernel (selftest.cu) compiles, launches and returns the right
    numbers on `dev`; else one sentence why not. Never raises."""
    x = np.linspace(-3.0, 1000.0, 32, dtype=np.float32)  # 1000.x rounds when made half
    try:
        got = dev.to_host(self_test(dev, dev.to_device(x, "self-test")), "self-test")
    except Exception as e:
        cause = e.__cause__ if isinstance(e, KernelLoadError) and e.__cause__ else e
        return f"cuda: the self-test kernel does not compile or run ({first_line(cause)})"
    want = x.astype(np.float16).astype(np.float32) * 2 + np.arange(32, dtype=np.float32) + 32
    # float32 arithmetic of exactly representable values: equal up to one rounding.
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=0):
        return "cuda: the self-test kernel returned wrong numbers (a driver/toolkit mismatch?)"
    return None
