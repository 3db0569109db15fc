"""MLX's token pipeline, precision modes and memory rules (MLX's CPU device here).

- the lazy loop (device tokens, step n+1 queued before step n is read) gives the same
  tokens as the synchronous loop and as the NumPy backend, greedy and sampled;
- one host read per token, never before the next step is queued (counted by patching
  every way an mx.array reaches the host from Python);
- Metal-only paths (wired limit, working-set total) run with Metal faked by monkeypatching.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from inference.backends import mlx_backend  # noqa: E402
from inference.backends.base import TokenSampler  # noqa: E402
from inference.backends.mlx_backend import MlxBackend, MlxSampler  # noqa: E402
from inference.backends.numpy_backend import NumpyBackend  # noqa: E402
from inference.generate import generate_step  # noqa: E402
from inference.models import llama  # noqa: E402
from inference.sampling import SamplingParams  # noqa: E402
from tests.test_backend_mlx import _build, tiny_llama  # noqa: E402

PROMPT = [1, 5, 9, 33, 2, 70, 11, 4, 5, 9]


def _tokens(model, sampling, n=24, seed=0, max_len=None):
    steps = generate_step(model, PROMPT, sampling, np.random.default_rng(seed), max_len)
    return list(itertools.islice(steps, n))


class _SyncMlx(MlxBackend):
    """MLX with the protocol's default synchronous sampler (read before the next step)."""

    def start_generation(self, params, prompt_ids, rng):
        return TokenSampler(self, params, prompt_ids, rng)


SAMPLINGS = [SamplingParams(temperature=0.0),
             SamplingParams(temperature=0.0, repetition_penalty=1.3, repetition_window=6),
             SamplingParams(temperature=0.9, seed=1),
             SamplingParams(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.2)]


@pytest.mark.parametrize("qtype", ["Q4_0", "Q6_K"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "penalty", "temp", "filters"])
def test_lazy_loop_equals_sync_loop_and_numpy(qtype, sampling):
    ckpt = tiny_llama(qtype)
    lazy = _tokens(_build(llama, ckpt, MlxBackend()), sampling)
    sync = _tokens(_build(llama, ckpt, _SyncMlx()), sampling)
    ref = _tokens(_build(llama, ckpt, NumpyBackend()), sampling)
    assert lazy == sync == ref


class _HostReads:
    """Records, in order, every Python-level way an mx.array reaches the host and every
    async_eval / eval call."""

    READS = ("item", "tolist", "__array__", "__int__", "__float__", "__bool__", "__index__")

    def __init__(self, monkeypatch):
        self.log: list[str] = []
        for name in self.READS:
            orig = getattr(mx.array, name)
            monkeypatch.setattr(mx.array, name, self._wrap("read", orig))
        monkeypatch.setattr(mx, "async_eval", self._wrap("queue", mx.async_eval))
        monkeypatch.setattr(mx, "eval", self._wrap("eval", mx.eval))

    def _wrap(self, tag, fn):
        def f(*a, **k):
            self.log.append(tag)
            return fn(*a, **k)
        return f


def test_one_host_read_per_token_after_the_next_step_is_queued(monkeypatch):
    model = _build(llama, tiny_llama("Q4_K"), MlxBackend())
    steps = generate_step(model, PROMPT, SamplingParams(temperature=0.7, repetition_penalty=1.1),
                          np.random.default_rng(0))
    reads = _HostReads(monkeypatch)
    n = 12
    toks = list(itertools.islice(steps, n))
    assert len(toks) == n
    log = reads.log
    assert log.count("read") == n and "eval" not in log
    # Before the k-th read, k + 2 steps are queued: the prefill's token and the next one.
    for k, i in enumerate(j for j, e in enumerate(log) if e == "read"):
        assert log[:i].count("queue") == k + 2


def test_sync_backends_keep_the_default_sampler():
    assert NumpyBackend().start_generation(SamplingParams(), [1], np.random.default_rng()
                                           ).lazy is False
    assert isinstance(MlxBackend().start_generation(SamplingParams(), [1],
                                                    np.random.default_rng()), MlxSampler)


def test_repetition_history_rolls_on_the_device():
    p = SamplingParams(temperature=0.0, repetition_penalty=2.0, repetition_window=3)
    s = MlxSampler(p, [7], np.random.default_rng())
    assert isinstance(s.history, mx.array) and s.history.tolist() == [-1, -1, 7]
    logits = mx.array(np.arange(10, dtype=np.float32))
    toks = [s.read(s.sample(logits)) for _ in range(4)]
    hist = [7]
    for _ in range(4):
        hist.append(NumpyBackend().sample(np.arange(10, dtype=np.float32), p, hist, None))
    assert toks == hist[1:] == [9, 8, 6, 7]  # a token drops out of the window of 3
    assert s.history.tolist() == [8, 6, 7]


