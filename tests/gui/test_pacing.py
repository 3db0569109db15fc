"""A streamed reply renders within a share of the GUI thread's time, and nothing streamed
is left unrendered or unsaved when renders are held back."""

from __future__ import annotations

from gui.pacing import RenderPacer
from tests.gui.conftest import job_result


class Clocks:
    """The wall clock, the GUI thread's and the process's CPU clocks, moved by hand."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.process = 0.0

    def step(self, wall: float, cpu: float, engine: float | None = None) -> None:
        """``engine``: CPU seconds the rest of the process got (default: two cores')."""
        self.wall += wall
        self.cpu += cpu
        self.process += cpu + (2 * wall if engine is None else engine)

    def pacer(self) -> RenderPacer:
        return RenderPacer(share=0.2, longest_s=1.0, clocks=(
            lambda: self.wall, lambda: self.cpu, lambda: self.process))


def test_renders_space_out_as_they_grow_dearer() -> None:
    c = Clocks()
    p = c.pacer()
    assert p.due()  # a stream's first render goes through
    c.step(0.05, 0.005)  # 10% of the thread since: within the share
    assert p.due()
    c.step(0.05, 0.02)  # 40%: held back...
    assert not p.due()
    c.step(0.05, 0.0)  # ...until the wall time since makes it 20%
    assert p.due()
    c.step(0.5, 0.4)  # 80%, however long...
    assert not p.due()
    c.step(0.6, 0.4)  # ...but never more than longest_s between renders
    assert p.due()
    c.step(0.01, 0.5)
    p.restart()  # a new stream starts with a render
    assert p.due()


def test_a_starved_engine_gets_the_windows_share_back() -> None:
    c = Clocks()
    p = c.pacer()
    assert p.due()
    c.step(0.1, 0.015, engine=0.2)  # the engine runs on both cores: 15% of the wall is fine
    assert p.due()
    c.step(0.1, 0.015, engine=0.04)  # other programs leave it 0.4 of a core: too much now
    assert not p.due()
    c.step(0.3, 0.0, engine=0.12)  # 0.015 of CPU against 0.16 the engine got: within 20%
    assert p.due()
    c.step(0.1, 0.015, engine=0.0)  # nothing else runs in the process: the wall counts
    assert p.due()


def test_held_back_renders_still_show_and_save_the_whole_reply(loaded_window, qtbot) -> None:
    w = loaded_window
    w.chat.new_conversation()
    w.chat.sampling.set_values({"max_tokens": 24, "temperature": 0.0, "seed": 3})
    held = RenderPacer(share=0.0, longest_s=1e9)  # no render while streaming
    w.chat._pacer, pacer = held, w.chat._pacer
    try:
        with job_result(qtbot, w.jobs, "generate", timeout=120_000) as got:
            w.chat.send("Name three rivers.")
    finally:
        w.chat._pacer = pacer
    done, reply = got.args[0], w.chat.views()[-1]
    assert done.text and reply.text == done.text  # rendered at the end, whole
    saved = w.chat.store.messages(w.chat.conv_id)[-1]
    assert saved.role == "assistant" and saved.content == done.text
