"""Errors become a message in the window; the app and the worker carry on."""

from __future__ import annotations

import os
import struct

from gui.jobs import on_progress
from gui.worker import LoadProgress
from tests.gui.conftest import job_result, spin


def test_corrupt_gguf_shows_a_message_and_the_app_keeps_working(loaded_window, qtbot,
                                                                  tmp_path, monkeypatch) -> None:
    w = loaded_window
    monkeypatch.setattr(w.picker, "confirm_replace", lambda name: True)  # "Yes, load it"
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 3) + os.urandom(256))
    with qtbot.waitSignal(w.picker.problem, timeout=60_000) as failed:
        w.picker.add_files([str(bad)])  # checked from its headers: no load is tried
    message, = failed.args
    assert w.banner.isVisible() and w.banner.text() == message
    assert "broken.gguf" in message and "Traceback" not in message
    assert not message.startswith("Unexpected")
    assert str(bad) not in w.settings.extra_paths()  # a file that failed is not kept
    assert {"causal", "encoder"} <= set(w.picker.loaded)  # what was loaded stays loaded
    spin(200)
    assert w.jobs.alive()
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": 4, "temperature": 0.0})
    with job_result(qtbot, w.jobs, "generate", timeout=120_000) as done:
        w.chat.send("Hi")
    assert done.args[0].n_generated >= 1
    w.banner.hide()


def test_sending_without_a_model_says_so(make_window, qtbot) -> None:
    w = make_window()
    assert not w.chat.send("Hello?")  # nothing is sent (and nothing stored) without a model
    assert "No chat model is loaded" in w.chat.banner.text()
    assert w.chat.input.toPlainText() == "Hello?" and w.chat.views() == []
    assert not w.chat.generating and w.chat.send_button.isEnabled()


def test_offline_download_says_so_plainly(make_window, qtbot, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read by the engine at call time
    w = make_window()
    box = w.picker.download_box
    box.repo.setText("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    box.filename.setText("not-in-the-cache.gguf")
    with qtbot.waitSignal(w.downloads.failed, timeout=60_000) as failed:
        box.start()
    kind, message = failed.args
    assert kind == "download" and "Hugging Face Hub" in message
    assert box.status.text() == message and w.banner.text() == message
    assert box.start_button.isEnabled() and not box.cancel_button.isEnabled()


def test_dropping_a_non_model_file_says_why(make_window, qtbot, tmp_path) -> None:
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    w = make_window()
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(notes))])
    drop = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime,
                      Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    with qtbot.waitSignal(w.picker.problem, timeout=30_000) as failed:
        w.picker.dropEvent(drop)
    assert w.banner.isVisible() and failed.args[0] == w.picker.load_status.text()
    assert "notes.txt" in failed.args[0]


def test_unload_then_use_says_so_and_reload_works(loaded_window, qtbot) -> None:
    w = loaded_window
    encoder = w.picker.loaded["encoder"]
    with job_result(qtbot, w.jobs, "unload", timeout=30_000):
        w.picker.unload_embed.click()
    assert "encoder" not in w.picker.loaded and not w.picker.unload_embed.isEnabled()
    w.embed.set_sentences(["one", "two"])
    with qtbot.waitSignal(w.jobs.failed, timeout=30_000) as failed:
        w.embed.embed()
    assert "Load an embedding model" in failed.args[1] == w.embed.status.text()
    spec = next(s for s in w.picker.specs if str(s.path) == encoder.path)
    fractions: list[int] = []
    on_progress(w.jobs, LoadProgress, lambda p: fractions.append(p.done * 1000 // p.total))
    with job_result(qtbot, w.jobs, "load", timeout=60_000):
        w.picker.load(spec)
    assert w.picker.loaded["encoder"].name == encoder.name
    assert fractions and fractions[-1] == 1000  # the bar followed the weights to the end
    assert w.picker.load_progress.maximum() == 1000
    w.banner.hide()
