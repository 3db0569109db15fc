"""KV reuse of the unchanged conversation prefix between chat turns (bundled SmolLM2)."""

from __future__ import annotations

import numpy as np
import pytest

import inference
from inference.events import DoneEvent
from inference.generate import stream_generate
from inference.prompt_cache import PromptCache, common_prefix
from inference.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, seed=1)


@pytest.fixture(scope="module")
def lm():  # noqa: ANN201
    return inference.load_model("smollm2", backend="numpy")


def _done(events) -> DoneEvent:  # noqa: ANN001
    return next(ev for ev in events if isinstance(ev, DoneEvent))


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2


def test_second_turn_with_the_cache_matches_a_fresh_prefill(lm) -> None:  # noqa: ANN001
    msgs = [{"role": "user", "content": "Name a colour."}]
    first = _done(lm.generate(messages=msgs, max_tokens=6, sampling=GREEDY))
    msgs += [{"role": "assistant", "content": first.text},
             {"role": "user", "content": "And a fruit?"}]
    cached = _done(lm.generate(messages=msgs, max_tokens=8, sampling=GREEDY))
    assert cached.n_cached > 0
    ids = lm._prompt_ids(None, msgs)
    fresh = _done(stream_generate(lm.model, lm.tokenizer, ids, max_tokens=8,
                                  sampling=GREEDY, eos_ids=lm.tokenizer.eos_ids))
    assert fresh.n_cached == 0
    # Greedy: the same first tokens. A different prefill split changes float rounding
    # only (~1e-6 relative), far below the gap between the top two logits here.
    assert cached.token_ids[:4] == fresh.token_ids[:4]


def test_cancel_mid_reply_leaves_a_consistent_cache(lm) -> None:  # noqa: ANN001
    import threading

    pc: PromptCache = lm.prompt_cache
    cancel = threading.Event()
    msgs = [{"role": "user", "content": "Count to twenty."}]
    for i, _ev in enumerate(lm.generate(messages=msgs, max_tokens=30, sampling=GREEDY,
                                        cancel=cancel)):
        if i == 3:
            cancel.set()
    assert len(pc.ids) >= pc.cache.offset  # ids cover every cached row
    ref = lm.logits(pc.ids[:pc.cache.offset])
    assert ref.shape[0] == pc.cache.offset


def test_turn_10_prefills_only_the_new_message(lm, capsys) -> None:  # noqa: ANN001
    """The benchmark printout: TTFT of turns 1 and 10 (not a timed assertion)."""
    lm.prompt_cache = PromptCache()
    msgs: list[dict] = [{"role": "system", "content": "Answer in a few words."}]
    ttft, prefilled = [], []
    for turn in range(1, 11):
        msgs.append({"role": "user", "content": f"Turn {turn}: name an animal."})
        done = _done(lm.generate(messages=msgs, max_tokens=4, sampling=GREEDY))
        msgs.append({"role": "assistant", "content": done.text})
        ttft.append(done.ttft_s)
        prefilled.append(done.n_prompt - done.n_cached)
        new_msg = len(lm.tokenize(msgs[-2]["content"], add_special_tokens=False))
    with capsys.disabled():
        print(f"\n[prompt cache] turn 1: TTFT {ttft[0] * 1000:.0f} ms, prefilled "
              f"{prefilled[0]} tokens; turn 10: TTFT {ttft[-1] * 1000:.0f} ms, prefilled "
              f"{prefilled[-1]} of {done.n_prompt} prompt tokens (median TTFT turns 2-10: "
              f"{np.median(ttft[1:]) * 1000:.0f} ms)")
    # Turn 10's prefill is the new message plus the template's few markup tokens and the
    # last reply's closing (a re-tokenized reply may differ from the sampled ids at its
    # end), not the whole history.
    assert done.n_cached > 0.7 * done.n_prompt
    assert prefilled[-1] <= new_msg + 16
