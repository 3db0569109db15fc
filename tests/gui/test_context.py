"""Context that never dead-ends: per-chat policy, a live token count, Continue."""

from __future__ import annotations

import pytest

from gui.jobs import on_progress
from inference.context import ContextFullError, Fitted, fit
from tests.gui.conftest import drain, job_result, wait_until

GEN_TIMEOUT_MS = 240_000
SMALL_CONTEXT = 512


@pytest.fixture
def small_context(loaded_window):
    """The loaded window with chats limited to SMALL_CONTEXT tokens (restored after)."""
    w = loaded_window
    before = w.settings.context()
    w.picker.context_box.setValue(SMALL_CONTEXT)
    yield w
    w.picker.context_box.setValue(before)


def _chat_model(w):  # noqa: ANN001, ANN202
    wait_until(lambda: w.jobs.job == "", 30_000, "the worker to go idle")
    return w.jobs.models.get("causal")  # used while the worker is idle


def _long_chat(w, turns: int = 8) -> int:  # noqa: ANN001
    conv = w.store.create("Long", "You are a pirate.")
    for i in range(turns):
        w.store.add_message(conv, "user", f"Tell me about island number {i}. " * 12)
        w.store.add_message(conv, "assistant", f"Island {i} has palm trees and sand. " * 12)
    w.chat.open_conversation(conv)
    return conv


def test_fit_policies_with_the_real_model(loaded_window) -> None:
    model = _chat_model(loaded_window)
    system = {"role": "system", "content": "You are a pirate."}
    turns = []
    for i in range(8):
        turns += [{"role": "user", "content": f"Question {i}? " * 30},
                  {"role": "assistant", "content": f"Answer {i}. " * 30}]
    chat = [system] + turns + [{"role": "user", "content": "And the last one?"}]
    rolling = fit(model, chat, "rolling", 400, 100)
    assert rolling.messages[0] == system and rolling.messages[-1] == chat[-1]
    assert rolling.messages[1]["role"] == "user"  # kept turns start with the user
    assert rolling.dropped > 0 and rolling.n_prompt <= 300
    assert rolling.messages[1:] == chat[-(len(rolling.messages) - 1):]  # the latest ones
    middle = fit(model, chat, "truncate_middle", 400, 100)
    assert middle.messages[:3] == chat[:3]  # system prompt and the first exchange
    assert middle.messages[-1] == chat[-1] and middle.dropped > 0
    assert middle.n_prompt <= 300
    with pytest.raises(ContextFullError, match="Truncate middle"):
        fit(model, chat, "stop", 400, 100)
    whole = fit(model, chat[:3], "stop", 4096, 100)
    assert whole.messages == chat[:3] and whole.dropped == 0 and not whole.note()
    # One message longer than the whole context: its middle (or start) goes, not the chat.
    long = " ".join(f"word{i}" for i in range(5000))
    one = [system, {"role": "user", "content": long}]
    cut = fit(model, one, "truncate_middle", 1024, 256)
    text = cut.messages[-1]["content"]
    assert cut.n_prompt <= 1024 - 256 and cut.cut_chars > 0
    assert text.startswith("word0 word1") and text.endswith("word4999")
    assert f"{cut.cut_chars:,} characters left out" in text
    tail = fit(model, one, "rolling", 1024, 256)
    assert tail.messages[-1]["content"].endswith("word4999")
    assert "word0 " not in tail.messages[-1]["content"] and tail.n_prompt <= 1024 - 256


