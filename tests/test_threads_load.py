"""The cpu backend's thread count under other processes' load (``adapt_threads``): one
thread per core they leave free unless a count was set, and every entry point asks."""

from __future__ import annotations

import os
import time

import numba
import pytest

from inference import threads as T
from inference.backends.cpu import CpuBackend


@pytest.mark.parametrize(("limit", "others", "cores", "want"), [
    (2, 0.0, 2, 2),    # quiet
    (2, 0.3, 2, 2),    # a little background work: both cores still pay
    (2, 0.67, 2, 1),   # one busy process beside our two threads (its fair share)
    (2, 1.0, 2, 1),    # ... beside one thread
    (2, 2.0, 2, 1),    # never fewer than one
    (8, 2.6, 8, 5),
    (4, 0.0, 8, 4),    # never more than the limit
])
def test_one_thread_per_free_core(limit, others, cores, want):
    assert T.threads_for(limit, others, cores) == want


@pytest.fixture(autouse=True)
def _no_import_readings(monkeypatch):
    """Each BusyCores here starts from its own first reading, not the engine's import."""
    monkeypatch.setattr(T, "_AT_IMPORT", None)


class FakeTimes:
    """BusyCores._now's readings in turn: (wall, machine busy, own) seconds."""

    def __init__(self, readings):
        self.readings = [T.Mark(*r, 0.0, None) for r in readings]

    def __call__(self):
        return self.readings.pop(0)


def test_busy_cores_subtract_our_own_cpu(monkeypatch):
    fake = FakeTimes([(0.0, 0.0, 0.0), (1.0, 2.0, 1.25), (3.0, 4.0, 3.25)])
    monkeypatch.setattr(T.BusyCores, "_now", lambda self: fake())
    b = T.BusyCores()
    monkeypatch.setattr(T.time, "monotonic", lambda: 0.1)
    assert b.others() is None  # the window has not passed: no reading taken
    monkeypatch.setattr(T.time, "monotonic", lambda: 1.0)
    assert b.others() == pytest.approx(0.75)  # 2 cores busy, 1.25 of them ours
    monkeypatch.setattr(T.time, "monotonic", lambda: 3.0)
    assert b.others() == 0.0  # all the busy time was ours


def test_busy_cores_read_the_cores_this_process_may_use():
    b = T.BusyCores()
    assert 1 <= b.cores <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert b.cores == len(os.sched_getaffinity(0))
    time.sleep(T.LOAD_WINDOW_S)
    others = b.others()  # a real reading: the OS's times of those cores
    assert others is not None and 0.0 <= others <= b.cores + 0.5  # ticks round (10 ms)


class FixedLoad:
    cores = 2

    def __init__(self, others):
        self.value = others

    def others(self):
        return self.value


def test_the_backend_follows_the_load_until_pinned(monkeypatch):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: nothing to choose")
    b = CpuBackend()
    b._auto = 2
    b._use_threads(2)
    load = b._busy = FixedLoad(1.0)
    b.adapt_threads()
    assert b._threads == 1 and numba.get_num_threads() == 1
    load.value = None  # within the window: unchanged
    b.adapt_threads()
    assert b._threads == 1
    load.value = 0.1
    b.adapt_threads()
    assert b._threads == 2 and numba.get_num_threads() == 2
    b.set_threads(2)  # a count the user chose stays, whatever the load
    load.value = 1.5
    b.adapt_threads()
    assert b._threads == 2


