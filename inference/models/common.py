"""Pieces every architecture shares: config parsing and weight lookup."""

from __future__ import annotations

import dataclasses
from typing import Any

from inference.backends.base import Backend
from inference.errors import UnsupportedModelError
from inference.formats.tensor import Checkpoint, TensorData


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Build a config dataclass from a Hugging Face config dict, ignoring unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names and v is not None})


class Weights:
    """Looks tensors up by Hugging Face name and converts them through the backend."""

    def __init__(self, ckpt: Checkpoint, backend: Backend):
        self.ckpt = ckpt
        self.B = backend

    def has(self, name: str) -> bool:
        return name in self.ckpt.tensors

    def tensor(self, name: str) -> TensorData:
        try:
            return self.ckpt.tensors[name]
        except KeyError:
            raise UnsupportedModelError(
                f"{self.ckpt.path.name} has no tensor '{name}', which this architecture needs."
            ) from None

    def linear(self, name: str) -> Any:
        return self.B.weight(self.tensor(name))

    def dense(self, name: str) -> Any:
        return self.B.dense(self.tensor(name))

    def optional_dense(self, name: str) -> Any | None:
        return self.dense(name) if self.has(name) else None
