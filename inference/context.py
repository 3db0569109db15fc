"""Fit a conversation into the context a chat may use, by the chat's context policy.

Used by the app's worker with the loaded model. The conversation store keeps every message
whole; only what the model is sent is shortened, and :class:`Fitted` says how, with the
prompt's token ids as counted, which ``CausalLM.generate(prompt_ids=...)`` takes so a
message is templated and tokenized once.

Policies (as in LM Studio):
- ``stop``: the conversation is sent whole; one that does not fit is refused, saying what
  to change, and a reply stops when the context is full (finish reason "length");
- ``truncate_middle``: keep the system prompt, the first exchange and the latest
  messages, leave out the messages between; a latest message that alone is too long
  loses the middle of its text;
- ``rolling``: keep the system prompt and the latest messages, leave out the oldest; a
  latest message that alone is too long keeps its end.
Kept messages always start with a user turn after the system prompt (templates such as
Gemma's refuse any other order).

A model that cannot count tokens here (a remote engine: its server may not expose its
tokenizer or context) gets the conversation whole, with the counts unknown (None) rather
than guessed; the server applies its own limit and says so when a chat outgrows it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from inference.errors import ContextOverflowError, InvalidInputError
from inference.tokenizer.bounded import MAX_CHARS_PER_TOKEN, encode_bounded

POLICIES = {"rolling": "Rolling window", "truncate_middle": "Truncate middle",
            "stop": "Stop at limit"}
POLICY_TIPS = {
    "rolling": "Leave out the oldest messages (never the system prompt) when the chat "
               "outgrows the context",
    "truncate_middle": "Keep the system prompt, the first exchange and the latest "
                       "messages; leave out those in between",
    "stop": "Send the chat whole; refuse when it no longer fits",
}
DEFAULT_POLICY = "rolling"
MARK = "\n[… {n:,} characters left out to fit the context …]\n"
REPLY_SHARE = 4  # a shortened conversation leaves at least 1/4 of the context for the reply
UNCOUNTED = ("The remote engine counts tokens itself: the chat is sent whole, and the "
             "server refuses it if it outgrows the server's context.")


class ContextFullError(InvalidInputError):
    """The conversation does not fit and the chat's policy is to stop."""


@dataclass
class Fitted:
    messages: list[dict]  # what the model is sent
    n_prompt: int | None  # its tokens (None: the model cannot count them here)
    limit: int | None  # the context this chat may use (None: unknown)
    policy: str
    dropped: int = 0  # messages left out
    cut_chars: int = 0  # characters left out of one message
    notes: list[str] = field(default_factory=list)
    ids: list[int] | None = None  # the prompt's token ids (None: not counted here)

    def reply_tokens(self, max_tokens: int) -> int:
        """Tokens the reply may take: ``max_tokens`` within the room the context leaves."""
        if self.limit is None or self.n_prompt is None:
            return max(1, max_tokens)
        return max(1, min(max_tokens, self.limit - self.n_prompt))

    def note(self) -> str:
        """One sentence on what was left out ('' when the conversation went whole)."""
        if self.n_prompt is None:
            return UNCOUNTED
        parts = []
        if self.dropped:
            parts.append(f"{self.dropped} earlier message{'s' if self.dropped != 1 else ''}")
        if self.cut_chars:
            parts.append(f"{self.cut_chars:,} characters of a long message")
        if not parts:
            return ""
        return f"{POLICIES[self.policy]}: {' and '.join(parts)} left out to fit the context."


def counts_tokens(model: Any) -> bool:
    """Whether ``model`` tokenizes prompts here (a remote engine does not)."""
    return hasattr(model, "plan") and getattr(model, "context_length", None) is not None


def fit(model: Any, messages: list[dict], policy: str, limit: int | None, max_tokens: int,
        continue_final: bool = False, cancel: threading.Event | None = None) -> Fitted:
    """``messages`` shortened by ``policy`` so they fit ``limit`` tokens (capped at the
    model's context) with room for a reply; ContextFullError under ``stop``."""
    if policy not in POLICIES:
        raise InvalidInputError(f"Unknown context policy {policy!r}; choose one of "
                                f"{', '.join(POLICIES)}.")
    if not counts_tokens(model):
        return Fitted(list(messages), None, None, policy)
    limit = max(2, min(int(limit), int(model.context_length)))

    counted: dict[tuple, list[int]] = {}  # the ids of each message list counted

    def key(msgs: list[dict]) -> tuple:
        return tuple((m["role"], m["content"]) for m in msgs)

    def count(msgs: list[dict]) -> int | None:
        """Prompt tokens of ``msgs``, None when beyond the model's context."""
        try:
            ids, _ = model.plan(messages=msgs, max_tokens=1, cancel=cancel,
                                continue_final=continue_final)
        except ContextOverflowError:
            return None
        counted[key(msgs)] = ids
        return len(ids)

    fitted = _fit(model, messages, policy, limit, max_tokens, count)
    fitted.ids = counted.get(key(fitted.messages))
    return fitted


