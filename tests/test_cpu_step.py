"""The cpu backend's captured decode step (inference/backends/cpu/replay.py): replayed steps
give the eager steps' tokens and logits on every architecture, and anything a replay could
get wrong falls back to eager steps instead of a wrong token."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference import load_model
from inference.backends.cpu import CpuBackend
from inference.backends.cpu.replay import CpuSampler, StepReplayer
from inference.events import DoneEvent
from inference.generate import generate_step
from inference.sampling import SamplingParams

TINY = Path(__file__).resolve().parent / "goldens" / "tiny"
# One of each path through the decoder block: biases and tied embeddings (qwen2), untied
# with llama3 RoPE from a quantized file (llama3_q4_k), per-head q/k norms (qwen3_f16),
# GELU and scaled embeddings (gemma_q8_0), fused projections and LongRoPE (phi3_q4_0),
# soft-caps and sliding windows (gemma2_q4_0: sliding layers keep the eager step), file-byte
# Q2_K / Q3_K matrices (llama.cpp's Q2_K and Q3_K_M: kdot.py, or raw.py with float).
MODELS = {"qwen2": "qwen2", "llama3_q4_k": "llama3_q4_k.gguf", "qwen3_f16": "qwen3_f16.gguf",
          "gemma_q8_0": "gemma_q8_0.gguf", "phi3_q4_0": "phi3_q4_0.gguf",
          "gemma2_q4_0": "gemma2_q4_0.gguf", "llama3_q2_k": "llama3_Q2_K.llamacpp.gguf",
          "llama3_q3_k_m": "llama3_Q3_K_M.llamacpp.gguf"}
WINDOWED = {"gemma2_q4_0"}
TOKENS = 12
_models: dict[str, object] = {}


def _model(name: str):
    if name not in _models:
        m = _models[name] = load_model(str(TINY / MODELS[name]), backend="cpu")
        # A fixed count: the backend follows other processes' load step by step, and a
        # prefill's products split by thread count round differently (eager and replayed
        # generations are compared to 1e-5 of their largest logit).
        m.backend.set_threads(m.backend.threads()[1])
    return _models[name]


def _generate(m, replay: bool, monkeypatch, temperature: float = 0.0
              ) -> tuple[list[int], list[np.ndarray], CpuSampler]:
    """Tokens, the logits row of each step, and the sampler of one generation."""
    B = m.backend
    B.drop_steps()  # each generation here captures anew (ops are patched between them)
    monkeypatch.setattr(B, "step_replay", replay)
    rows: list[np.ndarray] = []
    made: list[CpuSampler] = []
    real_sample = CpuSampler.sample

    def sample(self, row):
        rows.append(np.array(row, copy=True))
        return real_sample(self, row)

    def start(params, prompt_ids, rng):
        made.append(CpuSampler(B, params, prompt_ids, rng))
        return made[-1]

    monkeypatch.setattr(CpuSampler, "sample", sample)
    monkeypatch.setattr(B, "start_generation", start)
    prompt = m.tokenize("The quick brown fox")
    params = SamplingParams(temperature=temperature, seed=7)
    steps = generate_step(m.model, prompt, params, np.random.default_rng(3),
                          max_len=len(prompt) + TOKENS + 1)
    toks = [next(steps) for _ in range(TOKENS)]
    steps.close()
    monkeypatch.undo()
    return toks, rows, made[0]


@pytest.mark.parametrize("name", MODELS)
def test_replayed_steps_equal_eager_steps(name, monkeypatch):
    m = _model(name)
    want, want_rows, eager = _generate(m, False, monkeypatch)
    got, got_rows, s = _generate(m, True, monkeypatch)
    assert eager.steps.replay is None
    if name in WINDOWED:
        assert s.steps.replay is None  # sliding-window caches move rows: eager steps
    else:
        assert s.steps.eager_reason is None and s.steps.replay is not None
        assert s.steps.verified == {1} and s.steps.captures == 1
    assert got == want
    # Same kernels over the same inputs; only buffer addresses differ (BLAS code paths
    # for the dense float weights may differ in rounding with alignment).
    for a, b in zip(got_rows, want_rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()))


def test_a_sliding_window_replays_until_it_hides_a_key(monkeypatch):
    """Local layers of a window W (set here on half of a tiny Llama's layers, as Gemma 3
    has them) attend as full ones while the context is under W tokens: those steps replay;
    from the first that would hide a key on, the steps are eager (the window masks, then
    drops rows). The same tokens and logits as eager steps throughout."""
    m = _model("llama3_q4_k")
    prompt = len(m.tokenize("The quick brown fox"))
    for i, layer in enumerate(m.model.layers):
        monkeypatch.setattr(layer.attn, "window", prompt + 4 if i % 2 == 0 else None)
    with monkeypatch.context() as mp:
        want, want_rows, _ = _generate(m, False, mp)
    with monkeypatch.context() as mp:
        ran = []
        real_run = StepReplayer._run
        mp.setattr(StepReplayer, "_run", lambda self, *a: ran.append(1) or real_run(self, *a))
        got, got_rows, s = _generate(m, True, mp)
    assert s.steps.eager_reason is None and s.steps.verified == {1}
    assert 0 < len(ran) < TOKENS - 4  # replays under the window, eager steps past it
    assert got == want
    for a, b in zip(got_rows, want_rows, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * float(np.abs(b).max()))


def test_sampled_tokens_are_the_eager_ones(monkeypatch):
    m = _model("qwen2")
    want, _, _ = _generate(m, False, monkeypatch, temperature=0.9)
    got, _, s = _generate(m, True, monkeypatch, temperature=0.9)
    assert s.steps.replay is not None and got == want


def test_an_op_without_replay_runs_the_step_eagerly(monkeypatch):
    m = _model("qwen2")
    want, _, _ = _generate(m, False, monkeypatch)
    real = CpuBackend.rms_norm

    def rms_norm(self, x, w, eps):
        self._untaped("this norm")
        return real(self, x, w, eps)

    monkeypatch.setattr(CpuBackend, "rms_norm", rms_norm)
    got, _, s = _generate(m, True, monkeypatch)
    assert s.steps.replay is None and s.steps.eager_reason == "this norm has no replay"
    assert got == want


def test_a_replay_that_disagrees_is_caught_and_the_step_redone(monkeypatch):
    """An op computed at capture but left off the tape replays a stale buffer: the check
    beside the first replay sees it, and every step from there on is eager."""
    m = _model("qwen2")
    want, _, _ = _generate(m, False, monkeypatch)

    def add(self, a, b):
        return a + b  # no replay call: the residual stream stays the captured one

    monkeypatch.setattr(CpuBackend, "add", add)
    got, _, s = _generate(m, True, monkeypatch)
    assert s.steps.eager_reason == "a replayed step disagreed with the eager one"
    assert got == want


def test_the_bench_times_replayed_and_eager_steps():
    from inference.bench.kernels import step_replay

    m = _model("qwen2")
    r = step_replay(m, m.tokenize("The quick brown fox"), 4, rounds=1)
    assert r["eager_reason"] is None
    # Per layer at least a norm, the q/k/v, o, gate/up and down products, RoPE twice, two
    # KV writes, attention: a replayed token still calls every kernel.
    assert r["replay_calls_per_token"] >= 10 * len(m.model.layers)
    assert len(r["samples_ms"]["eager"]) == len(r["samples_ms"]["replayed"]) == 1
    assert m.backend.step_replay and "start_generation" not in vars(m.backend)
    assert step_replay(_model_numpy(), [1, 2, 3], 2) is None  # no replay to time


def _model_numpy():
    return load_model(str(TINY / MODELS["qwen2"]), backend="numpy")


def test_the_servers_batched_steps_replay_and_change_no_token(monkeypatch):
    """Four sequences decoding together, joining and leaving: each step's caches are
    captured anew when the set changes, replayed while it holds; every request's tokens
    are those it gets alone (greedy and seeded)."""
    from inference.server.scheduler import Request, Scheduler

    m = _model("qwen2")
    prompts = [m.tokenize(t) for t in ("One two", "The quick brown fox", "Hello", "A B C D E")]
    samplings = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=5)] * 2
    rows: list[int] = []  # batch rows of each replayed step
    run = StepReplayer._run
    monkeypatch.setattr(StepReplayer, "_run", lambda self, r, ids, caches: (
        rows.append(len(caches)), run(self, r, ids, caches))[1])

    def serve(parallel: int) -> list[list[int]]:
        sched = Scheduler(m, parallel=parallel)
        done: list[threading.Event] = [threading.Event() for _ in prompts]
        out: list[list[int]] = [[] for _ in prompts]

        def emit(i):
            def f(ev, _lp):
                if isinstance(ev, DoneEvent):
                    out[i] = ev.token_ids
                    done[i].set()
            return f

        try:
            for i, (p, s) in enumerate(zip(prompts, samplings, strict=True)):
                sched.submit(Request(p, 10 + 2 * i, s, emit(i)))
            assert all(d.wait(300) for d in done)
        finally:
            sched.close()
        return out

    alone = serve(1)
    assert rows and max(rows) == 1
    rows.clear()
    together = serve(4)
    assert together == alone
    assert max(rows) >= 2


def test_a_capture_tapes_only_its_own_threads_ops():
    """The server embeds on other threads while the scheduler thread captures a step."""
    from inference.backends.cpu.replay import Tape

    B = CpuBackend()
    x, w = np.ones((2, 64), np.float32), np.ones(64, np.float32)
    B._tape = tape = Tape(0)
    try:
        worker = threading.Thread(target=B.rms_norm, args=(x, w, 1e-6))
        worker.start()
        worker.join()
        assert tape.calls == []
        B.rms_norm(x, w, 1e-6)
        assert len(tape.calls) == 1
    finally:
        B._tape = None


def test_linears_of_one_input_share_its_quantized_rows_in_a_replay():
    """q, k and v of different types (a Q4_K_M file) read one input: a replay quantizes it
    once, and each product still equals the eager one for the replayed input."""
    from inference.backends.cpu import quantize as cpu_quantize
    from inference.backends.cpu.replay import Tape
    from tests.bundled import random_tensor

    B = CpuBackend()
    if B.activations == "float":
        pytest.skip("no integer dot products on this CPU: nothing is quantized")
    ws = [B.weight(random_tensor(q, 64, 256, seed)) for seed, q in enumerate(("Q4_0", "Q8_0",
                                                                               "Q4_K"))]
    x = np.random.default_rng(0).standard_normal((1, 1, 256)).astype(np.float32)
    B._tape = tape = Tape(0)
    try:
        ys = [B.linear(x, w) for w in ws]
    finally:
        B._tape = None
    assert sum(getattr(c, "func", None) is cpu_quantize._quantize for c in tape.calls) == 1
    x[...] = np.random.default_rng(1).standard_normal(x.shape)
    for call in tape.calls:
        call()
    for w, y in zip(ws, ys, strict=True):
        np.testing.assert_array_equal(y, B.linear(x, w))


def test_a_later_generation_rebinds_the_models_capture(monkeypatch):
    """The model's replayer outlives a generation: the next one rebinds its capture to
    the new cache (checked once, beside an eager step), and from the one after that on
    the first decode step is a replay; the tokens stay the eager ones. Between
    generations the replayer holds no cache, and it goes with the model."""
    import gc
    import weakref

    m = _model("llama3_q4_k")
    B = m.backend
    want, _, _ = _generate(m, False, monkeypatch)
    B.drop_steps()
    eager = []
    real_verify = StepReplayer._verify
    monkeypatch.setattr(StepReplayer, "_verify",
                        lambda self, *a: eager.append(1) or real_verify(self, *a))
    prompt = m.tokenize("The quick brown fox")
    params = SamplingParams(temperature=0.0, seed=7)
    runs = []
    for _ in range(3):
        eager.clear()
        steps = generate_step(m.model, prompt, params, np.random.default_rng(3),
                              max_len=len(prompt) + TOKENS + 1)
        toks = [next(steps) for _ in range(TOKENS)]
        steps.close()
        kept = B._steps[m.model]
        runs.append((toks, kept.captures, kept.rebinds, len(eager)))
        assert not B._lent and kept.replay is not None and kept.replay.buffers == ()
    assert [r[0] for r in runs] == [want] * 3
    assert [r[1:] for r in runs] == [(1, 0, 1), (1, 1, 1), (1, 2, 0)]
    held = weakref.ref(kept)
    del kept, steps
    B.drop_steps()
    gc.collect()
    assert held() is None


def test_a_generation_beside_another_gets_its_own_replayer():
    m = _model("llama3_q4_k")
    B = m.backend
    B.drop_steps()
    first, kept = B.borrow_steps(m.model)
    second, kept2 = B.borrow_steps(m.model)
    assert kept and not kept2 and second is not first
    B.return_steps(first)
    again, kept3 = B.borrow_steps(m.model)
    assert kept3 and again is first
    B.return_steps(again)


def test_a_new_batch_rebinds_the_capture_of_its_size():
    """A new set of caches of a size already captured (sequences joined or left) rebinds
    that capture instead of running an eager step to capture anew; each row's tokens stay
    those of its sequence alone, and a capture lets go of caches it no longer runs."""
    import gc
    import weakref

    from inference.kv_cache import BatchedCaches

    m = load_model("smollm2", backend="cpu")
    M, B = m.model, m.backend

    def prefilled(text: str):
        ids = m.tokenize(text)
        c = M.make_cache(len(ids) + 16)
        logits = M(B.array(np.asarray([ids])), c, last_only=True)
        return c, int(np.argmax(B.to_numpy(logits)[0, -1]))

    def alone(text: str, n: int) -> list[int]:
        c, tok = prefilled(text)
        out = [tok]
        for _ in range(n - 1):
            logits = M(B.array(np.asarray([[tok]])), c, last_only=True)
            tok = int(np.argmax(B.to_numpy(logits)[0, -1]))
            out.append(tok)
        return out

    def together(steps: StepReplayer, texts: list[str], n: int) -> tuple[list[list[int]], Any]:
        """Each sequence's greedy tokens, and a weak reference to a KV buffer of theirs."""
        cs, toks = zip(*(prefilled(t) for t in texts), strict=True)
        out = [[t] for t in toks]
        for _ in range(n - 1):
            ids = B.array(np.asarray([[o[-1]] for o in out]))
            logits = B.to_numpy(steps(M, ids, BatchedCaches(list(cs))))
            for o, row in zip(out, logits, strict=True):
                o.append(int(np.argmax(row[-1])))
        return out, weakref.ref(cs[0].keys[0])

    steps = StepReplayer(B)
    first = ["The quick brown fox", "Once upon a time, in a land far"]
    second = ["Water boils at", "My favourite colour is green because"]
    got, held = together(steps, first, 6)
    assert got == [alone(t, 6) for t in first]
    assert steps.captures == 1 and steps.rebinds == 0
    got, _ = together(steps, second, 6)
    assert got == [alone(t, 6) for t in second]
    assert steps.captures == 1 and steps.rebinds == 1 and steps.eager_reason is None
    gc.collect()
    assert held() is None  # the first pair's cache buffers are no longer held
    got, held = together(steps, first[:1], 4)  # another size: a capture of its own
    assert got == [alone(first[0], 4)] and steps.captures == 2
    together(steps, second, 3)  # back to two: rebinds the kept capture of that size
    assert steps.captures == 2 and steps.rebinds == 2
    gc.collect()
    assert held() is None  # the one-row capture let go of its cache



