"""Kernels compiling at model load are said, with the time, in the status bar and in the
chat of a reply waiting for its first token, never a bare "Generating…". The slow compile
is a fake one, driven step by step through the engine's compile_progress callback."""

from __future__ import annotations

import re
import threading

import inference
from inference.backends.cpu import backend as cpu
from tests.gui.conftest import wait_until

STEP = re.compile(r"Preparing kernels \(compiled on a first run, then cached\): "
                  r"(\d+) of (\d+), \d+ s")


def test_cpu_prepare_reports_each_step(monkeypatch) -> None:
    """The cpu backend's prepare says how far it is: 0 of n first, n of n last."""
    monkeypatch.setattr(cpu, "_PREPARED", set())  # prepared again in this process
    seen: list[tuple[int, int, str]] = []
    b = cpu.create(compile_progress=lambda d, t, what: seen.append((d, t, what)))
    b._qtypes = {"Q8_0", "F32"}  # what a load of those weight types records
    b.prepare(None)
    assert [(d, t) for d, t, _ in seen] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert seen[1][2] == "F32 products" and seen[-1][2] == "norms, RoPE, attention"


def test_status_bar_and_chat_say_what_compiles(make_window, monkeypatch) -> None:
    w = make_window()
    steps = [threading.Event() for _ in range(3)]
    real = inference.load_model

    def slow_compile_load(target, **kw):  # noqa: ANN001, ANN003, ANN202
        say = kw["compile_progress"]
        say(0, 3, "")
        for i, go in enumerate(steps):
            go.wait(60)  # the test lets each kernel "compile" when it has looked
            say(i + 1, 3, f"kernel {i}")
        return real(target, **{k: v for k, v in kw.items() if k != "compile_progress"})

    monkeypatch.setattr(inference, "load_model", slow_compile_load)
    wait_until(lambda: w.picker.specs, 60_000, "the model list")
    spec = next(s for s in w.picker.specs if s.kind == "causal" and s.source == "bundled")
    try:
        w.picker.load(spec)
        wait_until(lambda: STEP.search(w.statusBar().currentMessage()), 60_000,
                   "the compile's first line")
        assert STEP.search(w.statusBar().currentMessage()).groups() == ("0", "3")
        # A message sent now waits for the load: the chat says why, not "Generating…".
        w.tabs.setCurrentWidget(w.chat)
        w.chat.set_model(spec.name)
        assert w.chat.send("Hello")
        assert STEP.search(w.chat.wait_label.text()) and w.chat.wait_label.isVisible()
        steps[0].set()
        wait_until(lambda: STEP.search(w.statusBar().currentMessage()).groups() == ("1", "3"),
                   60_000, "the first kernel")
        assert STEP.search(w.chat.wait_label.text()).groups() == ("1", "3")
    finally:
        for go in steps:
            go.set()
    wait_until(lambda: not STEP.search(w.statusBar().currentMessage() or ""), 120_000,
               "the compile's end")
    wait_until(lambda: not w.chat.generating, 120_000, "the reply")
    assert not w.chat.wait_label.isVisible()
    assert w.chat.views()[-1].role == "assistant"