def test_temperature_only_sampling_does_not_sort(monkeypatch):
    def no_sort(*a, **k):
        raise AssertionError("sorted the vocabulary")

    monkeypatch.setattr(mx, "argsort", no_sort)
    monkeypatch.setattr(mx, "sort", no_sort)
    mlx_backend._compiled_sampler.cache_clear()
    p = SamplingParams(temperature=0.731)
    logits = np.random.default_rng(2).standard_normal(500).astype(np.float32)
    s = MlxSampler(p, [], np.random.default_rng(3))
    got = [s.read(s.sample(mx.array(logits))) for _ in range(50)]
    r = np.random.default_rng(3)
    want = [NumpyBackend().sample(logits, p, [], r) for _ in range(50)]
    assert got == want
    with pytest.raises(AssertionError):
        MlxSampler(SamplingParams(temperature=0.731, top_k=5), [], r).sample(mx.array(logits))


# --- precision ------------------------------------------------------------------------------

def test_precision_defaults_and_override(monkeypatch):
    monkeypatch.delenv(mlx_backend.DTYPE_ENV, raising=False)
    assert MlxBackend().precision == ("float16" if mx.metal.is_available() else "float32")
    monkeypatch.setenv(mlx_backend.DTYPE_ENV, "float16")
    ok, reason = mlx_backend.probe()
    assert ok and reason.endswith(", float16")
    monkeypatch.setenv(mlx_backend.DTYPE_ENV, "float8")
    ok, reason = mlx_backend.probe()
    assert not ok and "float8" in reason


def test_float16_mode_keeps_everything_in_float16():
    B = MlxBackend("float16")
    model = _build(llama, tiny_llama("Q6_K"), B)
    w = model.layers[0].mlp.down
    assert w.scales.dtype == w.biases.dtype == mx.float16
    assert model.norm.dtype == mx.float16 and B.zeros((1, 2)).dtype == mx.float16
    cache = model.make_cache()
    logits = model(B.array(np.array([PROMPT])), cache)
    assert logits.dtype == mx.float16 and cache.keys[0].dtype == mx.float16
    nm = _build(llama, tiny_llama("Q6_K"), NumpyBackend())
    ref = nm(np.array([PROMPT]), nm.make_cache())
    got = np.array(logits.astype(mx.float32))
    # float16 activations and scales (11-bit significands; Q6_K's 9*d*sc needs up to 22
    # bits) through 2 layers of random weights, which amplify rounding more than trained
    # ones: measured 1.9% of the largest logit here (Q4_0 0.4%, float32 1e-5; 8% when the
    # CPU device summed in float16). SmolLM2's float16 parity is in docs/mlx.md.
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()


@pytest.mark.slow
def test_smollm2_float16_mode_meets_the_parity_bars(monkeypatch):
    """Float16 mode (Metal's default) against transformers float32, on the prose golden's
    first 100 tokens: the bars float32 meets. Measured on all 566 golden tokens: top-1
    100%, mean |delta log p| 2.1e-3 to 3.4e-3 (docs/mlx.md)."""
    from tests import goldens_io as g
    from tests.bundled import load_bundled

    monkeypatch.setenv(mlx_backend.DTYPE_ENV, "float16")
    model = load_bundled("SmolLM2-135M-Instruct.Q4_1", "mlx")
    assert model.backend.precision == "float16"
    text = g.load_smollm2()["texts"]["prose"]
    golden = {k: text[k][:100] for k in ("top_ids", "top_logp")}
    agree, dlogp = g.smollm2_agreement(golden, model.logits([int(i) for i in text["ids"][:100]]))
    model.close()
    assert agree >= g.SMOLLM2_MIN_TOP1_AGREEMENT and dlogp <= g.SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q2_K", "Q3_K", "Q6_K"])
def test_16bit_modes_sum_quantized_matmuls_in_float32(precision, qtype):
    """A 16-bit mode rounds what it stores, not what it sums: each output equals the float64
    sum of the same (already 16-bit) activations and weights, rounded once to 16 bits, as
    Metal's kernels compute it. Summed in 16 bits over 1,536 inputs (MLX's CPU kernel on
    its own) the worst output here is off by 800 to 3,900 ulp."""
    from tests.bundled import random_tensor

    B = MlxBackend(precision)
    w = B.weight(random_tensor(qtype, 64, 1536, seed=3))
    x = B.array(np.random.default_rng(4).standard_normal((3, 1536)))
    got = np.array(B.linear(x, w).astype(mx.float32), dtype=np.float64)
    xs = x if w.expand is None else B._expand(x, w.expand)  # the 16-bit activation it reads
    s, z = w.scales.astype(mx.float32), w.biases.astype(mx.float32)
    wf = np.array(mx.dequantize(w.w, s, z, group_size=w.group_size, bits=w.bits), np.float64)
    want = np.array(xs.astype(mx.float32), np.float64) @ wf.T
    ulp = np.array(mx.array(np.abs(want).astype(np.float32)).astype(B.dtype).astype(mx.float32))
    ulp = np.spacing(ulp.astype(np.float16 if precision == "float16" else np.float32)) * (
        1 if precision == "float16" else 2.0 ** 16)  # bfloat16: 8-bit significand
    # one rounding of the output (half an ulp, or one at a power of two) plus float32's
    # summation error (~1e-6 relative) stays under one ulp
    assert np.all(np.abs(got - want) <= ulp), np.max(np.abs(got - want) / ulp)


