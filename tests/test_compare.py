"""inference.compare: two backends on one file, step by step.

References: transformers' logits and greedy tokens for the tiny Qwen 3 Q4_0 GGUF
(tests/goldens/tiny), and the NumPy backend. Bars are test_parity_tiny's: every engine
path is within ABS_TOL and REL_TOL * max |reference| of transformers (float32 summation
order only), so two backends are within twice that of each other; the argmax agrees at
every position and greedy continuations are identical.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference import load_model
from inference.compare import (
    CompareSummary,
    Generated,
    SideLoaded,
    StepRecord,
    compare,
    side_steps,
)
from inference.errors import BackendUnavailableError, CancelledError, InvalidInputError

TINY = Path(__file__).resolve().parent / "goldens" / "tiny"
MODEL = TINY / "qwen3_q4_0.gguf"
ABS_TOL, REL_TOL = 1e-3, 1e-4  # tests/test_parity_tiny.py's bars against transformers


def golden() -> dict[str, np.ndarray]:
    with np.load(TINY / "qwen3_q4_0.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def float_cpu_loader(monkeypatch: pytest.MonkeyPatch):
    """load_model with the cpu backend's float activations, whose logits are held to the
    float32 bars (the default int16 activations round each product's input to 1/32767 of
    its group's largest value: held to the top-1 and greedy bars instead)."""
    from inference.backends.cpu import ACTIVATIONS_ENV

    def load(source: Any, backend: str = "auto", **kw: Any) -> Any:
        if backend == "cpu":
            monkeypatch.setenv(ACTIVATIONS_ENV, "float")
        try:
            return load_model(source, backend=backend, **kw)
        finally:
            monkeypatch.delenv(ACTIVATIONS_ENV, raising=False)
    return load


def summary_of(events: list) -> CompareSummary:
    assert isinstance(events[-1], CompareSummary)
    return events[-1]


def assert_parity(s: CompareSummary) -> None:
    """Two backends within test_parity_tiny's bars of each other (each is within one bar of
    transformers, hence twice the bar), and the same top-1 token at every step."""
    assert s.max_abs_diff <= 2 * ABS_TOL, (s.max_abs_diff, s.worst_step)
    assert s.max_rel_diff <= 2 * REL_TOL, s.max_rel_diff
    assert s.agreement == 1.0, s.first_disagreement


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_steps_match_transformers(backend, monkeypatch):
    """Each teacher-forced step's row (prefill, then one decode step per token) against
    transformers' logits of the same position, and greedy steps against its continuation."""
    gold = golden()
    m = float_cpu_loader(monkeypatch)(str(MODEL), backend=backend)
    ids = gold["chat.ids"].tolist()
    ref = gold["chat.logits"]
    rows = [row for row, _t, _s in side_steps(m, ids[:1], len(ids) - 1, forced=ids[1:])]
    got = np.stack(rows)
    assert got.shape == ref[:-1].shape
    scale = float(np.abs(ref).max())
    assert float(np.abs(got - ref[:-1]).max()) <= min(ABS_TOL, REL_TOL * scale)
    want = gold["greedy.tokens"].tolist()
    greedy = [t for _r, t, _s in side_steps(m, gold["greedy.prompt"].tolist(), len(want))]
    assert greedy == want


def test_numpy_against_itself_is_exact():
    # Same code, same process, same inputs: NumPy and its BLAS give the same bits.
    events = list(compare(MODEL, "numpy", "numpy", "Hello there", 6))
    s = summary_of(events)
    assert s.steps == len([e for e in events if isinstance(e, StepRecord)]) >= 1
    assert s.max_abs_diff == 0.0 and s.agreement == 1.0 and s.first_disagreement is None
    assert [e.side for e in events if isinstance(e, SideLoaded)] == ["a", "b"]
    assert s.a.backend == s.b.backend == "numpy"
    assert len(s.a.step_s) == len(s.b.step_s) == s.steps
    assert s.a.load_bytes >= 0 and s.a.peak_bytes >= s.a.load_bytes
    assert s.a.warmup_s > 0 and s.b.warmup_s > 0
    gen = [e for e in events if isinstance(e, Generated)]
    assert [g.token_id for g in gen] == [r.token_id for r in s.records]
    assert s.prompt_kind == "chat template"


def test_numpy_against_cpu_is_within_the_parity_bars(monkeypatch):
    """Greedy on NumPy reproduces transformers' continuation; cpu (float activations),
    teacher-forced on it, is within the float32 bars of NumPy at every step."""
    gold = golden()
    want = gold["greedy.tokens"].tolist()
    s = summary_of(list(compare(MODEL, "numpy", "cpu", prompt_ids=gold["greedy.prompt"],
                                max_tokens=len(want), loader=float_cpu_loader(monkeypatch))))
    assert [r.token_id for r in s.records] == want
    assert s.finish == "length" and s.n_prompt == len(gold["greedy.prompt"])
    assert_parity(s)
    assert s.max_abs_diff > 0.0  # two implementations, not one run twice
    assert s.b.decode_tok_s > 0 and s.a.decode_tok_s > 0


def test_numpy_against_mlx_reports_device_memory():
    """MLX (on its CPU device where there is no Metal) within the float32 bars, and its
    device figures carried into the summary."""
    from inference.backends import probe

    if not probe("mlx").available:
        pytest.skip("mlx is unavailable")
    gold = golden()
    s = summary_of(list(compare(MODEL, "numpy", "mlx", prompt_ids=gold["greedy.prompt"],
                                max_tokens=8)))
    assert [r.token_id for r in s.records] == gold["greedy.tokens"].tolist()[:8]
    assert_parity(s)
    assert s.b.memory.device_used is not None and s.a.memory.device_used is None


@pytest.mark.long
def test_smollm2_numpy_against_cpu_meets_its_bars():
    """The bundled SmolLM2 Q4_1, 64 greedy steps: top-1 agreement of at least 99%
    (tests/test_parity.py's bar against transformers for this file)."""
    from tests import goldens_io as g

    s = summary_of(list(compare("SmolLM2-135M-Instruct.Q4_1", "numpy", "cpu",
                                "Write a short poem about the sea.", 64)))
    assert s.agreement >= g.SMOLLM2_MIN_TOP1_AGREEMENT, s.first_disagreement


def test_default_cpu_agrees_token_for_token():
    """The int16-activation cpu path: greedy identical (test_parity_tiny's bar for it),
    here without the warm-up run (whose steps the other tests show change nothing)."""
    gold = golden()
    want = gold["greedy.tokens"].tolist()
    s = summary_of(list(compare(MODEL, "cpu", "numpy", prompt_ids=gold["greedy.prompt"],
                                max_tokens=len(want), warmup=0)))
    assert [r.token_id for r in s.records] == want
    assert s.agreement == 1.0
    assert s.a.warmup_s == s.b.warmup_s == 0.0


class _Shifted:
    """A model whose logits are the real ones plus ``delta`` on one vocabulary entry."""

    def __init__(self, net: Any, delta: np.ndarray):
        self._net, self._delta = net, delta

    def __call__(self, *args: Any, **kw: Any) -> Any:
        return self._net(*args, **kw) + self._delta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._net, name)


