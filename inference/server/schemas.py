"""Request bodies of the OpenAI API subset we serve (pydantic), checked as OpenAI checks
them: numbers are JSON numbers (``true`` is not 1, ``"5"`` is not 5), floats are finite,
strings are valid Unicode. A few fields of OpenAI's API are accepted and change nothing
here (who sent the request, storing and reporting on OpenAI's side: ``_Ignored``); any
field not declared is refused with a 400 naming it (those we cannot honour, such as
``tools`` or ``response_format``, and those OpenAI does not have). The OpenAPI document
says so (``additionalProperties: false``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from inference.errors import InvalidInputError

MAX_STOP = 4  # as OpenAI
SEED_MODULUS = 1 << 64  # a seed is taken modulo this (numpy's generators take 0 <= seed)
# Fields of OpenAI's API we do not implement, with what to do instead.
UNSUPPORTED = {
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
    "functions": "function calls are not supported",
    "function_call": "function calls are not supported",
    "response_format": "structured output is not supported",
    "logit_bias": "logit bias is not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "reasoning settings are not supported",
    "web_search_options": "web search is not supported",
    "verbosity": "verbosity settings are not supported",
}
Float = Annotated[float, Field(allow_inf_nan=False, strict=True)]
_ZERO = {"minimum": 0, "maximum": 0}  # a penalty: only 0 is served


def rng_seed(seed: int | None) -> int | None:
    """The sampler's seed for a request's ``seed``: None and -1 (llama.cpp's "random") give
    a fresh random seed; any other integer, negative or past 64 bits, is taken modulo
    2^64, so every integer a client sends is a valid seed and equal seeds sample alike."""
    return None if seed is None or seed == -1 else seed % SEED_MODULUS


def _bad_text(value: Any, where: str) -> str | None:
    """The path of the first string in ``value`` that is not valid Unicode (a lone UTF-16
    surrogate, which JSON's ``\\ud800`` escapes can carry), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        if isinstance(k, str) and _bad_text(k, where) is not None:
            return where or "body"
        bad = _bad_text(v, f"{where}.{k}" if where else str(k))
        if bad is not None:
            return bad
    return None


class _Body(BaseModel):
    # Undeclared fields are kept for check() to name them (a pydantic "extra" error would
    # not say why), and refused: the document says so.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False,
                              json_schema_extra={"additionalProperties": False})

    model: str
    user: str | None = None  # accepted, ignored: who sent it, for OpenAI's abuse checks

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        bad = _bad_text(data, "")
        if bad is not None:
            raise InvalidInputError(f"'{bad or 'body'}' is not valid Unicode text (it holds a lone "
                                    "surrogate); send UTF-8.")
        return data

    def check(self) -> None:
        """Refuse the fields sent that this endpoint does not take (a 400 naming them)."""
        extra = set(self.model_extra or ())
        if not extra:
            return
        known = sorted(f for f in extra if f in UNSUPPORTED)
        if known:
            raise InvalidInputError(f"'{known[0]}' is not supported: "
                                    f"{UNSUPPORTED[known[0]]}; remove it.")
        names = ", ".join(f"'{f}'" for f in sorted(extra)[:5])
        raise InvalidInputError(f"Unrecognized request argument(s): {names}.")


_TEXT = {"type": "string", "pattern": r"\S"}  # in the document: text with a non-space


def _document(*alternatives: dict[str, Any]) -> Any:
    """A field's schema in the OpenAPI document: what is served (``alternatives``), where
    validation takes more so that it can refuse the rest in a sentence of its own (token
    ids, images, a whitespace-only prompt)."""
    def edit(schema: dict[str, Any]) -> None:
        schema.pop("anyOf", None)
        schema.pop("type", None)
        schema["anyOf"] = list(alternatives)
    return edit


def _parts_document(schema: dict[str, Any]) -> None:
    """A message's content in the document: text, or a non-empty list of text parts."""
    parts = [{**alt, "minItems": 1} for alt in schema.pop("anyOf") if alt.get("type") == "array"]
    schema["anyOf"] = [_TEXT, *parts]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"required": ["type", "text"]})

    type: str = Field(json_schema_extra={"enum": ["text"]})  # others: a 400 saying so
    text: str | None = Field(None, json_schema_extra=_document(_TEXT))


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(None, json_schema_extra=_parts_document)

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text":
                raise InvalidInputError(
                    f"Message content of type '{part.type}' is not supported; send text.")
            if part.text is None:
                raise InvalidInputError("A content part of type 'text' needs its 'text'.")
        return "".join(p.text or "" for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool = False


class _Sampling(_Body):
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Float = Field(1.0, ge=0.0, le=2.0)
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    # What is served, in the document; other values get a 400 saying so (check()).
    n: StrictInt = Field(1, json_schema_extra={"minimum": 1, "maximum": 1})
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: Float = Field(0.0, ge=-2.0, le=2.0, json_schema_extra=_ZERO)
    presence_penalty: Float = Field(0.0, ge=-2.0, le=2.0, json_schema_extra=_ZERO)
    # Accepted and ignored: storing, reporting and billing on OpenAI's side.
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise InvalidInputError(f"'stop' takes at most {MAX_STOP} strings.")
        return [s for s in stops if s]

    def check(self) -> None:
        super().check()
        if self.n != 1:
            raise InvalidInputError("Only n=1 is supported.")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise InvalidInputError(f"'{name}' is not supported; leave it at 0.")


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)

    def check(self) -> None:
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidInputError("'top_logprobs' needs 'logprobs': true.")

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def turns(self) -> list[dict[str, str]]:
        # "developer" is the newer name of "system"; chat templates know only the latter.
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[StrictInt] = Field(json_schema_extra=_document(
        _TEXT, {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1}))
    logprobs: StrictInt | None = Field(None, ge=0, le=5)
    echo: StrictBool = Field(False, json_schema_extra={"enum": [False]})
    best_of: StrictInt | None = Field(None, json_schema_extra={"enum": [1, None]})
    suffix: str | None = Field(None, json_schema_extra={"enum": ["", None]})

    def text(self) -> str:
        p = self.prompt
        if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
            raise InvalidInputError("Token-id prompts are not supported; send text.")
        if isinstance(p, list):
            if len(p) != 1:
                raise InvalidInputError("Send one prompt per request.")
            p = p[0]
        return str(p)

    def check(self) -> None:
        super().check()
        if self.echo or self.suffix or (self.best_of or 1) != 1:
            raise InvalidInputError("'echo', 'suffix' and 'best_of' are not supported.")


class EmbeddingRequest(_Body):
    input: str | list[str] | list[StrictInt] | list[list[StrictInt]] = Field(
        json_schema_extra=_document({"type": "string"}, {
            "type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2048}))
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=1)

    def texts(self) -> list[str]:
        inp: Any = self.input
        if isinstance(inp, str):
            return [inp]
        if any(not isinstance(x, str) for x in inp):
            raise InvalidInputError("Token-id inputs are not supported; send strings.")
        if not inp:
            raise InvalidInputError("'input' is empty: send at least one string.")
        return list(inp)
