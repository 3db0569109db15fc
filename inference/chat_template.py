"""Chat templates: turn a list of messages into the prompt text a chat model was trained on.

Templates are Jinja2 programs shipped inside model files, so they are untrusted code: they run
in Jinja's immutable sandbox, with the environment transformers gives them (trim_blocks,
lstrip_blocks, loop controls, ``raise_exception``, ``strftime_now``, a non-escaping ``tojson``),
so a template renders here exactly as ``apply_chat_template`` renders it.

Where the template comes from, first found wins:
1. the GGUF key ``tokenizer.chat_template``;
2. ``chat_template`` in tokenizer_config.json (or a chat_template.jinja beside it);
3. the model family's known template, by architecture (and, for the "llama" architecture
   many families share, by the turn tokens in its vocabulary): Gemma, Llama 3, Llama 2,
   Mistral, Phi-3, Qwen (ChatML), resources/chat_templates/<family>.jinja;
4. ChatML, resources/chat_templates/chatml.jinja.

A file's own template that is not valid UTF-8 or does not compile is passed over for the
next source, and :attr:`ChatTemplate.fallback_reason` says why in one sentence;
:attr:`ChatTemplate.template_source` always says which template is used and why ("the file's
own", "Gemma's, by architecture: the file has none"); ``strict=True`` raises
UnsupportedModelError instead. A template that fails while rendering raises
InvalidInputError when the template itself rejects the conversation (``raise_exception``,
e.g. roles that do not alternate) and UnsupportedModelError for any other failure.

Bounds: every width a template can ask for (``center``, ``indent``, ``format``, ``%``,
``str.format`` specs, ``ljust``...) is at most :data:`MAX_WIDTH`, and every string or list it
builds by repeating, joining, concatenating or replacing is at most :data:`MAX_OUTPUT_CHARS`
long. The checks sit in the filters and operators themselves, so they hold when Jinja folds
constant expressions while compiling, too.

A template that rejects a conversation only because it opens with a system message (Gemma 2
has no system role) renders it with the system text folded into the first user message,
``system + "\n\n" + user``, the way Gemma 3's own template folds it; transformers would raise.

The rendered text already holds every special token the model wants (BOS included, if the
template writes it), so encode it with ``add_special_tokens=False``.
"""

from __future__ import annotations

import json
import re
import string
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import filters as jinja_filters
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum

from inference.errors import CancelledError, InvalidInputError, UnsupportedModelError

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "resources" / "chat_templates"
CHATML_PATH = TEMPLATES_DIR / "chatml.jinja"

# Bounds on one rendering: a template is untrusted code, and a prompt is small.
RENDER_SECONDS = 5.0
MAX_OUTPUT_CHARS = 16 * 2**20  # the rendering, and any one string or list a template builds
MAX_WIDTH = 10_000  # any width or precision a template asks for
MAX_INT_BITS = 4096  # any integer a template multiplies into being


class TemplateRejected(jinja2.TemplateError):
    """Raised by a template's own ``raise_exception``: the conversation is not acceptable."""


class TemplateTimeout(Exception):
    """A rendering ran past :data:`RENDER_SECONDS`."""


def _raise_exception(message: str) -> None:
    raise TemplateRejected(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes, which would change the prompt text.
    _check_width(indent, "tojson indent")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    return _BoundedSandbox(trim_blocks=True, lstrip_blocks=True,
                           extensions=["jinja2.ext.loopcontrols"]).from_string(source)


class TemplateTooLarge(jinja2.TemplateError):
    """A template asked for a width, a string or a number past the bounds above."""


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int) and abs(width) > MAX_WIDTH:
        raise TemplateTooLarge(f"{what} asks for a width of {width:,}; a chat template may "
                               f"use at most {MAX_WIDTH:,}")


def _check_size(n: int, what: str) -> None:
    if n > MAX_OUTPUT_CHARS:
        raise TemplateTooLarge(f"{what} of {n:,} characters is more than a chat template may "
                               f"build ({MAX_OUTPUT_CHARS:,})")


def _text_len(x: Any) -> int:
    return len(x) if isinstance(x, str) else len(str(x))


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _check_percent(fmt: str, args: Any) -> None:
    """``fmt % args`` within bounds: widths and precisions, and the size of what it writes."""
    values = list(args.values()) if isinstance(args, Mapping) else \
        list(args) if isinstance(args, tuple) else [args]
    specs = _PERCENT_SPEC.findall(fmt)
    for width, precision in specs:
        for n in (width, precision):
            _check_width(int(n) if n.isdigit() else None, "%-format")
    if any("*" in (w, p) for w, p in specs):
        for v in values:
            _check_width(v, "%-format")
    longest = max((_text_len(v) for v in values), default=0)
    _check_size(len(fmt) + len(specs) * longest, "a %-format")


