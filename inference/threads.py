"""How many threads the engine computes with (bench, `inferdesk serve --threads`)."""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple


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
# Niced processes' CPU time below this share of the window is not looked into process by
# process (a daemon's wake-ups): reading every process costs ~25 us each.
NICED_NOISE = 0.02


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
    """The busy CPU seconds in ``cpus`` rows (:func:`cpu_times` or psutil's; the hypervisor's
    steal included); ``count_niced``: also the time of processes niced above 0 (the "nice"
    row). Those take a core's time slices mostly when nothing of higher priority runs there."""
    fields = ("user", "system", "irq", "softirq", "steal") + (("nice",) if count_niced else ())
    return sum(getattr(t, f, 0.0) for t in cpus for f in fields)


class CpuTimes(NamedTuple):
    """One CPU's row of /proc/stat, in seconds (psutil's names)."""

    user: float
    nice: float
    system: float
    idle: float
    iowait: float = 0.0
    irq: float = 0.0
    softirq: float = 0.0
    steal: float = 0.0


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_times() -> list[Any]:
    """Each CPU's times since boot: /proc/stat where there is one (no import: it is read as
    the engine is imported), else psutil's ``cpu_times(percpu=True)``."""
    try:
        with open("/proc/stat", "rb") as f:
            text = f.read()
    except OSError:
        import psutil

        return list(psutil.cpu_times(percpu=True))
    rows = []
    for line in text.splitlines():
        if line.startswith(b"cpu") and line[3:4].isdigit():
            ticks = line.split()[1:9]
            rows.append(CpuTimes(*(int(t) * _TICK_S for t in ticks)))
    return rows


def process_times() -> dict[int, tuple[float, int]]:
    """Every process's (CPU seconds since it started, nice) by id: /proc/<pid>/stat where
    there is a /proc (~20 us a process), else psutil. The nice is its main thread's."""
    if not os.path.isdir("/proc/self"):
        import psutil

        return {p.pid: (p.info["cpu_times"].user + p.info["cpu_times"].system, p.info["nice"])
                for p in psutil.process_iter(["cpu_times", "nice"])
                if p.info["cpu_times"] is not None and isinstance(p.info["nice"], int)}
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
        # after the command name (in parentheses, which may hold any byte): the state
        # first, then utime and stime at 12 and 13, the nice at 17
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 16:
            out[int(name)] = ((int(fields[11]) + int(fields[12])) * _TICK_S, int(fields[16]))
    return out


def priority_weight(theirs: int, ours: int) -> float:
    """The part of a process at nice ``theirs``'s CPU time that counts as taken from one at
    nice ``ours``: all of it at our priority or higher; below it, the kernel's share of a
    contended core between the two (CFS weights fall 1.25x a nice level: a nice-0 process
    gets ~1 slice in 10 beside one at nice -10, its time counts 0.107)."""
    return min(1.0, 1.25 ** (ours - theirs))


_NO_GROUP = ("", 0)  # every process in one scheduling group: nice alone orders them


def sched_group(pid: int | str = "self") -> tuple[str, int]:
    """The scheduling group a process's threads compete in, and the group's nice: nice
    orders processes only inside one group; between groups the kernel shares a core by the
    groups' own weights. A CPU cgroup other than the root is a group (cgroup v1's ``cpu``
    hierarchy, or v2 where the cpu controller is on); in the root, with the kernel's
    autogroups on (one per ``setsid``: a terminal, a desktop's launch), the autogroup is,
    with its own nice. ``_NO_GROUP`` where neither applies or /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return _NO_GROUP
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") and path != "/":  # v1
            return f"cgroup:{path}", 0
        if controllers == "" and path != "/" and _v2_cpu_controlled(path):
            return f"cgroup:{path}", 0
    try:
        with open(f"/proc/{pid}/autogroup") as f:  # present when autogroups are on
            name, _, nice = f.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return _NO_GROUP


def _v2_cpu_controlled(path: str) -> bool:
    try:
        with open(f"/sys/fs/cgroup{path}/cgroup.controllers") as f:
            return "cpu" in f.read().split()
    except OSError:
        return False


def _own_nice() -> int | None:
    """This process's nice, or None where the OS has none (Windows)."""
    return os.nice(0) if hasattr(os, "nice") else None


