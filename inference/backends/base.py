"""The backend protocol: one op set, implemented once per backend.

Model files (``inference/models``) call only the methods named in :data:`OPS`; they never
import numpy, mlx or cupy for compute. A backend is chosen once, at load
(:func:`inference.backends.select_backend`), and a model is refused or falls back *before*
any weight moves if the backend lacks an op or quant type the architecture declares.
docs/ops.md lists, for every op, each backend's method and the kernel file it ends in.

Array conventions (every backend):
- activations are float32 native arrays; ``x`` is ``(batch, seq, hidden)``;
  attention tensors are ``(batch, heads, seq, head_dim)``;
- linear weights are ``(out_features, in_features)``: ``linear(x, w) = x @ w.T + b``;
- ``rope`` uses the Hugging Face (NeoX, half-split) pairing unless ``traditional=True``
  (adjacent pairs, GGML's "normal" mode); scaled RoPE divides each pair's frequency by
  ``freq_factors[i]`` (GGML's ``rope_freqs``; see :mod:`inference.models.rope`);
- ``attention(..., causal_offset=o)`` lets query ``i`` see keys ``0 .. o + i``; with
  ``window=w`` only the last ``w`` of them (keys ``o + i - w + 1 .. o + i``: sliding-window
  layers); ``softcap=c`` maps each scaled score ``s`` to ``c * tanh(s / c)`` before masking
  (Gemma 2). The mask is computed from positions by the backend, never shipped from the host;
  ``key_mask`` is a ``(batch, seq_k)`` native array, 1 for tokens and 0 for padding.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from inference.errors import InvalidInputError
from inference.events import MemorySample
from inference.formats.tensor import TensorData
from inference.sampling import SamplingParams

T = TypeVar("T")  # map_calls: item and result types
R = TypeVar("R")

# Every op a model may call. An architecture lists the subset it needs (REQUIRED_OPS).
OPS: tuple[str, ...] = (
    "embedding",
    "linear",
    "rms_norm",
    "layer_norm",
    "rope",
    "attention",
    "silu_mul",
    "gelu_tanh_mul",
    "gelu",
    "softcap",
    "add",
    "mul",
    "reshape",
    "transpose",
    "zeros",
    "set_slice",
    "narrow",
    "attention_packed",
    "sample",
)

# Ops the base class implements for every backend (array operators, methods and slicing).
GENERIC_OPS = frozenset({"add", "mul", "reshape", "transpose", "set_slice", "narrow",
                         "attention_packed"})


def _along(ndim: int, axis: int, start: int, stop: int) -> tuple[slice, ...]:
    """An index selecting ``start:stop`` along ``axis`` and everything on the other axes."""
    idx = [slice(None)] * ndim
    idx[axis] = slice(start, stop)
    return tuple(idx)


# Quant types a backend may accept in weight(); F32/F16/BF16 are always accepted.
QUANT_TYPES: tuple[str, ...] = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MLX",
)


# Bytes of attention scores (and their softmax temporaries) one attention call may hold at
# once: prompts longer than fits are processed in tiles of query rows (:func:`query_tiles`),
# so scratch is bounded by this, not by the square of the prompt's length.
ATTENTION_SCRATCH_BYTES = 64 * 2**20
# Live float32 score arrays an attention call is budgeted for (a backend that keeps fewer
# says so in :attr:`Backend.score_copies`).
SCORE_COPIES = 3


def query_tiles(batch: int, heads: int, t: int, s: int,
                budget: int = ATTENTION_SCRATCH_BYTES) -> list[tuple[int, int]]:
    """Query-row ranges ``[start, stop)`` covering ``t`` rows, each tile's scores (float32
    ``batch x heads x rows x s``, ``SCORE_COPIES`` live copies) within ``budget``; at least
    one row."""
    rows = max(1, budget // (SCORE_COPIES * 4 * batch * heads * max(s, 1)))
    return [(r, min(r + rows, t)) for r in range(0, t, rows)]


def tiled_attention(attend: Any, q: Any, k: Any, v: Any, scale: float,
                    causal_offset: int | None, key_mask: Any, concat: Any,
                    **options: Any) -> Any | None:
    """Attention over query tiles when one call's scores would pass the scratch budget, else
    None (the caller attends in one go). A causal tile sees only the keys up to its last
    row, so each tile is cut to them (key positions keep their indices, so a sliding
    window in ``options`` masks the same keys). ``concat(parts)`` joins outputs along the
    query axis; ``options`` (window, softcap) go to every tile's call."""
    b, hq, t, _ = q.shape
    s = k.shape[2]
    tiles = query_tiles(b, hq, t, s)
    if len(tiles) == 1:
        return None
    parts = []
    for r0, r1 in tiles:
        if causal_offset is None:
            kk, vv, off = k, v, None
        else:
            n = min(s, causal_offset + r1)
            kk, vv, off = k[:, :, :n], v[:, :, :n], causal_offset + r0
        mask = None if key_mask is None else key_mask[:, :kk.shape[2]]
        parts.append(attend(q[:, :, r0:r1], kk, vv, scale, causal_offset=off, key_mask=mask,
                            **options))
    return concat(parts)