def _check_format(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """``fmt.format(*args, **kwargs)`` within bounds (a spec computed from a field refused)."""
    fields = 0
    for _, name, spec, _ in string.Formatter().parse(fmt):
        if name is None:
            continue
        fields += 1
        if spec and "{" in spec:
            raise TemplateTooLarge("a format width computed from a field is not allowed in "
                                   "a chat template")
        for n in re.findall(r"\d+", spec or ""):
            _check_width(int(n), "format")
    longest = max((_text_len(v) for v in (*args, *kwargs.values())), default=0)
    _check_size(len(fmt) + fields * (longest + MAX_WIDTH), "a formatted string")


def _check_replace(s: str, old: str, new: str, count: int | None) -> None:
    if len(new) > len(old):
        n = s.count(old) if old else len(s) + 1
        if count is not None and count >= 0:
            n = min(n, count)
        _check_size(len(s) + n * (len(new) - len(old)), "a replaced string")


def _check_join(sep: Any, items: list[Any]) -> None:
    _check_size(_text_len(sep) * max(0, len(items) - 1) + sum(_text_len(x) for x in items),
                "a joined string")


def _bounded_str_method(obj: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """``obj.<name>`` with its arguments checked first (a str method that can grow)."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if name in ("center", "ljust", "rjust", "zfill") and args:
            _check_width(args[0], name)
        elif name == "expandtabs":
            size = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(size, int):
                _check_size(len(obj) + obj.count("\t") * size, "an expanded string")
        elif name == "join" and args:
            items = list(args[0])
            _check_join(obj, items)
            args = (items,)
        elif name == "replace" and len(args) >= 2:
            _check_replace(obj, str(args[0]), str(args[1]),
                           args[2] if len(args) > 2 else kwargs.get("count"))
        elif name in ("format", "format_map"):
            mapping = args[0] if name == "format_map" and args else kwargs
            _check_format(obj, args if name == "format" else (), mapping)
        return method(*args, **kwargs)

    return call


_GROWING_STR_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "join",
                                  "replace", "format", "format_map"})


def _center(value: Any, width: int = 80) -> str:
    _check_width(width, "center")
    return jinja_filters.do_center(value, width)


def _indent(s: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    _check_width(len(width) if isinstance(width, str) else width, "indent")
    text = str(s)
    unit = len(width) if isinstance(width, str) else int(width)
    _check_size(len(text) + (text.count("\n") + 1) * unit, "an indented string")
    return jinja_filters.do_indent(s, width, first, blank)


def _format(value: str, *args: Any, **kwargs: Any) -> str:
    _check_percent(str(value), kwargs or args)
    return jinja_filters.do_format(value, *args, **kwargs)


@jinja2.pass_eval_context
def _join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> str:
    items = list(value)
    if attribute is None:
        _check_join(d, items)
    return jinja_filters.do_join(eval_ctx, items, d, attribute)


@jinja2.pass_eval_context
def _replace(eval_ctx: Any, s: str, old: str, new: str, count: int | None = None) -> str:
    _check_replace(str(s), str(old), str(new), count)
    return jinja_filters.do_replace(eval_ctx, s, old, new, count)


def _batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
    if fill_with is not None and isinstance(linecount, int):
        _check_size(linecount, "a padded batch")  # the last batch is padded to this length
    return jinja_filters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None) -> Any:
    _check_width(slices, "slice")
    return jinja_filters.sync_do_slice(value, slices, fill_with)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    _check_width(n * max, "lipsum")
    return generate_lorem_ipsum(n, html, min, max)


class _BoundedCodeGenerator(CodeGenerator):
    """Jinja's code generator with ``~`` joined through :meth:`_BoundedSandbox.concat_bounded`
    (a loop that doubles a string with ``~`` stops at the bound, not at memory's end)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.concat_bounded((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every widening filter, operator and str method bounded."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.filters.update(tojson=_tojson, center=_center, indent=_indent, format=_format,
                            join=_join, replace=_replace, batch=_batch, slice=_slice)
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                            lipsum=_lipsum)

    def concat_bounded(self, parts: tuple[Any, ...]) -> str:
        texts = [str(p) for p in parts]
        _check_size(sum(len(t) for t in texts), "a joined string")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*``, ``**``, ``%`` and ``+`` with results of bounded size."""
        if operator == "**":
            if isinstance(left, int | float) and isinstance(right, int | float) \
                    and abs(right) > 64 and abs(left) > 1:
                raise TemplateTooLarge("a power too large for a chat template")
            return left ** right
        if operator == "%":
            if isinstance(left, str):
                _check_percent(left, right)
            return left % right
        if operator == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                _check_size(len(left) + len(right), "a concatenation")
            return left + right
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(n, int) \
                    and len(seq) * n > MAX_OUTPUT_CHARS:
                raise TemplateTooLarge("a repetition too large for a chat template")
        if isinstance(left, int) and isinstance(right, int) \
                and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateTooLarge("a product too large for a chat template")
        return left * right

    def getattr(self, obj: Any, attribute: str) -> Any:
        return self._bounded(obj, attribute, super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        return self._bounded(obj, argument, value) if isinstance(argument, str) else value

    @staticmethod
    def _bounded(obj: Any, name: str, value: Any) -> Any:
        if isinstance(obj, str) and name in _GROWING_STR_METHODS and callable(value):
            return _bounded_str_method(obj, name, value)
        return value


class _Limits:
    """A trace function that stops a rendering past its time budget or once ``cancel`` is set.

    Jinja compiles a template to Python; tracing its frames is the one way to interrupt a
    loop that writes nothing (the sandbox caps one range at 100,000, not nested ones). Every
    call (a generator resumed included) is seen; line by line only the template's own
    frames, where its loops run: tracing the lines of Jinja's runtime too made a rendering
    several times slower."""

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
        return self if frame.f_code.co_filename == "<template>" else None


class ChatTemplate:
    """A compiled chat template and the special-token strings it may refer to.

    ``template_source``: which template this is and why, for the model card ("the file's
    own", "Gemma's, by architecture: the file has none", "ChatML: ..."). ``fallback_reason``:
    one sentence saying why the file's own template is not used, or None."""

    def __init__(self, source: str, *, origin: str = "custom", bos_token: str | None = None,
                 eos_token: str | None = None, special_tokens: Mapping[str, str] | None = None,
                 fallback_reason: str | None = None, template_source: str | None = None
                 ) -> None:
        try:
            self._template = _compile(source)
        except jinja2.TemplateError as e:
            raise UnsupportedModelError(
                f"The chat template from {origin} does not compile: {_one_line(e)}.") from e
        self.source = source
        self.origin = origin  # "gguf" | "tokenizer_config.json" | a family | "chatml" | ...
        self.fallback_reason = fallback_reason
        self.template_source = template_source or (
            "the file's own" if origin in _FILE_ORIGINS else f"given ({origin})")
        self.variables = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.variables["bos_token"] = bos_token or ""
        self.variables["eos_token"] = eos_token or ""

    @classmethod
    def chatml(cls, tokenizer: Any = None, fallback_reason: str | None = None,
               template_source: str = "ChatML") -> ChatTemplate:
        """The ChatML fallback template."""
        return cls(CHATML_PATH.read_text(encoding="utf-8"), origin="chatml",
                   fallback_reason=fallback_reason, template_source=template_source,
                   **_token_strings(tokenizer))

    @classmethod
    def resolve(cls, *, gguf_metadata: Mapping[str, Any] | None = None,
                model_dir: str | Path | None = None, tokenizer: Any = None,
                strict: bool = False, model_type: str | None = None) -> ChatTemplate:
        """The model's template by the source order above: the file's own, else its
        family's (by ``model_type`` and the tokenizer's vocabulary), else ChatML."""
        tokens = _token_strings(tokenizer)
        found = _find_source(gguf_metadata, model_dir, tokenizer)
        why, reason = "the file has none", None
        if found is not None:
            source, origin = found
            try:
                if not _is_utf8(source):
                    raise UnsupportedModelError(
                        f"The chat template from {origin} is not valid UTF-8.")
                return cls(source, origin=origin, **tokens)
            except UnsupportedModelError as e:
                if strict:
                    raise
                reason = str(e)
                why = f"the file's own {_why_not(reason)}"
        family, basis = template_family(model_type, tokenizer)
        if family is None:
            arch = f"architecture {model_type!r}" if model_type else "its architecture"
            return cls.chatml(tokenizer, fallback_reason=None if reason is None
                              else f"{reason} Using ChatML instead.",
                              template_source=f"ChatML: {why}, and {arch} has no known "
                                              f"template")
        name, file = FAMILIES[family]
        used = "Qwen's template (ChatML)" if family == "qwen" else f"{name}'s template"
        return cls((TEMPLATES_DIR / file).read_text(encoding="utf-8"), origin=family,
                   fallback_reason=None if reason is None else f"{reason} Using {used}.",
                   template_source=f"{name}'s, by {basis}: {why}", **tokens)

    @classmethod
    def for_checkpoint(cls, ckpt: Any, tokenizer: Any = None, strict: bool = False
                       ) -> ChatTemplate:
        """The template of a loaded :class:`~inference.formats.tensor.Checkpoint`."""
        meta = dict(getattr(ckpt, "metadata", None) or {})
        if getattr(ckpt, "chat_template", None) and "tokenizer.chat_template" not in meta:
            meta["tokenizer.chat_template"] = ckpt.chat_template
        path = Path(ckpt.path)
        config = getattr(ckpt, "config", None) or {}
        return cls.resolve(gguf_metadata=meta, tokenizer=tokenizer, strict=strict,
                           model_dir=path if path.is_dir() else None,
                           model_type=config.get("model_type"))

    @classmethod
    def source_of(cls, ckpt: Any) -> str:
        """:attr:`template_source` for a checkpoint read from its headers only (the model
        picker's card, before any load): the family check reads the GGUF token list or the
        tokenizer.json text instead of building a tokenizer."""
        return cls.for_checkpoint(ckpt, _VocabularyProbe(ckpt)).template_source

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


_FILE_ORIGINS = frozenset({"gguf", "tokenizer_config.json", "chat_template.jinja", "tokenizer"})

# Family -> (name, template file under resources/chat_templates).
FAMILIES: dict[str, tuple[str, str]] = {
    "gemma": ("Gemma", "gemma.jinja"),
    "llama3": ("Llama 3", "llama3.jinja"),
    "llama2": ("Llama 2", "llama2.jinja"),
    "mistral": ("Mistral", "mistral.jinja"),
    "phi3": ("Phi-3", "phi3.jinja"),
    "qwen": ("Qwen", "chatml.jinja"),
    "chatml": ("ChatML", "chatml.jinja"),
}
_BY_MODEL_TYPE = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3_text": "gemma",
                  "qwen2": "qwen", "qwen3": "qwen", "phi3": "phi3", "mistral": "mistral"}
# The "llama" architecture is shared by many families; their turn tokens tell them apart.
_BY_TOKEN = (("<|start_header_id|>", "llama3"), ("<start_of_turn>", "gemma"),
             ("<|im_start|>", "chatml"), ("<|assistant|>", "phi3"), ("[INST]", "mistral"))


def template_family(model_type: str | None, tokenizer: Any = None
                    ) -> tuple[str | None, str]:
    """``(family, basis)``: the key in :data:`FAMILIES` of a model's known template (None:
    none known) and what told it ("architecture", or "vocabulary" for the families that
    share the "llama" architecture: their turn tokens; plain Llama 2 without any)."""
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type], "architecture"
    if model_type != "llama":
        return None, "architecture"
    to_id = getattr(tokenizer, "token_to_id", None)
    for token, family in _BY_TOKEN if to_id is not None else ():
        if to_id(token) is not None:
            return family, "vocabulary"
    return "llama2", "architecture"


class _VocabularyProbe:
    """``token_to_id`` enough for :func:`template_family`: whether a turn token is in the
    vocabulary (the GGUF token list, or the tokenizer.json text), read on first use."""

    def __init__(self, ckpt: Any) -> None:
        self._ckpt = ckpt
        self._tokens: set[str] | str | None = None

    def token_to_id(self, token: str) -> int | None:
        if self._tokens is None:
            listed = (getattr(self._ckpt, "metadata", None) or {}).get("tokenizer.ggml.tokens")
            if listed is not None:
                self._tokens = {t for t, _ in _BY_TOKEN} & {str(t) for t in listed}
            else:
                path = Path(self._ckpt.path) / "tokenizer.json"
                try:
                    self._tokens = path.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    self._tokens = ""
        found = token in self._tokens if isinstance(self._tokens, set) \
            else json.dumps(token) in self._tokens
        return 0 if found else None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8, kept as surrogate escapes
        return False
    return True


def _why_not(sentence: str) -> str:
    """"The chat template from gguf does not compile: x." -> "does not compile: x"."""
    for verb in (" does not compile", " is not valid UTF-8"):
        if verb in sentence:
            return sentence[sentence.index(verb) + 1:].rstrip(".")
    return "was refused"


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