FIRST_REPLY = """
from numba.core.registry import CPUDispatcher
from inference import load_model
from inference.backends.cpu import (attention, dequant, fused, kdot, matvec_float, matvec_int,
                                    quantize, raw)
from inference.sampling import SamplingParams

mods = (attention, dequant, fused, kdot, matvec_float, matvec_int, quantize, raw)
kernels = [v for m in mods for v in vars(m).values() if isinstance(v, CPUDispatcher)]
m = load_model("SmolLM2-135M-Instruct.Q4_1", backend="cpu")
loaded = {k: len(k.overloads) for k in kernels}
assert sum(loaded.values()) >= 8, loaded  # prepare loaded the model's kernels
text = "Kernels load when the model loads, so that the first reply does not wait for them."
list(m.generate(prompt=text, max_tokens=4, sampling=SamplingParams(temperature=0.0)))
new = [k.py_func.__qualname__ for k in kernels if len(k.overloads) != loaded[k]]
assert not new, new
print("first reply ok")
"""


def test_the_first_reply_loads_no_kernel():
    """In a fresh process, loading a model runs ``CpuBackend.prepare``: the first reply's
    prefill, capture, check and replayed steps then load no kernel of their own (each
    load from numba's cache costs the reply time the later replies do not pay)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FIRST_REPLY], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "first reply ok" in out.stdout, out.stderr[-3000:]