class Readings(NamedTuple):
    """What one look at the load reads (:func:`readings`)."""

    pid: int
    clock: float
    cpus: list[Any]  # each CPU's times since boot (cpu_times)
    own: float  # this process's CPU seconds
    procs: dict[int, tuple[float, int]] | None  # process_times(), where read


def readings(per_process: bool) -> Readings:
    """The clock, the CPUs' times and this process's (``os.times``), and, if
    ``per_process``, every process's (:func:`process_times`)."""
    own = os.times()
    return Readings(os.getpid(), time.monotonic(), cpu_times(), own.user + own.system,
                    process_times() if per_process else None)


def _weigh_processes(nice: int | None) -> bool:
    """Whether looks weigh each process by its priority: while this process runs at a
    negative ``nice`` (:func:`_own_nice`), where the CPUs' times cannot tell nice 0 from
    ours."""
    return nice is not None and nice < 0


def _import_readings() -> Readings | None:
    """The readings as the engine is imported, where the OS gives them without psutil
    (Linux's /proc: ~0.1 ms; ~1-5 ms more at a negative nice, one file a process), else
    None (the first look then starts its own window)."""
    if not os.path.exists("/proc/stat"):
        return None
    try:
        return readings(_weigh_processes(_own_nice()))
    except (OSError, ValueError):
        return None


# The readings as the engine is imported. A process's first BusyCores averages from them, so
# the first choice, at the load's end (numba's threads spin or sleep for the process), rests
# on what ran beside the whole load; a load under 0.1 s had left it to the 1-minute load
# average, which counts niced processes and lags (the bundled model's decode then waited
# passively at half speed beside niced work).
_AT_IMPORT = _import_readings()


class Mark(NamedTuple):
    """One look reduced to what BusyCores compares: the clock, the busy seconds counted on
    our cores, this process's seconds, the kernel's own (interrupts, steal) there, and the
    processes' (seconds, nice) where weighed."""

    clock: float
    busy: float
    own: float
    kernel: float
    procs: dict[int, tuple[float, int]] | None
    niced: float = 0.0  # the niced processes' seconds on our cores, where not in ``busy``


