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


def busy_seconds(cpus: Any, count_niced: bool) -> float:
    """The busy CPU seconds in psutil ``cpu_times`` rows ``cpus`` (the hypervisor's steal
    included); ``count_niced``: also the time of processes niced above 0 (the "nice" row).
    Those take a core's time slices mostly when nothing of higher priority runs there."""
    fields = ("user", "system", "irq", "softirq", "steal") + (("nice",) if count_niced else ())
    return sum(getattr(t, f, 0.0) for t in cpus for f in fields)


def _readings() -> tuple[int, float, Any, Any]:
    """(this process's id, the clock, psutil's per-CPU times, this process's CPU times)."""
    import psutil

    clock, per = time.monotonic(), psutil.cpu_times(percpu=True)
    return os.getpid(), clock, per, psutil.Process().cpu_times()


# The readings as the engine is imported. A process's first BusyCores averages from them, so
# the first choice, at the load's end (numba's threads spin or sleep for the process), rests
# on what ran beside the whole load; a load under 0.1 s had left it to the 1-minute load
# average, which counts niced processes and lags (the bundled model's decode then waited
# passively at half speed beside niced work).
_AT_IMPORT = _readings()


class BusyCores:
    """The cores other processes kept busy, on average, since the last look: the busy CPU
    time (the hypervisor's steal included) of the cores this process may run on (its
    affinity: ``cores`` of them) less this process's own, over the wall time between
    looks (psutil). Processes niced above 0 count only while this one is niced too: at
    nice 0 or below it takes their time slices (beside niced builds and tests, counting
    them made the decode wait passively at 43-45 tok/s on the bundled model at 2 threads,
    against 109-124 spinning; docs/benchmarks.md, 2026-11-29 02:05). The CPU times do not
    tell nice 0 from below it, so processes at nice 0 count at any priority: a spinning
    decode beside an uncounted process of its own priority fell to 0.5-1 tok/s on the
    bundled model, where one that waits passively ran at 89."""

    def __init__(self) -> None:
        self.cpus = usable_cpus()
        self.cores = len(self.cpus) if self.cpus else os.cpu_count() or 1
        self._count_niced = os.nice(0) > 0 if hasattr(os, "nice") else True
        global _AT_IMPORT
        first, _AT_IMPORT = _AT_IMPORT, None  # the process's first one starts at the import
        self._mark = self._reduce(first) if first and first[0] == os.getpid() else self._now()

    def _now(self) -> tuple[float, float, float]:
        return self._reduce(_readings())

    def _reduce(self, readings: Any) -> tuple[float, float, float]:
        """(clock, busy seconds counted, own seconds counted) from ``_readings()``."""
        _, clock, per, own = readings
        mine = [per[i] for i in self.cpus if i < len(per)] if self.cpus else per
        return clock, busy_seconds(mine, self._count_niced), own.user + own.system

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