def test_rolling_window_in_the_window_and_stop_says_what_to_change(small_context, qtbot
                                                                   ) -> None:
    w = small_context
    w.tabs.setCurrentWidget(w.chat)
    conv = _long_chat(w)
    w.chat.sampling.set_values({"max_tokens": 4, "temperature": 0.0, "seed": 1})
    w.chat.policy_combo.setCurrentIndex(w.chat.policy_combo.findData("stop"))
    assert w.store.context_policy(conv) == "stop"
    with qtbot.waitSignal(w.jobs.failed, timeout=GEN_TIMEOUT_MS) as failed:
        assert w.chat.send("Which island is best?")
    assert "Rolling window" in failed.args[1] and not w.chat.generating
    assert w.banner.isVisible() and "context" in w.banner.text()
    # Switch this chat to the rolling window and regenerate: it fits now.
    w.chat.policy_combo.setCurrentIndex(w.chat.policy_combo.findData("rolling"))
    planned: list = []
    conn = on_progress(w.jobs, Fitted, planned.append, "generate")
    try:
        # ``check``: the refused job's own end may still be on its way (a busy machine):
        # only a reply ends this wait.
        with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS,
                        check=lambda _: True) as done:
            w.chat.regenerate()
    finally:
        w.jobs.progress.disconnect(conn)
    fitted, ev = planned[-1], done.args[0]
    assert fitted.messages[0] == {"role": "system", "content": "You are a pirate."}
    assert fitted.dropped > 0 and fitted.limit == SMALL_CONTEXT
    assert ev.n_prompt == fitted.n_prompt and ev.n_prompt + ev.n_generated <= SMALL_CONTEXT
    assert w.chat.fit_note.isVisible() and "left out" in w.chat.fit_note.text()
    assert w.chat.context_label.text() == f"{ev.n_prompt + ev.n_generated} / 512 tokens"
    # The database keeps every message whole.
    assert len(w.store.messages(conv)) == 8 * 2 + 2
    w.chat.open_conversation(conv)
    assert w.chat.policy_combo.currentData() == "rolling"  # remembered per chat


def test_idle_indicator_counts_the_draft(small_context, qtbot) -> None:
    w = small_context
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    # A count for an earlier chat or draft may still be on its way from the worker: let
    # the pane's timer fire and the worker finish, then count each draft here (the model
    # is used only while the worker is idle) and wait for the indicator to show exactly
    # that, not for the next signal. The drafts fit whole, so every policy counts alike.
    wait_until(lambda: not w.chat._measure_timer.isActive(), 30_000, "the measure timer")
    drain(w)
    model = _chat_model(w)
    drafts = ["Hello there", "Hello there, " + "and a much longer draft " * 20]
    want = [fit(model, w.chat._history() + [{"role": "user", "content": d}],
                "rolling", SMALL_CONTEXT, 1).n_prompt for d in drafts]
    for draft, n in zip(drafts, want, strict=True):
        w.chat.input.setPlainText(draft)
        wait_until(lambda n=n: w.chat.context_label.text() == f"{n} / {SMALL_CONTEXT} tokens",
                   30_000, f"the indicator to show {n} tokens")
    assert want[1] > want[0] > 0
    w.chat.input.clear()


def test_continue_after_a_reply_ends_on_its_limit(loaded_window, qtbot) -> None:
    w = loaded_window
    w.tabs.setCurrentWidget(w.chat)
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": 6, "temperature": 0.0, "seed": 1})
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS) as first:
        assert w.chat.send("Write a long story about a lighthouse keeper.")
    assert first.args[0].finish_reason == "length"
    reply = w.chat.views()[-1]
    before, msg_id = reply.text, reply.msg_id
    assert w.chat.continue_button.isVisibleTo(w)
    with job_result(qtbot, w.jobs, "generate", timeout=GEN_TIMEOUT_MS) as second:
        w.chat.continue_button.click()
    ev = second.args[0]
    views = w.chat.views()
    assert len(views) == 2 and views[-1] is reply  # the same reply grew
    assert reply.text.startswith(before) and len(reply.text) > len(before)
    assert reply.text == before + ev.text
    assert reply.stats["n_generated"] == 6 + ev.n_generated
    assert ev.n_cached > 0  # the conversation so far came from the prompt cache
    stored = w.store.messages(w.chat.conv_id)
    assert [m.id for m in stored if m.role == "assistant"] == [msg_id]
    assert stored[-1].content == reply.text
