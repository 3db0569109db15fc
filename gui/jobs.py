"""One job runner: every piece of engine work the window asks for runs here, in order, on
one background thread.

``runner.submit(kind, fn, *args)`` queues ``fn(ctx, *args)`` and returns a :class:`Job`.
The function runs on the runner's thread and never touches a widget or a Qt object: it
reads the loaded models from ``ctx.models`` (the :class:`~gui.registry.ModelRegistry`),
reports with ``ctx.progress(payload)``, polls ``ctx.cancel`` and returns its result (or
raises: an engine error becomes its one sentence, :class:`CancelledError` a cancel).
The job's signals (``started``, ``progress``, ``result``, ``error``, ``cancelled``,
``finished``) are emitted on the GUI thread, as are the runner's, which repeat them for
every job so that observers (the status bar, the performance graphs) need not know who
asked. Cancelling sets a ``threading.Event`` that the running function polls, since a busy
thread cannot process requests.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, Signal, Slot

from gui.registry import ModelRegistry

log = logging.getLogger(__name__)


def user_message(exc: BaseException) -> str:
    """One sentence for the window. Engine errors already are one; others get a prefix."""
    from inference.errors import InferdeskError

    if isinstance(exc, InferdeskError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "Out of memory: close other programs or choose a smaller model."
    return f"Unexpected error ({type(exc).__name__}): {exc}"


class JobContext:
    """What a job's function gets: the models, its cancel event and a progress call."""

    def __init__(self, job: Job, models: ModelRegistry):
        self.job = job
        self.models = models
        self.cancel: threading.Event = job.cancel_event

    def progress(self, payload: Any) -> None:
        """Report ``payload`` (delivered on the GUI thread, in order)."""
        self.job._post.emit("progress", payload)


class Job(QObject):
    """One queued piece of work. Its outcome, once ``finished``: ``ok`` with ``value``,
    or ``message`` (the error's sentence), or ``was_cancelled``."""

    started = Signal()
    progress = Signal(object)
    result = Signal(object)
    error = Signal(str)  # one sentence
    cancelled = Signal()
    finished = Signal()
    _post = Signal(str, object)  # from the runner's thread; queued to this object's thread

    def __init__(self, runner: JobRunner, kind: str, fn: Callable[..., Any], args: tuple,
                 quiet: bool):
        super().__init__()
        self.runner, self.kind, self.fn, self.args, self.quiet = runner, kind, fn, args, quiet
        self.cancel_event = threading.Event()
        self.done = False
        self.ok = False
        self.value: Any = None
        self.message = ""
        self.was_cancelled = False
        self._post.connect(self._deliver)

    def cancel(self) -> None:
        """Ask the job to stop (a queued one does not start; generation stops within a
        token)."""
        self.cancel_event.set()

    @Slot(str, object)
    def _deliver(self, what: str, payload: Any) -> None:
        r = self.runner if shiboken6.isValid(self.runner) else _NOBODY  # a closed pane's
        if what == "started":
            self.started.emit()
            r.started.emit(self)
            if not self.quiet:
                r.busy.emit(self.kind)
        elif what == "progress":
            self.progress.emit(payload)
            r.progress.emit(self, payload)
        elif what == "result":
            self.ok, self.value = True, payload
            self.result.emit(payload)
        elif what == "error":
            self.message = payload
            self.error.emit(payload)
            if not self.quiet:
                r.failed.emit(self.kind, payload)
        elif what == "cancelled":
            self.was_cancelled = True
            self.cancelled.emit()
            r.cancelled.emit(self.kind)
        elif what == "finished":
            self.done = True
            r._jobs.discard(self)
            self.finished.emit()
            r.done.emit(self)
            if not self.quiet:
                r.busy.emit("")


class _Nobody:
    """Stands for a runner already deleted (its pane closed): its observers are gone."""

    def __getattr__(self, name: str) -> Any:
        return _Nobody()

    def __call__(self, *args: Any) -> None:
        return None


_NOBODY: Any = _Nobody()


