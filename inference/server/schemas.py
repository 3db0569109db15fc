"""Request bodies of the OpenAI API subset we serve (pydantic). Fields a client may send
but we ignore are allowed; fields we cannot honour are refused by :func:`refuse_unsupported`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from inference.errors import InvalidInputError

MAX_STOP = 4  # as OpenAI


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise InvalidInputError(
                    f"Message content of type '{part.type}' is not supported; send text.")
        return "".join(p.text or "" for p in self.content)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class _Sampling(_Body):
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise InvalidInputError(f"'stop' takes at most {MAX_STOP} strings.")
        return [s for s in stops if s]

    def check(self) -> None:
        if self.n != 1:
            raise InvalidInputError("Only n=1 is supported.")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise InvalidInputError(f"'{name}' is not supported; leave it at 0.")


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def turns(self) -> list[dict[str, str]]:
        # "developer" is the newer name of "system"; chat templates know only the latter.
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

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
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)

    def texts(self) -> list[str]:
        inp: Any = self.input
        if isinstance(inp, str):
            return [inp]
        if any(not isinstance(x, str) for x in inp):
            raise InvalidInputError("Token-id inputs are not supported; send strings.")
        if not inp:
            raise InvalidInputError("'input' is empty: send at least one string.")
        return list(inp)
