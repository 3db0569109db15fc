"""The app as a demanding user meets it: every input kept exactly, every state visible while
it holds, every figure honest, every tab usable at 800x600 and in the dark theme. One test
per defect class (numbered as in the review this suite answers); most drive the window
without a model (the worker's requests are recorded), the rest share the loaded window."""

from __future__ import annotations

import csv
import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from gui import theme
from tests.gui.conftest import drain, job_result, make_settings, report, spin, wait_until
from tests.gui.layout_probe import cut_off, plots_cut_off

GEN_TIMEOUT_MS = 120_000


def _offline_chat(w, monkeypatch) -> list:  # noqa: ANN001
    """A chat that believes a model is loaded; generation requests are recorded, not run."""
    sent: list = []
    monkeypatch.setattr(w.chat, "request_reply", sent.append)
    w.chat.set_model("SmolLM2-135M-Instruct")
    w.tabs.setCurrentWidget(w.chat)
    return sent


# 1 -----------------------------------------------------------------------------------------
def test_1_system_prompt_typed_before_the_first_message_is_kept(make_window, monkeypatch
                                                                ) -> None:
    w = make_window()
    sent = _offline_chat(w, monkeypatch)
    assert w.chat.conv_id is None  # an empty database: no chat yet
    w.chat.system_prompt.clear()
    QTest.keyClicks(w.chat.system_prompt, "You are a pirate. Always say Arr.")
    assert w.chat.send("hi")
    assert w.chat.system_prompt.toPlainText() == "You are a pirate. Always say Arr."
    assert w.store.get(w.chat.conv_id).system_prompt == "You are a pirate. Always say Arr."
    assert sent[-1].messages[0] == {"role": "system",
                                    "content": "You are a pirate. Always say Arr."}


# 2 -----------------------------------------------------------------------------------------
def test_2_read_only_banner_stays_while_the_database_is_read_only(make_window, monkeypatch,
                                                                  tmp_path) -> None:
    import gui.conversations as conversations

    monkeypatch.setattr(conversations, "_writable", lambda _p: False)
    w = make_window(tmp_path)
    assert w.store.read_only
    _offline_chat(w, monkeypatch)

    def read_only_said() -> bool:
        from gui.error_banner import ErrorBanner

        return any(b.isVisible() and "read-only" in b.text()
                   for b in w.findChildren(ErrorBanner))

    assert read_only_said()
    assert w.chat.send("hi")  # the first send hid it before
    assert read_only_said()
    w.chat.send("No model: says so")  # another passing message takes the chat's banner
    w.chat.edit_last()
    w.chat.cancel_edit()
    assert read_only_said()


# 3 (and 12: the model name beside Continue) ------------------------------------------------
def test_3_every_tab_is_usable_at_800x600(make_window, monkeypatch) -> None:
    from gui.worker import LoadedInfo

    w = make_window()
    _offline_chat(w, monkeypatch)
    # The longest lines the tabs show once models are loaded and a reply has ended.
    why = ("cpu: numba 0.68.1 kernels over quantized weights, up to 2 threads (fewer while "
           "other processes keep cores busy), AVX2, F16C (skipped cuda: no NVIDIA driver)")
    for kind, name in (("causal", "SmolLM2-135M-Instruct.Q4_1"), ("encoder", "all-MiniLM-L6-v2")):
        info = LoadedInfo(kind, name, f"/{name}", "cpu", why, 2**28, 2**27, 8192)
        info.template = "the file's own" if kind == "causal" else ""
        report(w, "load", info)
    report(w, "generate", _CachedLM().done())
    w.chat.set_context_length(2048)
    w.chat.continue_button.setVisible(True)  # the widest button row there is
    w.resize(800, 600)
    spin(50)
    w.chat._measure_timer.stop()
    w.chat._show_used(1670, 2048)
    assert (w.width(), w.height()) == (800, 600), "the window's minimum size is larger"
    problems = []
    for i in range(w.tabs.count()):
        w.tabs.setCurrentIndex(i)
        spin(30)
        problems += [f"{w.tabs.tabText(i)}: {p}" for p in cut_off(w.tabs.currentWidget())]
    assert not problems, "\n".join(problems)
    assert w.chat.context_label.text() == "1.7K / 2.0K tokens"
    # Every plot keeps a readable size: the area scrolls rather than cut one off.
    w.tabs.setCurrentWidget(w.perf)
    spin(50)
    assert not plots_cut_off(w.perf)