class JobRunner(QObject):
    """A queue of jobs and the one thread that runs them (see the module's docstring)."""

    started = Signal(object)  # Job
    progress = Signal(object, object)  # Job, payload
    done = Signal(object)  # Job, finished (its outcome on it)
    failed = Signal(str, str)  # job kind, one sentence (quiet jobs excepted)
    cancelled = Signal(str)  # job kind
    busy = Signal(str)  # job kind, "" when idle (quiet jobs excepted)

    _STOP = object()

    def __init__(self, name: str = "inferdesk-jobs", models: ModelRegistry | None = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.models = models if models is not None else ModelRegistry()
        self.job = ""  # what the thread is doing, as last reported ("" idle)
        self._jobs: set[Job] = set()  # queued or running, kept alive until finished
        self._queue: queue.Queue = queue.Queue()
        self.busy.connect(self._set_busy)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _set_busy(self, kind: str) -> None:
        self.job = kind

    def submit(self, kind: str, fn: Callable[..., Any], *args: Any,
               quiet: bool = False) -> Job:
        """Queue ``fn(ctx, *args)``. A ``quiet`` job (a count for a label) shows no busy
        state and no error banner."""
        job = Job(self, kind, fn, args, quiet)
        self._jobs.add(job)
        self._queue.put(job)
        return job

    def cancel(self, kind: str) -> None:
        """Cancel every queued or running job of ``kind``."""
        for job in list(self._jobs):
            if job.kind == kind:
                job.cancel()

    def active(self) -> list[Job]:
        """Jobs queued or running (their ``finished`` not yet delivered)."""
        return list(self._jobs)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, timeout_ms: int = 20000) -> bool:
        """Cancel what is queued or running, close the models and stop the thread, waiting
        at most ``timeout_ms``. A job that ignores its cancel is left to end with the
        process (the thread is a daemon): False then."""
        for job in list(self._jobs):
            job.cancel()
        if not self._thread.is_alive():
            return True
        self._queue.put(self._STOP)
        self._thread.join(timeout_ms / 1000)
        if self._thread.is_alive():
            log.warning("job thread did not stop within %d ms; left to the process's end",
                        timeout_ms)
            return False
        return True

    # --- the runner's thread (no widgets, no Qt objects but the jobs' own signals) -----
    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            if job is self._STOP:
                self.models.close_all()
                return
            self._run(job)

    def _run(self, job: Job) -> None:
        from inference.errors import CancelledError, InferdeskError

        post = job._post.emit
        if job.cancel_event.is_set():  # cancelled while it waited
            post("cancelled", None)
            post("finished", None)
            return
        post("started", None)
        try:
            value = job.fn(JobContext(job, self.models), *job.args)
        except CancelledError:
            post("cancelled", None)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a message
            if not isinstance(exc, InferdeskError):
                log.exception("%s failed", job.kind)
            post("error", user_message(exc))
        else:
            post("result", value)
        finally:
            if not job.quiet:
                sample = self.models.sample()
                if sample is not None:
                    post("progress", sample)
            post("finished", None)


def on_result(runner: JobRunner, kind: str, slot: Callable[[Any], None]
              ) -> Callable[[Job], None]:
    """Call ``slot(value)`` on the GUI thread whenever a job of ``kind`` succeeds; the
    function connected to ``runner.done`` (to disconnect it)."""
    def done(job: Job) -> None:
        if job.kind == kind and job.ok:
            slot(job.value)

    runner.done.connect(done)
    return done


def on_progress(runner: JobRunner, payload_type: type, slot: Callable[[Any], None],
                kind: str | None = None) -> Callable[[Job, Any], None]:
    """Call ``slot(payload)`` for every progress payload of ``payload_type`` (from jobs of
    ``kind``, or any job); the function connected to ``runner.progress``."""
    def progress(job: Job, payload: Any) -> None:
        if isinstance(payload, payload_type) and (kind is None or job.kind == kind):
            slot(payload)

    runner.progress.connect(progress)
    return progress