def host_rss() -> int:
    """This process's resident memory in bytes: /proc/self/statm where there is one (no
    psutil import on a generation's path), else psutil."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)


def host_memory() -> tuple[int, int]:
    """The machine's (total, available) memory in bytes: /proc/meminfo's MemTotal and
    MemAvailable where there is one (no psutil import on a load's path: ~0.1 s), else
    psutil's."""
    try:
        with open("/proc/meminfo", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return (int(fields[b"MemTotal"].split()[0]) * 1024,
                int(fields[b"MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError, IndexError):
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)


def peak_rss() -> int:
    """The most resident memory this process has held so far, in bytes (getrusage's
    ru_maxrss: kilobytes on Linux, bytes on macOS); its current RSS where that is not kept."""
    try:
        import resource
    except ImportError:  # Windows
        return host_rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _glibc() -> Any:
    """The C library's handle where it is glibc (malloc_trim/mallopt), else None."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            lib = ctypes.CDLL("libc.so.6")
            _libc = lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else False
        except OSError:
            _libc = False
    return _libc or None


def trim_host_heap() -> None:
    """Give freed heap pages back to the OS (malloc_trim: glibc only; a no-op elsewhere).

    Loading parses metadata into many small objects (the GGUF reader's field parts for
    SmolLM2's 49k-token vocabulary) and repacks weights through temporaries; glibc keeps
    freed pages, which counted ~20% of SmolLM2's file size in resident memory after load."""
    lib = _glibc()
    if lib is not None:
        lib.malloc_trim(0)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
HEAP_KEEP_BYTES = 256 << 20


def keep_freed_heap(keep: int = HEAP_KEEP_BYTES) -> bool:
    """Let freed NumPy temporaries be reused instead of returned to the OS (glibc only):
    arrays below 32 MB come from the heap rather than their own mmap, and up to ``keep``
    bytes of free heap stay mapped. Without this, each prefill's activation arrays were
    mapped and faulted in afresh: ~30,000 page faults and a fifth of a 138-token prefill
    on SmolLM2 (docs/cpu-backend.md). :func:`trim_host_heap` still returns it all on
    demand (after load, in the memory tests). Returns whether the policy was applied."""
    lib = _glibc()
    if lib is None:
        return False
    return bool(lib.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(
        lib.mallopt(_M_TRIM_THRESHOLD, keep))


_libc: Any = None

_MADV_DONTNEED = 4


def _is_library(name: str) -> bool:
    """Whether a mapped file's name is a shared library's (``libx.so``, ``libx.so.6``)."""
    return ".so" in name and name.split(".so", 1)[1][:1] in ("", ".")


# smaps: a mapping's line (start-end, permissions, offset, device, inode, [path]), then its
# "Key: value" lines. Matched by the regex engine over the whole text: a line-by-line parse
# in Python took ~10 ms of a load's ~0.2 s for a process's few hundred mappings.
_SMAPS_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)[ \t]+(\S+)(?:[ \t]+\S+){3}(?:[ \t]+(\S+))?",
                            re.MULTILINE)
_SMAPS_RSS = re.compile(r"^Rss:[ \t]+(\d+)", re.MULTILINE)
_SMAPS_ANONYMOUS = re.compile(r"^Anonymous:[ \t]+(\d+)", re.MULTILINE)


def library_spans(smaps: str, prefixes: Sequence[str] | None = None
                  ) -> list[tuple[int, int, int]]:
    """``(start, end, resident bytes)`` of each mapping in the text of /proc/self/smaps
    that :func:`release_library_pages` releases: a shared library's (whose file name starts
    with one of ``prefixes``; None: any), not writable, some of it resident, none of it a
    private copy (``Anonymous: 0``)."""
    heads = list(_SMAPS_MAPPING.finditer(smaps))
    names = None if prefixes is None else tuple(prefixes)
    spans: list[tuple[int, int, int]] = []
    for i, head in enumerate(heads):
        name = (head[4] or "").rsplit("/", 1)[-1]
        if "w" in head[3] or not _is_library(name) or (
                names is not None and not name.startswith(names)):
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(smaps)
        rss = _SMAPS_RSS.search(smaps, head.end(), end)
        anonymous = _SMAPS_ANONYMOUS.search(smaps, head.end(), end)
        if rss and int(rss[1]) and anonymous and anonymous[1] == "0":
            spans.append((int(head[1], 16), int(head[2], 16), int(rss[1]) << 10))
    return spans


def release_library_pages(prefixes: Sequence[str] | None = None) -> int:
    """Unmap the resident pages of the shared libraries whose file names start with one of
    ``prefixes`` (None: every shared library) and return how many bytes were resident
    (Linux, glibc; else a no-op).

    Only mappings that cannot be written and hold no private copy of a page (smaps'
    ``Anonymous: 0``) are touched: each page is the file's, so a later call into the
    library faults it in again from the file, unchanged (the page cache still holds it
    until the OS needs the room). After a model's first load most of the code that ran is
    not run again by a reply: numba's LLVM (68 MiB of code pages once the kernels are
    loaded), the tokenizer's build, the header's digest; the few pages a reply runs come
    back at its first call (Llama 3.2 1B: 20 MiB besides the compiler's, ~3.5 MiB of it
    back after a reply)."""
    lib = _glibc()
    if lib is None:
        return 0
    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
    except OSError:
        return 0
    import ctypes

    spans = library_spans(text, prefixes)
    lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    released = 0
    for lo, hi, rss in spans:
        if lib.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) == 0:
            released += rss
    return released


class TokenSampler:
    """Samples one generation's tokens: what :func:`inference.generate.generate_step` calls.

    This default is synchronous: :meth:`sample` returns the id as an int (``backend.sample``
    over a host history). A backend whose device runs ahead of the host returns a subclass
    with ``lazy = True``: :meth:`sample` only queues the work and returns a device token,
    :meth:`as_input` feeds it to the next step without leaving the device, and :meth:`read`
    is the one host read per token, which generate_step makes after queueing the next step.
    """

    lazy = False

    def __init__(self, backend: Backend, params: SamplingParams, prompt_ids: Sequence[int],
                 rng: np.random.Generator):
        self.B = backend
        self.params = params
        self.rng = rng
        self.history = list(prompt_ids)

    def sample(self, row: Any) -> Any:
        """The next token from a ``(vocab,)`` logits row."""
        tok = self.B.sample(row, self.params, self.history, self.rng)
        self.history.append(tok)
        return tok

    def as_input(self, tok: Any) -> Any:
        """A sampled token as the next forward call's ``(1, 1)`` input ids."""
        return self.B.array(np.asarray([[tok]], dtype=np.int64))

    def decode(self, model: Any, tok: Any, cache: Any) -> Any:
        """The logits of the step that feeds ``tok`` to ``model`` (a backend may replay a
        captured step instead of calling the model: CUDA graphs)."""
        return model(self.as_input(tok), cache, last_only=True)

    def read(self, tok: Any) -> int:
        return int(tok)

    def close(self) -> None:
        """The generation is over (ended, stopped or cancelled)."""


class EagerSteps:
    """A backend's decode steps run as they come (no captured step to replay)."""

    def __call__(self, model: Any, ids: Any, cache: Any) -> Any:
        return model(ids, cache, last_only=True)

    def release(self) -> None:
        """Give back what a captured step holds (nothing here)."""


class Backend:
    """Base class. Subclasses implement the ops they support; ``ops()`` reports them."""

    name: str = "base"
    device: str = "cpu"  # human-readable device, e.g. "NVIDIA RTX 4090", "Apple M2 (Metal)"
    # Prompt tokens per prefill forward call (None: the whole prompt at once), and whether a
    # generation's KV cache is allocated for prompt + max_tokens up front (else it grows).
    prefill_chunk: int | None = None
    preallocate_kv: bool = True
    # Float32 score arrays (heads x query rows x keys) one attention call keeps live at once,
    # and hidden-sized float32 rows per prompt token a prefill chunk keeps live besides two
    # intermediate-sized ones (eager backends: input, normed input, attention output, sum).
    score_copies: int = SCORE_COPIES
    hidden_rows: int = 4
    # Whether encoders run a chunk's inputs packed back to back, without padding rows
    # (:meth:`attention_packed`): set where that op is fast; elsewhere inputs are padded.
    packs_rows: bool = False

    # --- memory layout (what inference.memory_estimate reads) ----------------------
    def held_bytes(self, t: TensorData) -> int:
        """Bytes this backend keeps for weight ``t`` once loaded: float32 here."""
        return 4 * math.prod(int(d) for d in t.shape)

    def attention_bytes(self, heads: int, rows: int, keys: int, *, masked: bool = False,
                        capped: bool = False, tensors: Mapping[str, Any] | None = None) -> int:
        """Scratch of one attention call of ``rows`` queries over ``keys`` keys (``heads``:
        batch times heads): its live score arrays, in the query tiles
        :func:`tiled_attention` cuts. ``masked``: a key (padding) mask; ``capped``: soft-
        capped or sliding-window scores; backends whose fused path lacks those override.
        ``tensors``: the model's, by name, for a backend whose attention path depends on
        how its products run (cpu)."""
        r0, r1 = query_tiles(1, heads, rows, keys)[0]
        return self._score_copies(masked, capped) * 4 * heads * (r1 - r0) * keys

    def _score_copies(self, masked: bool, capped: bool) -> int:
        return self.score_copies

    # --- what this backend offers -------------------------------------------------
    def ops(self) -> set[str]:
        return {op for op in OPS
                if op in GENERIC_OPS or getattr(type(self), op, None) is not getattr(Backend, op)}

    def quant_types(self) -> set[str]:
        return set()

    def memory(self) -> MemorySample:
        return MemorySample(None, None, None, host_rss())

    def parallel_calls(self) -> int:
        """How many independent forward calls :meth:`map_calls` runs at once."""
        return 1

    def map_calls(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """``fn`` over ``items`` (independent forward calls, e.g. embedding chunks), results
        in order. One after another here; a backend whose device runs several calls at once
        better than one call spread over it (cpu) overrides this."""
        return map(fn, items)

    def threads(self) -> tuple[int, int] | None:
        """(threads computing now, the most it may use), where the backend chooses them
        (cpu); None elsewhere."""
        return None

    def adapt_threads(self) -> None:
        """Choose the thread count again for the load other processes put on the machine
        (cpu: at a generation's start and each server step); others keep theirs."""

    def synchronize(self, *outputs: Any) -> None:
        """Wait until ``outputs`` (or all queued device work) are computed; used by timing.
        Lazy backends (MLX) need the outputs to know what to evaluate."""

    def end_chunk(self, *outputs: Any) -> None:
        """A prefill chunk is queued: compute ``outputs`` and free its scratch memory."""
        self.synchronize(*outputs)

    def start_generation(self, params: SamplingParams, prompt_ids: Sequence[int],
                         rng: np.random.Generator) -> TokenSampler:
        """Called once per generation, before prefill: per-generation state (peak memory)
        is reset and the sampler for its tokens returned."""
        return TokenSampler(self, params, prompt_ids, rng)

    def prepare(self, model: Any) -> None:
        """Called once a causal ``model`` is loaded on this backend: a backend may do here
        what its first reply would otherwise pay for (cpu: loading compiled kernels)."""

    def decode_steps(self) -> EagerSteps:
        """What runs a caller's decode steps, ``(model, ids, cache) -> logits`` as
        ``model(ids, cache, last_only=True)``: a backend may replay a captured step
        instead (cpu)."""
        return EagerSteps()

    def close(self) -> None:
        """The model using this backend is unloaded: give back what loading took."""

    # --- moving data ----------------------------------------------------------------
    def array(self, a: np.ndarray) -> Any:
        """Host array -> native array."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def weight(self, t: TensorData) -> Any:
        """A linear/embedding weight in this backend's own layout (quantized if it can)."""
        raise NotImplementedError

    def dense(self, t: TensorData) -> Any:
        """A small weight (norm, bias) as a float32 native array."""
        raise NotImplementedError

    # --- ops (see module docstring for conventions) ----------------------------------
    def embedding(self, table: Any, ids: Any) -> Any:
        raise NotImplementedError

    def linear(self, x: Any, w: Any, bias: Any | None = None) -> Any:
        raise NotImplementedError

    def linears(self, x: Any, parts: Sequence[tuple[Any, Any | None]]) -> list[Any]:
        """``linear(x, w, bias)`` for each (w, bias) of ``parts``: linears that read one
        input (q/k/v, gate/up). A backend may compute them in one go (cpu: one prefill's
        products shared out between its threads at once)."""
        return [self.linear(x, w, b) for w, b in parts]
    def rms_norm(self, x: Any, w: Any, eps: float) -> Any:
        raise NotImplementedError

    def layer_norm(self, x: Any, w: Any, b: Any, eps: float) -> Any:
        raise NotImplementedError

    # --- attention over a KV cache: composites of the ops above (a backend may fuse them) -
    def attend_cached(self, q: Any, k: Any, v: Any, cache: Any, layer: int, *, theta: float,
                      freq_factors: Any, scale: float, window: int | None,
                      softcap: float | None) -> Any:
        """q/k/v (b, h, t, d) of ``t`` new tokens of one sequence (or a batch sharing one
        :class:`~inference.kv_cache.KVCache`): RoPE at the cache's position, k/v appended,
        attention over everything cached up to each token."""
        q = self.rope(q, cache.offset, theta, freq_factors=freq_factors)
        k = self.rope(k, cache.offset, theta, freq_factors=freq_factors)
        k, v = cache.update(layer, k, v)
        return self.attention(q, k, v, scale, causal_offset=cache.layer_offset(layer),
                              window=window, softcap=softcap)

    def attend_rows(self, q: Any, k: Any, v: Any, caches: Sequence[Any], layer: int,
                    **kw: Any) -> Any:
        """A decode step (t = 1) in which row ``i`` of q/k/v is the next token of the
        sequence ``caches[i]`` (the server's batched steps; one cache alone is plain
        decode): :meth:`attend_cached` row by row, each row at its own position."""
        if len(caches) == 1:
            return self.attend_cached(q, k, v, caches[0], layer, **kw)
        out = self.zeros(tuple(q.shape))
        for i, c in enumerate(caches):
            part = self.attend_cached(*(self.narrow(a, 0, i, 1) for a in (q, k, v)), c, layer,
                                      **kw)
            out = self.set_slice(out, part, 0, i)
        return out

    def rope(self, x: Any, offset: int, theta: float, traditional: bool = False, *,
             freq_factors: Any | None = None) -> Any:
        """Pair ``i`` at position ``p`` turns by ``p * theta^(-2i/d) / freq_factors[i]``;
        ``freq_factors`` is a native ``(d/2,)`` float32 array (scaled RoPE) or None (all 1)."""
        raise NotImplementedError

    def attention(
        self, q: Any, k: Any, v: Any, scale: float, *, causal_offset: int | None = None,
        key_mask: Any | None = None, window: int | None = None, softcap: float | None = None,
    ) -> Any:
        raise NotImplementedError

    def softcap(self, x: Any, cap: float) -> Any:
        """``cap * tanh(x / cap)`` (Gemma 2's final-logit soft-capping)."""
        raise NotImplementedError

    def silu_mul(self, gate: Any, up: Any) -> Any:
        raise NotImplementedError

    def gelu_tanh_mul(self, gate: Any, up: Any) -> Any:
        """``gelu_tanh(gate) * up``: Gemma's gated MLP (PyTorch's GELU, approximate="tanh")."""
        raise NotImplementedError

    def gelu(self, x: Any) -> Any:
        raise NotImplementedError

    # The ops below are the same on every array library we use (NumPy, CuPy and MLX share
    # these operators, methods and slicing), so they are written once, here.
    def add(self, a: Any, b: Any) -> Any:
        return a + b

    def mul(self, a: Any, b: Any) -> Any:
        return a * b

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def transpose(self, x: Any, axes: tuple[int, ...]) -> Any:
        return x.transpose(axes)

    def zeros(self, shape: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def use_kv_dtype(self, name: str) -> None:
        """Keep KV caches made from now on in ``name`` ("float32", "float16", "bfloat16")
        where this backend can; one clear sentence where it cannot."""
        if name != "float32":
            raise InvalidInputError(f"The {self.name} backend keeps its KV cache in float32, "
                                    f"not {name}.")

    def kv_zeros(self, shape: tuple[int, ...]) -> Any:
        """A zeroed KV cache buffer (KVCache's storage); a backend may store K/V in a
        narrower type than its activations (CUDA's float16 cache mode)."""
        return self.zeros(shape)

    def set_slice(self, dst: Any, src: Any, axis: int, start: int) -> Any:
        """Write ``src`` into ``dst`` at ``start`` along ``axis``; returns the result (MLX
        records the write lazily and writes in place once the old buffer has no user)."""
        dst[_along(dst.ndim, axis, start, start + src.shape[axis])] = src
        return dst

    def narrow(self, x: Any, axis: int, start: int, length: int) -> Any:
        return x[_along(x.ndim, axis, start, start + length)]

    # --- a decoder layer's decode step as one fused op (a backend may offer it) ---------
    def decode_layer(self, block: Any, x: Any, cache: Any) -> Any | None:
        """``block(x, cache)`` (a decoder block of inference/models/llama.py) for one new
        token, fused, or None where this backend has no fused step for it (then the block
        runs op by op, as every backend but CUDA always does)."""
        return None

    # --- an encoder's linear with what follows it (a backend may fuse them) -------------
    def linear_gelu(self, x: Any, w: Any, bias: Any | None) -> Any:
        """``gelu(linear(x, w, bias))``: BERT's MLP up projection."""
        return self.gelu(self.linear(x, w, bias))

    def linear_add_norm(self, x: Any, w: Any, bias: Any | None, residual: Any, nw: Any,
                        nb: Any, eps: float) -> Any:
        """``layer_norm(linear(x, w, bias) + residual, nw, nb, eps)``: a post-norm block's
        output projection, residual and norm."""
        return self.layer_norm(self.add(self.linear(x, w, bias), residual), nw, nb, eps)

    def attention_packed(self, q: Any, k: Any, v: Any, heads: int, scale: float,
                         starts: Sequence[int]) -> Any:
        """q, k, v (1, N, heads * d) hold inputs back to back without padding, input ``i``
        being rows ``starts[i] .. starts[i + 1]``; each row attends to all rows of its own
        input and to no other's. Returns (1, N, heads * d), heads side by side as in q.
        Here: :meth:`attention` over each input alone (backends fuse it)."""
        hd = q.shape[-1]
        out = self.zeros((1, q.shape[1], hd))
        for a, b in zip(starts[:-1], starts[1:], strict=True):
            a, n = int(a), int(b) - int(a)
            q1, k1, v1 = (self.transpose(self.reshape(self.narrow(x, 1, a, n),
                                                      (1, n, heads, hd // heads)), (0, 2, 1, 3))
                          for x in (q, k, v))
            o = self.transpose(self.attention(q1, k1, v1, scale), (0, 2, 1, 3))
            out = self.set_slice(out, self.reshape(o, (1, n, hd)), 1, a)
        return out

    def sample(self, logits: Any, params: SamplingParams, history: list[int],
               rng: np.random.Generator) -> int:
        """Pick the next token from a ``(vocab,)`` logits row; only the id leaves the device."""
        raise NotImplementedError


class OpProfiler:
    """Times every op of one backend instance while active (synchronising around each op).

    Off by default. Activating shadows the op methods on the instance; deactivating removes
    the shadows, so with profiling off the model calls the class methods directly and the
    cost is zero.
    """

    def __init__(self, backend: Backend):
        self.backend = backend
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def _timed(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.backend.synchronize(out)
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0
            self.counts[name] = self.counts.get(name, 0) + 1
            return out

        return timed

    def start(self) -> None:
        for name in self.backend.ops():
            setattr(self.backend, name, self._timed(name, getattr(self.backend, name)))

    def stop(self) -> None:
        for name in OPS:
            self.backend.__dict__.pop(name, None)

    def __enter__(self) -> OpProfiler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
