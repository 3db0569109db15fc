"""Chat templates: turn a list of messages into the prompt text a chat model was trained on.

Templates are Jinja2 programs shipped inside model files, so they are untrusted code: they run
in Jinja's immutable sandbox, with the environment transformers gives them (trim_blocks,
lstrip_blocks, loop controls, ``raise_exception``, ``strftime_now``, a non-escaping ``tojson``),
so a template renders here exactly as ``apply_chat_template`` renders it.

Where the template comes from, first found wins:
1. the GGUF key ``tokenizer.chat_template``;
2. ``chat_template`` in tokenizer_config.json (or a chat_template.jinja beside it);
3. ChatML, resources/chat_templates/chatml.jinja.

Fallback: a model template that does not compile makes :meth:`ChatTemplate.for_checkpoint`
use ChatML instead and say why in ``fallback_reason`` (the GUI shows it); ``strict=True``
raises UnsupportedModelError instead. A template that fails while rendering raises
InvalidInputError when the template itself rejects the conversation (``raise_exception``,
e.g. roles that do not alternate) and UnsupportedModelError for any other failure.

A template that rejects a conversation only because it opens with a system message (Gemma 2
has no system role) renders it with the system text folded into the first user message,
``system + "\n\n" + user``, the way Gemma 3's own template folds it; transformers would raise.

The rendered text already holds every special token the model wants (BOS included, if the
template writes it), so encode it with ``add_special_tokens=False``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.errors import CancelledError, InvalidInputError, UnsupportedModelError

CHATML_PATH = Path(__file__).resolve().parents[1] / "resources" / "chat_templates" / "chatml.jinja"


# Bounds on one rendering: a template is untrusted code, and a prompt is small.
RENDER_SECONDS = 5.0
MAX_OUTPUT_CHARS = 16 * 2**20


class TemplateRejected(jinja2.TemplateError):
    """Raised by a template's own ``raise_exception``: the conversation is not acceptable."""


class TemplateTimeout(Exception):
    """A rendering ran past :data:`RENDER_SECONDS`."""


