"""Generation on the real SmolLM2: cache consistency, stop strings, cancel, limits."""

import threading

import numpy as np
import pytest

from inference.errors import InvalidInputError
from inference.events import DoneEvent, TokenEvent
from inference.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def run(model, **kw):
    events = list(model.generate(**kw))
    assert isinstance(events[-1], DoneEvent)
    assert all(isinstance(e, TokenEvent) for e in events[:-1])
    return events[:-1], events[-1]


@pytest.fixture(scope="module")
def greedy_answer(smollm2):
    """The greedy 24-token answer to MESSAGES: checked below, and the stop-string test's
    reference (computed once)."""
    return run(smollm2, messages=MESSAGES, max_tokens=24, sampling=GREEDY)


def test_greedy_chat_answers_and_streams(smollm2, greedy_answer):
    tokens, done = greedy_answer
    assert "Paris" in done.text
    assert "".join(t.text for t in tokens) == done.text
    assert done.finish_reason in ("eos", "length")
    assert done.ttft_s > 0 and done.prefill_tok_s > 0
    assert done.n_prompt == len(smollm2.tokenize(smollm2.chat_prompt(MESSAGES),
                                                 add_special_tokens=False))


def test_cached_decode_equals_full_forward(smollm2):
    """Greedy ids from the KV-cached loop equal argmax of a fresh teacher-forced pass."""
    prompt = "def fibonacci(n):"
    ids = smollm2.tokenize(prompt)
    _, done = run(smollm2, prompt=prompt, max_tokens=12, sampling=GREEDY)
    full = ids + done.token_ids
    logits = smollm2.logits(full)
    np.testing.assert_array_equal(np.argmax(logits[len(ids) - 1:-1], axis=1), done.token_ids)


def test_seeded_sampling_is_reproducible(smollm2):
    p = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02,
                       repetition_penalty=1.1, seed=1234)
    a = run(smollm2, prompt="Once upon a time", max_tokens=10, sampling=p)[1].token_ids
    b = run(smollm2, prompt="Once upon a time", max_tokens=10, sampling=p)[1].token_ids
    assert a == b


def test_stop_string_is_cut_and_never_streamed(smollm2, greedy_answer):
    _, free = greedy_answer
    stop = "Paris"
    assert stop in free.text
    tokens, done = run(smollm2, messages=MESSAGES, max_tokens=24, sampling=GREEDY, stop=[stop])
    assert done.finish_reason == "stop"
    assert done.text == free.text[: free.text.index(stop)]
    assert stop not in "".join(t.text for t in tokens)


def test_max_tokens_and_cancel(smollm2):
    _, done = run(smollm2, prompt="The quick brown fox", max_tokens=3, sampling=GREEDY)
    assert done.n_generated <= 3
    cancel = threading.Event()
    gen = smollm2.generate(prompt="Count to one hundred: 1, 2, 3,", max_tokens=50,
                           sampling=GREEDY, cancel=cancel)
    first = next(gen)
    assert isinstance(first, TokenEvent)
    cancel.set()
    rest = list(gen)
    assert rest[-1].finish_reason == "cancelled"
    assert rest[-1].n_generated <= 2  # stopped within one token of the request


@pytest.mark.parametrize("kw", [{"prompt": ""}, {"prompt": "   "}, {"messages": []},
                                {"messages": [{"role": "user", "content": ""}]}])
def test_empty_input_is_refused_up_front(smollm2, kw):
    with pytest.raises(InvalidInputError):
        smollm2.generate(**kw)


def test_prompt_longer_than_context_is_refused(smollm2):
    with pytest.raises(InvalidInputError, match="tokens"):
        smollm2.generate(prompt="word " * (smollm2.context_length + 10))


def test_profile_records_op_times(smollm2):
    _, done = run(smollm2, prompt="Hi", max_tokens=2, sampling=GREEDY, profile=True)
    assert {"linear", "attention", "rms_norm"} <= set(done.op_times_s)
    assert "linear" not in vars(smollm2.backend)  # profiling off again: no shadows left


def test_freed_heap_goes_back_once_the_reply_is_out(smollm2, monkeypatch):
    """A prefill's freed temporaries stay for reuse within the reply (keep_freed_heap) and
    are returned to the OS after its DoneEvent, also when the reader stops there."""
    import inference.generate as gen_module

    seen: list[str] = []
    monkeypatch.setattr(gen_module, "trim_host_heap", lambda: seen.append("trim"))
    for ev in smollm2.generate(prompt="Hello", max_tokens=3, sampling=GREEDY):
        seen.append(type(ev).__name__)
    assert seen[-2:] == ["DoneEvent", "trim"] and seen.count("trim") == 1
    seen.clear()
    events = smollm2.generate(prompt="Hello", max_tokens=3, sampling=GREEDY)
    for ev in events:
        if isinstance(ev, DoneEvent):
            break
    events.close()
    assert seen == ["trim"]