class BusyCores:
    """The cores other processes kept busy, on average, since the last look: the busy CPU
    time (the hypervisor's steal included) of the cores this process may run on (its
    affinity: ``cores`` of them) less this process's own, over the wall time between
    looks. Processes niced above 0 count only while this one is niced too: at nice 0 or
    below it takes their time slices (beside niced builds and tests, counting them made
    the decode wait passively at 43-45 tok/s on the bundled model at 2 threads, against
    109-124 spinning; docs/benchmarks.md, 2026-11-29 02:05).

    At a negative nice the CPUs' times cannot tell a nice-0 process from one at ours, so
    each process whose CPU time rose is weighed by its priority (:func:`priority_weight`):
    one of our priority or higher counts whole (beside an uncounted one of its own priority
    a spinning decode fell to 0.5-1 tok/s), a nice-0 one at a tenth beside nice -10 (it gets
    about one time slice in ten of a core we want; counted whole, a nice -10 decode beside
    one nice-0 loop waited passively at 0.71x llama.cpp's). That sum, plus the interrupts and
    steal of our cores, is capped at the cores' own reading (a process pinned elsewhere
    takes none of ours).

    Priority orders processes only inside one scheduling group (:func:`sched_group`): with
    the kernel's autogroups, a loop started from another terminal gets half the contended
    core whatever our nice, and a niced build in another terminal a full share. A process
    in another group counts whole (by the groups' nice where both are autogroups); at
    nice 0, niced time is looked into process by process once it shows (beside one nice-0
    loop in another autogroup a nice -10 decode weighing it at a tenth spun at 1.5 tok/s
    against llama.cpp's 13; docs/benchmarks.md)."""

    def __init__(self) -> None:
        self.cpus = usable_cpus()
        self.cores = len(self.cpus) if self.cpus else os.cpu_count() or 1
        nice = _own_nice()
        self._nice = nice
        self._count_niced = nice is None or nice > 0
        self._weigh = _weigh_processes(nice)
        self._group = sched_group() if nice is not None else _NO_GROUP
        self._groups: dict[int, tuple[str, int]] = {}  # other processes', as first read
        self._niced_alone = False  # at nice 0: the last look saw niced time, read each process
        global _AT_IMPORT
        first, _AT_IMPORT = _AT_IMPORT, None  # the process's first one starts at the import
        usable = (first is not None and first.pid == os.getpid()
                  and (first.procs is not None) == self._weigh)
        self._mark = self._reduce(first) if usable else self._now()

    def _now(self) -> Mark:
        return self._reduce(readings(self._weigh or self._niced_alone))

    def _reduce(self, r: Readings) -> Mark:
        mine = [r.cpus[i] for i in self.cpus if i < len(r.cpus)] if self.cpus else r.cpus
        kernel = sum(getattr(t, f, 0.0) for t in mine for f in ("irq", "softirq", "steal"))
        niced = 0.0 if self._count_niced else sum(getattr(t, "nice", 0.0) for t in mine)
        return Mark(r.clock, busy_seconds(mine, self._count_niced), r.own, kernel, r.procs,
                    niced)

    def _weight(self, pid: int, nice: int) -> float:
        """How much of process ``pid``'s CPU time counts as taken from ours: by priority
        inside our scheduling group; from another group, by the groups' nice where both
        are autogroups, else whole (its group gets its own share whatever its nice)."""
        group = self._groups.get(pid)
        if group is None:
            group = self._groups[pid] = sched_group(pid)
        if group == self._group:
            return priority_weight(nice, self._nice or 0)
        if self._group[0].startswith("/autogroup") and group[0].startswith("/autogroup"):
            return priority_weight(group[1], self._group[1])
        return 1.0

    def _weighed(self, before: Mark, now: Mark, only_niced: bool) -> float:
        """The seconds other processes took from our cores between two looks, each weighed
        (:meth:`_weight`); ``only_niced``: the processes niced above 0 only."""
        weighed = 0.0
        pid = os.getpid()
        assert before.procs is not None and now.procs is not None
        for p, (cpu, nice) in now.procs.items():
            rose = cpu - before.procs.get(p, (0.0, 0))[0]  # a new one: all of its time
            if rose > 0 and p != pid and (nice > 0 or not only_niced):
                weighed += rose * self._weight(p, nice)
        # forget the processes that have gone: a reused pid is read afresh
        self._groups = {p: g for p, g in self._groups.items() if p in now.procs}
        return weighed

    def others(self, window: float = LOAD_WINDOW_S, *, peek: bool = False) -> float | None:
        """None until ``window`` seconds have passed since the last look; ``peek``: the
        window goes on (the next look averages from the same start)."""
        if time.monotonic() - self._mark.clock < window:
            return None
        before, now = self._mark, self._now()
        if not peek:
            self._mark = now
        seconds = now.clock - before.clock
        cores = max(0.0, now.busy - before.busy - (now.own - before.own))
        niced = now.niced - before.niced
        if self._weigh and now.procs is not None and before.procs is not None:
            weighed = now.kernel - before.kernel + self._weighed(before, now, False)
            return min(cores, max(0.0, weighed)) / seconds
        if niced <= NICED_NOISE * seconds or self._group == _NO_GROUP:
            self._niced_alone = False
            return cores / seconds
        # Niced processes ran while we are at nice 0: in our group they take few of our time
        # slices; in another group (another terminal's build, say) a full share. Until each
        # process is read at two looks, their time counts whole.
        if not peek:
            self._niced_alone = True
        if now.procs is None or before.procs is None:
            return (cores + niced) / seconds
        return (cores + min(niced, self._weighed(before, now, True))) / seconds
