"""Checked entry points of the kernels a captured decode step uses (step.cu, and the
``_pos`` variants of rope.cu and attention.cu, and attention.cu's ``_slot`` ones).

A CUDA graph replays its launches with the arguments they were captured with, so nothing a
step changes may be a kernel argument: the input id and the position live in device
buffers (``ids``, ``pos``), written by :func:`step_inputs` before each replay, and the
kernels below read them there. Each function serves one new token (t = 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.cuda import plan
from kernels.cuda.device import Device
from kernels.cuda.ops import (
    KV_BF16,
    _f32_contig,
    _need,
    attention_combine,
    attention_plan,
    attention_q8_1,
    attention_scratch,
    f32,
    i32,
    i64,
    kv_layout,
)

# The row write of a captured step, per KV cache element type (ops.KV_KERNELS).
KV_STORE = {np.dtype(np.float32): ("step", "kv_store_f32"),
            np.dtype(np.float16): ("kv_f16", "kv_store_f16"),
            KV_BF16: ("kv_bf16", "kv_store_bf16")}


def _pos_buffer(pos: Any) -> None:
    _need(pos.dtype == np.int32 and pos.shape == (1,), "pos must be a (1,) int32 device array")


def step_inputs(dev: Device, tok: Any, ids: Any, pos: Any, position: int) -> None:
    """ids[0] = tok[0] on the device (the sampled id never visits the host) and
    pos[0] = position (a kernel argument, not a copy)."""
    _pos_buffer(pos)
    _need(tok.dtype == np.int32 and ids.dtype == np.int32 and tok.size == ids.size == 1,
          "tok and ids must hold one int32 each")
    dev.launch("step", "step_inputs_i32", plan.plan_step_inputs(dev.limits),
               (tok, ids, pos, i32(position)))


def step_ids(dev: Device, tok: Any, ids: Any) -> None:
    """ids[r] = the int32 at the device address tok[r], for every row (a batched step's
    first launch: each row's input is the token its sequence sampled). tok: (rows,) int64
    device memory; ids: (rows, 1) int32."""
    rows = ids.shape[0]
    _need(tok.dtype == np.int64 and tok.shape == (rows,) and ids.dtype == np.int32
          and ids.size == rows, "tok must be (rows,) int64 addresses and ids (rows, 1) int32")
    dev.launch("step", "step_ids_i32", plan.plan_step_inputs(dev.limits), (tok, ids, i32(rows)))


def _slot(slot: Any, n: int) -> None:
    _need(slot is None or (slot.dtype == np.int64 and slot.shape == (n,)),
          f"a KV slot is ({n},) int64 device memory")


def add(dev: Device, a: Any, b: Any) -> Any:
    """a + b, float32: b of a's shape (the residual adds) or of its last axis (a bias on
    every row)."""
    _f32_contig(a, "a")
    _f32_contig(b, "b")
    _need(a.shape == b.shape or (b.ndim == 1 and a.shape[-1:] == b.shape),
          f"add of {a.shape} and {b.shape}")
    y = dev.empty(a.shape, np.float32)
    dev.launch("step", "add_f32", plan.plan_elementwise(a.size, dev.limits),
               (a, b, y, i64(a.size), i64(b.size)))
    return y


def _map(dev: Device, kernel: str, x: Any, c: float) -> Any:
    _f32_contig(x, "x")
    y = dev.empty(x.shape, np.float32)
    dev.launch("step", kernel, plan.plan_elementwise(x.size, dev.limits),
               (x, y, f32(c), i64(x.size)))
    return y


def scale(dev: Device, x: Any, s: float) -> Any:
    """x * s, float32 (s rounded to float32, as NumPy's float32 * Python float)."""
    return _map(dev, "scale_f32", x, s)


def softcap(dev: Device, x: Any, cap: float) -> Any:
    """cap * tanh(x / cap), float32."""
    _need(cap > 0, "softcap must be positive")
    return _map(dev, "softcap_f32", x, cap)


def kv_store(dev: Device, src: Any, dst: Any, pos: Any, slot: Any | None = None) -> Any:
    """Write src (batch, heads, 1, head_dim) float32 into row pos[0] of the cache dst (batch,
    heads, capacity, head_dim; float32 or float16, any strides, contiguous head_dim; a half
    cache stores src rounded to nearest even). Returns dst.

    slot: (2,) int64 device memory holding a cache's address and stride over heads (in
    elements), read at each launch in place of dst's (a batched graph's rows: the caches
    of that step's sequences, of dst's type, batch 1 and strides but over heads); dst is
    then only the layout, and the launch holds no reference to it."""
    _pos_buffer(pos)
    _slot(slot, 2)
    _need(src.dtype == np.float32 and src.ndim == 4 and src.shape[2] == 1,
          f"kv_store writes one float32 row per head, got {src.dtype} {src.shape}")
    _, _, (sb, sh, ss) = kv_layout(dst, dst)
    _need(dst.shape[:2] == src.shape[:2] and dst.shape[3] == src.shape[3],
          f"cache {dst.shape} does not fit rows {src.shape}")
    _need(src.flags.c_contiguous, "kv_store needs contiguous rows")
    b, h, _, d = src.shape
    module, kernel = KV_STORE[np.dtype(dst.dtype)]
    dev.launch(module, kernel, plan.plan_elementwise(src.size, dev.limits),
               (src, dst if slot is None else None, i32(h), i32(d), i64(sb), i64(sh), i64(ss),
                pos, i64(src.size), slot))
    return dst


def rope(dev: Device, x: Any, pos: Any, theta: float, *, neox: bool = True,
         freq_factors: Any | None = None) -> Any:
    """Rotate every head vector of a contiguous (..., head_dim) array of one token by
    position pos[0] (see rope.cu)."""
    _pos_buffer(pos)
    _f32_contig(x, "x")
    d = x.shape[-1]
    _need(d % 2 == 0, f"rope needs an even head_dim, got {d}")
    if freq_factors is not None:
        _f32_contig(freq_factors, "freq_factors")
        _need(freq_factors.shape == (d // 2,), f"freq_factors {freq_factors.shape} != ({d // 2},)")
    pairs = x.size // 2
    y = dev.empty(x.shape, np.float32)
    dev.launch("rope", "rope_f32_pos", plan.plan_elementwise(pairs, dev.limits),
               (x, y, i32(d), i64(pairs), i32(1), i32(1), pos, f32(theta),
                i32(1 if neox else 0), freq_factors))
    return y


def attention(dev: Device, q: Any, k: Any, v: Any, scale: float, pos: Any, max_kv: int, *,
              window: int | None = None, softcap: float | None = None,
              out: Any | None = None, q8_1: bool = False, slot: Any | None = None) -> Any:
    """ops.attention for one new token at row pos[0] of the cache k, v (batch, kv_heads,
    capacity, head_dim), over its rows 0..pos[0] (the last ``window`` of them with a
    window); the grid is planned for ``max_kv`` keys, the most any replay of the graph may
    see. ``out``: a contiguous float32 buffer of q's shape to write (a row of a batched
    step's output), else a new one. q8_1: return o_proj's q8_1 rows instead
    (ops.attention's q8_1, the fused decode layer's). slot: (4,) int64 device memory (K's
    address, stride over heads, V's address, the same stride), read at each launch in place
    of k's and v's (a batched graph's rows, as :func:`kv_store`); k and v then give the
    layout (and, for the decode kernel's vector loads, an alignment every slot keeps:
    16 bytes)."""
    _pos_buffer(pos)
    _slot(slot, 4)
    _f32_contig(q, "q")
    b, h, t, d = q.shape
    _need(t == 1, f"a captured step attends one token, got {t}")
    module, kernel, (sb, sh, ss) = kv_layout(k, v)
    kb, kvh, _, kd = k.shape
    _need(kb == b and kd == d and h % kvh == 0, f"q {q.shape} does not fit k {k.shape}")
    rows = h // kvh
    _need(window is None or window > 0, "a window needs at least one key")
    kernel, p = attention_plan(dev, kernel, k, v, rows, max_kv, b * kvh)
    xq = attention_q8_1(dev, q) if q8_1 else None
    if q8_1:
        _need(out is None, "attention writes either q8_1 rows or out")
    elif out is None:
        out = dev.empty(q.shape, np.float32)
    else:
        _f32_contig(out, "out")
        _need(out.shape == q.shape, f"out {out.shape} != q {q.shape}")
    part, part_ml = attention_scratch(dev, p, b * kvh * rows, d)
    tail = (f32(scale), f32(softcap or 0.0), i32(window or 0), xq,
            i64(0 if xq is None else xq.shape[1]))
    if slot is None:
        dev.launch(module, f"{kernel}_pos", p.main,
                   (q, k, v, out, part, part_ml, i32(d), i32(rows), i32(1), pos, i32(kvh),
                    i64(sb), i64(sh), i64(ss), *tail))
    else:  # the cache is the slot's (attention.cuh, name_slot)
        dev.launch(module, f"{kernel}_slot", p.main,
                   (q, slot, out, part, part_ml, i32(d), i32(rows), i32(1), pos, i32(kvh),
                    i64(sb), i64(ss), *tail))
    attention_combine(dev, p, part, part_ml, out, rows, d, kvh, xq)
    return out if xq is None else xq
