"""Embedding requests from many clients, batched: one thread takes every request waiting
when it wakes and embeds all their sentences in one ``Encoder.embed`` call (whose planner
groups them by length), then hands each request its rows.

A request whose client has gone (:meth:`EmbedJob.abandon`) never starts; one abandoned
while its call runs stops that call between its forward passes, and the call's other
requests go back to the front of the queue (their work is redone without it), so an
abandoned request costs the ones behind it at most one forward pass."""

from __future__ import annotations

import collections
import contextlib
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from inference.backends.base import trim_host_heap
from inference.errors import CancelledError
from inference.server.scheduler import IDLE_TRIM_S, QueuedWorker

MAX_SENTENCES_PER_CALL = 1024  # one call's sentences: bounds its memory and latency


class EmbedJob:
    """One request's sentences and the future of their rows."""

    def __init__(self, sentences: list[str]):
        self.sentences = sentences
        self.future: Future[np.ndarray] = Future()
        self.cancel = threading.Event()  # set: the client no longer wants the rows

    def abandon(self) -> None:
        self.cancel.set()
        self.future.cancel()  # not started yet: it never will


class _AnyOf:
    """``is_set`` of any of several events: the embed call's cancel flag."""

    def __init__(self, events: list[threading.Event]):
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class EmbedBatcher(QueuedWorker):
    what = "embedding"

    def __init__(self, encoder: Any, max_waiting: int = 64, lock: Any = None):
        self.encoder = encoder
        self.lock = lock if lock is not None else contextlib.nullcontext()  # held per call
        self.max_waiting = max_waiting
        self.calls = 0  # embed() calls completed (tests read it)
        self.abandoned = 0  # calls stopped because a request in them was abandoned
        self._waiting: collections.deque[EmbedJob] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self._dirty = False  # work done since the heap was last trimmed
        self.stopped: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="inferdesk-embed", daemon=True)
        self._thread.start()

    def submit(self, sentences: list[str]) -> EmbedJob:
        job = EmbedJob(sentences)
        self._admit(job)
        return job

    def pending(self) -> int:
        with self._cv:
            return len(self._waiting)

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as e:
            self.stopped = e
            raise
        finally:
            with self._cv:
                for job in self._waiting:
                    job.future.cancel()
                self._waiting.clear()

    def _take(self) -> list[EmbedJob] | None:
        """The next call's requests (None: closed); waits for work."""
        with self._cv:
            while not self._closed and not self._waiting:
                if self._dirty and not self._cv.wait(IDLE_TRIM_S):
                    self._dirty = False  # idle after work: give freed buffers back
                    trim_host_heap()
                elif not self._dirty:
                    self._cv.wait()
            if self._closed:
                return None
            batch: list[EmbedJob] = []
            n = 0
            while self._waiting and (not batch or n + len(self._waiting[0].sentences)
                                     <= MAX_SENTENCES_PER_CALL):
                job = self._waiting.popleft()
                if job.future.running() or job.future.set_running_or_notify_cancel():
                    batch.append(job)  # (False: abandoned while it waited)
                    n += len(job.sentences)
            return batch

    def _serve(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            self._dirty = True
            try:
                with self.lock:
                    vecs = self.encoder.embed([s for job in batch for s in job.sentences],
                                              cancel=_AnyOf([job.cancel for job in batch]))
                self.calls += 1
            except CancelledError:  # a client left: the others go again, first in line
                self.abandoned += 1
                keep = [job for job in batch if not job.cancel.is_set()]
                for job in batch:
                    if job.cancel.is_set():
                        job.future.set_exception(CancelledError("The client went away."))
                with self._cv:
                    self._waiting.extendleft(reversed(keep))
                continue
            except Exception as e:  # noqa: BLE001 - each request gets the error
                for job in batch:
                    job.future.set_exception(e)
                continue
            row = 0
            for job in batch:
                job.future.set_result(vecs[row: row + len(job.sentences)])
                row += len(job.sentences)