def test_a_perturbed_backend_fails_the_bars():
    """+0.25 on one logit of B: every step reports exactly that difference (up to float32
    rounding of the sum), and the parity check that passes above fails."""
    delta = np.zeros(320, dtype=np.float32)
    delta[7] = 0.25

    def perturbed(source: Any, backend: str = "auto", **kw: Any) -> Any:
        m = load_model(source, backend="numpy", **kw)
        if backend == "shifted":
            m.model = _Shifted(m.model, delta)
        return m

    s = summary_of(list(compare(MODEL, "numpy", "shifted", "Hello there", 5,
                                loader=perturbed)))
    assert s.steps >= 1
    for r in s.records:
        assert abs(r.max_abs_diff - 0.25) <= 1e-6 * max(r.scale, 1.0)
    with pytest.raises(AssertionError):
        assert_parity(s)

    delta[7] = 100.0  # now B's top-1 is always token 7
    s = summary_of(list(compare(MODEL, "numpy", "shifted", "Hello there", 3,
                                loader=perturbed)))
    flipped = [r for r in s.records if r.token_id != 7]
    assert flipped and all(r.b_token_id == 7 and not r.agree for r in flipped)
    assert s.agreement == 1 - len(flipped) / s.steps
    assert s.first_disagreement == flipped[0].index
    text = load_model(str(MODEL), backend="numpy").tokenizer.decode([7])
    assert all(r.b_text == text for r in flipped)


def test_bad_input_is_one_sentence_before_any_load():
    calls: list[str] = []

    def loader(*a: Any, **kw: Any) -> Any:
        calls.append(kw["backend"])
        return load_model(*a, **kw)

    with pytest.raises(InvalidInputError, match="empty"):
        list(compare(MODEL, "numpy", "numpy", "   ", 4, loader=loader))
    with pytest.raises(InvalidInputError, match="max_tokens"):
        list(compare(MODEL, "numpy", "numpy", "hi", 0, loader=loader))
    assert calls == []
    with pytest.raises(BackendUnavailableError, match="Unknown backend"):
        list(compare(MODEL, "numpy", "nope", "hi", 2))
    encoder = TINY.parent / "embedders"
    enc = next(p for p in sorted(encoder.iterdir()) if p.is_dir())
    with pytest.raises(InvalidInputError, match="chat model"):
        list(compare(enc, "numpy", "numpy", "hi", 2))


def test_cancel_stops_between_steps():
    cancel = threading.Event()
    seen = []
    with pytest.raises(CancelledError):
        for ev in compare(MODEL, "numpy", "numpy", "Hello there", 50, cancel=cancel):
            seen.append(ev)
            if isinstance(ev, Generated) and ev.index == 1:
                cancel.set()
    assert not any(isinstance(e, StepRecord) for e in seen)
