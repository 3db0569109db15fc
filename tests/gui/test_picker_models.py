"""The picker shows each model's architecture and context length, and for a model the engine
cannot run, why, with Load disabled, before the user tries it. The figures come
from the store's headers-only description (:func:`inference.store.spec_for_path`), the same
function `inferdesk models` prints."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from gui.model_picker import COLUMNS
from inference import load_model
from inference.errors import InferdeskError
from tests.gui.conftest import wait_until

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"
TINY = GOLDENS / "tiny"


def _refused_gemma3(tmp_path: Path) -> Path:
    """The tiny Gemma renamed to the multimodal ``gemma3`` type, which the engine refuses."""
    d = tmp_path / "gemma3-multimodal"
    shutil.copytree(TINY / "gemma", d)
    cfg = json.loads((d / "config.json").read_text()) | {"model_type": "gemma3"}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _broken_gguf(tmp_path: Path) -> Path:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 3) + os.urandom(256))
    return bad


def _cell(picker, row: int, column: str) -> str:  # noqa: ANN001
    return picker.table.item(row, COLUMNS.index(column)).text()


def _row(picker, path: Path) -> int:  # noqa: ANN001
    return next(r for r, s in enumerate(picker.specs) if s.path.resolve() == path.resolve())


@pytest.fixture
def listed(make_window, tmp_path):  # noqa: ANN001, ANN201
    """A window whose picker lists the bundled models plus tiny models of each layout (HF
    safetensors, a K-quant GGUF, an MLX-quantized directory, a sliding-window Gemma 3, an
    XLM-R embedder) and two it cannot run (an unsupported architecture, a broken file)."""
    runnable = [TINY / "llama", TINY / "llama3_q4_k.gguf", TINY / "llama_mlx",
                TINY / "gemma3_text", GOLDENS / "embedders" / "xlmr_e5"]
    refused = [_refused_gemma3(tmp_path), _broken_gguf(tmp_path)]
    w = make_window()
    for p in runnable + refused:
        w.settings.add_extra_path(str(p))
    w.picker.refresh()
    wait_until(lambda: len(w.picker.specs) >= 2 + len(runnable + refused), 60_000,
               "the added models to be listed")
    return w, runnable, refused


def test_architecture_and_context_are_shown_for_every_model(listed) -> None:  # noqa: ANN001
    w, runnable, _ = listed
    p = w.picker
    want = {"llama": ("llama", "512"), "llama3_q4_k.gguf": ("llama", "512"),
            "llama_mlx": ("llama", "512"), "gemma3_text": ("gemma3_text", "512"),
            "xlmr_e5": ("xlm-roberta", "48")}
    for path in runnable:
        r = _row(p, path)
        assert (_cell(p, r, "Architecture"), _cell(p, r, "Context")) == want[path.name]
        assert p.specs[r].problem is None and _cell(p, r, "Fits") in ("yes", "no", "?")
    for part, arch, ctx in (("SmolLM2", "llama", "8,192"), ("MiniLM", "bert", "512")):
        r = next(i for i, s in enumerate(p.specs) if part in s.name and s.source == "bundled")
        assert (_cell(p, r, "Architecture"), _cell(p, r, "Context")) == (arch, ctx)
        p.table.selectRow(r)
        assert p.load_button.isEnabled() and not p.problem_label.isVisible()


def test_a_model_that_cannot_run_says_why_and_cannot_be_loaded(listed, monkeypatch
                                                               ) -> None:  # noqa: ANN001
    w, _, refused = listed
    p = w.picker
    loads: list[tuple] = []
    monkeypatch.setattr(w.picker, "load", lambda *a: loads.append(a))
    for path in refused:
        r = _row(p, path)
        spec = p.specs[r]
        with pytest.raises(InferdeskError) as at_load:
            load_model(str(path), backend="numpy")
        # The sentence shown before loading is the one the load itself would give.
        assert spec.problem == str(at_load.value)
        p.table.selectRow(r)
        assert not p.load_button.isEnabled()
        assert p.problem_label.isVisible()
        assert p.problem_label.text() == f"{spec.name} cannot run: {spec.problem}"
        assert _cell(p, r, "Fits") == "cannot run"
        assert spec.problem in p.table.item(r, 0).toolTip()
        p.load_button.click()
        p.load_selected()  # a double-click's path: refused too
        assert loads == []
    assert "'gemma3'" in p.specs[_row(p, refused[0])].problem
    assert _cell(p, _row(p, refused[0]), "Architecture") == "gemma3"
    assert _cell(p, _row(p, refused[1]), "Architecture") == "?"
    # Selecting a model that runs clears the reason and enables Load again.
    p.table.selectRow(_row(p, TINY / "llama"))
    assert p.load_button.isEnabled() and not p.problem_label.isVisible()


def test_the_listing_job_works_out_each_chat_template(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The discover job reads each chat template line, so the window's thread never compiles
    a template when it shows a model card."""
    from types import SimpleNamespace

    from gui import worker
    from inference import store
    from tests.hostile_models import write_gguf

    write_gguf(tmp_path / "mine.gguf", arch="gemma")
    store._spec_cache.clear()
    specs = worker.discover(SimpleNamespace(progress=lambda _: None), [str(tmp_path)])
    mine = next(s for s in specs if s.name == "mine")

    def unread(path: object) -> None:
        raise AssertionError("the chat template was worked out on the window's thread")

    monkeypatch.setattr(store, "read_checkpoint", unread)
    assert mine.chat_template == "Gemma's, by architecture: the file has none"
