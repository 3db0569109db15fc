"""The context fit in the engine: the ids it counts are the prompt generate takes, so a
chat is templated and tokenized once per message."""

from __future__ import annotations

import pytest

from inference.context import fit
from inference.errors import InvalidInputError
from inference.events import TokenEvent
from inference.sampling import SamplingParams

CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a colour."}]
GREEDY = SamplingParams(temperature=0.0)


def _tokens(events) -> list[int]:  # noqa: ANN001
    return [ev.token_id for ev in events if isinstance(ev, TokenEvent)]


def test_fit_returns_the_ids_generate_takes(smollm2, monkeypatch) -> None:
    fitted = fit(smollm2, CHAT, "rolling", 2048, 4)
    assert fitted.ids == smollm2.plan(messages=CHAT, max_tokens=1)[0]
    plans = []
    real = smollm2.plan
    monkeypatch.setattr(smollm2, "plan", lambda *a, **k: plans.append(1) or real(*a, **k))
    by_ids = _tokens(smollm2.generate(prompt_ids=fitted.ids, max_tokens=4, sampling=GREEDY))
    assert plans == []  # the counted ids are used as they are: no second tokenization
    monkeypatch.undo()
    assert by_ids == _tokens(smollm2.generate(messages=CHAT, max_tokens=4, sampling=GREEDY))


def test_a_shortened_chat_carries_the_ids_of_what_is_sent(smollm2) -> None:
    turns = []
    for i in range(6):
        turns += [{"role": "user", "content": f"Question {i}? " * 20},
                  {"role": "assistant", "content": f"Answer {i}. " * 20}]
    chat = CHAT[:1] + turns + [{"role": "user", "content": "And the last one?"}]
    fitted = fit(smollm2, chat, "rolling", 300, 50)
    assert fitted.dropped > 0
    assert fitted.ids == smollm2.plan(messages=fitted.messages, max_tokens=1)[0]
    assert len(fitted.ids) == fitted.n_prompt


@pytest.mark.parametrize("ids", [[], [-1], [10 ** 9], "12", [1.5]])
def test_bad_prompt_ids_are_one_sentence(smollm2, ids) -> None:
    with pytest.raises(InvalidInputError):
        list(smollm2.generate(prompt_ids=ids, max_tokens=2))


def test_prompt_ids_with_messages_is_refused(smollm2) -> None:
    with pytest.raises(InvalidInputError, match="one of prompt, messages or prompt_ids"):
        list(smollm2.generate(messages=CHAT, prompt_ids=[1, 2], max_tokens=2))


@pytest.mark.parametrize("kw, says", [({"max_tokens": 0}, "max_tokens"),
                                      ({"stop": "x"}, "stop must be a list"),
                                      ({"cancel": 1}, "cancel must be")])
def test_prompt_ids_get_the_same_run_checks(smollm2, kw, says) -> None:
    """The token limit, stop list and cancel event are checked for ids as for text."""
    with pytest.raises(InvalidInputError, match=says):
        list(smollm2.generate(prompt_ids=[1, 2], **{"max_tokens": 2, **kw}))
