"""The server's prompt cache: a finished request's whole prefill chunks stay in a bounded
pool, and the next request with the same prompt start copies them, prefills only its
tail, and still gets exactly the tokens it gets alone (greedy and seeded)."""

from __future__ import annotations

import threading

import numpy as np
import openai
import pytest

from inference.backends.numpy_backend import NumpyBackend
from inference.events import DoneEvent, TokenEvent
from inference.kv_cache import KVCache
from inference.sampling import SamplingParams
from inference.server.prefix_pool import PrefixPool, cache_nbytes, shared_chunks
from inference.server.scheduler import Request, Scheduler
from tests.server_support import alone, engine, server, wait_load  # noqa: F401
from tests.test_server_batching import WorkClock, _run_together

# Over 128 tokens with the chat template: its first whole chunk can be kept.
SYSTEM = {"role": "system", "content": (
    "You are the help desk of a small public library in a river town. The library opens "
    "at nine in the morning and closes at six in the evening on weekdays, and at one in "
    "the afternoon on Saturdays; it is closed on Sundays and public holidays. Members may "
    "borrow up to eight books and two films at a time, for three weeks, and renew them "
    "twice online unless someone else has reserved them. Late returns cost ten cents a "
    "day per item. The reading room on the first floor is quiet; the children's corner "
    "has story time on Wednesday mornings. Answer visitors in one short, friendly "
    "sentence, and never invent a service the library does not offer.")}
QUESTIONS = ["When do you open on Saturday?", "How many films may I borrow?"]


def _conv(i: int) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": QUESTIONS[i]}]


