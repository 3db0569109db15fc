"""Embedding requests from many clients, batched: one thread takes every request waiting
when it wakes and embeds all their sentences in one ``Encoder.embed`` call (whose planner
groups them by length), then hands each request its rows."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from inference.server.scheduler import QueueFullError

MAX_SENTENCES_PER_CALL = 1024  # one call's sentences: bounds its memory and latency


class EmbedBatcher:
    def __init__(self, encoder: Any, max_waiting: int = 64):
        self.encoder = encoder
        self.max_waiting = max_waiting
        self.calls = 0  # embed() calls made (tests read it)
        self._waiting: collections.deque[tuple[list[str], Future[np.ndarray]]] = (
            collections.deque())
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="inferdesk-embed", daemon=True)
        self._thread.start()

    def submit(self, sentences: list[str]) -> Future[np.ndarray]:
        fut: Future[np.ndarray] = Future()
        with self._cv:
            if self._closed:
                raise QueueFullError("The server is shutting down.")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(f"{len(self._waiting)} embedding requests are waiting; "
                                     "retry shortly.")
            self._waiting.append((sentences, fut))
            self._cv.notify()
        return fut

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._waiting:
                    self._cv.wait()
                if self._closed:
                    break
                batch: list[tuple[list[str], Future[np.ndarray]]] = []
                n = 0
                while self._waiting and (not batch or n + len(self._waiting[0][0])
                                         <= MAX_SENTENCES_PER_CALL):
                    item = self._waiting.popleft()
                    if item[1].set_running_or_notify_cancel():  # False: the client left
                        batch.append(item)
                        n += len(item[0])
            if not batch:
                continue
            try:
                vecs = self.encoder.embed([s for sents, _ in batch for s in sents])
                self.calls += 1
            except BaseException as e:  # noqa: BLE001 - each request gets the error
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            row = 0
            for sents, fut in batch:
                fut.set_result(vecs[row: row + len(sents)])
                row += len(sents)
        with self._cv:
            for _, fut in self._waiting:
                fut.cancel()
            self._waiting.clear()
