"""Subprocess checks started as soon as the session's tests are chosen, one at a time on a
thread of their own. What they spend is compiling (every kernel for another CPU target, or
over a fresh numba cache, 10-20 s each on a cold clone), and the suite around them runs
mostly on one core, so they take the idle one instead of adding to the wall time.

A test opts in with ``@pytest.mark.early(steps=fn)``: ``fn(tmp)`` returns the commands
(:class:`Step`, run in order until one fails, ``tmp`` a fresh directory of their own) or a
string, the reason the check does not apply here. The test then takes the finished runs from
:func:`result` (a list of ``CompletedProcess``) or skips with that reason. Run on its own,
without the session hook, a test still gets its result: it starts its steps then. So does
every early test of a pytest-xdist worker (``make test TEST_WORKERS=2`` runs two): each
worker collects all the tests but runs only those sent to it, so the session hook starts
nothing there, and each
check runs once, in the worker that asserts on it, while the other worker keeps the second
core busy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

TIMEOUT_S = 900  # one step; a cold compile takes 10-40 s on 2 busy cores
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    argv: Sequence[str]
    env: dict[str, str]
    cwd: Path


Steps = Callable[[Path], "list[Step] | str"]


def python(code: str, *args: str, **env: str | None) -> Step:
    """``python -c code *args`` in the repository's root, with ``env`` over this process's
    environment (a None value removes the variable)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    return Step([sys.executable, "-c", code, *args], full, ROOT)


def over_one_cache(code: str, *runs: str) -> Steps:
    """Steps for ``python -c code run``, one process per ``run`` in turn, all over one fresh
    numba cache (the check's ``tmp``)."""
    return lambda tmp: [python(code, run, NUMBA_CACHE_DIR=str(tmp)) for run in runs]


def assert_ok(runs: Sequence[subprocess.CompletedProcess[str]], names: Sequence[str]) -> None:
    """Every step ran (one run per name) and printed "ok"; else the failing one's stderr."""
    assert len(runs) == len(names), runs[-1].stderr[-2000:]
    for name, out in zip(names, runs, strict=True):
        assert out.returncode == 0 and "ok" in out.stdout, (name, out.stderr[-2000:])


class _Job:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.done = threading.Event()
        self.runs: list[subprocess.CompletedProcess[str]] | str = []


_lock = threading.Lock()
_jobs: dict[str, _Job] = {}
_queue: list[_Job] = []
_current: list[subprocess.Popen[str]] = []
_running = [False]  # a worker thread is on the queue (set and cleared under _lock)
_stopped = threading.Event()


def _work() -> None:
    while True:
        with _lock:
            if not _queue or _stopped.is_set():
                _running[0] = False
                return
            job = _queue.pop(0)
        tmp = Path(tempfile.mkdtemp(prefix="inferdesk-early-"))
        try:
            steps = job.steps(tmp)
            if isinstance(steps, str):
                job.runs = steps
                continue
            runs: list[subprocess.CompletedProcess[str]] = []
            for step in steps:
                if _stopped.is_set():
                    break
                proc = subprocess.Popen(list(step.argv), env=step.env, cwd=step.cwd, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                _current[:] = [proc]
                try:
                    out, err = proc.communicate(timeout=TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
                _current.clear()
                runs.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
                if proc.returncode:
                    break
            job.runs = runs
        except Exception as e:  # the test reports it, not the thread
            job.runs = [subprocess.CompletedProcess([], -1, "", f"{type(e).__name__}: {e}")]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            job.done.set()


def start(items: Sequence[pytest.Item]) -> None:
    """Queue the early steps of ``items`` (in their order) and start the worker thread."""
    with _lock:
        for item in items:
            mark = item.get_closest_marker("early")
            if mark is not None and item.nodeid not in _jobs:
                _jobs[item.nodeid] = job = _Job(mark.kwargs["steps"])
                _queue.append(job)
        if _queue and not _running[0]:
            _running[0] = True
            threading.Thread(target=_work, name="early-subprocesses", daemon=True).start()


def result(item: pytest.Item) -> list[subprocess.CompletedProcess[str]]:
    """The finished runs of ``item``'s steps (started now if the session hook did not)."""
    if item.nodeid not in _jobs:
        start([item])
    job = _jobs[item.nodeid]
    job.done.wait()
    if isinstance(job.runs, str):
        pytest.skip(job.runs)
    return job.runs


def stop() -> None:
    """End of session: queued steps are dropped and a running one is killed."""
    _stopped.set()
    for proc in list(_current):
        proc.kill()