def _raise_exception(message: str) -> None:
    raise TemplateRejected(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes, which would change the prompt text.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.intercepted_binops = frozenset({"*", "**"})
    env.call_binop = _bounded_binop
    return env.from_string(source)


def _bounded_binop(context: Any, operator: str, left: Any, right: Any) -> Any:
    """``*`` and ``**`` with results of bounded size ('a' * 10**10 would take memory first)."""
    if operator == "**":
        if isinstance(left, int | float) and isinstance(right, int | float) \
                and abs(right) > 64 and abs(left) > 1:
            raise jinja2.TemplateError("a power too large for a chat template")
        return left ** right
    for seq, n in ((left, right), (right, left)):
        if isinstance(seq, str | list | tuple) and isinstance(n, int) \
                and len(seq) * n > MAX_OUTPUT_CHARS:
            raise jinja2.TemplateError("a repetition too large for a chat template")
    return left * right


class _Limits:
    """A trace function that stops a rendering past its time budget or once ``cancel`` is set.

    Jinja compiles a template to Python; tracing its frames is the one way to interrupt a
    loop that writes nothing (the sandbox caps one range at 100,000, not nested ones)."""

    def __init__(self, seconds: float, cancel: Any) -> None:
        self.deadline = time.monotonic() + seconds
        self.cancel = cancel
        self.events = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        self.events += 1
        if self.events % 256 == 0:
            if self.cancel is not None and self.cancel.is_set():
                raise CancelledError("Rendering the chat template was cancelled.")
            if time.monotonic() > self.deadline:
                raise TemplateTimeout()
        return self


class ChatTemplate:
    """A compiled chat template and the special-token strings it may refer to."""

    def __init__(self, source: str, *, origin: str = "custom", bos_token: str | None = None,
                 eos_token: str | None = None, special_tokens: Mapping[str, str] | None = None,
                 fallback_reason: str | None = None) -> None:
        try:
            self._template = _compile(source)
        except jinja2.TemplateError as e:
            raise UnsupportedModelError(
                f"The chat template from {origin} does not compile: {_one_line(e)}.") from e
        self.source = source
        self.origin = origin  # "gguf" | "tokenizer_config.json" | "chatml" | "custom"
        self.fallback_reason = fallback_reason
        self.variables = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.variables["bos_token"] = bos_token or ""
        self.variables["eos_token"] = eos_token or ""

    @classmethod
    def chatml(cls, tokenizer: Any = None, fallback_reason: str | None = None) -> ChatTemplate:
        """The ChatML fallback template."""
        return cls(CHATML_PATH.read_text(encoding="utf-8"), origin="chatml",
                   fallback_reason=fallback_reason, **_token_strings(tokenizer))

    @classmethod
    def resolve(cls, *, gguf_metadata: Mapping[str, Any] | None = None,
                model_dir: str | Path | None = None, tokenizer: Any = None,
                strict: bool = False) -> ChatTemplate:
        """The model's template by the source order above, else ChatML."""
        found = _find_source(gguf_metadata, model_dir, tokenizer)
        if found is None:
            return cls.chatml(tokenizer)
        source, origin = found
        try:
            return cls(source, origin=origin, **_token_strings(tokenizer))
        except UnsupportedModelError as e:
            if strict:
                raise
            return cls.chatml(tokenizer, fallback_reason=f"{e} Using ChatML instead.")

    @classmethod
    def for_checkpoint(cls, ckpt: Any, tokenizer: Any = None, strict: bool = False
                       ) -> ChatTemplate:
        """The template of a loaded :class:`~inference.formats.tensor.Checkpoint`."""
        meta = dict(getattr(ckpt, "metadata", None) or {})
        if getattr(ckpt, "chat_template", None) and "tokenizer.chat_template" not in meta:
            meta["tokenizer.chat_template"] = ckpt.chat_template
        path = Path(ckpt.path)
        return cls.resolve(gguf_metadata=meta, tokenizer=tokenizer, strict=strict,
                           model_dir=path if path.is_dir() else None)

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
               **kwargs: Any) -> str:
        """The prompt text for ``messages`` (dicts with "role" and "content")."""
        return self._render_folding(_check_messages(messages), add_generation_prompt, None,
                                    kwargs)[0]

    def _render_folding(self, chat: list[dict[str, Any]], add_generation_prompt: bool,
                        cancel: Any, kwargs: Mapping[str, Any]
                        ) -> tuple[str, list[dict[str, Any]]]:
        """The rendering and the messages it used. A template that rejects a conversation
        opening with a system message (Gemma 2: "System role not supported") gets it folded
        into the first user message as Gemma 3's own template does, "system\n\nuser"."""
        try:
            return self._render(chat, add_generation_prompt, cancel, kwargs), chat
        except InvalidInputError as e:
            folded = _fold_system(chat)
            if folded is None or not isinstance(e.__cause__, TemplateRejected):
                raise
        try:
            return self._render(folded, add_generation_prompt, cancel, kwargs), folded
        except InvalidInputError as e2:
            raise e2 from None

    def render_segments(self, messages: Sequence[Mapping[str, Any]],
                        add_generation_prompt: bool = True, cancel: Any = None,
                        **kwargs: Any) -> list[tuple[str, bool]]:
        """The prompt as ``(text, is_content)`` pieces: message contents apart from the
        template's own markup, so a caller can tokenize content without special tokens.

        Each message's content is rendered between its own pair of private-use sentinels.
        A content the template passes through (or trims: each piece is matched against
        the plain rendering as is, stripped, or stripped on one side) is a content piece.
        A content the template cuts apart (Qwen 3 drops the reasoning before ``</think>``
        from earlier turns) cannot be located and stays in the markup around it. Joined,
        the pieces always equal :meth:`render`'s text.
        """
        # The sentinels are private-use characters; any in a content become U+FFFD.
        chat = [{**m, "content": m["content"].translate(_UNMARK)}
                if isinstance(m.get("content"), str) else m for m in _check_messages(messages)]
        plain, chat = self._render_folding(chat, add_generation_prompt, cancel, kwargs)
        marked = [{**m, "content": f"{_open(k)}{m['content']}{_close(k)}"}
                  if isinstance(m.get("content"), str) and k < _MAX_MARKED else m
                  for k, m in enumerate(chat)]
        text = self._render(marked, add_generation_prompt, cancel, kwargs)
        pieces = _align(_split_marked(text), plain)
        if pieces is None:
            raise UnsupportedModelError(
                f"The chat template from {self.origin} rewrites message contents in a way "
                f"that keeps them from being told apart from its own markup.")
        return pieces

    def _render(self, chat: list[dict[str, Any]], add_generation_prompt: bool, cancel: Any,
                kwargs: Mapping[str, Any]) -> str:
        limits = _Limits(RENDER_SECONDS, cancel)
        previous = sys.gettrace()
        sys.settrace(limits)
        try:
            out: list[str] = []
            size = 0
            for part in self._template.generate(messages=chat,
                                                add_generation_prompt=add_generation_prompt,
                                                **{**self.variables, **kwargs}):
                size += len(part)
                if size > MAX_OUTPUT_CHARS:
                    raise InvalidInputError(
                        f"The chat template from {self.origin} wrote more than "
                        f"{MAX_OUTPUT_CHARS // 2**20} M characters; the conversation is too "
                        f"long for it.")
                out.append(part)
            return "".join(out)
        except (InvalidInputError, CancelledError):
            raise
        except TemplateTimeout:
            raise UnsupportedModelError(
                f"The chat template from {self.origin} ran for more than {RENDER_SECONDS:g} s "
                f"and was stopped.") from None
        except TemplateRejected as e:
            raise InvalidInputError(f"The chat template rejected this conversation: {e}.") from e
        except Exception as e:  # a template is a program: any error of its own ends up here
            raise UnsupportedModelError(
                f"The chat template from {self.origin} failed to render: {_one_line(e)}.") from e
        finally:
            sys.settrace(previous)


