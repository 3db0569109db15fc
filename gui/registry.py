"""The app's loaded models, owned in one place: one chat model and one encoder at most,
each with the lock its forward passes hold. The chat, the embeddings tab and the server
tab all use these objects (never a copy), and a chat turn and a server step on the same
model take turns through its lock. No Qt here: jobs and server threads call it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)
KINDS = ("causal", "encoder")
MEMORY_SAMPLE_S = 0.2  # samples feed the >= 4 Hz memory graphs


@dataclass
class MemoryReading:
    """A memory sample of a model's backend (a job's progress payload)."""
    backend: str
    sample: Any  # inference.events.MemorySample


def release_memory() -> None:
    """Give freed model memory back: collect cycles, then return free heap pages to the
    OS (glibc's ``malloc_trim``; elsewhere the collection alone)."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim with
        pass


class ForwardLock:
    """A lock held for a model's forward passes; ``waiting`` counts the threads queued
    for it (a server step waiting out a chat turn)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = threading.Lock()
        self.waiting = 0

    def __enter__(self) -> ForwardLock:
        if not self._lock.acquire(blocking=False):
            with self._count:
                self.waiting += 1
            try:
                self._lock.acquire()
            finally:
                with self._count:
                    self.waiting -= 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


class ModelRegistry:
    """Models by kind ("causal", "encoder"), the lock of each kind, and the encoder's last
    embedded sentences (what the embeddings tab searches and exports)."""

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}
        self.locks = {kind: ForwardLock() for kind in KINDS}
        self.sentences: list[str] = []
        self.vectors: Any = None  # (n, dim) float32 of ``sentences``, or None
        self._on_release: list[Callable[[str], None]] = []
        self._last_sample = 0.0

    def get(self, kind: str) -> Any:
        return self._models.get(kind)

    def kinds(self) -> list[str]:
        return list(self._models)

    @contextmanager
    def using(self, kind: str, missing: str) -> Iterator[Any]:
        """The model of ``kind`` with its forward lock held; ``missing``: the sentence
        raised when none is loaded."""
        from inference.errors import InvalidInputError

        with self.locks[kind]:
            model = self._models.get(kind)
            if model is None:
                raise InvalidInputError(missing)
            yield model

    def on_release(self, callback: Callable[[str], None]) -> None:
        """``callback(kind)`` runs before a model of ``kind`` is closed (a server that
        serves it stops first)."""
        self._on_release.append(callback)

    def put(self, model: Any) -> bool:
        """Own ``model`` under its kind, closing the one it replaces; True if one was."""
        replaced = self.remove(model.kind)
        self._models[model.kind] = model
        return replaced

    def remove(self, kind: str) -> bool:
        """Close the model of ``kind`` and give its memory back; False if none was loaded."""
        if kind not in self._models:
            return False
        for callback in self._on_release:
            callback(kind)
        with self.locks[kind]:
            model = self._models.pop(kind)
            if kind == "encoder":
                self.sentences, self.vectors = [], None
            model.close()
            del model
        release_memory()
        return True

    def close_all(self) -> None:
        for kind in list(self._models):
            try:
                self.remove(kind)
            except Exception:  # noqa: BLE001 - closing is best effort at exit
                log.debug("close failed", exc_info=True)

    def sample(self, model: Any = None, force: bool = True) -> MemoryReading | None:
        """A memory reading of ``model`` (or the chat model, else the encoder); with
        ``force`` False, None within MEMORY_SAMPLE_S of the last one."""
        now = time.monotonic()
        if not force and now - self._last_sample < MEMORY_SAMPLE_S:
            return None
        self._last_sample = now
        model = model or self._models.get("causal") or self._models.get("encoder")
        try:
            if model is not None:
                return MemoryReading(model.backend.name, model.backend.memory())
        except Exception:  # noqa: BLE001 - a missing sample must not end a job
            log.debug("memory sample failed", exc_info=True)
        return None
