"""Next-token sampling over one logits row, written against an array namespace.

``xp`` is numpy or cupy (same API), so the CPU and CUDA backends share this code and only
the chosen id leaves the device. Order of filters follows llama.cpp / transformers:
repetition penalty, temperature, top-k, top-p, min-p.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.errors import InvalidInputError


@dataclass
class SamplingParams:
    temperature: float = 0.7
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    repetition_window: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _number(name: str, v: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) \
            or v < lo or v > hi or (lo_open and v == lo):
        low = f"above {lo:g}" if lo_open else f"at least {lo:g}"
        high = "" if math.isinf(hi) else f" and at most {hi:g}"
        raise InvalidInputError(f"{name} is {v!r}; it must be a number {low}{high}.")
    return float(v)


def _integer(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < lo:
        raise InvalidInputError(f"{name} is {v!r}; it must be a whole number of at least {lo}.")
    return int(v)


def check_params(p: Any) -> SamplingParams:
    """``p`` with every field checked (NaN, negative, out of range -> one sentence).
    A seed of -1 means "no fixed seed", as in llama.cpp."""
    if not isinstance(p, SamplingParams):
        raise InvalidInputError(f"sampling must be a SamplingParams, not {type(p).__name__}.")
    if p.seed is not None and (isinstance(p.seed, bool) or not isinstance(p.seed, numbers.Integral)
                               or p.seed < -1):
        raise InvalidInputError(f"seed is {p.seed!r}; it must be a whole number of at least 0 "
                                f"(or -1 for a random seed).")
    return dataclasses.replace(
        p,
        temperature=_number("temperature", p.temperature, 0.0, math.inf),
        top_k=_integer("top_k", p.top_k, 0),
        top_p=_number("top_p", p.top_p, 0.0, 1.0, lo_open=True),
        min_p=_number("min_p", p.min_p, 0.0, 1.0),
        repetition_penalty=_number("repetition_penalty", p.repetition_penalty, 0.0, math.inf,
                                   lo_open=True),
        repetition_window=_integer("repetition_window", p.repetition_window, 0),
        seed=None if p.seed is None or p.seed == -1 else int(p.seed),
    )


def apply_repetition_penalty(xp: Any, logits: Any, recent: Any, penalty: float) -> Any:
    """CTRL-style penalty: divide positive logits, multiply negative ones, of the ids in
    ``recent`` (a device array; a repeated id writes the same value twice, so no unique(),
    which would sync a GPU)."""
    if penalty == 1.0 or recent is None or not len(recent):
        return logits
    vals = logits[recent]
    logits = logits.copy()
    logits[recent] = xp.where(vals > 0, vals / penalty, vals * penalty)
    return logits


MIN_TEMPERATURE = 1e-30  # float32 logits over it stay finite in float64 (|z| < 4e68)


def filtered_probs(xp: Any, logits: Any, p: SamplingParams) -> Any:
    """Probabilities after temperature, top-k, top-p and min-p (float64 for stable sums).

    Dropped entries become zeros rather than being selected with a boolean mask: on CuPy a
    masked selection copies its count to the host, a sync inside the token loop.
    """
    # Floored: logits over a tiny temperature overflow to inf, and inf - inf is NaN.
    z = logits.astype(xp.float64) / max(p.temperature, MIN_TEMPERATURE)
    probs = xp.exp(z - z.max())
    probs /= probs.sum()
    order = xp.argsort(-probs)
    sorted_p = probs[order]
    keep = xp.ones(sorted_p.shape[0], dtype=bool)
    if p.top_k > 0:
        keep[p.top_k:] = False
    if p.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it included).
        keep &= (xp.cumsum(sorted_p) - sorted_p) < p.top_p
    if p.min_p > 0.0:
        keep &= sorted_p >= p.min_p * sorted_p[0]
    keep[0] = True
    out = xp.zeros_like(probs)
    out[order] = xp.where(keep, sorted_p, 0.0)
    return out / out.sum()


def sample_on_device(xp: Any, row: Any, p: SamplingParams, recent: Any, u: float,
                     argmax: Any = None) -> Any:
    """The next id as a 0-d device array, -1 if the row holds NaN or Inf; nothing is read
    back, so a GPU namespace (CuPy) copies only the id the caller reads. ``recent``: the
    window of previous ids as a device array (None: no penalty); ``u``: one host uniform
    for the inverse-CDF draw; ``argmax``: the backend's own kernel, if it has one."""
    finite = xp.isfinite(row).all()
    row = apply_repetition_penalty(xp, row, recent, p.repetition_penalty)
    if p.greedy:
        idx = (argmax or xp.argmax)(row)
    else:
        probs = filtered_probs(xp, row, p)
        idx = xp.minimum(xp.searchsorted(xp.cumsum(probs), u * probs.sum(), side="right"),
                         probs.shape[0] - 1)
    return xp.where(finite, idx, -1)


def sample_row(xp: Any, logits: Any, p: SamplingParams, history: list[int],
               rng: np.random.Generator) -> int:
    """The next id, or -1 if the row holds NaN or Inf (the caller reports it)."""
    recent = xp.asarray(history[-p.repetition_window:], dtype=xp.int64) if history else None
    u = 0.0 if p.greedy else rng.random()
    return int(sample_on_device(xp, logits, p, recent, u))