def test_a_repeated_prompt_start_prefills_only_its_tail(engine, server):  # noqa: F811
    """Through the server (chunks of 128): the second and third requests copy the
    system prompt's whole chunks from the first, finished one; each answer equals the
    same request through CausalLM.generate alone."""
    llm, sched = engine.llm, engine.scheduler
    prompts = [llm.plan(messages=_conv(i), max_tokens=6)[0] for i in range(2)]
    assert min(len(p) for p in prompts) > 128
    kept = shared_chunks(prompts[1], prompts[0], len(prompts[0]), 128)
    assert kept >= 128
    assert wait_load(sched) == (0, 0)
    sched.pool.clear()
    asks = [(0, SamplingParams(temperature=0.0)),  # nothing kept yet: prefills it all
            (1, SamplingParams(temperature=0.8, top_p=0.9, seed=7)),  # copies the system part
            (0, SamplingParams(temperature=0.0))]  # the first prompt again
    copied = [0, kept, (len(prompts[0]) - 1) // 128 * 128]
    with openai.OpenAI(base_url=server.url, api_key="x", max_retries=0, timeout=600) as c:
        for (i, sp), want in zip(asks, copied, strict=True):
            shared, prefilled = sched.shared_tokens, sched.prefilled_tokens
            r = c.chat.completions.create(model=llm.name, messages=_conv(i), max_tokens=6,
                                          temperature=sp.temperature, top_p=sp.top_p,
                                          seed=sp.seed)
            ref = alone(llm, _conv(i), max_tokens=6, temperature=sp.temperature,
                        top_p=sp.top_p, seed=sp.seed)
            assert r.choices[0].message.content == ref.text
            assert wait_load(sched) == (0, 0)
            assert sched.shared_tokens - shared == want
            assert sched.prefilled_tokens - prefilled == len(prompts[i]) - want
    assert len(sched.pool) >= 1


def _solo(llm, prompt: list[int], n: int, sp: SamplingParams, chunk: int) -> list[int]:
    s = Scheduler(llm, parallel=1, prefill_chunk=chunk, prompt_cache_bytes=0)
    try:
        return _run_together(s, [prompt], n, [sp])[0].token_ids
    finally:
        s.close()


def test_zero_megabytes_keeps_nothing(engine):  # noqa: F811
    llm = engine.llm
    ids = llm.plan(messages=_conv(0), max_tokens=3)[0]
    sched = Scheduler(llm, parallel=1, prefill_chunk=24, prompt_cache_bytes=0)
    try:
        first = _run_together(sched, [ids], 3, [SamplingParams(temperature=0.0)])[0]
        again = _run_together(sched, [ids], 3, [SamplingParams(temperature=0.0)])[0]
    finally:
        sched.close()
    assert first.token_ids == again.token_ids
    assert len(sched.pool) == 0 and sched.shared_tokens == 0
    assert sched.prefilled_tokens == 2 * len(ids)


def test_the_option_reaches_the_scheduler(engine, monkeypatch):  # noqa: F811
    from inference.cli import main
    from inference.server import run
    from inference.server.app import Engine

    seen = {}
    monkeypatch.setattr(run, "load_engine", lambda *a: seen.update(args=a))
    monkeypatch.setattr(run, "serve", lambda *a: None)
    assert main(["serve", "--model", "smollm2", "--prompt-cache-mb", "0",
                 "--kv-dtype", "float16", "--prompt-cache-idle", "30"]) == 0
    assert seen["args"][4:] == (0, "float16", 30.0)  # (model, embed, backend, parallel, ..)
    assert main(["serve", "--model", "smollm2"]) == 0
    assert seen["args"][4:] == (256, None, 300.0)  # the defaults
    for flag, bad in (("--prompt-cache-mb", "-1"), ("--prompt-cache-idle", "-5"),
                      ("--prompt-cache-idle", "nan"), ("--prompt-cache-idle", "soon")):
        with pytest.raises(SystemExit):
            main(["serve", "--model", "smollm2", flag, bad])
    off = Engine(engine.llm, None, parallel=1, prompt_cache_mb=0)
    on = Engine(engine.llm, None, parallel=1, prompt_cache_mb=3, prompt_cache_idle=7)
    try:
        assert (off.scheduler.pool.max_bytes, on.scheduler.pool.max_bytes) == (0, 3 << 20)
        assert on.scheduler.prompt_cache_idle == 7
    finally:
        off.close()
        on.close()


def test_an_idle_server_lets_its_prompt_cache_go(engine, monkeypatch):  # noqa: F811
    """``prompt_cache_idle`` seconds after the last request the kept prefixes are dropped
    and the heap trimmed; with 0 they stay."""
    import time

    from inference.server import scheduler as scheduler_module

    trimmed_by: list[threading.Thread] = []  # every scheduler alive in the process trims here
    monkeypatch.setattr(scheduler_module, "trim_host_heap",
                        lambda: trimmed_by.append(threading.current_thread()))
    llm = engine.llm
    ids = llm.plan(messages=_conv(0), max_tokens=2)[0]
    greedy = [SamplingParams(temperature=0.0)]
    for idle in (0.2, 0.0):
        sched = Scheduler(llm, parallel=1, prefill_chunk=24, prompt_cache_idle=idle)
        cleared: list[int] = []
        clear = sched.pool.clear
        sched.pool.clear = lambda pool=sched.pool, clear=clear, cleared=cleared: (
            cleared.append(len(pool)), clear())  # what each clear dropped
        try:
            _run_together(sched, [ids], 2, greedy)
            deadline = time.monotonic() + (60 if idle else 1)  # 0: nothing may come
            while not (cleared and sched._thread in trimmed_by) and time.monotonic() < deadline:
                time.sleep(0.02)  # the clear is seen before the trim that follows it
            trims = [t for t in trimmed_by if t is sched._thread]
            if idle:
                assert cleared == [1] and len(sched.pool) == 0 and trims == [sched._thread]
            else:
                assert cleared == [] and len(sched.pool) == 1
        finally:
            sched.close()


class _CancelAt:
    """A decoder layer that sets ``cancel`` at the ``at``-th layer call over ``tokens``
    tokens: a prefill chunk of that size, part way through its pass."""

    def __init__(self, layer, state: dict):
        self.layer, self.state = layer, state

    def __call__(self, x, cache):
        if x.shape[1] == self.state["tokens"]:
            self.state["calls"] += 1
            if self.state["calls"] == self.state["at"]:
                self.state["cancel"].set()
        return self.layer(x, cache)

    def __getattr__(self, name):
        return getattr(self.layer, name)


def test_a_request_cancelled_mid_prefill_leaves_only_its_whole_chunks(engine,  # noqa: F811
                                                                        monkeypatch):
    """A long prompt prefilled a few layers per step beside another stream's decode steps
    is cancelled 5 layers into its second chunk: the pool keeps its first chunk only (a
    compacted copy of 24 rows), and a later request with that prompt copies those rows and
    gets the tokens it gets alone."""
    llm = engine.llm
    n_layers = len(llm.model.layers)
    long = llm.plan(messages=_conv(1), max_tokens=5)[0]
    short = llm.plan(prompt="Once upon a time", max_tokens=30)[0]
    assert len(long) > 3 * 24 and len(short) < 24
    cancel = threading.Event()
    state = {"tokens": 24, "calls": 0, "at": n_layers + 5, "cancel": cancel}
    clock = WorkClock(llm, monkeypatch)  # budgeted pieces on any machine
    monkeypatch.setattr(llm.model, "layers", [_CancelAt(la, state) for la in llm.model.layers])
    sched = Scheduler(llm, parallel=2, prefill_chunk=24, step_budget=0.1, clock=clock)
    tokens, done = threading.Semaphore(0), {"short": threading.Event(),
                                            "long": threading.Event()}

    def emit_for(name: str):
        def emit(ev, _lp):
            if isinstance(ev, TokenEvent):
                tokens.release()
            if isinstance(ev, DoneEvent | BaseException):
                done[name].set()
        return emit

    try:
        sched.submit(Request(short, 30, SamplingParams(temperature=0.0), emit_for("short")))
        for _ in range(2):  # decoding: the long prompt's chunks then run in budgeted pieces
            assert tokens.acquire(timeout=120)
        sched.submit(Request(long, 5, SamplingParams(temperature=0.0), emit_for("long"),
                             cancel=cancel))
        assert done["long"].wait(600) and done["short"].wait(600)
        assert wait_load(sched) == (0, 0)
        assert ("cancelled", 0) in sched.finished
        last = [p for p in sched.plans if p.chunk_tokens][-1]
        assert last.chunk_tokens == 24 and not last.chunk_done  # cancelled mid-chunk
        assert sched.pool.keys() == [tuple(long[:24])]
        (entry, _), = sched.pool._entries.values()
        assert entry.offset == 24 and all(k.shape[2] == 24 for k in entry.keys)
        state["at"] = -1  # no more cancelling
        shared = sched.shared_tokens
        again = _run_together(sched, [long], 5, [SamplingParams(temperature=0.0)])[0]
        assert sched.shared_tokens - shared == 24
    finally:
        sched.close()
    monkeypatch.undo()
    assert again.token_ids == _solo(llm, long, 5, SamplingParams(temperature=0.0), 24)


def _fake_cache(rows: int, width: int = 4) -> KVCache:
    """One layer of ``rows`` rows: 2 x rows x width float32s."""
    c = KVCache(NumpyBackend(), 1)
    c.keys = [np.zeros((1, 1, rows, width), np.float32)]
    c.values = [np.zeros((1, 1, rows, width), np.float32)]
    c.offset = rows
    return c


def test_the_pool_holds_its_bounds_least_recently_used_out():
    row = 2 * 4 * 4  # bytes per row of _fake_cache
    pool = PrefixPool(max_bytes=10 * row, max_entries=3)
    for first in (1, 2, 3):
        pool.put([first, 0], _fake_cache(2))
    assert pool.nbytes == 6 * row and len(pool) == 3
    assert pool.match([2, 0, 9], 2)[0] == 2  # used: now the most recent
    pool.put([4, 0], _fake_cache(2))  # a fourth entry: the least recently used (1) goes
    assert pool.keys() == [(3, 0), (2, 0), (4, 0)]
    seven = (5, 0, 0, 0, 0, 0, 0)
    pool.put(seven, _fake_cache(7))  # four entries, 13 rows: (3) goes, then 11: (2) too
    assert pool.keys() == [(4, 0), seven] and pool.nbytes == 9 * row
    pool.put([4, 0, 1], _fake_cache(3))  # it holds all of (4, 0): that entry goes
    assert pool.keys() == [seven, (4, 0, 1)] and pool.nbytes == 10 * row
    assert pool.covers([4, 0]) and not pool.covers([4, 1])
    pool.put(list(range(12)), _fake_cache(12))  # bigger than the whole pool: not kept
    assert len(pool) == 2 and pool.nbytes <= 10 * row
    assert cache_nbytes(_fake_cache(12), 3) == 3 * row
    pool.clear()
    assert len(pool) == 0 and pool.nbytes == 0


def test_whole_chunks_only_and_one_prompt_token_left():
    a = list(range(10))
    assert shared_chunks(a, a, 10, 4) == 8  # not 10: the last token must run
    assert shared_chunks(a[:9], a, 10, 4) == 8  # 9 tokens: 8, the 9th runs
    assert shared_chunks(a[:8], a, 10, 4) == 4  # 8 tokens: the 8th must run
    assert shared_chunks(a, a, 7, 4) == 4  # the other has only 7 ready
    assert shared_chunks(a, [0, 1, 2, 3, 4, 5, 9, 9, 9], 9, 4) == 4  # differs in chunk 2
    assert shared_chunks(a, [0, 1, 2, 3, 4, 5, 6, 7], 8, 4) == 8


def test_out_of_memory_for_a_new_cache_empties_the_pool_first(engine,  # noqa: F811
                                                               monkeypatch):
    llm = engine.llm
    first, second = (llm.plan(prompt=f"{w} " * 60, max_tokens=3)[0] for w in ("owl", "fox"))
    greedy = [SamplingParams(temperature=0.0)]
    sched = Scheduler(llm, parallel=1, prefill_chunk=24)
    try:
        _run_together(sched, [first], 3, greedy)
        assert sched.pool.keys() == [tuple(first[:len(first) // 24 * 24])]
        real, refused = llm.model.make_cache, []

        def tight(max_len=None):  # no room for a new cache while the pool holds anything
            if len(sched.pool):
                refused.append(max_len)
                raise MemoryError
            return real(max_len)

        monkeypatch.setattr(llm.model, "make_cache", tight)
        done = _run_together(sched, [second], 3, greedy)[0]
        assert refused and done.n_generated == 3
        assert sched.pool.keys() == [tuple(second[:len(second) // 24 * 24])]  # first's: gone
    finally:
        sched.close()
    assert len(sched.pool) == 0  # closing gives it back too
