"""CUDA backend: our kernels (kernels/cuda) through a thin device interface.

On a GPU the device is CuPy: activations and the KV cache are CuPy arrays, dense GEMMs go to
cuBLAS through ``cupy.matmul``, everything else is a kernel of kernels/cuda. Under the
emulator (tests) the same code runs with NumPy buffers and emulated launches.

Inside the token loop nothing crosses the host/device boundary but the sampled id: masks
are computed from positions in the kernels, the cache lives on the device, sampling runs
on the device, and the next step's input id is the device copy of the sampled one. A
generation samples through :class:`CudaSampler` (the engine's lazy-token protocol, as MLX):
the host reads token t only after step t+1 is queued, so host and GPU time overlap.

Decode steps are captured as CUDA graphs and replayed (:class:`CudaSteps`), for every
decoder family (q/k/v biases, soft-caps and sliding windows are kernel arguments or read
from device memory) and for the server's batched steps (one graph per row count, whichever
sequences fill the rows: their KV buffers are read through slots in device memory); the
server reads each sequence's token one step behind (:meth:`CudaBackend.token_sampler`).
One sequence's decode step runs each decoder layer as ops.decode_layer's 8 launches
(:meth:`CudaBackend.decode_layer`).

Kernel compile progress, for an app: the first run on a machine compiles every kernel
module with NVRTC (tens of seconds on a few cores; later runs read CuPy's on-disk cache).
Pass ``compile_progress=fn`` to ``inference.load_model`` (the one hook; the CLI and the app
use it): ``fn(done, total, module)`` is called on the loading thread,
first ``(modules already loaded, total, "")``, then once per module as it is ready; show
"compiling {done} of {total}" while ``done < total``. A GUI worker emits a signal from
``fn`` (it runs on the worker's thread, never the GUI's).
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.backends.base import OPS, Backend, EagerSteps, TokenSampler, host_rss
from inference.errors import BackendUnavailableError, InvalidInputError
from inference.events import MemorySample
from inference.formats.quants import dequantize, unpack_mlx
from inference.formats.tensor import TensorData
from inference.kv_cache import BatchedCaches, KVCache
from inference.sampling import SamplingParams, sample_on_device
from kernels.cuda import ops, plan, step
from kernels.cuda.device import (
    CupyDevice,
    Device,
    Graph,
    PendingRead,
    cuda_unavailable_reason,
)
from kernels.cuda.ops import QuantMatrix, check_device
from kernels.cuda.table import ATTN_MAX_HEAD_DIM, TYPES
from kernels.errors import KernelLoadError

# Up to this many rows of x, linear() runs the quantized mat-vec instead of dequantizing to
# float32 for a GEMM (read quantized, write and read float32: about 2.1 passes of float32
# weight). Every mat-vec (integer, float and 16-bit) reads the weight once per tile of up
# to 8 rows (plan.mmv_tile), so a batched decode step of up to 8 sequences reads each
# weight once; read once per row instead, 8 passes of a 4-bit weight (1/8 of its float32
# size) would cost about what the dequantize route does.
MMV_MAX_ROWS = 8

CompileProgress = Callable[[int, int, str], None]  # (modules ready, modules, module or "")

_KERNEL_TYPES = set(TYPES)  # F32, F16, BF16 and the GGML block types: kept as they are

# The KV cache's element type unless CudaBackend(kv_dtype=...) says otherwise. Half: it
# halves the cache's memory and the bytes decode attention reads, and on SmolLM2-135M
# (all 30 layers, emulator) moved the logits by 0.10% of the largest against the float32
# cache, with top-1 and 24 greedy tokens equal (docs/cuda.md, "A float16 KV cache").
# float32 keeps the NumPy reference's exact parity; "bfloat16" (a mode: float32's range,
# a quarter of half's precision) is stored as uint16 bit patterns (ops.KV_BF16).
KV_DTYPE = np.float16

# Prefill GEMM input types (CudaBackend(prefill_dtype=...)): float32 (the default: NumPy's
# parity), float16 and bfloat16 (cublasGemmEx, float32 sums; docs/cuda.md states parity).
PREFILL_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), ops.BF16)


def _q4_1_halves(t: TensorData) -> tuple[np.ndarray, np.ndarray] | None:
    """An MLX weight's scales and biases as float16, one per 32 weights, where Q4_1 holds
    it exactly: 4-bit codes, groups of a multiple of 32, and every scale and bias (MLX's
    float16 or bfloat16) equal to its float16 rounding. Else None."""
    x = t.extra
    if t.qtype != "MLX" or int(x["bits"]) != 4 or int(x["group_size"]) % 32:
        return None
    per = int(x["group_size"]) // 32
    out = []
    for key in ("scales", "biases"):
        v = np.asarray(x[key], np.float32)
        h = v.astype(np.float16)
        if not np.array_equal(h.astype(np.float32), v):
            return None
        out.append(np.repeat(h, per, axis=-1))
    return out[0], out[1]


def mlx_as_q4_1(t: TensorData) -> np.ndarray | None:
    """An MLX 4-bit weight as Q4_1 blocks, (rows, cols/32 * 20) bytes, or None where Q4_1
    cannot hold it exactly (:func:`_q4_1_halves`). Both are ``scale * code + bias`` over
    4-bit codes; a group of 64 or 128 becomes 2 or 4 blocks sharing its scale and bias."""
    halves = _q4_1_halves(t)
    if halves is None or len(t.shape) != 2:
        return None
    rows, cols = t.shape
    codes = unpack_mlx(t.data, 4).reshape(rows, cols // 32, 32)
    blocks = np.empty((rows, cols // 32, 20), np.uint8)
    for at, h in zip((0, 2), halves, strict=True):
        blocks[..., at:at + 2] = h.reshape(rows, -1, 1).view(np.uint8)
    blocks[..., 4:] = codes[..., :16] | (codes[..., 16:] << 4)  # Q4_1's nibble order
    return blocks.reshape(rows, -1)


class _StridedRows(QuantMatrix):
    """Float32 rows ``stride`` bytes apart (a block of columns of a wider array) as a
    matrix the F32 row copy (ops.dequantize) reads: it makes them contiguous."""

    def __init__(self, data: Any, rows: int, cols: int, stride: int) -> None:
        super().__init__(data, "F32", rows, cols)
        self.stride = stride

    @property
    def row_bytes(self) -> int:
        return self.stride


class GraphUnsupported(Exception):
    """A decode step being captured called an op a graph cannot hold here (a CuPy operator
    rather than one of our kernels, or a shape that changes per step): it runs eagerly."""


@dataclass
class _Capture:
    """While a decode step is captured: its sequences (``caches``, one per batch row) and
    the most keys any replay attends to (attention's grid is planned for it).

    ``positions[(row, shift)]`` is a (1,) int32 device buffer holding row's position minus
    ``shift`` (0 for RoPE and full layers; a sliding-window layer's ``KVCache.start``, its
    row 0's position, for its KV write and attention), written before each replay. ``pos``,
    ``kv_pos`` and ``out`` are what the op being recorded reads: the rotation's position
    buffer, the KV row buffer, and the batched step's output row attention writes."""

    caches: list[KVCache]
    max_kv: int
    positions: dict[tuple[int, int], Any] = field(default_factory=dict)
    pos: Any = None
    kv_pos: Any = None
    out: Any = None
    # A batched step's table (rows read their caches through KV slots, see _Slots), and
    # the cache and layer whose slot ``slot`` is, while attention's ops are recorded.
    slots: _Slots | None = None
    slot: Any = None
    cache: Any = None
    layer: int = 0

    def at(self, dev: Device, row: int, shift: int) -> Any:
        buf = self.positions.get((row, shift))
        if buf is None:
            buf = self.positions[(row, shift)] = dev.empty((1,), np.int32)
        return buf


class _Slots:
    """What a batched step's graph reads that changes between replays, in one int64 device
    table written by one copy before each replay (:meth:`write`): row ``r``'s input token's
    address (``tok[r]``, read by step_ids_i32 inside the graph), then per row its position,
    its sliding layers' KV rows (the position minus the layer's start; int32 in the low
    half of an entry) and per layer its KV slot (K's address, K's stride over heads, V's
    address, V's stride). A change in which sequences fill the rows, a cache grown into new
    buffers or a slid window is a new table, not a new graph."""

    SLOT = 4  # int64 per layer: K address, stride_h, V address, stride_h

    def __init__(self, dev: Device, rows: int, windows: Sequence[int | None]) -> None:
        self.rows, self.layers = rows, len(windows)
        self.sliding = {layer: 1 + j for j, layer in
                        enumerate(i for i, w in enumerate(windows) if w is not None)}
        self.head = 1 + len(self.sliding)  # position and sliding rows, before the slots
        self.per_row = self.head + self.SLOT * self.layers
        n = rows * (1 + self.per_row)
        self.host = np.zeros(n, np.int64)
        # Every row's position and sliding rows: a replay moves each on by one.
        self.counters = np.concatenate([np.arange(self._base(r), self._base(r) + self.head)
                                        for r in range(rows)])
        self.table = dev.zeros((n,), np.int64)
        self.tok = self.table[:rows]
        self._i32 = self.table.view(np.int32)

    def _base(self, row: int) -> int:
        return self.rows + row * self.per_row

    def _int(self, entry: int) -> Any:
        return self._i32[2 * entry:2 * entry + 1]  # the low half (little-endian)

    def read(self, row: int, layer: int) -> tuple[Any, Any, Any]:
        """(position, KV row, KV slot) buffers that row's kernels of ``layer`` read."""
        b = self._base(row)
        kv = b + self.sliding.get(layer, 0)
        at = b + self.head + self.SLOT * layer
        return self._int(b), self._int(kv), self.table[at:at + self.SLOT]

    def write(self, dev: Device, toks: list[Any], caches: list[KVCache],
              blocks: list[np.ndarray] | None) -> None:
        """The table for this step: each row's token, position, sliding rows and slots
        (``blocks``: a cache's SLOT * layers entries, :meth:`CudaSteps._slots_of`), or,
        with ``blocks`` None, the last table's rows one replay on (the same caches, moved
        only by that replay: the slots stay, the positions and sliding rows grow by one)."""
        h = self.host
        h[:self.rows] = [dev.address(tok) for tok in toks]
        if blocks is None:
            h[self.counters] += 1
        else:
            for r, (c, block) in enumerate(zip(caches, blocks, strict=True)):
                b = self._base(r)
                h[b] = c.offset
                for layer, j in self.sliding.items():
                    h[b + j] = c.offset - c.start[layer]
                h[b + self.head:b + self.per_row] = block
        dev.write(self.table, h, "step inputs")


class CudaBackend(Backend):
    name = "cuda"
    # Mat-vecs of Q4_0/Q4_1/Q5_x/Q8_0 and K-quant weights quantize x to q8_1 and use
    # integer dot products (__dp4a, sm_61+), the path that reaches memory bandwidth on every
    # such GPU (kernels/cuda/mmv.cu); x is then rounded to 8 bits per 32 values, as
    # llama.cpp does. False: the float kernels, equal to NumPy up to float32 rounding.
    q8_1_activations = True

    # A captured decode step serves positions up to a bucket of keys: a power of two, at
    # least this many (attention's split-K grid is planned for the bucket, and a replay past
    # it needs a new capture). Smaller buckets mean more captures and fewer idle splits.
    graph_min_keys = 256

    def __init__(self, device: Device | None = None, prefill_dtype: Any = np.float32,
                 graphs: bool = True, kv_dtype: Any = KV_DTYPE,
                 compile_progress: CompileProgress | None = None):
        """prefill_dtype: the type of the prefill GEMMs' inputs. float32 (default) matches the
        NumPy reference to float32 rounding; float16 or "bfloat16" round the weights (into a
        scratch reused by every weight, unless already of that type) and the activations to
        16 bits and run cublasGemmEx with float32 products and sums (tensor cores; half the
        weight bytes; parity per mode in docs/cuda.md). graphs: capture each decode step once
        per bucket of keys and replay it (where the device supports graphs). kv_dtype: the KV
        cache's element type, float32, float16 or "bfloat16" (16-bit: half the cache's
        bytes; attention widens as it reads and accumulates in float32; parity in
        docs/cuda.md). compile_progress(done, total, module): see Device.load_all (the
        first run on a machine compiles every module with NVRTC, in parallel; later runs
        hit CuPy's kernel cache); create() logs it too."""
        self.dev = device if device is not None else CupyDevice()
        try:  # every module now: a missing NVRTC fails here, not mid-generation
            self.dev.load_all(progress=compile_progress)
        except KernelLoadError as e:
            raise BackendUnavailableError(f"The CUDA backend cannot start: {e}.") from e
        # Prefill GEMM inputs, reused by every weight of every layer: "w" the weight in
        # prefill_dtype, "x" the activations rounded to it (16-bit modes).
        self._scratch: dict[str, Any] = {}
        self.use_prefill_dtype(prefill_dtype)
        self.use_kv_dtype(kv_dtype)
        self.xp = self.dev.xp
        self.device = getattr(self.dev, "device_name", self.dev.name)
        self._last_id: tuple[int, Any] | None = None  # (sampled id, its device copy)
        self._hist: tuple[list[int], Any] | None = None  # history ids and their device copy
        self.graphs = graphs and self.dev.supports_graphs
        self.graph_error: str | None = None  # why the last capture fell back to eager steps
        self._step: _Capture | None = None  # set while a decode step is being captured
        # Each decoder block's ops.DecoderLayer, or None where the fused step does not fit.
        self._fused: weakref.WeakKeyDictionary[Any, ops.DecoderLayer | None] = \
            weakref.WeakKeyDictionary()
        # The eager fused step's device buffers (RoPE's position, sliding layers' KV rows):
        # (their cache, its offset, {value: (1,) int32 buffer}).
        self._eager_pos: tuple[weakref.ref[Any], int, dict[int, Any]] | None = None

    # --- what this backend offers -------------------------------------------------
    def quant_types(self) -> set[str]:
        """The GGML block types the kernels read, and MLX's affine groups (4-bit ones with
        float16-exact scales as Q4_1 blocks, the rest as float32: see :func:`mlx_as_q4_1`)."""
        return {t for t in TYPES if t not in ("F32", "F16", "BF16")} | {"MLX"}

    def close(self) -> None:
        """Drop the scratch buffers and give the device pool's free blocks back to the
        driver (arrays still referenced elsewhere, such as a live model's weights, stay)."""
        self._scratch.clear()
        self._last_id = self._hist = None
        self.dev.release()

    def memory(self) -> MemorySample:
        used, total, peak = self.dev.memory()
        return MemorySample(used, total, peak, host_rss())

    def synchronize(self, *outputs: Any) -> None:
        self.dev.synchronize()

    def start_generation(self, params: SamplingParams, prompt_ids: Sequence[int],
                         rng: np.random.Generator) -> CudaSampler:
        return CudaSampler(self, params, prompt_ids, rng)

    def decode_steps(self) -> CudaSteps:
        """Captured and replayed decode steps, batched ones included (:class:`CudaSteps`);
        the server's scheduler feeds them the tokens :meth:`token_sampler` samples."""
        return CudaSteps(self)

    def token_sampler(self, params: SamplingParams, prompt_ids: Sequence[int],
                      rng: np.random.Generator) -> CudaSampler:
        """One sequence's device-side sampler for a caller that steps many (the server):
        its tokens stay on the device and are read one step behind."""
        return CudaSampler(self, params, prompt_ids, rng)

    # --- moving data ----------------------------------------------------------------
    def array(self, a: np.ndarray) -> Any:
        a = np.asarray(a)
        if self._last_id is not None and a.size == 1 and a.dtype.kind in "iu":
            tok, dev_id = self._last_id
            if int(a.reshape(-1)[0]) == tok:  # the id we just sampled: already on the device
                return self.xp.reshape(dev_id, a.shape)
        if a.dtype.kind == "f":
            a = a.astype(np.float32, copy=False)
        return self.dev.to_device(np.ascontiguousarray(a), "input")

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.dev.to_host(x, "output")

    def weight(self, t: TensorData) -> QuantMatrix:
        if len(t.shape) != 2:
            raise ValueError(f"{t.name}: a linear/embedding weight must be 2-D, got {t.shape}")
        data, qtype = t.data, t.qtype
        if qtype == "MLX" and (q4_1 := mlx_as_q4_1(t)) is not None:
            data, qtype = q4_1, "Q4_1"
        elif qtype not in _KERNEL_TYPES:  # MLX, or a float type the kernels lack: float32
            data, qtype = dequantize(t).astype(np.float32), "F32"
        return ops.upload_matrix(self.dev, data, qtype, t.shape, t.name)

    def held_bytes(self, t: TensorData) -> int:
        """File bytes for the types the kernels read (2 per weight for F16 and BF16), 20
        per 32 weights for MLX held as Q4_1, float32 for the rest."""
        if len(t.shape) == 2 and t.qtype in _KERNEL_TYPES:
            return t.nbytes
        if len(t.shape) == 2 and _q4_1_halves(t) is not None:
            return t.shape[0] * t.shape[1] // 32 * 20
        return super().held_bytes(t)

    def dense(self, t: TensorData) -> Any:
        host = np.ascontiguousarray(dequantize(t), dtype=np.float32).reshape(t.shape)
        return self.dev.to_device(host, t.name)

    # --- helpers --------------------------------------------------------------------
    def _c(self, x: Any) -> Any:
        if self._step is not None and not (x.dtype == np.float32 and x.flags.c_contiguous):
            raise GraphUnsupported("a copy to contiguous float32")
        return self.xp.ascontiguousarray(x, dtype=self.xp.float32)

    def _eager_only(self, what: str) -> None:
        """Refuse ``what`` (a CuPy operator) while a step is captured: the emulator records
        only our kernels, so a graph holding it would replay without it."""
        if self._step is not None:
            raise GraphUnsupported(what)

    def _reused(self, slot: str, shape: tuple[int, int], dtype: Any) -> Any:
        """A (shape) buffer of dtype from the scratch ``slot``, grown to the largest asked
        for. Later kernels are queued behind the GEMM that reads it on the same stream, so
        the next weight (or layer) cannot overwrite it early."""
        n = shape[0] * shape[1]
        buf = self._scratch.get(slot)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = self._scratch[slot] = self.dev.empty((n,), dtype)
        return buf[:n].reshape(shape)

    def _dequantized(self, w: QuantMatrix) -> Any:
        dtype = self.prefill_dtype
        if w.data.dtype == dtype:  # F32, F16 or BF16 weights in the GEMM's type: no copy
            return w.data
        return ops.dequantize(self.dev, w, dtype, out=self._reused("w", (w.rows, w.cols), dtype))

    def _as_table(self, t: Any) -> QuantMatrix:
        if isinstance(t, QuantMatrix):
            return t
        t = self._c(t)
        return QuantMatrix(t, "F32", t.shape[0], t.shape[1])

    # --- the fused decode layer ----------------------------------------------------------
    def _decoder_layer(self, block: Any) -> ops.DecoderLayer | None:
        """ops.decode_layer's weights for a Llama-like block (Llama, Mistral, Qwen2's biases,
        Phi-3, Gemma 1; Qwen3's per-head q/k norms; Gemma 2/3's norms after attention and
        MLP, soft-cap and sliding windows): q/k/v and gate/up stacked into one weight each
        with an integer mat-vec, head_dim and widths in whole q8_1 blocks. Else None (the
        block runs op by op). Built eagerly (the first call of a block is a prefill's): the
        layer's zeroed tail counters are allocated here, never inside a captured step."""
        at, mlp = block.attn, block.mlp
        act = getattr(mlp.act, "__name__", None)
        if (len(at.qkv.parts) != 1 or len(mlp.gate_up.parts) != 1
                or mlp.gate_up.parts[0][2] is not None or act not in ops.GATED_Q8_1
                or at.head_dim % 32):
            return None
        qkv, _, bias = at.qkv.parts[0]
        mats = (qkv, at.o_proj, mlp.gate_up.parts[0][0], mlp.down)
        if not all(isinstance(w, QuantMatrix) and w.cols % 32 == 0
                   and ops.dp4a_applies(self.dev, w) for w in mats):
            return None
        tails = at.q_norm is not None or block.post_attn_norm is not None
        return ops.DecoderLayer(
            attn_norm=block.input_norm, qkv=qkv, o=at.o_proj, mlp_norm=block.pre_mlp_norm,
            gate_up=mats[2], down=mats[3], heads=at.n_heads, kv_heads=at.n_kv, eps=block.eps,
            theta=at.theta, scale=at.scale, qkv_bias=bias, act=act,
            freq_factors=at.freq_factors, softcap=at.softcap, window=at.window,
            q_norm=at.q_norm, k_norm=at.k_norm, post_attn_norm=block.post_attn_norm,
            post_mlp_norm=block.post_mlp_norm,
            done=ops.tail_counters(self.dev, at.n_heads + at.n_kv) if tails else None)

    def _eager_row(self, cache: KVCache, value: int) -> Any:
        """A (1,) int32 device buffer holding ``value`` for this step of ``cache`` (RoPE's
        position, a sliding layer's KV row), filled on the device (no copy from the host)
        once per step and value."""
        last = self._eager_pos
        if last is None or last[0]() is not cache or last[1] != cache.offset:
            last = self._eager_pos = (weakref.ref(cache), cache.offset, {})
        buf = last[2].get(value)
        if buf is None:
            buf = last[2][value] = self.dev.empty((1,), np.int32)
            buf.fill(value)
        return buf

    def decode_layer(self, block: Any, x: Any, cache: Any) -> Any | None:
        """ops.decode_layer (8 launches, 9 when attention splits) for one sequence's decode
        step through a block it fits (:meth:`_decoder_layer`) on a float32, float16 or
        bfloat16 cache, q8_1 activations on; eager or captured. Else None: prefill, batched
        steps, an eager step that slides a window's rows and an OpProfiler run op by op."""
        if not self.q8_1_activations or not _OPS.isdisjoint(vars(self)):
            return None
        if block not in self._fused:
            self._fused[block] = self._decoder_layer(block)
        if not isinstance(cache, KVCache) or tuple(x.shape[:2]) != (1, 1):
            return None
        layer, i = self._fused[block], block.index
        k = cache.keys[i]
        if layer is None or k is None or np.dtype(k.dtype) not in ops.QKV_ROPE_KV:
            return None
        row, cap = cache.layer_offset(i), self._step
        attend = None
        if cap is None:
            if layer.window is not None and row + 1 > k.shape[2]:
                return None  # the cache slides its rows (KVCache.update)
            cache.reserve(i, k, row + 1)
            pos, kv_row = self._eager_row(cache, cache.offset), self._eager_row(cache, row)
        else:
            if len(cap.caches) != 1 or cap.caches[0] is not cache:
                raise GraphUnsupported("a fused layer over a cache outside the step")
            pos, kv_row = cap.at(self.dev, 0, 0), cap.at(self.dev, 0, cache.start[i])

            def attend(q: Any, kc: Any, vc: Any) -> Any:
                return step.attention(self.dev, q, kc, vc, layer.scale, kv_row, cap.max_kv,
                                      window=layer.window, softcap=layer.softcap, q8_1=True)
        h = self.xp.reshape(self._c(x), (1, x.shape[-1]))
        out = ops.decode_layer(self.dev, layer, h, cache.keys[i], cache.values[i], pos, row,
                               attend=attend, row=kv_row)
        return self.xp.reshape(out, tuple(x.shape))

    # --- ops ----------------------------------------------------------------------------
    def embedding(self, table: Any, ids: Any) -> Any:
        tab = self._as_table(table)
        if self._step is not None and ids.dtype != np.int32:
            raise GraphUnsupported("token ids that are not int32")
        flat = self.xp.ascontiguousarray(self.xp.reshape(ids, (-1,)), dtype=self.xp.int32)
        out = ops.get_rows(self.dev, tab, flat)
        return self.xp.reshape(out, (*ids.shape, tab.cols))

    def linear(self, x: Any, w: Any, bias: Any | None = None) -> Any:
        xp = self.xp
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = xp.reshape(self._c(x), (-1, k))
        if isinstance(w, QuantMatrix):
            if x2.shape[0] <= MMV_MAX_ROWS:
                y = ops.mul_mat_vec(self.dev, w, x2, self.q8_1_activations)
            else:  # cuBLAS on the GPU
                self._eager_only("a GEMM")
                wd = self._dequantized(w)
                if wd.dtype == np.float32:
                    y = xp.matmul(x2, wd.T)
                else:  # x rounded to the weight's 16-bit type by the same kernel; sums float32
                    xs = ops.dequantize(self.dev, QuantMatrix(x2, "F32", *x2.shape), wd.dtype,
                                        out=self._reused("x", x2.shape, wd.dtype))
                    y = ops.gemm_16(self.dev, xs, wd)
        else:
            self._eager_only("a float32 matmul")
            y = xp.matmul(x2, w.T)
        if bias is not None:
            y = y + bias if self._step is None else step.add(self.dev, y, self._c(bias))
        return xp.reshape(y, (*lead, y.shape[-1]))

    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        return ops.rms_norm(self.dev, self._c(x), w, eps)

    def layer_norm(self, x: Any, w: Any, b: Any, eps: float) -> Any:
        return ops.layer_norm(self.dev, self._c(x), w, b, eps)

    def attend_cached(self, q: Any, k: Any, v: Any, cache: Any, layer: int, **kw: Any) -> Any:
        cap = self._step
        if cap is not None:  # the positions this sequence's and layer's kernels read
            row = next((i for i, c in enumerate(cap.caches) if c is cache), None)
            if row is None:
                raise GraphUnsupported("attention over a cache outside the step")
            if cap.slots is not None:  # and its KV slot: the buffers are read at each replay
                cap.pos, cap.kv_pos, cap.slot = cap.slots.read(row, layer)
                cap.cache, cap.layer = cache, layer
            else:
                cap.pos = cap.at(self.dev, row, 0)
                cap.kv_pos = cap.at(self.dev, row, cache.start[layer])
        return super().attend_cached(q, k, v, cache, layer, **kw)

    def attend_rows(self, q: Any, k: Any, v: Any, caches: Sequence[Any], layer: int,
                    **kw: Any) -> Any:
        cap = self._step
        if cap is None or len(caches) == 1:
            return super().attend_rows(q, k, v, caches, layer, **kw)
        out = self.dev.empty(tuple(q.shape), np.float32)  # each row's attention writes its row
        for i, c in enumerate(caches):
            cap.out = out[i:i + 1]
            try:
                self.attend_cached(*(self.narrow(a, 0, i, 1) for a in (q, k, v)), c, layer, **kw)
            finally:
                cap.out = None
        return out

    def rope(self, x: Any, offset: int, theta: float, traditional: bool = False, *,
             freq_factors: Any | None = None) -> Any:
        # The models pass (b, h, t, d) views of contiguous (b, t, h, d) projections: rotate
        # those in place of a copy, positions running along axis 1.
        kw = dict(neox=not traditional, freq_factors=freq_factors)
        if self._step is not None:  # one token, at the position the device holds
            if x.shape[-2] != 1 or self._step.pos is None:
                raise GraphUnsupported("rope over several positions or outside attend_cached")
            return step.rope(self.dev, self._c(x), self._step.pos, theta, **kw)
        if x.ndim == 4:
            base = self.xp.transpose(x, (0, 2, 1, 3))
            if base.flags.c_contiguous:
                y = ops.rope(self.dev, base, offset, theta, seq_axis=1, **kw)
                return self.xp.transpose(y, (0, 2, 1, 3))
        return ops.rope(self.dev, self._c(x), offset, theta, seq_axis=-2, **kw)

    def attention(self, q: Any, k: Any, v: Any, scale: float, *,
                  causal_offset: int | None = None, key_mask: Any | None = None,
                  window: int | None = None, softcap: float | None = None) -> Any:
        xp = self.xp
        b, hq, t, d = q.shape
        hk, s = k.shape[1], k.shape[2]
        mask = None if key_mask is None else self._c(key_mask)
        if self._step is not None:  # rows 0..pos of the cache, pos read on the device
            cap = self._step
            if key_mask is not None or t != 1 or cap.kv_pos is None:
                raise GraphUnsupported("attention with a mask or several queries")
            return step.attention(self.dev, self._c(q), k, v, scale, cap.kv_pos, cap.max_kv,
                                  window=window, softcap=softcap, out=cap.out, slot=cap.slot)
        window = window if window is not None and s > window else None  # else it hides nothing
        if d <= ATTN_MAX_HEAD_DIM and k.dtype in ops.KV_KERNELS and k.dtype == v.dtype \
                and k.strides[-1] == k.itemsize and v.strides == k.strides:
            # Prefill and decode: the tiled kernel, no score matrix (split-K at long context).
            return ops.attention(self.dev, self._c(q), k, v, scale, causal_offset=causal_offset,
                                 key_mask=mask, window=window, softcap=softcap)
        # Head dims past the kernel's limit, or K/V in other layouts: grouped queries fold
        # into rows, two GEMMs around the masked softmax (a t x n_kv score matrix).
        qg = xp.reshape(self._c(q), (b, hk, (hq // hk) * t, d))
        k, v = ops.kv_as_f32(xp, k), ops.kv_as_f32(xp, v)
        scores = xp.matmul(qg, xp.transpose(k, (0, 1, 3, 2)))
        if softcap is not None:
            scores, scale = self.softcap(scores * scale, softcap), 1.0
        p = ops.softmax(self.dev, self._c(scores), scale, nq=t, causal_offset=causal_offset,
                        key_mask=mask, window=window)
        return xp.reshape(xp.matmul(p, v), (b, hq, t, d))

    def silu_mul(self, gate: Any, up: Any) -> Any:
        return ops.silu_mul(self.dev, self._c(gate), self._c(up))

    def gelu_tanh_mul(self, gate: Any, up: Any) -> Any:
        return ops.gelu_tanh_mul(self.dev, self._c(gate), self._c(up))

    def gelu(self, x: Any) -> Any:
        return ops.gelu(self.dev, self._c(x))

    def softcap(self, x: Any, cap: float) -> Any:
        # Eagerly CuPy's fused tanh, like add and mul; a kernel in a captured step.
        if self._step is not None:
            return step.softcap(self.dev, self._c(x), cap)
        return (cap * self.xp.tanh(x / cap)).astype(self.xp.float32, copy=False)

    def zeros(self, shape: tuple[int, ...]) -> Any:
        self._eager_only("a new zero buffer")
        return self.dev.zeros(shape, np.float32)

    def use_prefill_dtype(self, name: Any) -> None:
        """The prefill GEMMs' input type (see __init__); load_model(prefill_dtype=...)."""
        try:
            dtype = ops.BF16 if name == "bfloat16" else np.dtype(name)
        except TypeError:
            dtype = None
        if dtype not in PREFILL_DTYPES:
            raise InvalidInputError(f"The cuda backend runs prefill in float32, float16 or "
                                    f"bfloat16, not {name}.")
        self.prefill_dtype = dtype
        self._scratch.pop("w", None)
        self._scratch.pop("x", None)

    def use_kv_dtype(self, name: Any) -> None:
        try:
            dtype = ops.KV_BF16 if name == "bfloat16" else np.dtype(name)
        except TypeError:
            dtype = None
        if dtype not in ops.KV_KERNELS:
            raise InvalidInputError(f"The cuda backend keeps its KV cache in float32, float16 "
                                    f"or bfloat16, not {name}.")
        self.kv_dtype = dtype

    def kv_zeros(self, shape: tuple[int, ...]) -> Any:
        self._eager_only("a new zero buffer")
        return self.dev.zeros(shape, self.kv_dtype)

    # Eagerly the generic ops are CuPy operators; a captured step needs them as kernels.
    def add(self, a: Any, b: Any) -> Any:
        if self._step is None:
            return a + b
        if a.shape != b.shape:
            raise GraphUnsupported("a broadcasting add")
        return step.add(self.dev, self._c(a), self._c(b))

    def mul(self, a: Any, b: Any) -> Any:
        if self._step is None:
            return a * b
        if not isinstance(b, (int, float)):
            raise GraphUnsupported("mul by an array")
        return step.scale(self.dev, self._c(a), b)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        y = x.reshape(shape)
        if self._step is not None and self.dev.address(y) != self.dev.address(x):
            raise GraphUnsupported("a reshape that copies")
        return y

    def narrow(self, x: Any, axis: int, start: int, length: int) -> Any:
        y = super().narrow(x, axis, start, length)
        if (self._step is None or y.flags.c_contiguous or axis % x.ndim != x.ndim - 1
                or x.dtype != np.float32 or not x.flags.c_contiguous):
            return y
        # Captured, several rows: a stacked projection's part (q, k, v; gate, up) is a
        # block of columns, copied into its own rows by one kernel (the ops after it read
        # contiguous rows; eagerly CuPy copies it).
        rows = y.size // length
        out = ops.dequantize(self.dev, _StridedRows(y, rows, length, x.shape[-1] * 4))
        return self.xp.reshape(out, y.shape)

    def set_slice(self, dst: Any, src: Any, axis: int, start: int) -> Any:
        if self._step is None:
            if dst.dtype == ops.KV_BF16 and src.dtype == np.float32:  # a bfloat16 cache row
                src = ops.to_bf16_bits(self.xp, src)
            return super().set_slice(dst, src, axis, start)
        cap = self._step
        if dst.ndim != 4 or axis != 2 or src.shape[2] != 1 or cap.kv_pos is None:
            raise GraphUnsupported("a slice write other than one KV cache row")
        slot = None
        if cap.slot is not None:  # K's half of the slot, or V's
            if dst is cap.cache.keys[cap.layer]:
                slot = cap.slot[0:2]
            elif dst is cap.cache.values[cap.layer]:
                slot = cap.slot[2:4]
            else:
                raise GraphUnsupported("a row write to a buffer other than the step's cache")
        return step.kv_store(self.dev, src, dst, cap.kv_pos, slot=slot)

    # --- sampling on the device --------------------------------------------------------
    def _history(self, history: list[int]) -> Any:
        """History ids on the device; extended on the device by the ids sampled here."""
        xp = self.xp
        if self._hist is not None:
            ids, dev_ids = self._hist
            if history == ids:
                return dev_ids
            last = self._last_id
            if (last is not None and len(history) == len(ids) + 1 and history[-1] == last[0]
                    and history[:-1] == ids):
                dev_ids = xp.concatenate([dev_ids, xp.reshape(last[1], (1,))])
                self._hist = (list(history), dev_ids)
                return dev_ids
        dev_ids = self.dev.to_device(np.asarray(history, np.int32), "history")
        self._hist = (list(history), dev_ids)
        return dev_ids

    def sample_id(self, logits: Any, params: SamplingParams, recent: Any,
                  rng: np.random.Generator) -> Any:
        """The next id as a (1,) int32 device array (-1 for a row that is not finite);
        ``recent``: the penalty window's ids on the device, or None. Nothing is read."""
        xp = self.xp
        row = self._c(xp.reshape(logits, (-1,)))
        if params.greedy and (recent is None or params.repetition_penalty == 1.0):
            return ops.argmax(self.dev, xp.reshape(row, (1, -1)), checked=True)  # one launch
        u = 0.0 if params.greedy else rng.random()  # a kernel argument, not a copy
        dev_id = sample_on_device(
            xp, row, params, recent, u,
            argmax=lambda r: xp.reshape(ops.argmax(self.dev, xp.reshape(r, (1, -1))), ()))
        return xp.reshape(dev_id.astype(xp.int32), (1,))

    def sample(self, logits: Any, params: SamplingParams, history: list[int],
               rng: np.random.Generator) -> int:
        recent = (self._history(history)[-params.repetition_window:]
                  if params.repetition_penalty != 1.0 and history else None)
        dev_id = self.sample_id(logits, params, recent, rng)
        tok = int(self.dev.to_host(dev_id, "sampled id")[0])
        self._last_id = (tok, dev_id)
        return tok


@dataclass
class StepGraph:
    """One captured decode step over ``caches`` (one sequence per batch row), replayed
    while they keep the buffers and window starts it was captured with (``bound``) and
    every row's keys fit ``max_kv``. Before each replay, row r's input id goes to
    ``ids[r]`` and each ``positions`` buffer gets its row's position minus its shift;
    ``logits`` (rows, 1, vocab) is the buffer each replay writes. ``left``: replays before
    a cache runs out of rows or a row past ``max_kv`` (then a check, an eager step or a new
    capture); ``next``: the offsets the caches have when the next replay may run."""

    graph: Graph
    ids: Any
    positions: list[tuple[Any, int, int]]
    logits: Any
    max_kv: int
    caches: list[KVCache]
    bound: tuple[Any, ...]
    left: int = 0
    next: list[int] = field(default_factory=list)
    inputs: list[tuple[Any, ...]] | None = None  # step_inputs' launch and arguments, checked


@dataclass
class BatchGraph:
    """One captured batched decode step for ``rows`` sequences, whichever they are: its
    kernels read the rows' tokens, positions and KV buffers through ``slots`` (written by
    one copy before each replay), so it is replayed while the rows' caches are of
    ``layout`` and every row's keys fit ``max_kv``. ``left``, ``caches`` (weak) and
    ``next``: as :class:`StepGraph`'s, for the rows of the last replay."""

    graph: Graph
    slots: _Slots
    ids: Any
    logits: Any
    max_kv: int
    layout: tuple[Any, ...]
    left: int = 0
    caches: list[weakref.ref[KVCache]] = field(default_factory=list)
    next: list[int] = field(default_factory=list)


@dataclass
class DeviceToken:
    """A sampled id on the device and its copy to the host, queued when it was sampled."""

    ids: Any  # (1,) int32 device array
    pending: PendingRead


_OPS = frozenset(OPS)


def _room(c: Any) -> int:
    """Decode steps ``c`` can take before a layer's buffer is full (it then grows or slides
    eagerly); 0 for what a graph cannot serve (no buffers yet, not a KVCache)."""
    if not isinstance(c, KVCache) or c.keys[0] is None:
        return 0
    return min(k.shape[2] - c.layer_offset(i) for i, k in enumerate(c.keys))


# A batched graph's KV slots are read by kernels planned on the capture's caches: every
# slot's buffers and stride over heads start on this many bytes (the decode attention's
# widest vector load).
SLOT_ALIGN = 16


def _slot_block(dev: Device, c: KVCache) -> tuple[np.ndarray, tuple[Any, ...]] | None:
    """``c``'s KV slots (_Slots.SLOT int64 per layer) and its layout (what a graph planned
    on another cache needs equal: per layer the type, heads, head_dim and row stride), or
    None where a slot cannot stand for it (no buffers yet, other layouts, misaligned)."""
    block = np.empty(_Slots.SLOT * len(c.keys), np.int64)
    layout = []
    for i, (k, v) in enumerate(zip(c.keys, c.values, strict=True)):
        if k is None or v is None or k.ndim != 4 or k.shape[0] != 1 or k.shape != v.shape \
                or k.strides != v.strides or k.dtype != v.dtype:
            return None
        size = k.itemsize
        ka, va, sh = dev.address(k), dev.address(v), k.strides[1]
        if ka % SLOT_ALIGN or va % SLOT_ALIGN or sh % SLOT_ALIGN:
            return None
        block[_Slots.SLOT * i:_Slots.SLOT * (i + 1)] = (ka, sh // size, va, sh // size)
        layout.append((np.dtype(k.dtype).str, k.shape[1], k.shape[3], k.strides[2:]))
    return block, (tuple(c.windows), *layout)


def _bound(caches: list[KVCache]) -> tuple[Any, ...]:
    """What a captured step holds of its caches: the buffers its kernels write and read,
    and each sliding layer's start (its KV row is the position minus that)."""
    return tuple(x for c in caches for x in (*c.keys, *c.values, tuple(c.start)))


class CudaSteps(EagerSteps):
    """Decode steps captured as CUDA graphs and replayed: ``steps(model, ids, cache)`` is
    ``model(ids, cache, last_only=True)`` for one sequence (a :class:`KVCache`) or several
    (:class:`BatchedCaches`, the server's steps), each row at its own position.

    ``ids``: the rows' input ids as a (rows, 1) device array, or the samplers' tokens
    (:class:`DeviceToken`, one or a list), which never leave the device.

    One sequence: each replay is one ``step_inputs`` launch per distinct sliding-window
    start, then the graph, which holds the sequence's KV buffers (a cache growing or
    sliding, or another sequence, captures anew). Several (the server's batched steps): a
    graph per row count (:class:`BatchGraph`), whose kernels read each row's token,
    position and KV buffers through a table (:class:`_Slots`) that one copy writes before
    each replay, so a sequence joining or leaving the batch, or a cache grown into new
    buffers, replays it. A capture records the step, it does not run it: the replay right
    after computes it. Positions are bucketed (``CudaBackend.graph_min_keys``, powers of
    two), so a moving position replays one graph. An op the capture refuses
    (:class:`GraphUnsupported`) makes every later step eager, the reason in
    ``eager_reason`` (and ``CudaBackend.graph_error``)."""

    def __init__(self, backend: CudaBackend):
        self.B = backend
        self.graph: StepGraph | None = None
        self.batched: dict[int, BatchGraph] = {}  # by rows
        # Each cache's KV slots, while it keeps the buffers they point to (_slot_block).
        self._blocks: weakref.WeakKeyDictionary[KVCache, tuple[Any, ...]] = \
            weakref.WeakKeyDictionary()
        self.eager_reason: str | None = None
        self.captures = 0
        self.replays = 0

    def __call__(self, model: Any, ids: Any, cache: Any) -> Any:
        caches = cache.caches if isinstance(cache, BatchedCaches) else [cache]
        if len(caches) > 1:
            return self._rows(model, ids, cache, caches)
        g = self._graph(model, caches)
        if g is None:
            return model(self._ids(ids, len(caches)), cache, last_only=True)
        dev = self.B.dev
        toks = self._tokens(ids, len(caches))
        if g.inputs is None:  # the first replay checks the inputs' launch; later ones reuse it
            for buf, row, shift in g.positions:
                step.step_inputs(dev, toks[row], g.ids[row], buf, caches[row].offset - shift)
            g.inputs = [(plan.plan_step_inputs(dev.limits), g.ids[row], buf, row, shift)
                        for buf, row, shift in g.positions]
        else:
            for launch, ids_row, buf, row, shift in g.inputs:
                dev.launch("step", "step_inputs_i32", launch,
                           (toks[row], ids_row, buf, np.int32(caches[row].offset - shift)))
        return self._replay(g, caches)

    def _replay(self, g: StepGraph | BatchGraph, caches: list[Any]) -> Any:
        """Launch ``g`` (its inputs written) and move its rows on by the step it computes."""
        g.graph.launch()
        for c in caches:
            c.advance(1)
        g.left -= 1
        g.next = [c.offset for c in caches]
        self.replays += 1
        return g.logits

    def release(self) -> None:
        """Drop the captured steps (one sequence's holds its KV buffers) and the slots."""
        self.graph = None
        self.batched.clear()
        self._blocks.clear()

    def _rows(self, model: Any, ids: Any, cache: BatchedCaches, caches: list[Any]) -> Any:
        """A batched step: the graph of its row count, its table written by one copy (the
        rows' tokens, positions and KV slots), one replay; eager where it cannot serve."""
        g, blocks = self._batch_graph(model, caches)
        if g is None:
            return model(self._ids(ids, len(caches)), cache, last_only=True)
        g.slots.write(self.B.dev, self._tokens(ids, len(caches)), caches, blocks)
        return self._replay(g, caches)

    def _slots_of(self, c: Any) -> tuple[np.ndarray, tuple[Any, ...]] | None:
        """(KV slots, layout) of ``c`` (:func:`_slot_block`), kept while its buffers are."""
        if not isinstance(c, KVCache):
            return None
        m = self._blocks.get(c)
        if m is not None and all(map(operator.is_, m[0], c.keys)) \
                and all(map(operator.is_, m[1], c.values)):
            return m[2], m[3]
        got = _slot_block(self.B.dev, c)
        if got is None:
            self._blocks.pop(c, None)
            return None
        self._blocks[c] = (tuple(c.keys), tuple(c.values), *got)
        return got

    def _batch_graph(self, model: Any, caches: list[Any]
                     ) -> tuple[BatchGraph | None, list[np.ndarray] | None]:
        """The graph to replay for these rows (None: an eager step) and the rows' KV slots
        (None: the graph's table of the last replay holds them, one step behind)."""
        B = self.B
        if not B.graphs or self.eager_reason is not None or not _OPS.isdisjoint(vars(B)):
            return None, None
        rows = len(caches)
        g = self.batched.get(rows)
        if (g is not None and g.left > 0
                and all(r() is c and c.offset == n
                        for r, c, n in zip(g.caches, caches, g.next, strict=True))):
            return g, None  # the rows moved only by this graph's replays since it checked
        room = min(_room(c) for c in caches)
        if room <= 0:
            return None, None  # this step grows or slides a cache (eagerly); the next replays
        got = [self._slots_of(c) for c in caches]
        if any(x is None for x in got) or any(x[1] != got[0][1] for x in got):
            return None, None
        layout = got[0][1]
        need = max(c.offset for c in caches) + 1
        if g is None or need > g.max_kv or g.layout != layout:
            self.batched.pop(rows, None)  # free the old graph's buffers before capturing
            max_kv = max(B.graph_min_keys, 1 << (need - 1).bit_length())
            g = self._capture_rows(model, caches, max_kv, layout)
            if g is None:
                return None, None
            self.batched[rows] = g
        g.left = min(room, g.max_kv - need + 1)
        g.caches = [weakref.ref(c) for c in caches]
        return g, [x[0] for x in got]

    def _tokens(self, ids: Any, rows: int) -> list[Any]:
        """Each row's input id as a (1,) int32 device array."""
        if isinstance(ids, DeviceToken):
            return [ids.ids]
        if isinstance(ids, list):
            return [t.ids for t in ids]
        xp = self.B.xp
        flat = xp.ascontiguousarray(xp.reshape(ids, (-1,)), dtype=xp.int32)
        return [flat[i:i + 1] for i in range(rows)]

    def _ids(self, ids: Any, rows: int) -> Any:
        """The rows' ids as the model's (rows, 1) input."""
        xp = self.B.xp
        if isinstance(ids, DeviceToken):
            return xp.reshape(ids.ids, (1, 1))
        if isinstance(ids, list):
            return xp.reshape(xp.concatenate([t.ids for t in ids]), (rows, 1))
        return ids

    def _graph(self, model: Any, caches: list[Any]) -> StepGraph | None:
        B, g = self.B, self.graph
        if not B.graphs or self.eager_reason is not None or not _OPS.isdisjoint(vars(B)):
            return None  # no graphs, a refused capture, or an OpProfiler timing each op
        if (g is not None and g.left > 0 and len(g.caches) == len(caches)
                and all(a is b and a.offset == n
                        for a, b, n in zip(caches, g.caches, g.next, strict=True))):
            return g  # the caches moved only by this graph's replays since it checked
        room = min(_room(c) for c in caches)
        if room <= 0:
            return None  # this step grows or slides a cache (eagerly); the next captures
        need = max(c.offset for c in caches) + 1
        bound = _bound(caches)
        if not (g is not None and need <= g.max_kv and len(g.bound) == len(bound)
                and all(a is b or (isinstance(a, tuple) and a == b)
                        for a, b in zip(g.bound, bound, strict=True))
                and all(a is b for a, b in zip(g.caches, caches, strict=True))):
            cap = max(k.shape[2] for c in caches for k in c.keys)
            max_kv = min(cap, max(B.graph_min_keys, 1 << (need - 1).bit_length()))
            self.graph = None  # free the old graph's buffers before capturing
            g = self.graph = self._capture(model, caches, max(max_kv, need), bound)
            if g is None:
                return None
        g.left = min(room, g.max_kv - need + 1)
        g.next = [c.offset for c in caches]
        return g

    def _record(self, model: Any, ids: Any, caches: list[KVCache], state: _Capture
                ) -> tuple[Graph, Any] | None:
        """Capture the model's step over ``caches`` from input ``ids``: (graph, logits),
        or None where the capture was refused (then every later step is eager)."""
        B, dev = self.B, self.B.dev
        offsets = [c.offset for c in caches]
        B._step = state
        dev.begin_capture()
        try:
            if state.slots is not None:  # the rows' tokens, inside the graph
                step.step_ids(dev, state.slots.tok, ids)
            logits = model(ids, caches[0] if len(caches) == 1 else BatchedCaches(caches),
                           last_only=True)
            graph = dev.end_capture()
        except BaseException as e:  # GraphUnsupported, or a capture the runtime refused
            dev.abort_capture()
            if not isinstance(e, Exception):  # KeyboardInterrupt: not a reason to go eager
                raise
            self.eager_reason = B.graph_error = f"{type(e).__name__}: {e}"
            return None
        finally:
            B._step = None
            for c, n in zip(caches, offsets, strict=True):
                c.offset = n  # captured, not run: each replay runs and advances it
        self.captures += 1
        return graph, logits

    def _capture(self, model: Any, caches: list[KVCache], max_kv: int,
                 bound: tuple[Any, ...]) -> StepGraph | None:
        ids = self.B.dev.empty((len(caches), 1), np.int32)
        state = _Capture(list(caches), max_kv)
        got = self._record(model, ids, caches, state)
        if got is None:
            return None
        positions = [(buf, row, shift) for (row, shift), buf in state.positions.items()]
        return StepGraph(got[0], ids, positions, got[1], max_kv, list(caches), bound)

    def _capture_rows(self, model: Any, caches: list[KVCache], max_kv: int,
                      layout: tuple[Any, ...]) -> BatchGraph | None:
        dev = self.B.dev
        ids = dev.empty((len(caches), 1), np.int32)
        slots = _Slots(dev, len(caches), caches[0].windows)
        got = self._record(model, ids, caches, _Capture(list(caches), max_kv, slots=slots))
        if got is None:
            return None
        return BatchGraph(got[0], slots, ids, got[1], max_kv, layout)


class CudaSampler(TokenSampler):
    """Device-side sampling for one generation, the lazy-token protocol of
    :class:`~inference.backends.base.TokenSampler` (the one MLX uses): tokens stay device
    arrays, the next step reads its input id from the device, and :meth:`read` waits only
    for the copy queued with the token, so the host reads token t while step t+1 runs.
    Decode steps replay a captured step (:class:`CudaSteps`) where they can.

    The penalty window is a device array extended on the device by each sampled id; a
    draw takes one host uniform from ``rng`` (a kernel argument), so draws equal the NumPy
    sampler's."""

    lazy = True
    B: CudaBackend

    def __init__(self, backend: CudaBackend, params: SamplingParams, prompt_ids: Sequence[int],
                 rng: np.random.Generator):
        super().__init__(backend, params, prompt_ids, rng)
        self.penalized = params.repetition_penalty != 1.0
        self.window = params.repetition_window  # sliced as sample_row does: 0 keeps all
        recent = list(prompt_ids)[-self.window:] if self.penalized else []
        self.recent = (backend.dev.to_device(np.asarray(recent, np.int32), "history")
                       if recent else None)
        self.steps = CudaSteps(backend)

    def sample(self, row: Any) -> DeviceToken:
        B = self.B
        ids = B.sample_id(row, self.params, self.recent, self.rng)
        if self.penalized:
            grown = ids if self.recent is None else B.xp.concatenate([self.recent, ids])
            self.recent = grown[-self.window:]
        return DeviceToken(ids, B.dev.read_later(ids, "sampled id"))

    def as_input(self, tok: DeviceToken) -> Any:
        return self.B.xp.reshape(tok.ids, (1, 1))

    def read(self, tok: DeviceToken) -> int:
        return int(tok.pending.result()[0])

    def decode(self, model: Any, tok: DeviceToken, cache: Any) -> Any:
        """The next step's logits: a replay of the captured step when there is one for
        this position (one launch for the inputs and one for the graph, whatever the
        layer count), else eager."""
        return self.steps(model, tok, cache)


def probe() -> tuple[bool, str]:
    """Available only if a tiny kernel compiles, launches and returns the right numbers on
    the GPU (kernels/cuda/selftest.cu), so `auto` never picks a device it cannot run on:
    no NVRTC, no CUDA headers, a driver too old for the toolkit. Never raises."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        return False, reason
    try:
        dev = CupyDevice()
    except Exception as e:  # a device that cannot be used after all
        return False, f"cuda: device unusable ({type(e).__name__}: {e})"
    reason = check_device(dev)
    if reason is not None:
        return False, reason
    return True, f"NVIDIA GPU {dev.device_name} (self-test kernel passed)"


log = logging.getLogger(__name__)


def _log_compile(done: int, total: int, module: str) -> None:
    if module:
        log.info("CUDA kernels: %s ready (%d of %d modules)", module, done, total)
    elif done < total:
        log.info("CUDA kernels: compiling %d modules (first run; cached afterwards)",
                 total - done)


def create(compile_progress: CompileProgress | None = None) -> CudaBackend:
    """The backend on the local NVIDIA GPU. Its kernel modules compile now (NVRTC; CuPy's
    on-disk cache on later runs): each step is logged and told to
    ``compile_progress(done, total, module)`` (what ``load_model(compile_progress=...)``
    passes here), on the calling thread."""
    def progress(done: int, total: int, module: str) -> None:
        _log_compile(done, total, module)
        if compile_progress is not None:
            compile_progress(done, total, module)

    return CudaBackend(compile_progress=progress)
