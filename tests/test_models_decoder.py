"""The configurable decoder's switches: each one changes the tiny goldens' logits (so the
parity tests in test_parity_tiny.py would catch it missing), and sliding-window layers
keep a bounded cache however long the context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inference.backends.numpy_backend import NumpyBackend
from inference.formats import read_checkpoint
from inference.kv_cache import KVCache
from inference.models import llama
from inference.models.common import Weights

TINY = Path(__file__).resolve().parent / "goldens" / "tiny"
N = NumpyBackend()


def _max_diff(name: str, **change: object) -> float:
    ckpt = read_checkpoint(TINY / name)
    args = llama.ModelArgs.from_dict(ckpt.config)
    for key, value in change.items():  # after __post_init__, which implies some from model_type
        setattr(args, key, value)
    m = llama.Model(args, N, Weights(ckpt, N))
    with np.load(TINY / f"{name}.npz") as z:
        ids, ref = z["chat.ids"], z["chat.logits"]
    return float(np.abs(m(ids[None], m.make_cache())[0] - ref).max())


@pytest.mark.parametrize("name, change", [
    ("llama3", {"rope_scaling": None}),
    ("qwen3", {"qk_norm": False}),
    ("gemma", {"norm_weight_offset": 0.0}),
    ("gemma", {"embed_scale": False}),
    ("phi3", {"attention_factor": 1.0}),
    ("phi3", {"rope_scaling": None}),
    ("gemma2", {"attn_logit_softcapping": None}),
    ("gemma2", {"final_logit_softcapping": None}),
    ("gemma2", {"sliding_window": None}),
    ("gemma2", {"query_pre_attn_scalar": None}),
    ("gemma3_text", {"rope_local_base_freq": None}),
    ("gemma3_text", {"sliding_window": None}),
])
def test_every_switch_shows_in_the_goldens(name: str, change: dict) -> None:
    assert _max_diff(name) <= 1e-3  # as built from the config: matches transformers
    assert _max_diff(name, **change) > 1e-2  # without the feature: visibly wrong


def test_sliding_layers_keep_a_bounded_cache() -> None:
    # 300 decode steps past an 8-token window: the local layer never holds more than
    # window - 1 + one 256-row step; the global layer holds everything.
    ckpt = read_checkpoint(TINY / "gemma2")
    m = llama.Model(llama.ModelArgs.from_dict(ckpt.config), N, Weights(ckpt, N))
    cache = m.make_cache()
    assert cache.windows == [8, None]
    tok = np.array([[1, 5, 9]])
    for _ in range(300):
        logits = m(tok, cache, last_only=True)
        tok = logits.argmax(-1)
        assert cache.keys[0].shape[2] <= 8 - 1 + KVCache.step
    assert cache.start[0] > 0 and cache.keys[1].shape[2] >= cache.offset == 302


def test_window_cache_matches_full_recompute() -> None:
    # Decoding token by token through the sliding cache gives the logits of one
    # teacher-forced pass over the whole sequence (40 tokens, window 8).
    ckpt = read_checkpoint(TINY / "gemma2")
    m = llama.Model(llama.ModelArgs.from_dict(ckpt.config), N, Weights(ckpt, N))
    with np.load(TINY / "gemma2.npz") as z:
        ids, ref = z["chat.ids"], z["chat.logits"]
    cache = KVCache(N, 2, windows=[8, None])
    cache.step = 4  # slide often
    rows = [m(ids[None, i:i + 1], cache)[0, 0] for i in range(len(ids))]
    np.testing.assert_allclose(np.stack(rows), ref, atol=1e-3)
    assert cache.keys[0].shape[2] <= 8 - 1 + 4


def test_trim_past_dropped_rows_forgets_everything() -> None:
    cache = KVCache(N, 2, windows=[4, None])
    cache.step = 2
    k = np.zeros((1, 1, 1, 2), np.float32)
    for _ in range(10):
        for layer in range(2):
            cache.update(layer, k, k)
        cache.advance(1)
    assert cache.start[0] > 0
    cache.trim(9)  # the query at 9 needs keys 6..8: still held
    assert cache.offset == 9
    cache.trim(2)  # keys 0..1 are gone from the local layer
    assert cache.offset == 0 and cache.start == [0, 0]


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_stacked_linears_equal_separate_products(backend: str) -> None:
    """q/k/v (and gate/up) stack into one weight per run of tensors of one type and width;
    each output row is still its own dot product, so the split outputs equal the separate
    products: bitwise on the cpu mat-vec, whose rows never mix; BLAS may block a wider GEMM
    differently, so there a float32 sum of 64 terms in another order: a few ulps of the
    largest term (1e-5 of the largest output)."""
    from inference.backends import create
    from inference.formats.quants import BLOCK_TYPES
    from inference.formats.tensor import Checkpoint, TensorData

    B = create(backend)
    rng = np.random.default_rng(0)
    k = 64

    def q8_0(rows: int) -> TensorData:  # random blocks; & 0x3F keeps each float16 d finite
        raw = rng.integers(0, 256, (rows, BLOCK_TYPES["Q8_0"].row_bytes(k)), dtype=np.uint8)
        return TensorData("", (rows, k), "Q8_0", raw & 0x3F)

    def f32(rows: int) -> TensorData:
        return TensorData("", (rows, k), "F32", rng.standard_normal((rows, k), np.float32))

    tensors = {"q": q8_0(96), "k": q8_0(40), "v": f32(40), "g": f32(24)}
    tensors["k.bias"] = TensorData("k.bias", (40,), "F32", rng.standard_normal(40, np.float32))
    w = Weights(Checkpoint(Path("m.gguf"), "gguf", {}, tensors), B)
    lin = w.linears(["q", "k", "v", "g"], ["q.bias", "k.bias", "v.bias", "g.bias"])
    assert [sizes for _, sizes, _ in lin.parts] == [[96, 40], [40, 24]]  # Q8_0, then F32
    for rows in (1, 12):  # decode mat-vec, prefill GEMM
        x = rng.standard_normal((1, rows, k)).astype(np.float32)
        got = [B.to_numpy(y) for y in lin(B.array(x))]
        for name, y in zip("qkvg", got, strict=True):
            want = B.to_numpy(B.linear(B.array(x), w.linear(name),
                                       w.dense("k.bias") if name == "k" else None))
            assert y.shape == want.shape
            if backend == "cpu" and rows == 1:
                assert np.array_equal(y, want), name
            else:
                np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * np.abs(want).max(),
                                           err_msg=name)
