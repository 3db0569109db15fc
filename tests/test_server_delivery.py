"""The scheduler hands a step's events on in one call (``deliver``), and the app turns
that call into one wake-up of the event loop, not one per token per stream."""

from __future__ import annotations

import threading

from inference.events import DoneEvent, TokenEvent
from inference.sampling import SamplingParams
from inference.server import app
from inference.server.scheduler import Request, Scheduler
from tests.server_support import engine  # noqa: F401

TOPICS = ["rivers", "owls", "bread", "chess"]


def test_one_delivery_per_step_carries_every_row_in_order(engine):  # noqa: F811
    llm = engine.llm
    calls: list[tuple[str, object, list[tuple[int, object]]]] = []
    done = threading.Event()
    sched: Scheduler | None = None

    def deliver(outbox):
        assert sched is not None
        calls.append((threading.current_thread().name, (len(sched.plans), sched.plans[-1]),
                      [(req.prompt_ids[-1], ev) for req, ev, _ in outbox]))
        if sum(isinstance(ev, DoneEvent) for c in calls for _, ev in c[2]) == len(TOPICS):
            done.set()

    prompts = [llm.plan(messages=[{"role": "user", "content": f"One sentence on {t}."}],
                        max_tokens=8)[0] for t in TOPICS]
    # Tell the requests apart by a last prompt token of their own (the prompts end alike).
    prompts = [p + [1000 + i] for i, p in enumerate(prompts)]
    sched = Scheduler(llm, parallel=4, deliver=deliver)
    try:
        for p in prompts:  # the default emit is never called: deliver replaces it
            sched.submit(Request(p, 8, SamplingParams(temperature=0.0), _never))
        assert done.wait(600)
    finally:
        sched.close()
    rank = {1000 + i: i for i in range(len(TOPICS))}
    assert {name for name, _, _ in calls} == {"inferdesk-scheduler"}
    steps = [n for _, (n, _), _ in calls]
    assert steps == sorted(set(steps))  # at most one call per scheduler iteration
    per_request: dict[int, list[object]] = {r: [] for r in rank}
    widest = 0
    for _, (_, plan), items in calls:
        sampled = [rank[r] for r, ev in items if isinstance(ev, TokenEvent) and ev.token_id >= 0]
        # A step may sample a prompt's first token (its last chunk's prefill), then runs
        # the decode step, whose rows come after it in row (admission) order.
        rows = sampled[len(sampled) - plan.decode_rows:] if plan.decode_rows else []
        assert rows == sorted(set(rows)) and len(sampled) - len(rows) <= 1
        widest = max(widest, len(rows))
        for r, ev in items:
            per_request[r].append(ev)
    assert widest >= 3  # a shared decode step's tokens of several streams in one call
    for evs in per_request.values():  # each stream's events complete, in order, Done last
        assert isinstance(evs[-1], DoneEvent) and not any(
            isinstance(e, DoneEvent) for e in evs[:-1])
        assert "".join(e.text for e in evs[:-1]) == evs[-1].text
        idx = [e.index for e in evs[:-1] if e.token_id >= 0]
        assert idx == list(range(len(idx)))


def _never(ev, lp):
    raise AssertionError("emit called although a deliver was given")


class _Loop:
    """An event loop's call_soon_threadsafe, recorded (or refused: a stopped loop)."""

    def __init__(self, closed: bool = False):
        self.calls: list[tuple[object, tuple]] = []
        self.closed = closed

    def call_soon_threadsafe(self, fn, *args):
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.calls.append((fn, args))


def _req(loop, got):
    return Request([1], 4, SamplingParams(), lambda ev, lp: got.append((ev, lp)), loop=loop)


def test_app_deliver_wakes_each_loop_once_with_its_events_in_order():
    a, b, gone = _Loop(), _Loop(), _Loop(closed=True)
    got: dict[str, list] = {k: [] for k in ("a1", "a2", "b", "none", "gone")}
    ra1, ra2, rb = _req(a, got["a1"]), _req(a, got["a2"]), _req(b, got["b"])
    rn, rg = _req(None, got["none"]), _req(gone, got["gone"])
    outbox = [(ra1, "x1", None), (rb, "y", None), (ra2, "x2", "lp"), (rn, "z", None),
              (ra1, "x3", None), (rg, "w", None)]
    app._deliver(outbox)
    assert len(a.calls) == 1 and len(b.calls) == 1  # one wake-up per loop per step
    assert got["none"] == [("z", None)]  # no loop: emitted at once, on this thread
    assert not got["a1"] and not got["b"]  # the others only when their loop runs
    for loop in (a, b):
        fn, args = loop.calls[0]
        fn(*args)
    assert got["a1"] == [("x1", None), ("x3", None)] and got["a2"] == [("x2", "lp")]
    assert got["b"] == [("y", None)]
    assert rg.cancel.is_set() and not got["gone"]  # its server stopped: nobody listens
    assert not ra1.cancel.is_set()


def test_the_engine_delivers_through_the_app(engine):  # noqa: F811
    assert engine.scheduler.deliver is app._deliver
