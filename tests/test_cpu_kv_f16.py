"""The cpu backend's float16 KV cache (``load_model(..., kv_dtype="float16")``): the
rounding of the rows the decode kernel writes, the fused decode attention over float16
rows against a float64 reference, a row alone against the row in a batch, and SmolLM2's
parity bars with the cache in float16."""

from __future__ import annotations

import numpy as np
import pytest

from inference.backends.cpu import CpuBackend
from inference.backends.cpu.attention import half_bits
from inference.errors import InvalidInputError
from inference.kv_cache import KVCache
from tests import goldens_io as g
from tests.bundled import load_bundled
from tests.test_cpu_attend_rows import KW, LAYERS, _step
from tests.test_cpu_attend_rows import _caches as attend_rows_caches
from tests.test_cpu_kquants import decode_logits

B = CpuBackend()
B.use_kv_dtype("float16")


def test_half_bits_rounds_as_numpy():
    import numba

    @numba.njit
    def convert(x, out):
        for i in range(x.shape[0]):
            out[i] = half_bits(x[i])

    rng = np.random.default_rng(0)
    scaled = [rng.standard_normal(20000).astype(np.float32) * s
              for s in (1e-8, 1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4, 7e4)]
    edges = np.array([0.0, -0.0, 65504, 65519, 65520, -65520, 1e9, np.inf, -np.inf,
                      6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-10], dtype=np.float32)
    anybits = rng.integers(0, 2 ** 32, 100000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([*scaled, edges, anybits[np.isfinite(anybits)]])
    got = np.empty(x.shape, dtype=np.uint16)
    convert(x, got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)  # integer rounding: the very bits


def _caches(lengths: list[int], seed: int) -> list[KVCache]:
    return attend_rows_caches(lengths, seed, backend=B)


def _reference(q: np.ndarray, cache: KVCache, layer: int, pos: int) -> np.ndarray:
    """softmax(q_rot . k) v in float64 over the cache's own float16 rows (RoPE on q by the
    NumPy formulas), one sequence: (hq, d)."""
    hq, d = q.shape[1], q.shape[3]
    half = d // 2
    inv = KW["theta"] ** (-np.arange(half, dtype=np.float64) * 2 / d)
    ang = pos * inv
    qq = q[0, :, 0].astype(np.float64)
    qr = np.concatenate([qq[:, :half] * np.cos(ang) - qq[:, half:] * np.sin(ang),
                         qq[:, half:] * np.cos(ang) + qq[:, :half] * np.sin(ang)], axis=1)
    k = cache.keys[layer][0, :, :pos + 1].astype(np.float64)
    v = cache.values[layer][0, :, :pos + 1].astype(np.float64)
    group = hq // k.shape[0]
    out = np.empty((hq, d))
    for h in range(hq):
        s = k[h // group] @ qr[h] * KW["scale"]
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[h // group]
    return out


@pytest.mark.parametrize("lengths", [[5], [1, 7, 300], [0, 3, 256, 255]])
def test_fused_attention_over_half_rows_matches_float64(lengths):
    q, k, v = _step(len(lengths), 1)
    caches = _caches(lengths, 2)
    for layer in range(LAYERS):
        got = B.attend_rows(q, k, v, caches, layer, **KW)
        for i, (c, n) in enumerate(zip(caches, lengths, strict=True)):
            assert c.keys[layer].dtype == np.float16 and c.values[layer].dtype == np.float16
            # The new row: v as it came, rounded to half; k after RoPE, within a half ulp.
            np.testing.assert_array_equal(c.values[layer][0, :, n], v[i, :, 0].astype(np.float16))
            want = _reference(q[i:i + 1], c, layer, n)
            # float32 sums over <= 301 keys against float64: a few float32 ulps.
            np.testing.assert_allclose(got[i, :, 0], want, rtol=0,
                                       atol=2e-6 * max(1.0, float(np.abs(want).max())))


def test_a_row_alone_is_bitwise_the_row_in_a_batch():
    lengths = [4, 130, 9]
    q, k, v = _step(3, 3)
    batch = B.attend_rows(q, k, v, _caches(lengths, 4), 0, **KW)
    for i in range(len(lengths)):
        alone = B.attend_rows(q[i:i + 1], k[i:i + 1], v[i:i + 1],
                              [_caches(lengths, 4)[i]], 0, **KW)
        np.testing.assert_array_equal(alone[0], batch[i])  # the server's exactness


def test_other_cache_types_are_refused_in_one_sentence():
    from inference.backends.numpy_backend import NumpyBackend

    with pytest.raises(InvalidInputError, match="float32 or float16, not 'bfloat16'"):
        CpuBackend().use_kv_dtype("bfloat16")
    with pytest.raises(InvalidInputError, match="keeps its KV cache in float32, not float16"):
        NumpyBackend().use_kv_dtype("float16")


@pytest.fixture(scope="module")
def smollm2_half():
    from inference import load_model

    load_bundled("SmolLM2-135M-Instruct.Q4_1", backend="cpu")  # present, or a clear failure
    return load_model("SmolLM2-135M-Instruct.Q4_1", backend="cpu", kv_dtype="float16")


def test_smollm2_with_a_half_cache_keeps_the_parity_bars(smollm2_half):
    # One golden text, decoded over its first 96 tokens (the suite's time); every text and
    # token: scripts/kv_cache_parity.py.
    text = g.load_smollm2()["texts"]["chat"]
    ids = [int(i) for i in text["ids"]]
    head = {k: text[k][:96] for k in ("top_ids", "top_logp")}
    assert smollm2_half.model.make_cache(4).B.kv_dtype == np.float16
    for path, golden, logits in (("prefill", text, smollm2_half.logits(ids)),
                                 ("decode", head, decode_logits(smollm2_half, ids[:96]))):
        agree, dlogp = g.smollm2_agreement(golden, logits)
        assert agree >= g.SMOLLM2_MIN_TOP1_AGREEMENT, (path, agree)
        assert dlogp <= g.SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1, (path, dlogp)


def test_cli_names_the_types_a_backend_keeps(capsys):
    from inference.cli import main

    argv = ["generate", "--model", "smollm2", "--prompt", "x", "--backend", "cpu"]
    assert main([*argv, "--kv-dtype", "bfloat16"]) == 2
    assert "float32 or float16, not 'bfloat16'" in capsys.readouterr().err
