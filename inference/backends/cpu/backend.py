"""The fast CPU backend: NumPy op semantics, quantized weights, numba kernels.

Weights stay quantized (lane layout, :mod:`.pack`). ``linear`` picks by the number of
token rows ``M``:
- ``M <= MATVEC_ROWS`` (decode): the numba mat-vec kernels read the 4/5/8-bit codes
  directly, parallel over tiles of 32 output rows (types kept as file bytes: the
  :mod:`.raw` kernels, block by block, or for Q2_K/Q3_K with integer activations on
  x86 with AVX2 the :mod:`.kdot` integer-dot kernels over the same bytes);
- larger ``M`` (prefill, teacher forcing): W's rows are shared out between the threads.
  4- and 5-bit packed weights, where the integer kernels group 8 rows with VNNI
  (AVX-512), go by those decode kernels over the rows quantized once (``_rows_plan``):
  no dequantize, and the ``vpdpwssd`` work matches sgemm's FMAs. On AVX2, 4-, 5-, 6- and
  8-bit packed weights take the integer GEMM (:mod:`.gemm_int`, ``_gemm_plan``): each block's
  codes unpacked once for all token rows. Other weights: each
  thread dequantizes its part a chunk at a time into a float32 scratch small enough to
  stay in its core's L2 (``CHUNK_BYTES``) and multiplies the chunk by a one-thread BLAS
  sgemm, which at 100+ rows runs far above what a hand loop reaches.
Dense float32 weights (MiniLM) go straight to BLAS. The token loop's small ops (norms,
RoPE, one-token attention, SiLU) are fused numba loops, since at one token the cost of
NumPy is its per-call overhead, not arithmetic.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache, partial
from typing import Any

import numba
import numpy as np

from inference.backends.base import (
    R,
    T,
    TokenSampler,
    _along,
    query_tiles,
    tiled_attention,
    trim_host_heap,
)
from inference.backends.cpu import attention as attn
from inference.backends.cpu import (
    dequant,
    features,
    fused,
    gemm_int,
    kdot,
    matvec_int,
    quantize,
    raw,
)
from inference.backends.cpu.kernel_load import install as _load_kernels_unrefreshed
from inference.backends.cpu.layout import LANES
from inference.backends.cpu.matvec_float import matvec_q4_f32, matvec_q8_f32, matvec_q8_f32_pairs
from inference.backends.cpu.pack import (
    PackedWeight,
    RawWeight,
    pack,
    packed_bits,
    packed_nbytes,
)
from inference.backends.cpu.replay import (
    CpuSampler,
    NotCapturable,
    StepReplayer,
    Tape,
    window_open,
)
from inference.backends.cpu.routing import (
    BLAS,
    GEMM_INT,
    INTEGER,
    KDOT,
    MATVEC_ROWS,
    PRODUCTS,
    RAW,
    PrefillRoute,
    integer_prefill,
    prefill_route,
    route,
)
from inference.backends.cpu.threads import SpinWorker, launch_kernel_threads
from inference.backends.numpy_backend import NumpyBackend, rope_angles
from inference.errors import InvalidInputError
from inference.formats.tensor import TensorData
from inference.kv_cache import KVCache, row_sources, shared_rows
from inference.sampling import SamplingParams
from inference.threads import BusyCores, threads_for

_load_kernels_unrefreshed()  # a cached kernel loads without numba's registry refresh
ACTIVATIONS_ENV = "INFERDESK_CPU_ACTIVATIONS"
# The weight types and activation modes prepared in this process (CpuBackend.prepare).
_PREPARED: set[tuple[Any, ...]] = set()
# Other processes' load, in cores, above which the prefill workers stop spinning: a
# spinning worker then takes the time slices a busy process and our own threads need.
BUSY_CORES = 0.25
# A prefill product's float32 scratch per thread: written by the dequantize and read at
# once by sgemm, so it should stay in the core's L2 (256 KB-2 MB on current x86). The
# dequantize runs 2.5x faster into 288-768 KB than into the 16 MB of a whole weight
# (Q4_1/Q4_K/Q6_K/Q8_0 at 1536 rows, 1 thread: 1.6-1.9 -> 4.0-4.8 Gweights/s).
CHUNK_BYTES = 512 << 10
# Products with fewer weights than this run whole on the calling thread: sharing out a
# 192x576 product cost more in hand-offs than it saved.
SHARE_MIN = 256 << 10


def _tile_step(k: int) -> int:
    """Tiles of ``LANES`` rows of a packed (out, k) weight dequantized at once (scratch)."""
    return max(1, CHUNK_BYTES // (4 * k * LANES))


def _row_step(k: int) -> int:
    """Rows of a raw (out, k) weight dequantized at once."""
    return max(1, CHUNK_BYTES // (4 * k))


ACTIVATIONS = ("int16", "int8", "float")


def _activations(requested: str | None) -> str:
    """How decode mat-vecs take their activations (:mod:`.matvec_int`): quantized to "int16"
    (the default: float parity, 2x the float kernels on 4-bit weights) or "int8" (faster,
    llama.cpp's numerics) for integer dot products (every target has a form of them:
    :func:`features.form`), or "float". The argument wins, then the environment variable
    ``INFERDESK_CPU_ACTIVATIONS``."""
    import os

    mode = requested or os.environ.get(ACTIVATIONS_ENV) or "int16"
    if mode not in ACTIVATIONS:
        raise InvalidInputError(
            f"{ACTIVATIONS_ENV} must be one of {', '.join(ACTIVATIONS)}, not {mode!r}")
    return mode


class CpuBackend(NumpyBackend):
    name = "cpu"
    # (done, total, what) as prepare() readies kernels (numba compiles any not yet cached)
    compile_progress: Callable[[int, int, str], None] | None = None
    device = "CPU (numba kernels, quantized weights)"
    score_copies = 1  # the fused softmax works in place
    own_threads = True  # shares work out between its threads; BLAS runs one (_share)
    packs_rows = True  # encoders: attention_packed, one numba pass (embed.embed_ids)

    def __init__(self, activations: str | None = None, step_replay: bool = True) -> None:
        import numba

        self.activations = _activations(activations)
        self.step_replay = step_replay  # decode by replaying a captured step (replay)
        self._local = threading.local()  # dequant scratch: one per thread (map_calls)
        self._rope: dict[tuple[float, int, bytes], tuple[np.ndarray, np.ndarray]] = {}
        # The most numba runs (get_num_threads would start its threads: prepare does).
        self._threads = numba.config.NUMBA_NUM_THREADS
        # Until set_threads pins a count: the most threads adapt_threads may choose.
        self._auto: int | None = self._threads
        # Other processes' load, watched from now on: the first choice, at the first
        # generation, already rests on what ran during the load.
        self._busy: BusyCores | None = BusyCores()
        self._parked = False  # the workers sleep between parts (other processes are busy)
        self.omp_wait: str | None = None  # how numba's threads wait (launch_kernel_threads)
        self._blas: Any = None
        self._pool: list[SpinWorker] | None = None
        self._sharing = threading.Lock()  # one share-out at a time has the worker threads
        # Each model's decode-step replayer, kept between generations (borrow_steps), and
        # the ones a generation has now.
        self._steps: weakref.WeakKeyDictionary[Any, StepReplayer] = (
            weakref.WeakKeyDictionary())
        self._lent: set[StepReplayer] = set()
        self._steps_lock = threading.Lock()
        self.kv_dtype = np.dtype(np.float32)
        self._qtypes: set[str] = set()  # the weight types loaded (prepare's key)
        # Each loaded weight's type by the id of what weight() returned (prepare: which
        # types only the embedding table and the output head hold); emptied by prepare.
        self._weight_types: dict[int, str] = {}

    def use_kv_dtype(self, name: str) -> None:
        if name not in ("float32", "float16"):
            raise InvalidInputError(f"The cpu backend keeps its KV cache in float32 or "
                                    f"float16, not {name!r}.")
        self.kv_dtype = np.dtype(name)

    def kv_zeros(self, shape: tuple[int, ...]) -> np.ndarray:
        return zeros_on_touch(shape, self.kv_dtype)

    def set_threads(self, n: int) -> None:
        """Compute with ``n`` threads from now on, whatever the load (adapt_threads stops)."""
        self._auto = None
        self._use_threads(n)

    def _use_threads(self, n: int) -> None:
        import numba

        self._threads = max(1, min(n, numba.config.NUMBA_NUM_THREADS))
        numba.set_num_threads(self._threads)
        # Tiles are split statically (numba's default), as the app runs them: dynamic
        # chunks of 2 tiles decoded 7% slower on a quiet machine, and with another
        # process busy on one core both schedules stalled alike (chunks of 1 tile:
        # 342 tok/s against 254 in a loaded prefill, still far below one thread's 541).

    def threads(self) -> tuple[int, int]:
        return self._threads, self._auto or self._threads

    def adapt_threads(self) -> None:
        """Unless set_threads pinned a count: one thread per core other processes leave
        free (:func:`inference.threads.threads_for`), chosen again at most every
        LOAD_WINDOW_S seconds from the load since the last choice; between choices a
        clock read, so it runs before every decode step. While other processes keep
        more than ``BUSY_CORES`` of a core busy, the prefill workers sleep between parts
        instead of spinning (:meth:`.threads.SpinWorker.park`), pinned count or not."""
        if self._busy is None:  # the first look starts the window
            self._busy = BusyCores()
            return
        others = self._busy.others()
        if others is None:
            return
        parked = others > BUSY_CORES
        if parked != self._parked:
            self._parked = parked
            for worker in self._pool or []:
                worker.park(parked)
        if self._auto is None:  # a pinned count: the workers park, the count stays
            return
        n = threads_for(self._auto, others, self._busy.cores)
        if n != self._threads:
            self._use_threads(n)

    def _busy_now(self) -> bool:
        """Whether other processes keep more than ``BUSY_CORES`` busy now: over the load
        watched since the backend was made (at least 0.1 s), else the 1-minute load
        average less this process."""
        others = self._busy.others(0.1, peek=True) if self._busy is not None else None
        if others is None:
            others = max(0.0, os.getloadavg()[0] - 1.0)
        return others > BUSY_CORES

    def start_generation(self, params: SamplingParams, prompt_ids: Sequence[int],
                         rng: np.random.Generator) -> TokenSampler:
        self.adapt_threads()
        return CpuSampler(self, params, prompt_ids, rng)

    def decode_steps(self) -> StepReplayer:
        return StepReplayer(self)

    def borrow_steps(self, model: Any) -> tuple[StepReplayer, bool]:
        """The replayer of ``model``'s decode steps for one generation, and whether it is
        the one kept for the model (hand it back with :meth:`return_steps`). Kept from
        one generation to the next, its captures and checks outlive the generation: the
        next one rebinds the capture to its own cache instead of capturing anew, and
        once a rebinding was checked, runs no eager step at all. A generation that runs
        while another has the kept one (or of a model that cannot be a weak key) gets a
        replayer of its own, as before."""
        with self._steps_lock:
            try:
                steps = self._steps.get(model)
                if steps is None:
                    steps = self._steps[model] = StepReplayer(self)
            except TypeError:  # not hashable or not weakly referable
                return StepReplayer(self), False
            if steps in self._lent:
                return StepReplayer(self), False
            self._lent.add(steps)
        steps.eager_reason = None  # replays stopped in the last generation: tried again
        return steps, True

    def return_steps(self, steps: StepReplayer) -> None:
        """A generation ended with ``steps`` (:meth:`borrow_steps`): they let go of its
        cache and wait for the model's next generation."""
        steps.let_go()
        with self._steps_lock:
            self._lent.discard(steps)

    def drop_steps(self) -> None:
        """Forget the kept replayers (the next generation of every model captures anew)."""
        with self._steps_lock:
            self._steps.clear()

    def prepare(self, model: Any) -> None:
        """The compiled kernels the first reply runs, loaded now, at load (numba loads a
        kernel from its cache at the kernel's first call: ~0.3 s of CPU for a model's set,
        which the first reply paid and later ones did not): each loaded weight type's
        products on a small zero weight (decode rows, a captured step's two calls, a
        prefill, an embedding lookup), then the row norm, RoPE, a prefill's attention,
        the model's activation (SiLU or GELU) and a decode step's attention on small
        inputs. The model's weights are not read: they stay where the load left them until
        a reply needs them. Once per process for each set of types, activation mode and
        KV cache type."""
        from inference.backends.cpu.warm import activation, has_zero_weight, products

        self.omp_wait = launch_kernel_threads(self._busy_now())  # before any kernel runs
        layers, head, table = self._weight_roles(model)
        key = (frozenset(layers), frozenset(head), table, self.activations, str(self.kv_dtype))
        if key in _PREPARED:
            return
        qtypes = sorted(filter(has_zero_weight, layers | head))
        say = self.compile_progress or (lambda *_: None)
        say(0, len(qtypes) + 1, "")
        for i, qtype in enumerate(qtypes):
            # A type only the head holds runs one row a step: a prompt's last row only.
            products(self, qtype, prefill=qtype in layers,
                     embedding=table is None or qtype == table)
            say(i + 1, len(qtypes) + 1, f"{qtype} products")
        self._weight_types.clear()  # the zero weights products() made
        x = np.ones((1, 2, 3, 64), np.float32)
        self.rms_norm(x, np.ones(64, np.float32), 1e-6)
        op = getattr(getattr(model, "args", None), "mlp_op", "silu_mul")
        activation(self, op)  # decode rows and a prefill's shared out, whole and column views
        self.rope(x, 0, 10000.0)
        self.attention(x, x[:, :1], x[:, :1], 0.125, causal_offset=0)
        # A prefill's attention takes numba's threads or, with one core free, BLAS and the
        # fused softmax; the cores free at the reply may not be those free now: load both.
        self._attend_prefill(x, x[:, :1], x[:, :1], 0.125, 0)
        fused.softmax_scores(np.zeros((1, 2, 3, 3), np.float32), 0.125, 0,
                             np.ones((1, 3), np.float32))
        # A decode step's heads (transposed views) through attend_rows into a one-layer cache.
        heads = np.ones((1, 1, 2, 64), np.float32).transpose(0, 2, 1, 3)
        self.attend_rows(heads, heads[:, :1], heads[:, :1], [KVCache(self, 1)], 0,
                         theta=10000.0, freq_factors=None, scale=0.125, window=None,
                         softcap=None)
        say(len(qtypes) + 1, len(qtypes) + 1, "norms, RoPE, attention")
        _PREPARED.add(key)

    def _weight_roles(self, model: Any) -> tuple[set[str], set[str], str | None]:
        """The weight types a reply multiplies by at prefill (every weight but the
        embedding table and the output head), the types only those two hold, and the
        table's type; where the model names no ``embed_tokens``, every loaded type in the
        first and None. The record of loaded weights is emptied."""
        types, self._weight_types = self._weight_types, {}
        table = getattr(model, "embed_tokens", None)
        if table is None or id(table) not in types:
            return set(self._qtypes), set(), None
        ends = {id(table), id(getattr(model, "lm_head", table))}
        layers = {q for i, q in types.items() if i not in ends}
        head = {types[i] for i in ends if i in types} - layers
        return layers, head, types[id(table)]

    # --- a decode step's replay calls (replay) ----------------------------------------
    @property
    def _tape(self) -> Tape | None:
        """The tape of the decode step this thread is capturing, if any (per thread: the
        server's embedding calls may run beside a capture on the scheduler thread)."""
        return getattr(self._local, "tape", None)

    @_tape.setter
    def _tape(self, tape: Tape | None) -> None:
        self._local.tape = tape

    def _taped(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` now, and again at each replay of the step being captured."""
        fn(*args)
        if self._tape is not None:
            self._tape.calls.append(partial(fn, *args))

    def _input(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """``x`` reshaped, as C-contiguous float32 (what the kernels read); where that
        copies, a capture replays the copy."""
        y = np.ascontiguousarray(np.reshape(x, shape), dtype=np.float32)
        if self._tape is not None and not np.may_share_memory(y, x):
            self._tape.calls.append(partial(_copy_into, y, x))
        return y

    def _unit_rows(self, x: np.ndarray, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """``x`` reshaped (default: rows (T, n)) as float32 rows of unit stride, a view
        where it is one (the columns of a stacked product's output: the kernels read each
        row through :func:`.ir._unit`), else a copy as :meth:`_input` makes."""
        shape = shape or (-1, x.shape[-1])
        if x.dtype == np.float32 and x.strides[-1] == 4 and x.size:
            y = np.reshape(x, shape)
            if np.may_share_memory(y, x) and y.strides[-1] == 4:  # a view, not a copy
                return y
        return self._input(x, shape)

    def _recomputed(self, fn: Callable[..., np.ndarray], *args: Any) -> np.ndarray:
        """``fn(*args)``, a NumPy expression allocating its result; a capture replays it
        whole, copied into the captured output."""
        out = fn(*args)
        if self._tape is not None:
            self._tape.calls.append(lambda: np.copyto(out, fn(*args)))
        return out

    def _untaped(self, what: str) -> None:
        if self._tape is not None:
            raise NotCapturable(f"{what} has no replay")

    # --- independent calls: one per core ---------------------------------------------
    def parallel_calls(self) -> int:
        return self._threads

    def map_calls(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """Up to one worker thread per core, the cores shared out among the calls (BLAS
        capped at threads // workers: 1 on a 2-core machine with 2+ calls).

        Why: an encoder call is GEMMs with small ops between them. Two BLAS threads share
        each GEMM well (1.9x), but the small ops stay serial, and a parallel numba pool
        next to OpenBLAS's spinning threads halved throughput. Whole calls side by side
        scale everything; the kernels and NumPy release the GIL. Measured on MiniLM, 1,000
        sentences, 2 cores: 256 sentences/s with 2 BLAS threads, 291 side by side."""
        n = min(self._threads, len(items))
        if n <= 1:
            yield from map(fn, items)
            return
        cores = self._threads // n

        def call(item: T) -> R:
            self._local.cores = cores  # what this call's own sharing may use (_share)
            return fn(item)

        with self._blas_threads(cores), ThreadPoolExecutor(n, "cpu-call") as pool:
            yield from pool.map(call, items)

    def _blas_libs(self) -> list[Any]:
        """threadpoolctl's handles on the loaded BLAS libraries (found once: ~ms)."""
        if self._blas is None:
            try:
                from threadpoolctl import ThreadpoolController
            except ImportError:
                self._blas = []
            else:
                self._blas = ThreadpoolController().select(user_api="blas").lib_controllers
        return self._blas

    @contextlib.contextmanager
    def _blas_threads(self, n: int) -> Iterator[None]:
        """BLAS capped at ``n`` threads inside the block (OpenBLAS takes this only from the
        thread that started it; elsewhere it stays as it was)."""
        libs = self._blas_libs()
        before = [lib.num_threads for lib in libs]
        for lib in libs:
            lib.set_num_threads(n)
        try:
            yield
        finally:
            for lib, m in zip(libs, before, strict=True):
                lib.set_num_threads(m)

    @staticmethod
    @contextlib.contextmanager
    def _numba_threads(n: int) -> Iterator[None]:
        """numba's parallel kernels called from this thread run on ``n`` threads inside the
        block (numba keeps the count per calling thread)."""
        before = numba.get_num_threads()
        numba.set_num_threads(n)
        try:
            yield
        finally:
            numba.set_num_threads(before)

    # --- weights ---------------------------------------------------------------------
    def weight(self, t: TensorData) -> Any:
        self._qtypes.add(t.qtype)
        if t.qtype == "F32" or len(t.shape) != 2:
            w = self.dense(t)
        else:
            w = pack(t)
            if t.nbytes >= 1 << 20:  # repacking frees a few MB of temporaries per tensor
                trim_host_heap()
        self._weight_types[id(w)] = t.qtype
        return w

    def held_bytes(self, t: TensorData) -> int:
        if t.qtype == "F32" or len(t.shape) != 2:
            return super().held_bytes(t)
        packed = packed_nbytes(t)
        return t.nbytes if packed is None else packed

    def attention_bytes(self, heads: int, rows: int, keys: int, *, masked: bool = False,
                        capped: bool = False, tensors: Mapping[str, TensorData] | None = None
                        ) -> int:
        """As :meth:`Backend.attention_bytes`; a prefill's causal attention on numba's
        threads (:meth:`_attend_prefill`, a model whose products run there) holds four rows
        of scores per thread."""
        if (not (masked or capped) and tensors is not None and self._shares(heads) > 1
                and self._numba_products(tensors)):
            return self._shares(heads) * 4 * 4 * keys
        return super().attention_bytes(heads, rows, keys, masked=masked, capped=capped,
                                       tensors=tensors)

    def _score_copies(self, masked: bool, capped: bool) -> int:
        # Soft-capped or windowed scores take the NumPy path (see attention).
        return NumpyBackend.score_copies if capped else self.score_copies

    def gemm_scratch_bytes(self, t: TensorData) -> int:
        """Float32 scratch a prefill product with weight ``t`` dequantizes into, one chunk
        per thread (0 for a float32 weight, which BLAS reads as it is)."""
        if t.qtype == "F32" or len(t.shape) != 2:
            return 0
        n_out, k = int(t.shape[0]), int(t.shape[1])
        if packed_nbytes(t) is not None:
            chunk = 4 * k * min(-(-n_out // LANES), _tile_step(k)) * LANES
        else:
            chunk = 4 * k * min(n_out, _row_step(k))
        return chunk * self._threads

    def dense(self, t: TensorData) -> np.ndarray:
        # A copy: a view would keep the whole memory-mapped file resident after load.
        return np.array(super().dense(t), dtype=np.float32, copy=True)

    # --- linear ------------------------------------------------------------------------
    def linear(self, x: np.ndarray, w: Any, bias: np.ndarray | None = None) -> np.ndarray:
        n_out, k = w.shape
        lead = x.shape[:-1]
        # One GEMM over all rows: (b, t, k) @ w.T would be b small GEMMs.
        x2 = self._input(x, (-1, k))
        kind = route(w, x2.shape[0], self.activations, self._tape is not None)
        if kind in (BLAS, KDOT, RAW):
            y = np.empty((x2.shape[0], n_out), dtype=np.float32)
            if kind == BLAS:
                self._taped(np.matmul, x2, w.T, y)
            elif kind == KDOT:
                self._taped(kdot.linear, w.bytes, w.code, x2, quantize.level(self.activations),
                            y)
            else:
                self._taped(raw.matvec, w.bytes, w.code, x2, y)
        elif kind == PRODUCTS:
            self._untaped("a prefill product")
            y = self._products(x2, [w])[0]
        else:  # MATVEC_FLOAT, MATVEC_INT
            y = self._matvec(x2, w)
        if bias is not None:
            self._taped(np.add, y, bias, y)
        return y.reshape(*lead, n_out)

    def linears(self, x: np.ndarray, parts: Sequence[tuple[Any, np.ndarray | None]]
                ) -> list[np.ndarray]:
        """Prefill: the quantized products of one input shared out in one go (one hand-off
        to the threads for q/k/v of different types, and none left on one core)."""
        rows = x.size // x.shape[-1]
        if len(parts) == 1 or rows <= MATVEC_ROWS or self._tape is not None:
            return super().linears(x, parts)  # each linear reads x itself (and tapes it)
        ys = self._products(self._input(x, (rows, x.shape[-1])), [w for w, _ in parts])
        for y, (_, bias) in zip(ys, parts, strict=True):
            if bias is not None:
                np.add(y, bias, out=y)
        return [y.reshape(*x.shape[:-1], y.shape[1]) for y in ys]

    def _matvec(self, x: np.ndarray, w: PackedWeight) -> np.ndarray:
        out = _lanes_out(x.shape[0], w)
        tape = self._tape
        if tape is not None and self.activations != "float":
            # Captured: the quantize and the kernel as two calls over fixed buffers, the
            # quantized rows shared by consecutive linears of one input (q, k, v of
            # different types).
            narrow = quantize.narrow(self.activations, w.bits)
            key = (x.ctypes.data, x.shape, x.strides, narrow)  # a new view of the same rows too
            if tape.quantized is None or tape.quantized[0] != key \
                    or tape.quantized[2] != len(tape.calls):
                fill, xq = quantize.quantize_call(x, self.activations, narrow)
                self._taped(fill)
                tape.quantized = (key, xq, len(tape.calls))
            self._taped(*self._idot(w, tape.quantized[1], out))
        else:
            self._taped(self._matvec_into, x, w, out)
        if out.shape[1] != w.shape[0]:
            y = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
            self._taped(np.copyto, y, out[:, : w.shape[0]])
            out = y
        if tape is not None and tape.quantized is not None:
            tape.quantized = (*tape.quantized[:2], len(tape.calls))
        return out

    def _idot(self, w: PackedWeight, xq: tuple[np.ndarray, ...], out: np.ndarray
              ) -> tuple[Any, ...]:
        """The integer-dot mat-vec of ``w`` over quantized rows ``xq``, as (kernel, *args)."""
        return (matvec_int.matvec_packed_int, w.codes, w.blocks, w.halves, w.flat, w.high,
                w.kind, w.zero, *xq, out)

    def _matvec_into(self, x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
        """out (T, tiles * LANES) = x @ W.T, the rows past W's padded to whole tiles."""
        if self.activations == "float":
            self._matvec_float(x, w, out)
            return
        # One numba call: the rows quantized inside it (matvec_int.linear_packed_int),
        # bitwise as quantize_rows + the kernel (the tape's two calls).
        level = quantize.level(self.activations, quantize.narrow(self.activations, w.bits))
        matvec_int.linear_packed_int(w.codes, w.blocks, w.halves, w.flat, w.high, w.kind,
                                     w.zero, x, level, out)

    def _matvec_float(self, x: np.ndarray, w: PackedWeight, out: np.ndarray) -> None:
        # Pairs of rows of 8-bit scale-only codes (Q8_0, Q6_K) share one conversion of the
        # codes to float: 2.1x the one-row kernel per row (Q8_0 49152x576, 8 rows, 1
        # thread: docs/server.md). 4-bit codes convert cheaply; there sharing measured
        # 0.6-0.8x, as both kernels are bound by loads and FMAs. The affine layouts are
        # left out because ``scale * sum + bias * xsum`` lets LLVM choose which product to
        # fuse per compiled loop, so a row could differ from the row alone.
        even = x.shape[0] - x.shape[0] % 2 if w.scale_only_int8 else 0
        if even:
            matvec_q8_f32_pairs(w.codes, w.blocks, w.halves, w.flat, w.kind, x[:even],
                                out[:even])
        if even == x.shape[0]:
            return
        if w.bits == 8:
            matvec_q8_f32(w.codes, w.blocks, w.halves, w.flat, w.kind, w.zero, x[even:],
                          out[even:])
        else:
            matvec_q4_f32(w.codes, w.blocks, w.halves, w.flat, w.high, w.kind, w.zero,
                          x[even:], out[even:])

    def _buffer(self, n: int) -> np.ndarray:
        buf = getattr(self._local, "scratch", None)
        if buf is None or buf.size < n:
            buf = self._local.scratch = np.empty(n, dtype=np.float32)
        return buf[:n]

    def _products(self, x: np.ndarray, ws: Sequence[PackedWeight | RawWeight | np.ndarray]
                  ) -> list[np.ndarray]:
        """x @ W.T for each W of ``ws``: their row units (lane tiles, or rows of file bytes)
        shared out between the threads in one go (:meth:`_share`), each thread
        dequantizing its units ``step`` at a time into its scratch and multiplying them
        there by a one-thread sgemm.

        Why not dequantize on one thread and let BLAS share the sgemm: that serial step
        was a quarter of a 2-thread prefill, and out of L2 it ran at 1.6-1.9 Gweights/s."""
        routes = [self._prefill_route(w) for w in ws]
        big = sum(w.shape[0] * w.shape[1] for w in ws) >= SHARE_MIN
        integer = all(r == INTEGER for r in routes)
        self._local.numba_products = integer  # the pool SiLU and attention follow
        if integer:
            return self._integer_products(x, ws, big)
        xqs: dict[bool, tuple[np.ndarray, ...]] = {}  # by quantize.narrow: q/k/v share them
        plans = [self._rows_plan(self._quantized(x, w.bits, xqs), w) if r == INTEGER
                 else self._gemm_plan(self._quantized(x, w.bits, xqs), w) if r == GEMM_INT
                 else self._plan(x, w) for w, r in zip(ws, routes, strict=True)]
        starts = [0]
        for _, _, units, _ in plans:
            starts.append(starts[-1] + units)

        def part(a: int, b: int) -> None:
            for (_, product, units, step), s0 in zip(plans, starts, strict=False):
                lo, hi = max(a, s0) - s0, min(b, s0 + units) - s0
                for u0 in range(lo, hi, step):
                    product(u0, min(hi, u0 + step))

        self._share(starts[-1] if big else 1, part, whole=starts[-1])
        return [y for y, _, _, _ in plans]

    def _integer_products(self, x: np.ndarray, ws: Sequence[PackedWeight], big: bool
                          ) -> list[np.ndarray]:
        """:meth:`_products` when every W takes the integer kernels: ``x`` quantized once
        per storage, then each W's decode kernel over all the rows, W's tiles split between
        numba's threads (its ``prange``), the quantized rows shared. A row's result is the
        bits the decode mat-vec gives it alone. ``big``: as in :meth:`_products`.

        Why numba's threads and not :meth:`_share`: a part handed to a worker runs Python,
        so the worker first waits for the GIL the caller holds, asleep, and waking it costs
        what its spin saves (an empty share-out ~66 us on a 2-vCPU KVM guest, an OpenMP
        region ~2 us). Q3_K_M prefill at 2 threads, in turns in one process: 586 -> 733
        tok/s (medians of 8), the same bits; 1 thread unchanged; slower than before with
        another process busy on a core (docs/cpu-backend.md, "One pool for the
        prefill")."""
        narrows = [quantize.narrow(self.activations, w.bits) for w in ws]
        xqs = {n: quantize.quantize_rows(x, self.activations, n) for n in set(narrows)}
        ys = []
        with self._numba_threads(self._shares(x.shape[0]) if big else 1):
            for n, w in zip(narrows, ws, strict=True):
                out = _lanes_out(x.shape[0], w)
                kernel, *args = self._idot(w, xqs[n], out)
                kernel(*args)
                ys.append(_w_columns(out, w))
        return ys

    def _plan(self, x: np.ndarray, w: PackedWeight | RawWeight | np.ndarray
              ) -> tuple[np.ndarray, Callable[[int, int], None], int, int]:
        """(y, product(u0, u1) writing units u0..u1's columns of y, units, step)."""
        n_out, k = w.shape
        y = np.empty((x.shape[0], n_out), dtype=np.float32)
        if isinstance(w, np.ndarray):  # float32: BLAS reads it as it is
            def dense(r0: int, r1: int) -> None:
                np.matmul(x, w[r0:r1].T, out=y[:, r0:r1])

            return y, dense, n_out, n_out
        if isinstance(w, RawWeight):
            def rows(r0: int, r1: int) -> None:
                if w.code is None:
                    wr = w.rows(r0, r1)
                else:
                    wr = self._buffer((r1 - r0) * k).reshape(r1 - r0, k)
                    raw.dequant_rows(w.bytes, w.code, r0, r1, wr)
                np.matmul(x, wr.T, out=y[:, r0:r1])

            return y, rows, n_out, _row_step(k)

        def tiles(t0: int, t1: int) -> None:
            wt = self._buffer(k * (t1 - t0) * LANES).reshape(k, (t1 - t0) * LANES)
            dequant.dequant_t(w.codes, w.blocks, w.halves, w.high, w.kind, w.bits, w.zero, w.groups,
                        t0, t1, wt)
            r0, r1 = t0 * LANES, min(n_out, t1 * LANES)
            np.matmul(x, wt[:, : r1 - r0], out=y[:, r0:r1])

        return y, tiles, len(w.codes) // w.groups, _tile_step(k)

    def _gemm_plan(self, xq: tuple[np.ndarray, ...], w: PackedWeight
                   ) -> tuple[np.ndarray, Callable[[int, int], None], int, int]:
        """As :meth:`_plan`, by the integer GEMM (:mod:`.gemm_int`) over the rows quantized
        once (``xq``): W's tiles shared out, each thread's whole range in one call. Each
        row's result is the bits the decode mat-vec gives it."""
        out = _lanes_out(xq[0].shape[0], w)
        tiles = len(w.codes) // w.groups

        def tiles_(t0: int, t1: int) -> None:
            gemm_int.gemm_int(w.codes, w.high, w.blocks, w.kind, w.zero, *xq, out, t0, t1)

        return _w_columns(out, w), tiles_, tiles, tiles

    def _prefill_route(self, w: PackedWeight | RawWeight | np.ndarray) -> PrefillRoute:
        """The kernel of ``w`` in a prefill product: routing's table
        (:func:`.routing.prefill_route`) for this backend's activations and CPU."""
        return prefill_route(w, self.activations, self._numba_prefill())

    def _numba_prefill(self) -> bool:
        """Whether prefill's packed products take the integer kernels, on numba's threads:
        a CPU whose kernels group 8 rows with VNNI, integer activations, a threading layer
        that runs kernels from two threads at once."""
        return (self.activations != "float" and matvec_int.vnni_groups()
                and _concurrent_kernels())

    def _after_numba_products(self) -> bool:
        """Whether this thread's latest prefill products ran on numba's threads: then SiLU
        and attention run there too, else on the workers or serially, so that a prefill
        keeps to one pool. Beside the workers of :meth:`_share`, an OpenMP region's workers
        spin on the same cores: attention alone on numba's threads next to shared-out
        products took a 2-thread Q3_K_M prefill from 762 to 450 tok/s."""
        return getattr(self._local, "numba_products", False)

    def _numba_products(self, tensors: Mapping[str, TensorData]) -> bool:
        """Whether a model of ``tensors`` has every layer's product on numba's threads
        (what :meth:`_after_numba_products` will say during its prefill)."""
        numba_prefill = self._numba_prefill()
        return numba_prefill and all(
            integer_prefill(packed_bits(t), numba_prefill) for name, t in tensors.items()
            if len(t.shape) == 2 and ("layers." in name or name.startswith("blk.")))

    def _quantized(self, x: np.ndarray, bits: int, done: dict[bool, tuple[np.ndarray, ...]]
                   ) -> tuple[np.ndarray, ...]:
        """:func:`quantize.quantize_rows` of ``x`` for ``bits``-bit codes, its rows shared
        out between the threads (~1.3 ns an element on one: ~1 ms a SmolLM2 layer at 138
        tokens); once per storage type, kept in ``done``."""
        narrow = quantize.narrow(self.activations, bits)
        if narrow not in done:
            _, xq = quantize.quantize_call(x, self.activations, narrow)
            self._share(x.shape[0], lambda a, b: quantize.quantize_part(
                x, self.activations, xq, a, b))
            done[narrow] = xq
        return done[narrow]

    def _rows_plan(self, xq: tuple[np.ndarray, ...], w: PackedWeight
                   ) -> tuple[np.ndarray, Callable[[int, int], None], int, int]:
        """As :meth:`_plan`, by the decode kernels over the rows quantized once (``xq``,
        :func:`quantize.quantize_rows`), on one thread a range of token rows: each row's
        result is the bits it gets in a decode step's mat-vec."""
        rows = xq[0].shape[0]
        out = _lanes_out(rows, w)

        def rows_(r0: int, r1: int) -> None:
            with self._numba_threads(1):  # per thread: the workers' and the caller's
                matvec_int.matvec_packed_int_range(w.codes, w.blocks, w.halves, w.flat, w.high,
                                                   w.kind, w.zero, *xq, out, r0, r1)

        return _w_columns(out, w), rows_, rows, rows

    def _share(self, units: int, part: Callable[[int, int], None], whole: int = 0) -> None:
        """``part(u0, u1)`` over ``units`` split into one contiguous range per thread: the
        caller's and the workers' (:mod:`.threads`), each part calling a one-thread BLAS.
        On the caller alone with one unit (``whole``: the units ``part`` then covers), one
        thread, inside :meth:`map_calls` (whose calls have the cores shared out), while
        another thread has the workers, or where OpenBLAS runs a pool of its own (numpy
        loaded before ``inference``, or threads asked of it): two threads' multi-threaded
        calls on one pool measured 10-50x slower than either alone."""
        n = self._shares(units)
        if n <= 1 or not self._sharing.acquire(blocking=False):
            part(0, whole or units)
            return
        try:
            workers = self._workers()[: n - 1]
            n = len(workers) + 1  # adapt_threads (another thread) may have shrunk the pool
            bounds = [units * i // n for i in range(n + 1)]
            for i, worker in enumerate(workers, 1):
                worker.start(part, bounds[i], bounds[i + 1])
            try:
                part(bounds[0], bounds[1])
            finally:
                for worker in workers:
                    worker.join()
        finally:
            self._sharing.release()

    def _shares(self, units: int) -> int:
        """Into how many parts :meth:`_share` would split ``units`` now (1: the caller's)."""
        n = min(getattr(self._local, "cores", self._threads), units)
        return 1 if n <= 1 or self._blas_pool() else n

    def _blas_pool(self) -> bool:
        """Whether BLAS runs calls on threads of its own (more than one thread)."""
        return any(lib.num_threads > 1 for lib in self._blas_libs())

    def _workers(self) -> list[SpinWorker]:
        """The threads prefill work is shared with (besides the caller's): they spin for
        the next part between share-outs (:mod:`.threads`)."""
        if self._pool is None or len(self._pool) != self._threads - 1:
            _close_all(self._pool or [])
            self._pool = [SpinWorker(f"cpu-share-{i}") for i in range(self._threads - 1)]
            for worker in self._pool:
                worker.park(self._parked)
            weakref.finalize(self, _close_all, self._pool)  # no threads outlive the backend
        return self._pool

    def embedding(self, table: Any, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.reshape(-1)
        rows = np.empty((flat.size, table.shape[1]), dtype=np.float32)
        if isinstance(table, np.ndarray):
            self._taped(partial(np.take, axis=0, out=rows), table, flat)
        elif isinstance(table, RawWeight):
            self._taped(_raw_rows, table, flat, rows)
        else:
            self._taped(dequant.gather_rows, table.codes, table.blocks, table.halves, table.kind,
                        table.bits, table.zero, table.groups, flat, rows)
        return rows.reshape(*ids.shape, table.shape[1])

    # --- the generic ops, with replay calls while a step is captured -----------------
    def add(self, a: np.ndarray, b: Any) -> np.ndarray:
        if self._tape is None:
            return a + b
        out = np.add(a, b)
        self._tape.calls.append(partial(np.add, a, b, out))
        return out

    def mul(self, a: np.ndarray, b: Any) -> np.ndarray:
        if self._tape is None:
            return a * b
        out = np.multiply(a, b)
        self._tape.calls.append(partial(np.multiply, a, b, out))
        return out

    def reshape(self, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        y = x.reshape(shape)
        if self._tape is not None and not np.may_share_memory(y, x):
            self._tape.calls.append(partial(_copy_into, y, x))
        return y

    def set_slice(self, dst: np.ndarray, src: np.ndarray, axis: int, start: int) -> np.ndarray:
        """While a decode step is captured, a write of rows into a 4-D buffer along axis 2
        is a KV cache write: it moves with the position at replay. Other writes (a batched
        step's attention rows) replay in place."""
        n = src.shape[axis]
        dst[_along(dst.ndim, axis, start, start + n)] = src
        if self._tape is not None and not (dst.ndim == 4 and axis == 2):
            self._tape.calls.append(partial(np.copyto, dst[_along(dst.ndim, axis, start,
                                                                   start + n)], src))
        elif self._tape is not None:
            at = self._tape.at(start)

            def write() -> None:
                row = at()
                dst[_along(dst.ndim, axis, row, row + n)] = src

            self._tape.calls.append(write)
        return dst

    # --- fused small ops -------------------------------------------------------------
    def rms_norm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        x2 = self._input(x, (-1, x.shape[-1]))
        out = np.empty_like(x2)
        self._taped(fused.rms_norm_rows, x2, w, eps, out)
        return out.reshape(x.shape)

    def layer_norm(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        out = np.empty_like(x2)
        fused.layer_norm_rows(x2, w, b, eps, out)
        return out.reshape(x.shape)

    def gelu(self, x: np.ndarray) -> np.ndarray:
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
        out = np.empty_like(x2)
        fused.gelu_rows(x2, out)
        return out.reshape(x.shape)

    def linear_gelu(self, x: np.ndarray, w: Any, bias: np.ndarray | None) -> np.ndarray:
        if self._tape is not None or bias is None:
            return super().linear_gelu(x, w, bias)
        y = self.linear(x, w)
        out = np.empty_like(y)
        fused.bias_gelu_rows(y.reshape(-1, y.shape[-1]), bias, out.reshape(-1, y.shape[-1]))
        return out

    def linear_add_norm(self, x: np.ndarray, w: Any, bias: np.ndarray | None,
                        residual: np.ndarray, nw: np.ndarray, nb: np.ndarray, eps: float
                        ) -> np.ndarray:
        if self._tape is not None or residual.shape[:-1] != x.shape[:-1]:
            return super().linear_add_norm(x, w, bias, residual, nw, nb, eps)
        y = self.linear(x, w)
        n_out = y.shape[-1]
        y2 = y.reshape(-1, n_out)
        res = np.ascontiguousarray(residual, dtype=np.float32).reshape(-1, n_out)
        b = bias if bias is not None else np.zeros(n_out, dtype=np.float32)
        out = np.empty_like(y)
        fused.add_norm_rows(y2, b, res, nw, nb, eps, out.reshape(-1, n_out))
        return out

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        if gate.shape != up.shape:
            return super().silu_mul(gate, up)
        return self._act_mul(gate, up, fused.silu_mul_rows, fused.silu_mul_chunks)

    def gelu_tanh_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        if gate.shape != up.shape:
            return super().gelu_tanh_mul(gate, up)
        return self._act_mul(gate, up, fused.gelu_tanh_mul_rows, fused.gelu_tanh_mul_chunks)

    def _act_mul(self, gate: np.ndarray, up: np.ndarray, rows: Callable[..., None],
                 chunks: Callable[..., None]) -> np.ndarray:
        """``act(gate) * up`` by a fused kernel: ``rows`` over (T, n) rows, ``chunks`` the
        same split between numba's threads. A prefill's is shared out in the pool the
        products used; every element is computed alone, so the split changes no bit."""
        g, u = self._unit_rows(gate), self._unit_rows(up)
        out = np.empty(g.shape, dtype=np.float32)
        if self._tape is None and g.size >= SHARE_MIN:  # a prefill's: in the products' pool
            t, per = g.shape[0], fused.silu_rows_per(g.shape[1])
            if self._after_numba_products():
                with self._numba_threads(self._shares(t // per + 1)):
                    chunks(g, u, out)
            else:
                self._share(t // per + 1, lambda a, b: rows(
                    g[a * per:b * per], u[a * per:b * per], out[a * per:b * per]))
        else:
            self._taped(rows, g, u, out)
        return out.reshape(gate.shape)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return self._recomputed(super().softcap, x, cap)

    def _rope_tables(self, end: int, dim: int, theta: float, freq_factors: np.ndarray | None
                     ) -> tuple[np.ndarray, np.ndarray]:
        key = (theta, dim, b"" if freq_factors is None else freq_factors.tobytes())
        cos, sin = self._rope.get(key, (np.empty((0, dim // 2)),) * 2)
        if len(cos) < end:  # grow in 1024-position steps; same float64 angles as NumPy
            cos, sin = rope_angles(-(-end // 1024) * 1024, 0, dim, theta, freq_factors)
            self._rope[key] = (cos, sin)
        return cos, sin

    def rope(self, x: np.ndarray, offset: int, theta: float, traditional: bool = False, *,
             freq_factors: np.ndarray | None = None) -> np.ndarray:
        if traditional or x.ndim != 4:
            return super().rope(x, offset, theta, traditional, freq_factors=freq_factors)
        b, h, t, d = x.shape
        xr = self._input(x, (b * h, t, d))
        out = np.empty_like(xr)

        def rotate(offset: int) -> None:
            cos, sin = self._rope_tables(offset + t, d, theta, freq_factors)
            fused.rope_rows(xr, cos[offset:offset + t], sin[offset:offset + t], out)

        rotate(offset)
        if self._tape is not None:  # at each replay, the replayed position's angles
            at = self._tape.at(offset)
            self._tape.calls.append(lambda: rotate(at()))
        return out.reshape(b, h, t, d)

    def attend_rows(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, caches: Sequence[Any],
                    layer: int, **kw: Any) -> np.ndarray:
        """The decode step's RoPE, cache writes and attention for every row in one kernel
        call (:func:`.attention.attend_rows`): one replay call a layer instead of six a
        row. Soft-caps, a sliding window that hides a key or has dropped rows
        (:func:`.replay.window_open`) and a profiler (which times the ops one by one) take
        the composite."""
        b, hq, t, d = q.shape
        if (kw["softcap"] is not None or t != 1 or d % 2
                or not all(window_open(c, layer, kw["window"]) for c in caches)
                or any(op in vars(self) for op in ("rope", "attention"))):
            return super().attend_rows(q, k, v, caches, layer, **kw)
        for i, c in enumerate(caches):
            c.reserve(layer, k[i:i + 1], c.layer_offset(layer) + 1)
        # rel: each row's offset from row 0's cache offset (a replay's position, Tape.pos);
        # src/shared: the row whose buffers row i reads its first shared[i] keys from.
        offsets, rel, kaddr, vaddr, caps, src, shared = (np.zeros(b, dtype=np.int64)
                                                         for _ in range(7))
        held: list[list[np.ndarray]] = []  # the caches' arrays: their addresses stay valid

        def bind(caches: Sequence[Any] | None) -> bool:
            """Point the call at ``caches`` (None: at nothing, holding none of them);
            False where one cannot take this step's row in place."""
            if caches is None:
                held[:], kaddr[:], vaddr[:] = [], 0, 0
                return True
            kbuf = [c.keys[layer] for c in caches]
            vbuf = [c.values[layer] for c in caches]
            at = [c.layer_offset(layer) for c in caches]
            if any(a is None or a.dtype != self.kv_dtype or not a.flags.c_contiguous
                   for a in kbuf + vbuf):
                return False
            if any(o >= a.shape[2] for o, a in zip(at, kbuf, strict=True)):
                return False  # no room for the row: an eager step grows the buffer
            held[:] = [kbuf, vbuf]
            kaddr[:], vaddr[:] = ([a.ctypes.data for a in bufs] for bufs in (kbuf, vbuf))
            caps[:], offsets[:] = [a.shape[2] for a in kbuf], at
            rel[:] = offsets - caches[0].offset
            src[:], shared[:] = _prefix_sources(caches)
            return True

        if not bind(caches):
            return super().attend_rows(q, k, v, caches, layer, **kw)
        like = _bits(np.zeros(1, self.kv_dtype))  # the element type the kernel reads
        qs, ks, vs = (self._unit_rows(a, (b, a.shape[1], d)) for a in (q, k, v))
        out = np.empty((b, hq, d), dtype=np.float32)
        theta, freq, scale = kw["theta"], kw["freq_factors"], kw["scale"]

        def run() -> None:
            cos, sin = self._rope_tables(int(offsets.max()) + 1, d, theta, freq)
            attn.attend_rows(qs, ks, vs, cos, sin, offsets, kaddr, vaddr, caps, src, shared,
                          scale, out, like)

        run()
        tape = self._tape
        if tape is not None:  # each row's position moves with the replayed one (row 0's)
            pos = tape.pos

            def replay() -> None:
                np.add(rel, pos[0], out=offsets)
                run()

            tape.calls.append(replay)
            tape.binders.append(bind)
        return out.reshape(b, hq, 1, d)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, *,
                  causal_offset: int | None = None, key_mask: np.ndarray | None = None,
                  window: int | None = None, softcap: float | None = None) -> np.ndarray:
        b, hq, t, d = q.shape
        s = k.shape[2]
        if softcap is not None or (window is not None and s > window):
            # Soft-capped or window-limited scores: the NumPy path (the fused kernels
            # implement the plain causal mask only).
            return super().attention(q, k, v, scale, causal_offset=causal_offset,
                                     key_mask=key_mask, window=window, softcap=softcap)
        # One new token that sees every cached key: the decode step.
        if b == 1 and t == 1 and key_mask is None and causal_offset == s - 1:
            out = np.empty((hq, d), dtype=np.float32)
            qh, kb, vb = self._input(q, (hq, d)), _rows_of(k), _rows_of(v)
            attn.attend_decode(qh, _bits(kb[0]), _bits(vb[0]), s, scale, out)
            if self._tape is not None:  # the keys up to the replayed position
                if kb is not k.base or vb is not v.base:
                    raise NotCapturable("attention over keys outside a KV cache buffer")
                at = self._tape.at(s)
                self._tape.calls.append(
                    lambda: attn.attend_decode(qh, _bits(kb[0]), _bits(vb[0]), at(), scale, out))
            return out.reshape(1, hq, 1, d)
        self._untaped("attention over more than one query")
        if (b == 1 and key_mask is None and causal_offset is not None
                and 0 <= causal_offset <= s - t and self._shares(hq) > 1
                and self._after_numba_products()):
            return self._attend_prefill(q, k, v, scale, causal_offset)  # a prefill
        tiled = tiled_attention(self.attention, q, k, v, scale, causal_offset, key_mask,
                                lambda parts: np.concatenate(parts, axis=2))
        if tiled is not None:
            return tiled
        group = hq // k.shape[1]
        mask = (np.ones((b, s), dtype=np.float32) if key_mask is None
                else np.ascontiguousarray(key_mask, dtype=np.float32))
        off = -1 if causal_offset is None else causal_offset
        if self._shares(b * hq) < 2:
            # Grouped-query heads folded into rows (as NumPy does): one BLAS GEMM per kv
            # head for q.k and one for p.v; the masked softmax between them one numba pass.
            qg = q.reshape(b, k.shape[1], group * t, d)
            sc = qg @ k.transpose(0, 1, 3, 2)
            fused.softmax_scores(sc.reshape(b, hq, t, s), scale, off, mask)
            return (sc @ v).reshape(b, hq, t, d)
        # Shared out by (sequence, head): a GEMM for q.k, the softmax, a GEMM for p.v
        # (each head's result is its own, whatever the split).
        out = np.empty((b, hq, t, d), dtype=np.float32)

        def heads(u0: int, u1: int) -> None:
            sc = np.empty((t, s), dtype=np.float32)
            for u in range(u0, u1):
                bi, h = divmod(u, hq)
                np.matmul(q[bi, h], k[bi, h // group].T, out=sc)
                fused.softmax_scores(sc.reshape(1, 1, t, s), scale, off, mask[bi:bi + 1])
                np.matmul(sc, v[bi, h // group], out=out[bi, h])

        self._share(b * hq, heads)
        return out

    def _attend_prefill(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                        offset: int) -> np.ndarray:
        """Causal attention of one sequence's t new tokens on more than one thread
        (:func:`.attention.attend_prefill`): blocks of query rows split between numba's
        threads, each row against only the keys it sees, read from the cache buffer.

        Why not BLAS per head on :meth:`_share`: each part runs Python between its calls,
        and two threads' Python trade the GIL (a sleep and a wake each time); that split
        gained nothing from the second thread. On one thread the grouped BLAS GEMMs stay:
        they compute the full square of scores, masked, but at about twice this kernel's
        rate, so it is a tie at 138 tokens and BLAS leads at 512-1024 (docs/cpu-backend.md,
        "One pool for the prefill")."""
        _, hq, t, d = q.shape
        qh = self._input(q, (hq, t, d))
        kb, vb = _bits(_rows_of(k)[0]), _bits(_rows_of(v)[0])
        out = np.empty((t, hq, d), dtype=np.float32)
        n = self._shares(hq)
        with self._numba_threads(n):
            attn.attend_prefill(qh, kb, vb, offset, scale, out, n)
        return out.transpose(1, 0, 2)[None]  # (1, hq, t, d): the caller's transpose is free

    def attention_packed(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, heads: int,
                         scale: float, starts: Sequence[int]) -> np.ndarray:
        """Each run of consecutive inputs of one length (embed's batches are sorted by
        length, so most inputs share a run) is a (count, length) batch of views into the
        packed rows: no gather, no padding, no mask. Scores by BLAS into a keys-outer
        (input, key, head, query) array for :func:`.fused.softmax_keys`, then p.v by
        BLAS straight into the output rows.

        Measured against the alternatives (MiniLM, bench sentences, 1 thread): gathering
        the rows into one right-padded batch cost ~30% more in this op (the gathers, and
        the padded scores); a numba kernel over the packed rows, ~1.3-1.4x more (inputs
        of ~23 tokens leave its vector loops mostly in their scalar remainders). Runs
        whose scores pass the query-tile budget take :meth:`attention`, which tiles."""
        self._untaped("packed attention")
        n, hd = q.shape[1], q.shape[2]
        d = hd // heads
        starts = np.asarray(starts, dtype=np.int64)
        lens = np.diff(starts)
        out = np.empty((n, hd), dtype=np.float32)
        cuts = [0, *(np.flatnonzero(np.diff(lens)) + 1).tolist(), len(lens)]
        for i0, i1 in zip(cuts[:-1], cuts[1:], strict=False):
            b, t, r0 = i1 - i0, int(lens[i0]), int(starts[i0])
            rows = slice(r0, r0 + b * t)
            q2, k2, v2 = (x.reshape(n, hd)[rows].reshape(b, t, heads, d).transpose(0, 2, 1, 3)
                          for x in (q, k, v))
            o2 = out[rows].reshape(b, t, heads, d).transpose(0, 2, 1, 3)  # (b, h, t, d) view
            if len(query_tiles(b, heads, t, t)) > 1:
                o2[...] = self.attention(q2, k2, v2, scale)
                continue
            sc = np.empty((b, t, heads, t), dtype=np.float32)  # [input, key, head, query]
            np.matmul(k2, q2.transpose(0, 1, 3, 2), out=sc.transpose(0, 2, 1, 3))
            fused.softmax_keys(sc.reshape(b, t, heads * t), scale, np.ones((b, t), np.float32))
            np.matmul(sc.transpose(0, 2, 3, 1), v2, out=o2)
        return out.reshape(1, n, hd)


@cache
def _concurrent_kernels() -> bool:
    """Whether numba's parallel kernels may run on two threads at once, as the integer
    prefill parts do: its tbb and omp layers allow it, workqueue does not."""
    from numba.np.ufunc import parallel

    parallel._launch_threads()  # picks the layer (as the first parallel call would)
    return numba.threading_layer() != "workqueue"


def _close_all(workers: list[SpinWorker]) -> None:
    for worker in workers:
        worker.close()


def _lanes_out(rows: int, w: PackedWeight) -> np.ndarray:
    """What a mat-vec kernel of ``w`` writes for ``rows`` rows: W's whole tiles of lanes
    (columns past W's rows where its last tile is partial)."""
    return np.empty((rows, len(w.codes) // w.groups * LANES), dtype=np.float32)


def _w_columns(out: np.ndarray, w: PackedWeight) -> np.ndarray:
    """The columns of a :func:`_lanes_out` buffer that are W's rows (a view)."""
    return out if out.shape[1] == w.shape[0] else out[:, : w.shape[0]]


def _copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    np.copyto(dst, np.reshape(src, dst.shape))


def _raw_rows(table: RawWeight, ids: np.ndarray, rows: np.ndarray) -> None:
    for r, i in enumerate(ids):
        rows[r] = table.rows(int(i), int(i) + 1)[0]


def _prefix_sources(caches: Sequence[Any]) -> tuple[list[int], list[int]]:
    """For a batched step's attention: each row's source row (the first of the batch that
    holds the most of its leading rows with the same bits, itself if none) and how many of
    its leading rows to read there (a multiple of 4, the kernel's key groups; at most its
    own offset). A batch of requests with one system prompt then reads that prompt's K/V
    once a step, not once per sequence."""
    src, shared = list(range(len(caches))), [0] * len(caches)
    rows = [row_sources(c) for c in caches]
    for i, c in enumerate(caches):
        for j in range(i):
            n = min(shared_rows(rows[i], rows[j]), c.offset) // 4 * 4
            if n > shared[i]:
                src[i], shared[i] = j, n
    return src, shared


def _rows_of(x: np.ndarray) -> np.ndarray:
    """The C-contiguous array whose leading rows (axis 2) ``x`` is, without a copy.

    The KV cache hands attention a narrow() view of its (b, h, capacity, d) buffer; numba
    vectorises only over C-contiguous arrays, so the kernel takes the whole buffer and a
    key count. Anything else is copied."""
    base = x.base
    if (isinstance(base, np.ndarray) and base.flags.c_contiguous and base.dtype == x.dtype
            and x.dtype in (np.float32, np.float16)
            and base.ndim == 4 and base.shape[:2] == x.shape[:2] and base.shape[3] == x.shape[3]
            and x.strides == base.strides and x.ctypes.data == base.ctypes.data):
        return base
    return np.ascontiguousarray(x, dtype=np.float32)


# Below this a buffer comes from the heap: a page's worth of rows is soon written anyway.
ON_TOUCH_BYTES = 1 << 20


def zeros_on_touch(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A zero array whose pages become resident only when first written: an anonymous
    map of its own from ``ON_TOUCH_BYTES`` up (unmapped with the array), else np.zeros.

    A KV cache is made for a whole reply (prompt + max_tokens rows, so a captured decode
    step's addresses hold) but filled a row at a time. np.zeros below glibc's mmap
    threshold (32 MB once keep_freed_heap applies) takes freed heap and clears all of it
    at once: a 12-token prompt with max_tokens 4096 made 222 MiB of the Llama 3.2 1B's
    cache resident before the first token. Huge pages are declined where the OS offers
    it: one would make 2 MiB of rows resident at the first write."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if n < ON_TOUCH_BYTES:
        return np.zeros(shape, dt)
    buf = mmap.mmap(-1, n)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dt).reshape(shape)


def _bits(x: np.ndarray) -> np.ndarray:
    """A float16 cache buffer as the uint16 bits the kernels read (float32 as it is)."""
    return x.view(np.uint16) if x.dtype == np.float16 else x


def probe() -> tuple[bool, str]:
    try:
        import numba
    except ImportError:
        return False, "numba is not installed"
    try:
        mode = _activations(None)
    except InvalidInputError as e:
        return False, str(e)
    if mode != "float":
        how = {"lanes": "lane by lane", "avx2": "code pairs", "avx512": "code pairs, 512-bit"}
        dot = f"integer dot products over {mode} activations ({how[features.form()]})"
    else:  # chosen by the user
        dot = "float mat-vec"
    n = numba.config.NUMBA_NUM_THREADS  # not get_num_threads: that starts the threads
    return True, (f"numba {numba.__version__} kernels over quantized weights, "
                  f"up to {n} thread{'s' if n != 1 else ''} (fewer while other processes "
                  f"keep cores busy), {features.target_isa()}, "
                  f"{features.float16_converts()}, {dot}")


def create(compile_progress: Callable[[int, int, str], None] | None = None) -> CpuBackend:
    b = CpuBackend()
    b.compile_progress = compile_progress
    return b

