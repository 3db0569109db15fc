"""A load lets go of the model file's pages as it converts, not only at its end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference.backends.numpy_backend import NumpyBackend
from inference.formats.tensor import Checkpoint, TensorData
from inference.models import common
from inference.models.common import Weights


def _mapped_checkpoint(tmp_path: Path, n: int) -> tuple[Checkpoint, np.ndarray]:
    """``n`` (64, 64) float32 tensors, views of one read-only memory-mapped file."""
    values = np.random.default_rng(0).standard_normal((n, 64, 64)).astype(np.float32)
    values.tofile(tmp_path / "w.bin")
    mapped = np.memmap(tmp_path / "w.bin", np.float32, "r", shape=values.shape)
    tensors = {f"t{i}": TensorData(f"t{i}", (64, 64), "F32", mapped[i]) for i in range(n)}
    return Checkpoint(tmp_path / "w.bin", "gguf", {}, tensors), values


def test_file_pages_released_every_few_bytes_converted(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt, values = _mapped_checkpoint(tmp_path, 8)
    released: list[int] = []
    release = ckpt.release_pages

    def spy() -> None:
        released.append(weights.done)
        release()

    monkeypatch.setattr(ckpt, "release_pages", spy)
    monkeypatch.setattr(common, "RELEASE_EVERY", 3 * 64 * 64 * 4)  # every third tensor
    weights = Weights(ckpt, NumpyBackend())
    out = [weights.dense(f"t{i}") for i in range(8)]
    assert released == [3 * 64 * 64 * 4, 6 * 64 * 64 * 4]
    # Released pages come back from the file when read again: the weights are unchanged.
    for i, w in enumerate(out):
        np.testing.assert_array_equal(np.asarray(w), values[i])
