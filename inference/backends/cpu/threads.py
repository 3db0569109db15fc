"""A worker thread that takes work without being woken: it spins, GIL released, for the
next part, and sleeps only after a quiet spell; on a CPU other processes keep busy it does
not spin at all (:meth:`SpinWorker.park`).

Why: handing a part to a sleeping thread costs a futex wake and, in a virtual machine,
waking that thread's idle vCPU. Measured on a 2-vCPU KVM guest: a Python Event or
SimpleQueue round trip 67-80 us, and a ThreadPoolExecutor share-out of an empty part
98 us; a 138-token SmolLM2 prefill shares out 150 products and attentions, so ~30 ms of
its ~230 went on hand-offs (docs/cpu-backend.md, "Prefill"). OpenBLAS and OpenMP spin
their workers for the same reason.

The spin is an atomic load in a numba loop (``nogil``), so the thread spinning holds
neither the GIL nor a lock; after ``SPIN`` loads without news it sleeps on a condition.
Spinning pays only while the cores are ours: beside another busy process a spinning thread
takes the time slices the kernels' own threads (and the other process) need, so the
backend parks its workers while it sees other processes busy.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from inference.backends.cpu.ir import _item_ptr

# Loads a quiet worker spins before it sleeps: ~0.3 ms at ~1 ns a load, longer than the
# serial ops between two share-outs of a prefill layer (norms, RoPE, adds), and short
# enough that a decode step after the prefill keeps its second core.
SPIN = 1 << 18
# Loads a caller spins for its worker's part to end before it sleeps: ~2 ms, longer than
# most parts (a part runs beside the caller's own, so the wait is their difference).
JOIN_SPIN = 1 << 23


# What GNU OpenMP (numba's ``omp`` layer, which runs the decode kernels' ``prange``) reads
# once, when the library loads: how long a thread waiting at a barrier or for the next
# region spins before it sleeps on a futex.
OMP_WAIT_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def launch_kernel_threads(busy: bool) -> str:
    """Start numba's parallel layer with its threads told how to wait, unless it runs
    already or the user set the OpenMP wait variables: beside other busy processes
    (``busy``) they sleep at once (``OMP_WAIT_POLICY=passive``), else they spin first as
    GNU OpenMP does by default. Returns the policy in force ("spin", "passive", or
    "as set": by the user, or before this call).

    Why: OpenMP's default spin (300,000 pause loops) outlasts a time slice. With two
    threads forced beside two busy loops on 2 cores, a decode step's ~500 regions each
    waited for a descheduled thread while its partner spun the slice away: 0.6-0.7 tok/s
    on the 1B shape, against 4.4-4.9 asleep at once (docs/benchmarks.md). The variables
    are read only when the library loads, so the choice holds for the process; the
    variables are put back after the load (child processes do not inherit it)."""
    from numba.np.ufunc import parallel

    if any(k in os.environ for k in OMP_WAIT_ENV) or _omp_loaded():
        parallel._launch_threads()
        return "as set"
    if busy:
        os.environ["OMP_WAIT_POLICY"] = "passive"
    try:
        parallel._launch_threads()
    finally:
        if busy:
            os.environ.pop("OMP_WAIT_POLICY", None)
    return "passive" if busy else "spin"


def _omp_loaded() -> bool:
    """Whether GNU OpenMP is mapped into this process already (its settings are fixed)."""
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        return "libgomp" in f.read()
    return False


@intrinsic
def _load_acquire(typingctx, arr, i):  # type: ignore[no-untyped-def]
    """arr[i] (int64) read with acquire ordering: the loop cannot keep it in a register."""
    sig = types.int64(arr, i)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ptr = _item_ptr(context, builder, signature.args[0], args[0], [args[1]])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


@njit(nogil=True, cache=True)
def spin_while(state: np.ndarray, i: int, value: int, spins: int) -> int:
    """state[i] once it differs from ``value``, or ``value`` after ``spins`` loads."""
    for _ in range(spins):
        v = _load_acquire(state, i)
        if v != value:
            return v
    return value


class SpinWorker:
    """One worker thread running ``part(a, b)`` calls handed over by :meth:`start`; the
    caller collects it with :meth:`join` (which re-raises the part's exception)."""

    def __init__(self, name: str = "cpu-share") -> None:
        self._state = np.zeros(2, dtype=np.int64)  # [parts handed over, parts done]
        self._cv = threading.Condition()
        self._sleeping = False  # the worker waits on _cv for a part
        self._joining = False  # the caller waits on _cv for the part's end
        self._job: tuple[Callable[[int, int], None], int, int] | None = None
        self._error: BaseException | None = None
        self.spin = SPIN  # loads spun for the next part before sleeping
        self.join_spin = JOIN_SPIN  # loads the caller spins for the part's end
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def park(self, parked: bool) -> None:
        """Sleep at once between parts and joins (``parked``), or spin first as usual."""
        self.spin, self.join_spin = (0, 0) if parked else (SPIN, JOIN_SPIN)

    def start(self, part: Callable[[int, int], None], a: int, b: int) -> None:
        self._job, self._error = (part, a, b), None
        with self._cv:  # the job is published before the count that announces it
            self._state[0] += 1
            if self._sleeping:
                self._cv.notify()

    def join(self) -> None:
        """Wait for the part: spinning as the worker does, then asleep (a spinning waiter
        beside a busy worker and another pool's spinning threads would take its core)."""
        n = int(self._state[0])
        if spin_while(self._state, 1, n - 1, self.join_spin) != n:
            with self._cv:
                self._joining = True
                while int(self._state[1]) != n:
                    self._cv.wait()
                self._joining = False
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Stop the thread (after the part in hand, if any)."""
        self.start(_stop, 0, 0)

    def _loop(self) -> None:
        seen = 0
        while True:
            if spin_while(self._state, 0, seen, self.spin) == seen:
                with self._cv:  # nothing came within the spin: sleep until it does
                    self._sleeping = True
                    while int(self._state[0]) == seen:
                        self._cv.wait()
                    self._sleeping = False
            seen = int(self._state[0])
            stop = self._run()
            with self._cv:
                self._state[1] = seen
                if self._joining:
                    self._cv.notify()
            if stop:
                return

    def _run(self) -> bool:
        """The part handed over (True for :meth:`close`'s); neither it nor what its
        closure holds stays referenced after it ran."""
        part, a, b = self._job  # type: ignore[misc]
        self._job = None
        if part is _stop:
            return True
        try:
            part(a, b)
        except BaseException as e:  # re-raised on the caller's thread by join()
            self._error = e
        return False


def _stop(a: int, b: int) -> None:
    """The part :meth:`SpinWorker.close` hands over: the loop ends on it."""
