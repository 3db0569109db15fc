"""How many threads the engine computes with (bench, `inferdesk serve --threads`)."""

from __future__ import annotations

import os
import time
from typing import Any


def usable_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity), or None where the OS has no
    affinity call (macOS, Windows)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def usable_cores() -> int:
    """How many cores this process may run on: its affinity's, else the machine's."""
    cpus = usable_cpus()
    return len(cpus) if cpus else os.cpu_count() or 1


def set_threads(n: int, backend: Any = None) -> str:
    """Cap the engine's thread pools at n: BLAS/OpenMP via threadpoolctl, and the backend's
    own pool (numba) through its set_threads hook. BLAS stays at one thread for a backend
    that shares its work out between its own threads (``own_threads``: cpu), whose parts
    each call BLAS. Returns what was capped."""
    done = []
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1 if getattr(backend, "own_threads", False) else n)
        done.append("threadpoolctl")
    except ImportError:
        pass
    hook = getattr(backend, "set_threads", None)
    if hook is not None:
        hook(n)
        done.append(f"{backend.name}.set_threads")
    return ", ".join(done) or "none (install threadpoolctl to cap BLAS threads)"


# A thread count is chosen again after at least this long: the busy cores are an average
# over the window since the last choice (a shorter one mostly measures our own spin-down).
LOAD_WINDOW_S = 0.5


def threads_for(limit: int, others: float, cores: int) -> int:
    """Threads to compute with, at most ``limit``, when other processes keep ``others`` of
    the ``cores`` this process may run on busy: one per core they leave free, rounded, at
    least one.

    Why not all of them: the kernels' parallel loops end when their slowest thread does,
    and a thread that shares its core with another process runs a fraction of the time.
    Measured (SmolLM2 Q3_K_M, 138-token prefill, 2-core Xeon, one ``yes`` process busy):
    254 tok/s at 2 threads against 541 at 1 (quiet: 727 against 544)."""
    return max(1, min(limit, int(cores - others + 0.5)))


# A process niced this far below 0 outweighs a nice-0 one at least threefold for a shared
# core's time slices (the kernel's weights: 3121 against 1024 at -5), so the nice-0 processes'
# time ("user" in the CPU times) is left out of the busy cores it sees.
OUTWEIGHS_NICE_0 = -5


def counted_classes(own_nice: int) -> tuple[bool, bool]:
    """Whose CPU time takes a process at ``own_nice``'s time slices: (processes at nice 0 or
    below, processes niced above 0). The lower-priority class takes few of them."""
    return own_nice > OUTWEIGHS_NICE_0, own_nice > 0


def busy_seconds(cpus: Any, count_niced: bool, count_user: bool = True) -> float:
    """The busy CPU seconds in psutil ``cpu_times`` rows ``cpus`` (the hypervisor's steal
    included); ``count_niced``: the time of processes niced above 0 (the "nice" row);
    ``count_user``: that of the rest (the "user" row). Kernel time always counts."""
    fields = ("system", "irq", "softirq", "steal") + (("user",) if count_user else ()) + (
        ("nice",) if count_niced else ())
    return sum(getattr(t, f, 0.0) for t in cpus for f in fields)


class BusyCores:
    """The cores other processes kept busy, on average, since the last look: the busy CPU
    time (the hypervisor's steal included) of the cores this process may run on (its
    affinity: ``cores`` of them) less this process's own, over the wall time between
    looks (psutil). Only processes of this one's priority class or higher count: niced
    ones only while this one is niced too (beside niced builds and tests, counting them made
    the decode wait passively at 43-45 tok/s on the bundled model at 2 threads, against
    109-124 spinning; docs/benchmarks.md, 2026-11-29 02:05), and nice-0 ones not while this
    one runs at ``OUTWEIGHS_NICE_0`` or lower (beside one nice-0 loop, a nice -10 decode
    went to one thread at 0.68x llama.cpp's two)."""

    def __init__(self) -> None:
        import psutil

        self.cpus = usable_cpus()
        self.cores = len(self.cpus) if self.cpus else os.cpu_count() or 1
        self._own = psutil.Process()
        self._count_user, self._count_niced = counted_classes(
            os.nice(0) if hasattr(os, "nice") else 1)
        self._mark = self._now()

    def _now(self) -> tuple[float, float, float]:
        import psutil

        per = psutil.cpu_times(percpu=True)
        mine = [per[i] for i in self.cpus if i < len(per)] if self.cpus else per
        busy = busy_seconds(mine, self._count_niced, self._count_user)
        own = self._own.cpu_times()
        # its user time sits in a counted row unless the nice-0 row is left out
        return time.monotonic(), busy, own.system + (own.user if self._count_user else 0.0)

    def others(self, window: float = LOAD_WINDOW_S, *, peek: bool = False) -> float | None:
        """None until ``window`` seconds have passed since the last look; ``peek``: the
        window goes on (the next look averages from the same start)."""
        if time.monotonic() - self._mark[0] < window:
            return None
        (t0, busy0, own0), now = self._mark, self._now()
        if not peek:
            self._mark = now
        t1, busy1, own1 = now
        return max(0.0, (busy1 - busy0 - (own1 - own0)) / (t1 - t0))
