"""What generate/embed stream to their consumers (CLI, GUI worker, scripts)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class MemorySample:
    """Same shape on every backend; bytes, ``None`` where the backend cannot know."""

    device_used: int | None
    device_total: int | None
    device_peak: int | None
    host_rss: int


@dataclass
class TokenEvent:
    """One decoded piece of text. ``text`` may be empty while a UTF-8 char is incomplete
    or a possible stop string is held back; a last event with ``token_id == -1`` releases
    such held-back text when generation ends without it."""

    text: str
    token_id: int
    index: int  # 0-based index among generated tokens
    elapsed_s: float  # since generate() was called
    ttft_s: float  # time to first token (prefill included)
    prefill_tok_s: float
    decode_tok_s: float  # over decode steps so far (0.0 until the second token)


@dataclass
class DoneEvent:
    """Last event of a generation."""

    text: str  # the whole generated text (stop string removed)
    token_ids: list[int]
    n_prompt: int
    n_generated: int
    finish_reason: str  # "eos" | "stop" | "length" | "cancelled"
    ttft_s: float
    prefill_tok_s: float
    decode_tok_s: float
    total_s: float
    memory: MemorySample | None = None
    op_times_s: dict[str, float] = field(default_factory=dict)  # filled when profiling
    n_cached: int = 0  # prompt tokens whose K/V came from the previous turn (not prefilled)
    # (threads computing at the end, the most it may use) where the backend says (cpu:
    # fewer while other processes keep cores busy), else None
    threads: tuple[int, int] | None = None


GenerationEvent = TokenEvent | DoneEvent