def _fit(model: Any, messages: list[dict], policy: str, limit: int, max_tokens: int,
         count: Any) -> Fitted:
    """:func:`fit` over ``count`` (prompt tokens of a message list, None past the context)."""
    n = count(messages)
    if policy == "stop":
        if n is None or n >= limit:
            have = f"{n:,}" if n is not None else f"more than {model.context_length - 1:,}"
            raise ContextFullError(
                f"This chat is {have} tokens and its context holds {limit:,}: choose "
                f"“{POLICIES['truncate_middle']}” or “{POLICIES['rolling']}” for this chat, or a "
                f"longer context in Models.")
        return Fitted(list(messages), n, limit, policy)
    budget = limit - max(1, min(max_tokens, limit // REPLY_SHARE))
    if n is not None and n <= budget:
        return Fitted(list(messages), n, limit, policy)

    system = [m for m in messages[:1] if m["role"] == "system"]
    rest = messages[len(system):]
    # The messages that must stay: the last user turn (and the reply being continued).
    tail_from = max((i for i, m in enumerate(rest) if m["role"] == "user"), default=0)
    head = rest[:2] if policy == "truncate_middle" and tail_from >= 2 else []
    starts = [i for i in range(len(head), tail_from + 1) if rest[i]["role"] == "user"] \
        or [tail_from]

    def fits(i: int, with_head: bool = True) -> int | None:
        c = count(system + (head if with_head else []) + rest[i:])
        return c if c is not None and c <= budget else None

    # Fewest messages left out: binary search over the user turns a suffix may start at
    # (leaving out more never makes the prompt longer).
    lo, hi = 0, len(starts) - 1
    if fits(starts[hi]) is not None:
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(starts[mid]) is not None:
                hi = mid
            else:
                lo = mid + 1
        kept = system + head + rest[starts[lo]:]
        return Fitted(kept, count(kept), limit, policy,
                      dropped=len(messages) - len(kept))
    # Only the last turn is left, and it is still too long: shorten its longest message.
    kept = system + rest[tail_from:]
    return _cut(model, kept, policy, limit, budget, count, len(messages) - len(kept))


def _cut(model: Any, kept: list[dict], policy: str, limit: int, budget: int, count: Any,
         dropped: int) -> Fitted:
    """Shorten the longest kept non-system message until the prompt fits ``budget``."""
    i = max((j for j, m in enumerate(kept) if m["role"] != "system"),
            key=lambda j: len(kept[j]["content"]))
    text = kept[i]["content"]
    others = count(kept[:i] + [{**kept[i], "content": ""}] + kept[i + 1:])
    if others is None or others >= budget:
        raise ContextFullError("The system prompt alone fills this chat's context: shorten "
                               "it, or choose a longer context in Models.")
    keep = budget - others
    for _ in range(4):  # re-tokenizing a cut text can add a few tokens at the seams
        short, gone = _shorten(model.tokenizer, text, keep,
                               middle=policy == "truncate_middle")
        msgs = kept[:i] + [{**kept[i], "content": short}] + kept[i + 1:]
        n = count(msgs)
        if n is not None and n <= budget:
            return Fitted(msgs, n, limit, policy, dropped=dropped, cut_chars=gone)
        keep -= (n - budget if n is not None else keep // 2) + 8
        if keep <= 0:
            break
    raise ContextFullError("This message cannot be shortened enough to fit the context: "
                           "choose a longer context in Models.")


def _shorten(tokenizer: Any, text: str, keep: int, middle: bool) -> tuple[str, int]:
    """``text`` with only about ``keep`` tokens left: its start and end (``middle``) or
    its end, joined by a marker that says how many characters are gone (returned too).
    Only a bounded
    piece at each end is tokenized, however long the text."""
    keep = max(1, keep - 24)  # room for the marker's own tokens
    span = keep * MAX_CHARS_PER_TOKEN

    def end_part(n: int) -> str:
        piece = text[-span:]
        ids = tokenizer.encode(piece, add_special_tokens=False, parse_special=False)
        return tokenizer.decode(ids[-n:]).lstrip("\ufffd") if n else ""

    if middle:
        h = keep // 2
        ids, _ = encode_bounded(tokenizer, text[:span], h, add_special_tokens=False,
                                parse_special=False)
        start = tokenizer.decode(ids[:h]).rstrip("\ufffd")
        end = end_part(keep - h)
    else:
        start, end = "", end_part(keep)
    gone = max(0, len(text) - len(start) - len(end))
    return start + MARK.format(n=gone) + end, gone
