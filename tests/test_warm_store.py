"""The install's warm-up (``python -m inference.warm``, run by ``make run`` / ``make test``)
generates a few tokens with the bundled chat model, so that model's packed store is written
at install: the first generate after it maps the store instead of packing."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference import warm
from inference.backends.cpu.pack import stores
from tests.bundled import smollm2_gguf


def test_warm_up_writes_the_bundled_models_store(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path))
    assert stores() == []
    steps = dict(warm.model_steps())
    steps["the bundled chat model"]()
    made = [e for e in stores() if e.model == str(smollm2_gguf().resolve())]
    assert len(made) == 1 and made[0].nbytes > 0
