"""NumPy reference backend ops against naive, independent formulations."""

import math

import numpy as np

from inference.backends.numpy_backend import NumpyBackend
from inference.embed import BatchLimits, fixed_batches, l2_normalize, mean_pool, plan_batches
from inference.kv_cache import KVCache

B = NumpyBackend()
rng = np.random.default_rng(0)


def naive_attention(q, k, v, scale, offset=None):
    b, hq, t, d = q.shape
    hk, s = k.shape[1], k.shape[2]
    out = np.zeros_like(q)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hk)
            for i in range(t):
                sc = np.array([q[bi, h, i] @ k[bi, kh, j] * scale for j in range(s)])
                if offset is not None:
                    sc[np.arange(s) > offset + i] = -np.inf
                p = np.exp(sc - sc.max())
                out[bi, h, i] = (p / p.sum()) @ v[bi, kh]
    return out


def test_attention_gqa_causal_matches_naive():
    q = rng.standard_normal((2, 6, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 9, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 9, 8)).astype(np.float32)
    got = B.attention(q, k, v, 0.3, causal_offset=4)
    np.testing.assert_allclose(got, naive_attention(q, k, v, 0.3, offset=4), atol=1e-5)


def test_attention_key_mask_ignores_padding():
    q = rng.standard_normal((1, 2, 3, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0]], dtype=np.float32)
    got = B.attention(q, k, v, 0.5, key_mask=mask)
    want = naive_attention(q, k[:, :, :3], v[:, :, :3], 0.5)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_rope_neox_rotates_half_split_pairs():
    x = rng.standard_normal((1, 1, 3, 8)).astype(np.float32)
    got = B.rope(x, offset=5, theta=10000.0)
    for t in range(3):
        for i in range(4):
            ang = (5 + t) / 10000.0 ** (2 * i / 8)
            a, b = x[0, 0, t, i], x[0, 0, t, i + 4]
            assert math.isclose(got[0, 0, t, i], a * math.cos(ang) - b * math.sin(ang),
                                abs_tol=1e-5)
            assert math.isclose(got[0, 0, t, i + 4], b * math.cos(ang) + a * math.sin(ang),
                                abs_tol=1e-5)


def test_rope_traditional_is_neox_after_permutation():
    x = rng.standard_normal((1, 2, 4, 8)).astype(np.float32)
    perm = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # adjacent pairs -> half-split
    trad = B.rope(x, 3, 500.0, traditional=True)
    neox = B.rope(x[..., perm], 3, 500.0)
    np.testing.assert_allclose(trad[..., perm], neox, atol=1e-6)


def test_norms_and_activations():
    x = rng.standard_normal((3, 7)).astype(np.float32)
    w, b = rng.standard_normal(7).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    np.testing.assert_allclose(B.rms_norm(x, w, 1e-6),
                               x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * w, rtol=1e-5)
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(B.layer_norm(x, w, b, 1e-5), ln, rtol=1e-4, atol=1e-5)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(B.gelu(x), 0.5 * x * (1 + erf(x / math.sqrt(2))), atol=1e-6)
    np.testing.assert_allclose(B.silu_mul(x, w), x / (1 + np.exp(-x)) * w, rtol=1e-6)
    xd = x.astype(np.float64)  # PyTorch's gelu(approximate="tanh"), in float64
    ref = 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3))) * w
    np.testing.assert_allclose(B.gelu_tanh_mul(x, w), ref, rtol=1e-5, atol=1e-6)


def test_kv_cache_grows_and_keeps_history():
    cache = KVCache(B, n_layers=1)
    cache.step = 4
    seen = []
    for t in (3, 1, 1, 2):
        k = rng.standard_normal((1, 2, t, 4)).astype(np.float32)
        seen.append(k)
        kk, vv = cache.update(0, k, k)
        cache.advance(t)
        np.testing.assert_array_equal(kk, np.concatenate(seen, axis=2))
    assert cache.offset == 7 and cache.keys[0].shape[2] == 8


def test_plan_batches_covers_each_input_once_within_limits():
    lengths = list(rng.integers(1, 300, size=1000))
    limits = BatchLimits(max_batch=32, max_tokens=4096)
    chunks = plan_batches(lengths, limits)
    assert sorted(i for c in chunks for i in c) == list(range(1000))
    for c in chunks:
        assert len(c) <= 32
        assert len(c) == 1 or len(c) * max(lengths[i] for i in c) <= 4096
        assert min(lengths[i] for i in c) >= 0.9 * max(lengths[i] for i in c)  # min_fill


def test_plan_batches_respects_memory_budget_and_backend_caps():
    from inference.embed import encoder_call_bytes

    lengths = [256] * 300 + [3] * 5000  # MiniLM-sized: long inputs price by attention
    def cost(n, L):
        return encoder_call_bytes(384, 1536, 12, n, L)

    limits = BatchLimits(max_batch=128, max_tokens=10**9, memory_budget=64 * 2**20)
    chunks = plan_batches(lengths, limits, cost)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    for c in chunks:
        width = max(lengths[i] for i in c)
        assert len(c) <= 128 and (len(c) == 1 or cost(len(c), width) <= 64 * 2**20)
    long_chunks = [c for c in chunks if lengths[c[0]] == 256]
    assert max(len(c) for c in long_chunks) < 32 < max(len(c) for c in chunks)


def test_pooling_ignores_padding():
    h = rng.standard_normal((2, 4, 3)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=np.float32)
    pooled = mean_pool(h, mask)
    np.testing.assert_allclose(pooled[0], h[0, :2].mean(0), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(l2_normalize(pooled), axis=1), 1, rtol=1e-6)


def test_unsupported_rope_scaling_is_refused_not_ignored():
    import pytest

    from inference.errors import UnsupportedModelError
    from inference.models.llama import ModelArgs

    base = {"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1,
            "intermediate_size": 16, "num_attention_heads": 2, "vocab_size": 10}
    assert ModelArgs.from_dict({**base, "rope_parameters": {"rope_type": "default",
                                                            "rope_theta": 5e5}}).rope_theta == 5e5
    llama3 = {"rope_type": "llama3", "factor": 8.0}
    assert ModelArgs.from_dict({**base, "rope_scaling": llama3}).rope_scaling == llama3
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelArgs.from_dict({**base, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}})


def test_fixed_batches_are_the_peers_batches():
    """sentence-transformers' batching: longest first, batch_size at a time."""
    lengths = [3, 9, 1, 7, 5]
    assert fixed_batches(lengths, 2) == [[1, 3], [4, 0], [2]]
