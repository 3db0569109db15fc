"""Sampler: each filter against a hand-computed expectation on tiny distributions."""

import numpy as np
import pytest

from inference.sampling import SamplingParams, apply_repetition_penalty, filtered_probs, sample_row

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03]))


def probs(**kw):
    return filtered_probs(np, LOGITS.copy(), SamplingParams(temperature=1.0, **kw))


def test_no_filter_keeps_distribution():
    np.testing.assert_allclose(probs(), [0.5, 0.25, 0.15, 0.07, 0.03], atol=1e-12)


def test_top_k():
    np.testing.assert_allclose(probs(top_k=2), [2 / 3, 1 / 3, 0, 0, 0], atol=1e-12)


def test_top_p_keeps_token_that_crosses():
    # 0.5 < 0.6, 0.5+0.25 crosses 0.6: keep the first two.
    np.testing.assert_allclose(probs(top_p=0.6), [2 / 3, 1 / 3, 0, 0, 0], atol=1e-12)


def test_min_p():
    # threshold 0.25 * 0.5 = 0.125 keeps 0.5, 0.25, 0.15.
    np.testing.assert_allclose(probs(min_p=0.25), np.array([0.5, 0.25, 0.15, 0, 0]) / 0.9,
                               atol=1e-12)


def test_temperature_sharpens():
    p = filtered_probs(np, LOGITS.copy(), SamplingParams(temperature=0.5))
    expect = np.array([0.5, 0.25, 0.15, 0.07, 0.03]) ** 2
    np.testing.assert_allclose(p, expect / expect.sum(), atol=1e-12)


def test_repetition_penalty_signs():
    logits = np.array([2.0, -2.0, 1.0])
    out = apply_repetition_penalty(np, logits, np.array([0, 1, 0]), 2.0)  # 0 twice: once
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0])
    assert logits[0] == 2.0  # input untouched


def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    assert sample_row(np, LOGITS, SamplingParams(temperature=0), [], rng) == 0


def test_seed_reproducible_and_frequencies():
    p = SamplingParams(temperature=1.0, seed=3)
    draws = [sample_row(np, LOGITS, p, [], np.random.default_rng(i)) for i in range(4000)]
    freq = np.bincount(draws, minlength=5) / len(draws)
    np.testing.assert_allclose(freq, [0.5, 0.25, 0.15, 0.07, 0.03], atol=0.03)
    a = [sample_row(np, LOGITS, p, [], np.random.default_rng(7)) for _ in range(5)]
    assert len(set(a)) == 1


@pytest.mark.parametrize("k", [1, 3])
def test_top_k_never_samples_outside(k):
    p = SamplingParams(temperature=1.5, top_k=k)
    rng = np.random.default_rng(1)
    assert max(sample_row(np, LOGITS, p, [], rng) for _ in range(500)) < k