# --- memory ---------------------------------------------------------------------------------

@pytest.fixture
def fake_metal(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(mlx_backend, "_metal", lambda: True)
    monkeypatch.setattr(mlx_backend, "_device_info", lambda: {
        "device_name": "Apple M9", "max_recommended_working_set_size": 5 << 30,
        "memory_size": 8 << 30})

    def set_wired_limit(n):
        calls.append(n)
        return 7 if len(calls) == 1 else 5 << 30

    monkeypatch.setattr(mx, "set_wired_limit", set_wired_limit)
    monkeypatch.setattr(mlx_backend._WiredLimit, "users", 0)
    return calls


def test_wired_limit_while_loaded_and_restored_on_last_close(fake_metal, monkeypatch):
    monkeypatch.delenv(mlx_backend.DTYPE_ENV, raising=False)
    a, b = MlxBackend(), MlxBackend()
    assert a.precision == "float16" and a.device == "Apple M9 (Metal)"
    assert fake_metal == [5 << 30]
    a.close()
    a.close()  # closing twice releases once
    assert fake_metal == [5 << 30]
    b.close()
    assert fake_metal == [5 << 30, 7]
    assert a.memory().device_total == 5 << 30  # the working set, not the RAM


def test_unloading_a_model_restores_the_wired_limit(fake_metal):
    from inference import load_model
    from tests import goldens_io as g

    model = load_model(str(g.GOLDENS_DIR / "tiny" / "llama_q4_0.gguf"), backend="mlx")
    assert model.backend.name == "mlx" and fake_metal == [5 << 30]
    model.close()
    assert fake_metal == [5 << 30, 7]


def test_no_wired_limit_without_metal(monkeypatch):
    called = []
    monkeypatch.setattr(mx, "set_wired_limit", lambda n: called.append(n))
    B = MlxBackend()
    B.close()
    assert called == [] and B.memory().device_total is None


def test_prefill_in_chunks_with_clear_cache(monkeypatch):
    ckpt = tiny_llama("Q4_0")
    whole = _tokens(_build(llama, ckpt, MlxBackend()), SamplingParams(temperature=0.0), n=8)
    B = MlxBackend()
    B.prefill_chunk = 4  # 10 prompt tokens: chunks 4 + 4 + 2, cleared twice
    cleared = []
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(1))
    chunked = _tokens(_build(llama, ckpt, B), SamplingParams(temperature=0.0), n=8)
    assert chunked == whole and len(cleared) == 2


def test_kv_cache_grows_in_steps_and_peak_resets_per_generation(monkeypatch):
    assert MlxBackend.prefill_chunk == 2048  # mlx-lm's prefill_step_size
    model = _build(llama, tiny_llama("Q4_0"), MlxBackend())
    made, caches, resets = [], [], []
    make = model.make_cache
    monkeypatch.setattr(model, "make_cache",
                        lambda n=None: made.append(n) or caches.append(make(n)) or caches[-1])
    monkeypatch.setattr(mx, "reset_peak_memory", lambda: resets.append(1))
    _tokens(model, SamplingParams(temperature=0.0), n=3, max_len=4096)
    _tokens(model, SamplingParams(temperature=0.0), n=250, max_len=4096)
    assert made == [None, None] and len(resets) == 2
    # 10 prompt + 3 tokens fit one step of 256 rows; 10 + 250 took a second step
    assert [c.keys[0].shape[2] for c in caches] == [256, 512]
    np_model = _build(llama, tiny_llama("Q4_0"), NumpyBackend())
    assert np_model.B.preallocate_kv  # the CPU backends still allocate once


def test_decode_memory_stays_flat_in_the_lazy_loop():
    model = _build(llama, tiny_llama("Q4_0"), MlxBackend())
    steps = generate_step(model, PROMPT, SamplingParams(temperature=0.0),
                          np.random.default_rng())
    for i, _ in enumerate(itertools.islice(steps, 120)):
        if i == 20:
            mx.clear_cache()
            before = mx.get_active_memory()
    mx.clear_cache()
    assert mx.get_active_memory() <= before + 64 * 1024


@pytest.mark.parametrize("precision,bits_per_weight,norm_bytes", [("float32", 10, 4),
                                                                  ("float16", 8, 2)])
def test_bench_weight_bytes_per_token_from_the_layout(precision, bits_per_weight, norm_bytes):
    from inference.bench import weight_bytes_per_token

    h = 256  # tiny_llama's K-quant width; tied Q6_K embedding = the output head, once
    model = _build(llama, tiny_llama("Q6_K", emb="Q6_K"), MlxBackend(precision))
    weights = 2 * (2 * h * h + 2 * (h // 2) * h + 3 * 2 * h * h) + 96 * h
    norms = (2 * 2 + 1) * h
    assert weight_bytes_per_token(model) == weights * bits_per_weight // 8 + norms * norm_bytes