# 5 -----------------------------------------------------------------------------------------
def test_5_leading_whitespace_of_a_message_is_kept(make_window, monkeypatch) -> None:
    w = make_window()
    sent = _offline_chat(w, monkeypatch)
    code = "    x = 1\n    y = 2\n"
    w.chat.input.setPlainText(code)
    assert w.chat.send()
    assert w.chat.views()[-1].text == code
    assert w.store.messages(w.chat.conv_id)[-1].content == code
    assert sent[-1].messages[-1]["content"] == code


# 6 -----------------------------------------------------------------------------------------
def test_6_ctrl_z_in_the_message_box_undoes_a_deletion(make_window, qtbot, monkeypatch
                                                       ) -> None:
    from gui.worker import LoadedInfo

    w = make_window()
    _offline_chat(w, monkeypatch)
    w.resize(800, 600)  # the narrowest window, with both models' names in the status bar
    for kind, name in (("causal", "SmolLM2-135M-Instruct.Q4_1"), ("encoder", "all-MiniLM-L6-v2")):
        report(w, "load", LoadedInfo(kind, name, f"/{name}", "cpu", "", None, None))
    w.perf.device = (1536 << 20, 2047 << 20)  # the widest reading: a device's memory too
    w._update_memory()
    assert "device" in w.status_memory.toolTip()
    keep = w.store.create("Give me three tips for writing clear code, as a Markdown list")
    w.store.add_message(keep, "user", "hello")
    w.chat.refresh_list()
    w.chat.open_conversation(keep)
    with qtbot.waitActive(w):
        w.activateWindow()
    w.chat.delete_conversation()
    assert w.store.get(keep) is None
    # The status message and the Undo button do not overlap.
    spin(20)
    text = w.statusBar().currentMessage()
    assert text.startswith("Deleted") and w.undo_button.isVisible()
    need = w.statusBar().fontMetrics().horizontalAdvance(text)
    first = min(x.geometry().left() for x in (w.undo_button, w.status_backend, w.status_model,
                                               w.status_memory) if x.isVisible())
    assert first > need, f"the message needs {need} px, the status bar leaves {first}"
    w.chat.input.setFocus()
    QTest.keyClick(w.chat.input, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert w.store.get(keep) is not None and w.chat.conv_id == keep
    # Where the box has its own undo, Ctrl+Z is the box's.
    w.chat.delete_conversation()
    QTest.keyClicks(w.chat.input, "draft")
    QTest.keyClick(w.chat.input, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert w.store.get(keep) is None and w.chat.input.toPlainText() != "draft"


# 7 -----------------------------------------------------------------------------------------
class _CachedLM:
    """A chat model whose prompt cache served 308 of 316 prompt tokens."""

    kind = "causal"
    context_length = 2048
    prompt_cache = SimpleNamespace(reused=308)

    def close(self) -> None:
        pass

    def plan(self, messages, max_tokens, cancel=None, continue_final=False):  # noqa: ANN001, ANN201
        return list(range(316)), None

    def generate(self, **_kw):  # noqa: ANN003, ANN201
        from inference.events import TokenEvent

        for i in range(3):
            yield TokenEvent("x", 5, i, 0.3 + i * 0.1, 0.25, 316 / 0.25, 10.0)
        yield self.done()

    @staticmethod
    def done():  # noqa: ANN205
        from inference.events import DoneEvent

        return DoneEvent("xxx", [5, 5, 5], 316, 3, "length", 0.25, 316 / 0.25, 10.0, 0.5,
                         n_cached=308, threads=(1, 2))


def test_7_prefill_counts_prefilled_tokens_and_appears_when_prefill_ends(make_window) -> None:
    from gui import worker
    from gui.format import message_stats
    from gui.registry import ModelRegistry
    from gui.worker import GenerateRequest, Prefill
    from inference.events import TokenEvent

    models, order = ModelRegistry(), []
    models.put(_CachedLM())

    def progress(p: object) -> None:
        if isinstance(p, Prefill):
            order.append(("prefilled", p))
        elif isinstance(p, TokenEvent):
            order.append(("token", p.index))

    ctx = SimpleNamespace(models=models, cancel=threading.Event(), progress=progress)
    done = worker.generate(ctx, GenerateRequest([{"role": "user", "content": "hi"}], 3,
                                                policy="rolling"))
    order.append(("done", done))
    assert [k for k, _ in order] == ["prefilled", "token", "token", "token", "done"]
    prefill = order[0][1]
    assert (prefill.n_prompt, prefill.n_cached, prefill.n_prefilled) == (316, 308, 8)
    assert prefill.tok_s == pytest.approx(8 / 0.25)  # not 316 / 0.25

    w = make_window()
    job = w.jobs.submit("generate", lambda ctx: ctx.progress(prefill))  # before the end
    wait_until(lambda: job.done, 10_000, "the prefill report")
    assert len(w.perf.prefills) == 1 and w.perf.prefills[-1][1] == pytest.approx(32.0)
    report(w, "generate", order[-1][1])
    assert "316 prompt tokens, 308 of them cached, 8 prefilled at 32 tok/s" \
        in w.perf.last_label.text()
    assert len(w.perf.prefills) == 1  # one point per message
    assert "prompt 316 (308 cached)" in message_stats({"n_prompt": 316, "n_cached": 308,
                                                       "n_generated": 3})


# 8 -----------------------------------------------------------------------------------------
def test_8_indicator_warns_under_stop_at_limit_and_the_panel_follows_the_policy(
        loaded_window, qtbot) -> None:
    w = loaded_window
    chat = w.chat
    w.tabs.setCurrentWidget(chat)
    chat.new_conversation()
    w.settings.set("models/context", 256)
    try:
        chat.policy_combo.setCurrentIndex(chat.policy_combo.findData("stop"))
        chat.input.setPlainText("word " * 400)  # ~400 tokens against 256
        wait_until(lambda: not chat.fit_note.isHidden(), 30_000, "the stop policy's note")
        label = chat.context_label
        used = label.text().split(" / ")[0]
        assert label.text().endswith("/ 256 tokens") and not used.isdigit() or int(used) > 256
        assert "color" in label.styleSheet()  # drawn as a warning
        assert "256" in chat.fit_note.text()
        stop_note = chat.fit_note.text()
        chat.policy_combo.setCurrentIndex(chat.policy_combo.findData("rolling"))
        assert chat.fit_note.text() != stop_note  # not left saying what another policy did
        wait_until(lambda: "Rolling window" in chat.fit_note.text(), 30_000, "the new note")
    finally:
        w.settings.set("models/context", 4096)
        chat.input.clear()
    # (4, the app's part) The model card says which chat template is used, and why: for the
    # loaded model, and for a selected one before it is loaded.
    assert "Chat template: the file's own" in w.picker.loaded_labels["causal"].text()
    row = next(r for r, s in enumerate(w.picker.specs) if s.kind == "causal"
               and s.source == "bundled")
    w.picker.table.selectRow(row)
    assert w.picker.template_label.text().endswith("chat template: the file's own")


# 9 -----------------------------------------------------------------------------------------
def test_9_unloading_gives_memory_back_and_the_estimate_says_at_full_context(make_window
                                                                             ) -> None:
    import psutil

    from gui import worker
    from gui.worker import LoadedInfo

    # The heap keeps freed blocks below a live one; release_memory hands their pages back.
    proc = psutil.Process()
    blocks = [bytes(1024) + bytes([i % 256]) for i in range(80_000)]  # ~80 MB of malloc
    pin = bytes(2048)  # a block after them keeps the heap from shrinking by itself
    del blocks
    before = proc.memory_info().rss
    worker.release_memory()
    assert before - proc.memory_info().rss > 40 * 2**20
    del pin

    w = make_window()
    drain(w)  # the window's own discovery and estimates are in
    info = LoadedInfo("causal", "m", "/m.gguf", "cpu", "fast", 10, 5 * 2**20, 4096)
    w.picker.estimates = {"/m.gguf": SimpleNamespace(total=300 * 2**20, context=4096,
                                                      backend="cpu")}
    report(w, "load", info)
    text = w.picker.loaded_labels["causal"].text()
    assert "300.0 MiB at full context (4,096 tokens)" in text and "5.0 MiB" in text


# 10 ----------------------------------------------------------------------------------------
def test_10_embeddings_keep_blank_lines_as_rows_and_say_what_was_cut(loaded_window, qtbot,
                                                                     tmp_path) -> None:
    w = loaded_window
    pane = w.embed
    lines = ["a cat sleeps", "", "a dog barks", "   ", "word " * 4_000] + \
        [f"sentence {i}" for i in range(7)]
    pane.input.setPlainText("\n".join(lines) + "\n")
    with job_result(qtbot, w.jobs, "embed", timeout=GEN_TIMEOUT_MS) as got:
        assert pane.embed()
    result = got.args[0]
    assert result.sentences == lines and result.vectors.shape[0] == len(lines)
    status = pane.status.text()
    assert "Lines 2 and 4 are blank" in status
    assert "Line 5 was longer than the model's window" in status
    assert pane.k_box.value() == 10  # more than five neighbours by default
    with job_result(qtbot, w.jobs, "export", timeout=30_000):
        pane.export(str(tmp_path / "rows.csv"))
    rows = list(csv.reader((tmp_path / "rows.csv").open(encoding="utf-8")))
    assert [r[0] for r in rows[1:]] == lines


# 11 ----------------------------------------------------------------------------------------
def test_11_dark_theme_reaches_plots_icons_and_the_menu_bar_live(make_window) -> None:
    w = make_window()
    try:
        w.tabs.setCurrentWidget(w.perf)
        spin(30)
        assert theme.scheme() == "light"  # offscreen reports no scheme: light
        assert w.perf.graphs.backgroundBrush().color().lightness() > 200
        w.set_theme("dark")
        spin(30)
        assert w.perf.graphs.backgroundBrush().color().lightness() < 60
        w.tabs.setCurrentWidget(w.embed)  # a pane hidden at the switch, on showing
        assert w.embed.heat_plot.backgroundBrush().color().lightness() < 60
        img = theme.icon("send").pixmap(24, 24).toImage()
        ink = [img.pixelColor(x, y) for x in range(24) for y in range(24)
               if img.pixelColor(x, y).alpha() > 200]
        assert ink and max(c.lightness() for c in ink) > 150  # light ink on a dark ground
        shot = w.grab().toImage()
        top = w.menuBar().geometry().bottom()
        for y in range(top - 1, top + 4):
            assert max(shot.pixelColor(x, y).lightness() for x in range(0, 800, 7)) < 200, \
                f"a light line at y={y}"
    finally:
        w.set_theme("system")


# 12 ----------------------------------------------------------------------------------------
def test_12_a_bad_added_file_is_named_before_anything_is_asked(make_window, monkeypatch,
                                                               tmp_path) -> None:
    from gui.worker import LoadedInfo

    w = make_window()
    w.picker.loaded["causal"] = LoadedInfo("causal", "SmolLM2", "/x", "cpu", "", None, None)
    asked: list = []
    monkeypatch.setattr(w.picker, "confirm_replace", lambda name: asked.append(name))
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"hi\n")
    w.picker.add_files([str(bad)])
    assert not asked and str(bad) not in w.settings.extra_paths()
    assert "not a GGUF file" in w.picker.load_status.text()
    assert "truncated" not in w.picker.load_status.text()


def test_12_new_chat_after_a_recovery_is_new(make_window, tmp_path) -> None:
    db = tmp_path / "conversations.sqlite3"
    raw = sqlite3.connect(db)
    from gui.conversations import SCHEMA

    raw.executescript(SCHEMA)
    raw.execute("INSERT INTO conversations (title, system_prompt, created, updated)"
                " VALUES ('Old recovered title', '', 1, 1)")
    raw.commit()
    raw.close()
    w = make_window(tmp_path)
    new = w.chat.new_conversation()
    assert new != 1 and w.store.get(new).title == "New chat"  # not the emptied chat 1


def test_12_a_damaged_file_is_kept_as_one_file(tmp_path) -> None:
    from gui.conversations import ConversationStore

    db = tmp_path / "live" / "conversations.sqlite3"
    db.parent.mkdir()
    s = ConversationStore(db)
    for c in range(3):
        cid = s.create(f"chat {c}")
        for _m in range(40):
            s.add_message(cid, "user", "z" * 400)
    s._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.add_message(cid, "user", "in the WAL only")
    copy = tmp_path / "copy"
    copy.mkdir()
    for suffix in ("", "-wal", "-shm"):  # a crash: the WAL still beside the file
        src = Path(str(db) + suffix)
        if src.exists():
            (copy / ("conversations.sqlite3" + suffix)).write_bytes(src.read_bytes())
    s.close()
    target = copy / "conversations.sqlite3"
    assert Path(str(target) + "-wal").stat().st_size > 0
    with open(target, "r+b") as f:  # a page of messages in the middle, not in the WAL
        f.seek((target.stat().st_size // 4096 // 2) * 4096)
        f.write(b"\xff" * 4096)
    store = ConversationStore(target)  # what the window opens at start
    try:
        aside = store.moved_to
        assert aside is not None and aside.exists()
        assert not Path(str(aside) + "-wal").exists() and not Path(str(aside) + "-shm").exists()
        assert any(m.content == "in the WAL only" for c in store.conversations()
                   for m in store.messages(c.id))
    finally:
        store.close()


# huge settings clamped; recovered rows counted ----------------------------------------------------
def test_huge_settings_values_are_clamped_before_any_widget(make_window, tmp_path) -> None:
    (tmp_path / "settings.ini").write_text(
        "[server]\nport=4294967296\nparallel=99999999999\nprompt_cache_mb=2199023255552\n"
        "[window]\ntab=-99999999999\n")
    w = make_window(tmp_path)
    assert w.server.port.value() == 65535 and w.server.parallel.value() == 8
    assert w.server.prompt_cache.value() == w.server.prompt_cache.maximum()
    assert make_settings(tmp_path / "settings.ini").get("server/port", 0, int) == 2**31 - 1


def test_recovery_copies_null_rows_and_the_banner_counts_them(make_window, tmp_path) -> None:
    db = tmp_path / "conversations.sqlite3"
    raw = sqlite3.connect(db)
    # The same tables without NOT NULL: rows the real schema refuses.
    raw.executescript(
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT, system_prompt TEXT,"
        " created REAL, updated REAL, context_policy TEXT);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation_id INTEGER, role TEXT,"
        " content TEXT, stats TEXT, created REAL, active INTEGER);")
    for c in range(1, 51):
        raw.execute("INSERT INTO conversations VALUES (?, ?, '', 1, 1, '')",
                    (c, None if c % 7 == 0 else f"chat {c}"))
    for m in range(1, 1001):
        raw.execute("INSERT INTO messages VALUES (?, ?, 'user', ?, '{}', 1, 1)",
                    (m, m % 50 + 1, None if m % 9 == 0 else f"m{m} " + "y" * 300))
    raw.commit()
    raw.close()
    with open(db, "r+b") as f:  # one page in the middle of the messages
        size = f.seek(0, 2)
        f.seek((size // 4096 // 2) * 4096)
        f.write(b"\xff" * 4096)
    w = make_window(tmp_path)
    rec = w.store.recovery
    assert rec is not None and rec.conversations == 50
    assert 0 < rec.messages < 1000 and rec.lost_messages == 1000 - rec.messages
    n = sum(len(w.store.messages(c.id)) for c in w.store.conversations())
    assert n == rec.messages
    text = w.chat.store_banner.text()
    assert f"{rec.messages:,} messages were recovered" in text
    assert f"{rec.lost_messages:,} messages could not be recovered" in text
    assert w.chat.store_banner.isVisible()


def test_a_recovery_cut_short_leaves_the_damaged_file_to_recover_again(tmp_path, monkeypatch
                                                                      ) -> None:
    from gui.conversations import ConversationStore

    db = tmp_path / "conversations.sqlite3"
    damaged = b"this is not a database" * 100
    db.write_bytes(damaged)

    def killed(self, found):  # noqa: ANN001, ANN202 - the process dies mid-copy
        raise RuntimeError("killed")

    with monkeypatch.context() as m:
        m.setattr(ConversationStore, "_copy_in", killed)
        with pytest.raises(RuntimeError):
            ConversationStore(db)
    assert db.read_bytes() == damaged and not list(tmp_path.glob("*.corrupt-*"))
    store = ConversationStore(db)  # the next start recovers it
    try:
        assert store.moved_to is not None and store.moved_to.read_bytes() == damaged
        assert store.recovery is not None and store.conversations() == []
    finally:
        store.close()