# Message k's content is rendered between _open(k) and _close(k), characters of the
# supplementary private-use plane (any in a content become U+FFFD first).
_SENTINEL_BASE, _MAX_MARKED = 0xF0000, 0x7FFE
_UNMARK = {c: "\ufffd" for c in range(_SENTINEL_BASE, _SENTINEL_BASE + 2 * _MAX_MARKED)}


def _open(k: int) -> str:
    return chr(_SENTINEL_BASE + 2 * k)


def _close(k: int) -> str:
    return chr(_SENTINEL_BASE + 2 * k + 1)


def _is_sentinel(c: str) -> bool:
    return _SENTINEL_BASE <= ord(c) < _SENTINEL_BASE + 2 * _MAX_MARKED


def _split_marked(text: str) -> list[tuple[str, bool]]:
    """``text`` as markup and content pieces. A content counts only where its message's
    open and close sentinels each appear once, in order, with no other sentinel between;
    any other sentinel is dropped and the text around it is markup."""
    where: dict[int, list[int]] = {}
    for i, c in enumerate(text):
        if _is_sentinel(c):
            where.setdefault(ord(c), []).append(i)
    spans = []
    for code, at in where.items():
        if (code - _SENTINEL_BASE) % 2 == 0:
            ends = where.get(code + 1, [])
            if len(at) == 1 and len(ends) == 1 and at[0] < ends[0] and not any(
                    _is_sentinel(c) for c in text[at[0] + 1:ends[0]]):
                spans.append((at[0], ends[0]))
    def markup(part: str) -> tuple[str, bool]:
        return "".join(c for c in part if not _is_sentinel(c)), False

    pieces: list[tuple[str, bool]] = []
    pos = 0
    for a, b in sorted(spans):
        pieces += [markup(text[pos:a]), (text[a + 1:b], True)]
        pos = b + 1
    pieces.append(markup(text[pos:]))
    return pieces


def _align(pieces: list[tuple[str, bool]], plain: str) -> list[tuple[str, bool]] | None:
    """``pieces`` matched against the unmarked rendering ``plain``: a template that trims a
    content sees the sentinels, not the whitespace inside them, so each content is taken
    as is or stripped (both sides, left, right), whichever lets the text after it match.
    None if no choice reproduces ``plain``."""
    out: list[tuple[str, bool]] = []
    pos = 0
    for i, (piece, is_content) in enumerate(pieces):
        if not is_content:
            if not plain.startswith(piece, pos):
                return None
            out.append((piece, False))
            pos += len(piece)
            continue
        after = pieces[i + 1][0] if i + 1 < len(pieces) else ""
        for cand in dict.fromkeys((piece, piece.strip(), piece.lstrip(), piece.rstrip())):
            if plain.startswith(cand, pos) and plain.startswith(after, pos + len(cand)):
                out.append((cand, True))
                pos += len(cand)
                break
        else:
            return None
    if pos != len(plain):
        return None
    return [(p, c) for p, c in out if p]


def _fold_system(chat: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``chat`` with its opening system message joined to the user message after it, or
    None when it does not open that way."""
    if len(chat) < 2 or chat[0].get("role") != "system" or chat[1].get("role") != "user":
        return None
    system, user = chat[0].get("content"), chat[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str):
        return None
    joined = f"{system}\n\n{user}" if system.strip() else user
    return [{**chat[1], "content": joined}, *chat[2:]]


def _find_source(meta: Mapping[str, Any] | None, model_dir: str | Path | None,
                 tokenizer: Any) -> tuple[str, str] | None:
    if meta and isinstance(meta.get("tokenizer.chat_template"), str):
        return meta["tokenizer.chat_template"], "gguf"
    if model_dir is not None:
        d = Path(model_dir)
        jinja_file = d / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8"), "chat_template.jinja"
        cfg = d / "tokenizer_config.json"
        if cfg.is_file():
            try:
                value = json.loads(cfg.read_text(encoding="utf-8")).get("chat_template")
            except ValueError:
                value = None
            if isinstance(value, list):  # named templates: take "default"
                named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
                value = named.get("default")
            if isinstance(value, str):
                return value, "tokenizer_config.json"
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str):
        return own, "tokenizer"
    return None


def _token_strings(tokenizer: Any) -> dict[str, Any]:
    if tokenizer is None:
        return {}
    return {
        "bos_token": getattr(tokenizer, "bos_token", None),
        "eos_token": getattr(tokenizer, "eos_token", None),
        "special_tokens": {"unk_token": getattr(tokenizer, "unk_token", None),
                           "pad_token": getattr(tokenizer, "pad_token", None)},
    }


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidInputError("A conversation must be a list of messages.")
    chat = []
    for m in messages:
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise InvalidInputError('Every message needs a "role" and a "content".')
        chat.append(dict(m))
    return chat


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text.rstrip(".")