def test_the_first_generation_already_follows_the_load(monkeypatch):
    """The load is watched from the backend's creation, so the first choice (one process's
    only generation, as ``inferdesk generate`` runs) rests on a reading, not on none."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: nothing to choose")
    monkeypatch.setattr("inference.backends.cpu.backend.BusyCores", lambda: FixedLoad(1.0))
    b = CpuBackend()
    b._use_threads(2)
    b.adapt_threads()
    assert b._threads == 1


def test_workers_park_while_other_processes_are_busy():
    """Beside a busy process the prefill workers sleep between parts instead of spinning;
    when the load goes, they spin again (new workers take the current state too)."""
    from inference.backends.cpu import threads as cpu_threads

    b = CpuBackend()
    b._auto = 2
    b._use_threads(2)
    workers = b._workers()
    load = b._busy = FixedLoad(0.9)
    b.adapt_threads()
    assert all(w.spin == 0 and w.join_spin == 0 for w in workers)
    b._use_threads(2)
    assert all(w.spin == 0 for w in b._workers())
    load.value = 0.0
    b.adapt_threads()
    assert all(w.spin == cpu_threads.SPIN for w in b._workers())


def test_generation_server_steps_and_embeddings_ask(monkeypatch):
    from inference.api import load_model
    from inference.events import DoneEvent
    from inference.sampling import SamplingParams
    from inference.server.scheduler import Request, Scheduler

    asked = []
    monkeypatch.setattr(CpuBackend, "adapt_threads", lambda self: asked.append("x"))
    llm = load_model("smollm2", backend="cpu")
    events = list(llm.generate(prompt="Hi", max_tokens=4,
                               sampling=SamplingParams(temperature=0.0)))
    tokens = sum(not isinstance(e, DoneEvent) for e in events)
    assert len(asked) >= tokens, "generate: at its start and before every decode step"
    asked.clear()
    sched = Scheduler(llm, parallel=2)
    try:
        done = []
        ids = llm.tokenizer.encode("Hi")
        sched.submit(Request(ids, 2, SamplingParams(temperature=0.0),
                             emit=lambda ev, lp: done.append(ev)))
        deadline = time.monotonic() + 120
        while not any(isinstance(e, DoneEvent) for e in done):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        sched.close()
    assert asked, "server steps"
    asked.clear()
    enc = load_model("all-MiniLM-L6-v2", backend="cpu")
    enc.embed(["a sentence"])
    assert asked, "embeddings"


def test_a_generation_reports_its_threads():
    from inference.api import load_model
    from inference.events import DoneEvent

    llm = load_model("smollm2", backend="cpu")
    done = [e for e in llm.generate(prompt="Hi", max_tokens=2) if isinstance(e, DoneEvent)]
    used, most = done[0].threads
    assert 1 <= used <= most and (used, most) == llm.backend.threads()
    ref = load_model("smollm2", backend="numpy")
    done = [e for e in ref.generate(prompt="Hi", max_tokens=2) if isinstance(e, DoneEvent)]
    assert done[0].threads is None  # the reference backend does not choose a count


def test_workers_park_beside_busy_processes_with_a_pinned_count():
    """A count the user chose stays, but its workers still stop spinning beside a busy
    process (a spinning waiter takes the slice its descheduled partner needs)."""
    b = CpuBackend()
    b.set_threads(2)
    workers = b._workers()
    b._busy = FixedLoad(1.5)
    b.adapt_threads()
    assert b._threads == min(2, numba.config.NUMBA_NUM_THREADS)
    assert all(w.spin == 0 and w.join_spin == 0 for w in workers)


@pytest.mark.parametrize(("busy", "preset", "want", "seen"), [
    (True, None, "passive", "passive"),  # beside busy processes: asleep at once
    (False, None, "spin", None),  # quiet: OpenMP's default spin
    (True, "active", "as set", "active"),  # the user's own setting is left alone
])
def test_kernel_threads_wait_as_the_load_asks(monkeypatch, busy, preset, want, seen):
    from numba.np.ufunc import parallel

    from inference.backends.cpu import threads as cpu_threads

    launched = []
    monkeypatch.setattr(parallel, "_launch_threads",
                        lambda: launched.append(os.environ.get("OMP_WAIT_POLICY")))
    monkeypatch.setattr(cpu_threads, "_omp_loaded", lambda: False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    if preset is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", preset)
    assert cpu_threads.launch_kernel_threads(busy) == want
    assert launched == [seen]  # what the library read as it loaded
    assert os.environ.get("OMP_WAIT_POLICY") == preset  # and no child inherits ours


def test_niced_processes_count_as_busy_only_for_a_niced_process():
    """Time of processes niced above 0 takes few of a nice-0 process's time slices: it is
    left out of the busy time unless asked for (this process niced too)."""
    from types import SimpleNamespace

    cpus = [SimpleNamespace(user=1.0, nice=4.0, system=0.5, idle=9.0, steal=0.25),
            SimpleNamespace(user=2.0, nice=0.0, system=0.0, idle=9.0, irq=0.125)]
    assert T.busy_seconds(cpus, count_niced=False) == 3.875
    assert T.busy_seconds(cpus, count_niced=True) == 7.875


def _row(user: float, nice: float = 0.0) -> T.CpuTimes:
    return T.CpuTimes(user=user, nice=nice, system=0.0, idle=0.0)


def test_the_first_busy_cores_averages_from_the_engine_import(monkeypatch):
    """A load shorter than the first window still gets a reading of the cores' load: the
    process's first BusyCores starts at the readings taken as the engine was imported (one
    nice-0 loop beside it on one of two cores for the 2 s since), once; a forked child's
    inherited readings are not its own."""
    monkeypatch.setattr(T.os, "nice", lambda inc: 0)
    monkeypatch.setattr(T, "usable_cpus", lambda: [0, 1])
    now = T.Readings(os.getpid(), 12.0, [_row(2.0), _row(0.5)], 0.5, None)
    monkeypatch.setattr(T, "readings", lambda per_process: now)
    monkeypatch.setattr(T.time, "monotonic", lambda: 12.0)
    start = T.Readings(os.getpid(), 10.0, [_row(0.0), _row(0.0)], 0.0, None)
    monkeypatch.setattr(T, "_AT_IMPORT", start)
    assert T.BusyCores().others(0.1, peek=True) == 1.0  # (2.5 busy - 0.5 ours) / 2 s
    assert T._AT_IMPORT is None and T.BusyCores().others(0.1) is None  # used once
    monkeypatch.setattr(T, "_AT_IMPORT", start._replace(pid=os.getpid() + 1))
    assert T.BusyCores().others(0.1) is None  # another process's readings


@pytest.mark.parametrize(("their_nice", "want"), [
    (0, 0.8 ** 10),  # a nice-0 loop beside us at nice -10: ~1 time slice in 10
    (-10, 1.0),  # one of our own priority takes its fair share: counted whole
    (-15, 1.0),  # a higher priority: whole too
    (19, 0.8 ** 29),  # a nice-19 one next to nothing
])
def test_at_a_negative_nice_each_process_counts_by_its_priority(monkeypatch, their_nice,
                                                                 want):
    """At nice -10 the CPUs' "user" time holds nice-0 and nice -10 processes alike: the
    busy cores come from each process whose CPU time rose, weighed by its priority against
    ours; an idle process and this one do not count."""
    me = os.getpid()
    monkeypatch.setattr(T.os, "nice", lambda inc: -10)
    monkeypatch.setattr(T, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(T, "sched_group", lambda pid="self": T._NO_GROUP)  # one group
    # 2 s: the loop (pid 1) on one core, ours 0.5 s, an idle pid 2, a new pid 3 0.2 s.
    before = T.Readings(me, 10.0, [_row(0.0), _row(0.0)], 0.0,
                        {1: (5.0, their_nice), 2: (7.0, -10), me: (0.0, -10)})
    after = T.Readings(me, 12.0, [_row(2.2), _row(0.5)], 0.5,
                       {1: (7.0, their_nice), 2: (7.0, -10), 3: (0.2, -10), me: (0.5, -10)})
    asked = []
    monkeypatch.setattr(T, "readings", lambda per_process: asked.append(per_process) or after)
    monkeypatch.setattr(T, "_AT_IMPORT", before)
    monkeypatch.setattr(T.time, "monotonic", lambda: 12.0)
    others = T.BusyCores().others(0.1)
    assert asked == [True]  # read process by process
    assert others == pytest.approx((2.0 * want + 0.2) / 2.0)


def test_a_process_pinned_elsewhere_takes_none_of_our_cores(monkeypatch):
    """The processes' weighed time is capped at what our cores' own times show busy."""
    me = os.getpid()
    monkeypatch.setattr(T.os, "nice", lambda inc: -10)
    monkeypatch.setattr(T, "usable_cpus", lambda: [0])  # the loop runs on CPU 1
    monkeypatch.setattr(T, "sched_group", lambda pid="self": T._NO_GROUP)
    before = T.Readings(me, 10.0, [_row(0.0), _row(0.0)], 0.0, {1: (0.0, -10)})
    after = T.Readings(me, 12.0, [_row(0.0), _row(2.0)], 0.0, {1: (2.0, -10)})
    monkeypatch.setattr(T, "readings", lambda per_process: after)
    monkeypatch.setattr(T, "_AT_IMPORT", before)
    monkeypatch.setattr(T.time, "monotonic", lambda: 12.0)
    assert T.BusyCores().others(0.1) == 0.0


@pytest.mark.parametrize(("theirs", "want"), [
    (("/autogroup-1", 0), 1.0),  # a loop from another terminal: its group's half, whole
    (("/autogroup-1", 10), 0.8 ** 10),  # another autogroup niced below ours
    (("cgroup:/user.slice/app.scope", 0), 1.0),  # another CPU cgroup: whole
    (("/autogroup-2", 0), 0.8 ** 10),  # our own autogroup: by the processes' nice
])
def test_priority_counts_only_inside_a_scheduling_group(monkeypatch, theirs, want):
    """At nice -10 a nice-0 loop in another scheduling group is not held back by our
    priority: its time counts whole, or by the two autogroups' nice."""
    me = os.getpid()
    monkeypatch.setattr(T.os, "nice", lambda inc: -10)
    monkeypatch.setattr(T, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(T, "sched_group",
                        lambda pid="self": ("/autogroup-2", 0) if pid == "self" else theirs)
    before = T.Readings(me, 10.0, [_row(0.0), _row(0.0)], 0.0, {1: (5.0, 0), me: (0.0, -10)})
    after = T.Readings(me, 12.0, [_row(2.0), _row(0.5)], 0.5, {1: (7.0, 0), me: (0.5, -10)})
    monkeypatch.setattr(T, "readings", lambda per_process: after)
    monkeypatch.setattr(T, "_AT_IMPORT", before)
    monkeypatch.setattr(T.time, "monotonic", lambda: 12.0)
    assert T.BusyCores().others(0.1) == pytest.approx(2.0 * want / 2.0)


@pytest.mark.parametrize(("theirs", "want"), [
    (("/autogroup-1", 0), 1.0),  # a niced build in another session: a full share
    (("/autogroup-2", 0), 0.8 ** 10),  # ours: it takes few of our slices
])
def test_at_nice_0_niced_time_is_looked_into_once_it_shows(monkeypatch, theirs, want):
    """At nice 0 niced processes' time is left out only when they share our scheduling
    group: it counts whole until each process has been read at two looks, then by group."""
    me = os.getpid()
    monkeypatch.setattr(T.os, "nice", lambda inc: 0)
    monkeypatch.setattr(T, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(T, "sched_group",
                        lambda pid="self": ("/autogroup-2", 0) if pid == "self" else theirs)
    clock = [10.0]
    monkeypatch.setattr(T.time, "monotonic", lambda: clock[0])
    asked = []

    def readings(per_process):  # a nice-10 process (pid 1) busy on one core, 1 s a second
        asked.append(per_process)
        t = clock[0] - 10.0
        return T.Readings(me, clock[0], [_row(0.0, nice=t), _row(0.0)], 0.0,
                          {1: (t, 10), me: (0.0, 0)} if per_process else None)
    monkeypatch.setattr(T, "readings", readings)
    monkeypatch.setattr(T, "_AT_IMPORT", None)
    busy = T.BusyCores()
    seen = []
    for _ in range(3):
        clock[0] += 2.0
        seen.append(busy.others(0.1))
    assert asked == [False, False, True, True]  # process by process once niced time showed
    assert seen == [1.0, 1.0, pytest.approx(want)]


def test_at_nice_0_niced_time_in_one_group_is_left_out(monkeypatch):
    """With no scheduling groups (no autogroups, the root cgroup) niced processes take few of
    a nice-0 process's slices: left out, and no process is read."""
    me = os.getpid()
    monkeypatch.setattr(T.os, "nice", lambda inc: 0)
    monkeypatch.setattr(T, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(T, "sched_group", lambda pid="self": T._NO_GROUP)
    before = T.Readings(me, 10.0, [_row(0.0), _row(0.0)], 0.0, None)
    after = T.Readings(me, 12.0, [_row(0.0, nice=2.0), _row(0.0)], 0.0, None)
    asked = []
    monkeypatch.setattr(T, "readings", lambda per_process: asked.append(per_process) or after)
    monkeypatch.setattr(T, "_AT_IMPORT", before)
    monkeypatch.setattr(T.time, "monotonic", lambda: 12.0)
    assert T.BusyCores().others(0.1) == 0.0 and asked == [False]


def test_sched_group_reads_this_process(monkeypatch):
    """/proc names this process's group: an autogroup with its nice, a CPU cgroup, or none."""
    if not os.path.exists("/proc/self/cgroup"):
        pytest.skip("no /proc")
    group, nice = T.sched_group()
    assert group == "" or group.startswith(("/autogroup-", "cgroup:/"))
    assert isinstance(nice, int)
    assert T.sched_group(2 ** 31 - 1) == T._NO_GROUP  # no such process


def test_the_cpus_times_are_read_without_psutil(monkeypatch):
    """/proc/stat and /proc/<pid>/stat give what psutil would (it costs ~20 ms to import)."""
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc")
    import psutil

    ours, theirs = T.cpu_times(), psutil.cpu_times(percpu=True)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert a.user == pytest.approx(b.user, abs=1.0)  # read at two moments
    procs = T.process_times()
    own = psutil.Process()
    assert procs[os.getpid()][1] == own.nice()
    assert procs[os.getpid()][0] == pytest.approx(sum(own.cpu_times()[:2]), abs=0.5)
