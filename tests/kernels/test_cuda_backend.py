"""The CUDA backend on the emulated device against the NumPy reference backend.

The whole backend runs here: its launch plans, its chaining of kernels, its cuBLAS stand-in
(NumPy matmul) and its host<->device copies, which the device counts.

Tolerances: logits atol/rtol 2e-4 on tiny models (float32, other summation orders);
SmolLM2 (2 layers; all 30 opt-in, ``long``) logits atol 2e-3 with the same greedy tokens;
MiniLM hidden states atol 1e-4 and cosine >= 0.99999 per token.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import gguf.quants as gq
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from inference.backends import probe
from inference.backends.base import OPS
from inference.backends.cuda import CudaBackend
from inference.backends.numpy_backend import NumpyBackend
from inference.formats.affine import pack_codes
from inference.formats.tensor import Checkpoint, TensorData
from inference.generate import generate_step
from inference.models import bert, llama
from inference.models.common import Weights
from inference.sampling import SamplingParams
from kernels.cuda import ops
from kernels.cuda.device import Device
from tests.bundled import minilm_dir, smollm2_gguf
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.quantdata import make_weight

N = NumpyBackend()


@pytest.fixture(params=["emulator", pytest.param("gpu", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest) -> Device:
    """A fresh emulated device (its transfer log is the test's), or the real GPU."""
    if request.param == "emulator":
        return EmulatedDevice()
    return request.getfixturevalue("gpu")


def test_probe_imports_cleanly_and_says_why() -> None:
    p = probe("cuda")
    if not p.available:
        assert p.reason and not p.reason.startswith("cuda")  # one sentence, name not doubled


def test_backend_offers_every_op_and_ggml_type() -> None:
    b = CudaBackend(EmulatedDevice())
    assert b.ops() == set(OPS)
    assert b.quant_types() == {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                               "Q5_K", "Q6_K", "MLX"}


def _mlx(bits: int, scale_dtype: type, rows: int = 40, n: int = 256, group: int = 64
         ) -> TensorData:
    r = np.random.default_rng(bits)
    codes = r.integers(0, 1 << bits, size=(rows, n), dtype=np.uint8)
    scales = (r.random((rows, n // group)) * 0.05).astype(scale_dtype)
    biases = (r.standard_normal((rows, n // group)) * 0.05).astype(scale_dtype)
    return TensorData("w", (rows, n), "MLX", pack_codes(codes, bits),
                      {"scales": scales, "biases": biases, "group_size": group, "bits": bits})


@pytest.mark.parametrize(("bits", "scale_dtype", "group", "held"), [
    (4, np.float16, 64, "Q4_1"), (4, np.float16, 32, "Q4_1"), (4, np.float16, 128, "Q4_1"),
    (4, np.float32, 64, "F32"),  # scales float16 cannot hold: float32, exact
    (8, np.float16, 64, "F32"), (3, np.float16, 64, "F32")])
def test_mlx_weights_match_numpy(bits: int, scale_dtype: type, group: int, held: str) -> None:
    # Q4_1 holds MLX 4-bit groups exactly (the same scale * code + bias): the float
    # mat-vec and the GEMM agree with NumPy's dequantized weight to float32 rounding.
    t = _mlx(bits, scale_dtype, group=group)
    C = CudaBackend(EmulatedDevice())
    C.q8_1_activations = False
    w = C.weight(t)
    assert w.qtype == held
    assert C.held_bytes(t) == w.data.nbytes
    x = np.random.default_rng(1).standard_normal((11, 256)).astype(np.float32)
    want = x @ N.weight(t).T
    for rows in (1, 3, 11):  # mat-vec, mat-vec tile, GEMM
        got = C.to_numpy(C.linear(C.array(x[:rows]), w))
        np.testing.assert_allclose(got, want[:rows], atol=1e-4, rtol=1e-4)


class _Pool:
    def __init__(self, used: int, cached: int) -> None:
        self.used, self.cached = used, cached

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.used + self.cached

    def free_all_blocks(self) -> None:
        self.cached = 0


def test_memory_reports_live_bytes_and_close_returns_the_pool() -> None:
    # CuPy's pool keeps freed blocks cached: memory() counts what arrays hold, and close()
    # hands the cached blocks back, so switching models cannot run the GPU out.
    from types import SimpleNamespace

    from kernels.cuda.device import CupyDevice

    pool, pinned = _Pool(100, 300), _Pool(0, 50)
    dev = CupyDevice.__new__(CupyDevice)
    Device.__init__(dev)
    dev._cupy = SimpleNamespace(
        get_default_memory_pool=lambda: pool, get_default_pinned_memory_pool=lambda: pinned,
        cuda=SimpleNamespace(get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None)))
    dev._peak, dev._total = 0, 1 << 30
    assert dev.memory() == (100, 1 << 30, 100)
    C = CudaBackend.__new__(CudaBackend)
    C.dev, C._scratch, C._last_id, C._hist = dev, {"w": object()}, None, None
    C.close()
    assert pool.cached == 0 and pinned.cached == 0 and not C._scratch


def _tensor(name: str, qtype: str, shape: tuple[int, int], rng: np.random.Generator
            ) -> TensorData:
    if qtype in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F32"):
        x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        data = x if qtype == "F32" else gq.quantize(x, GGMLQuantizationType[qtype])
        return TensorData(name, shape, qtype, data)
    # random K-quant codes and scales; small super-block scales keep activations O(1)
    return TensorData(name, shape, qtype, make_weight(qtype, *shape, rng, scale=0.005))


def tiny_llama(qtype: str, embed_type: str = "Q8_0", layers: int = 2) -> Checkpoint:
    hidden, inter, vocab = 256, 512, 96  # K-quants need rows of 256
    cfg = {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
           "intermediate_size": inter, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": vocab, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
    rng = np.random.default_rng(7)
    ts = {"model.embed_tokens.weight": _tensor("e", embed_type, (vocab, hidden), rng)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n, shape in [("q", (256, 256)), ("k", (128, 256)), ("v", (128, 256)),
                         ("o", (256, 256))]:
            ts[p + f"self_attn.{n}_proj.weight"] = _tensor(n, qtype, shape, rng)
        for n, shape in [("gate", (inter, hidden)), ("up", (inter, hidden))]:
            ts[p + f"mlp.{n}_proj.weight"] = _tensor(n, qtype, shape, rng)
        ts[p + "mlp.down_proj.weight"] = _tensor("d", "Q8_0", (hidden, inter), rng)
        for n in ("input_layernorm", "post_attention_layernorm"):
            w = (1 + rng.standard_normal(hidden) * 0.1).astype(np.float32)
            ts[p + n + ".weight"] = TensorData(n, (hidden,), "F32", w)
    ts["model.norm.weight"] = TensorData("n", (hidden,), "F32", np.ones(hidden, np.float32))
    return Checkpoint(Path("tiny.gguf"), "gguf", cfg, ts)


def _build(mod, ckpt: Checkpoint, B):  # noqa: ANN001, ANN202
    return mod.Model(mod.ModelArgs.from_dict(ckpt.config), B, Weights(ckpt, B))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                   "Q6_K"])
def test_tiny_llama_prefill_and_greedy_decode_match_numpy(qtype: str, device: Device) -> None:
    # The float mat-vec (exact to float32 rounding): random tiny models have near-tied
    # logits that x rounded to q8_1 can swap (see the q8_1 test below).
    ckpt = tiny_llama(qtype, embed_type="Q6_K" if qtype == "Q4_K" else "Q8_0")
    C = CudaBackend(device, kv_dtype=np.float32)  # float32 bars: the float32 cache
    C.q8_1_activations = False
    mc, mn = _build(llama, ckpt, C), _build(llama, ckpt, N)
    ids = np.array([[1, 5, 9, 33, 2, 70, 11, 4, 8, 60, 3]])  # 11 rows: the GEMM path
    got = C.to_numpy(mc(C.array(ids), mc.make_cache()))
    np.testing.assert_allclose(got, mn(ids, mn.make_cache()), atol=2e-4, rtol=2e-4)
    sp = SamplingParams(temperature=0.0)
    rng = np.random.default_rng(0)
    a = generate_step(mc, [1, 5, 9], sp, rng, max_len=40)  # 3 rows: the mat-vec path
    b = generate_step(mn, [1, 5, 9], sp, rng, max_len=40)
    assert list(itertools.islice(a, 12)) == list(itertools.islice(b, 12))


def test_stacked_projections_are_one_mat_vec_each(monkeypatch: pytest.MonkeyPatch) -> None:
    # q/k/v and gate/up stack at load (Weights.linears: same type and width) into one
    # weight each: a decode step runs 4 mat-vecs per layer instead of 7, plus the LM head.
    # Each output row is its own dot product either way; the tolerance allows the GEMM
    # path (prefill) to sum a wider product in another order: 1e-5 of the largest logit.
    from inference.models import common

    ckpt = tiny_llama("Q4_K")
    calls: list[int] = []
    mmv = ops.mul_mat_vec
    monkeypatch.setattr(ops, "mul_mat_vec", lambda *a: (calls.append(1), mmv(*a))[1])

    def run(stacked: bool) -> tuple[list[np.ndarray], int]:
        C = CudaBackend(EmulatedDevice())
        C.decode_layer = lambda *a: None  # op by op: the fused layer calls no mul_mat_vec
        with monkeypatch.context() as m:
            if not stacked:
                m.setattr(common, "_stackable", lambda a, b: False)
            model = _build(llama, ckpt, C)
        cache = model.make_cache(32)
        out = [C.to_numpy(model(C.array(np.array([[1, 5, 9, 33, 2, 70, 11, 4, 8, 60]])),
                                cache, last_only=True))]
        calls.clear()
        out.append(C.to_numpy(model(C.array(np.array([[3]])), cache, last_only=True)))
        return out, len(calls)

    fused, n_fused = run(True)
    apart, n_apart = run(False)
    assert (n_fused, n_apart) == (2 * 4 + 1, 2 * 7 + 1)
    for a, b in zip(fused, apart, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
        assert a.argmax() == b.argmax()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                   "Q6_K"])
def test_tiny_llama_decode_with_q8_1_activations(qtype: str, device: Device) -> None:
    # The default mat-vec path: x in q8_1, integer dot products. Decode logits (3 rows: the
    # mat-vec, one weight read per block for all 3) against NumPy's float ones: |error| <= 8%
    # of the largest |logit|, measured 0.09-4.9% on these random models (Q2_K 0.09%, Q3_K
    # 0.13%; x rounded to 8 bits per 32 values in every mat-vec of 2 layers and the head;
    # random weights cancel, so the logits are small next to the rounding). The same top
    # token wherever NumPy's top two are further apart than 2x that.
    # Real weights: SmolLM2 in docs/cuda.md.
    ckpt = tiny_llama(qtype, embed_type="Q6_K" if qtype == "Q4_K" else "Q8_0")
    C = CudaBackend(device)
    assert C.q8_1_activations
    mc, mn = _build(llama, ckpt, C), _build(llama, ckpt, N)
    ids = np.array([[1, 5, 9]])
    got = C.to_numpy(mc(C.array(ids), mc.make_cache()))
    want = mn(ids, mn.make_cache())
    tol = 0.08 * np.abs(want).max()
    assert np.abs(got - want).max() <= tol, np.abs(got - want).max() / np.abs(want).max()
    top2 = np.sort(want, -1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 2 * tol
    assert (got.argmax(-1) == want.argmax(-1))[clear].all()



def test_batched_decode_step_gives_each_sequence_its_own_logits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's batched decode (BatchedCaches: one row per sequence, each at its own
    # position; every linear over all rows) with q8_1 on: 5 sequences, so the mat-vecs
    # read each weight once for all 5 (tile 8, 3 rows idle). Each row must be that
    # sequence's own decode step: every op is row-independent and the tiles equal the
    # 1-row kernel bitwise (test_mmvq.py), so 1e-6 of the largest |logit| is float32 noise.
    ckpt = tiny_llama("Q4_K", embed_type="Q6_K", layers=1)
    check_batched_decode(ckpt, "mul_mat_vec_q_b8_", monkeypatch)
    # F32 weights: the float kernel's tiles (test_mmv_tiles.py), the same bar.
    check_batched_decode(tiny_llama("F32", embed_type="F32", layers=1), "mul_mat_vec_b8_",
                         monkeypatch)


def check_batched_decode(ckpt: Checkpoint, kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batched decode step of 5 sequences launches `kernel`... and gives each sequence the
    logits of its own single decode step, within 1e-6 of the largest."""
    from inference.kv_cache import BatchedCaches

    C = CudaBackend(EmulatedDevice(), kv_dtype=np.float32)
    assert C.q8_1_activations
    model = _build(llama, ckpt, C)
    prompts = [[1, 5, 9], [2, 7], [3, 4, 6, 8], [10, 20, 30, 40, 50], [60]]
    nxt = [[11], [12], [13], [14], [15]]

    def prefilled() -> list:
        caches = []
        for p in prompts:
            caches.append(model.make_cache(16))
            model(C.array(np.array([p])), caches[-1], last_only=True)
        return caches

    names: list[str] = []
    launch = C.dev.launch
    monkeypatch.setattr(C.dev, "launch", lambda m, n, *a: (names.append(n), launch(m, n, *a)))
    batched = C.to_numpy(model(C.array(np.array(nxt)), BatchedCaches(prefilled()),
                               last_only=True))
    assert any(n.startswith(kernel) for n in names), sorted(set(names))
    alone = np.concatenate([C.to_numpy(model(C.array(np.array([t])), c, last_only=True))
                            for t, c in zip(nxt, prefilled(), strict=True)])
    assert batched.shape == alone.shape == (5, 1, 96)
    np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-6 * np.abs(alone).max())
    assert (batched.argmax(-1) == alone.argmax(-1)).all()

def test_half_precision_prefill_stays_close() -> None:
    # float16 weights and activations in the prefill GEMMs: atol/rtol 2e-2 on the logits.
    ckpt = tiny_llama("Q4_K", embed_type="Q8_0")
    C = CudaBackend(EmulatedDevice(), prefill_dtype=np.float16)
    mc, mn = _build(llama, ckpt, C), _build(llama, ckpt, N)
    ids = np.array([[1, 5, 9, 33, 2, 70, 11, 4, 8, 60, 3]])
    got = C.to_numpy(mc(C.array(ids), mc.make_cache()))
    np.testing.assert_allclose(got, mn(ids, mn.make_cache()), atol=2e-2, rtol=2e-2)


def test_decode_loop_moves_only_the_sampled_id(device: Device) -> None:
    # Counts the device interface's explicit copies. On a GPU, CuPy ops that synchronise
    # implicitly would not show here; the backend avoids the known ones (boolean-mask
    # indexing, unique) in sampling.
    dev = device
    C = CudaBackend(dev)
    model = _build(llama, tiny_llama("Q4_1"), C)
    for sp in (SamplingParams(temperature=0.0),
               SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05,
                              repetition_penalty=1.3, seed=1)):
        steps = generate_step(model, [1, 5, 9, 2], sp, np.random.default_rng(1), max_len=64)
        next(steps)  # prefill: the prompt goes up, the first id comes down
        dev.transfers.clear()
        launches = dev.launches
        toks = [next(steps) for _ in range(10)]
        assert dev.launches - launches >= 2 * 10  # the loop did run kernels (graphs on)
        assert dev.transfers.count("h2d") == 0, dev.transfers.events
        assert dev.transfers.events == [("d2h", 4, "sampled id")] * 10, dev.transfers.events
        assert all(0 <= t < 96 for t in toks)
        steps.close()


@pytest.mark.parametrize("graphs", [False, True])
def test_sampled_id_is_read_one_step_behind(graphs: bool) -> None:
    # The engine's lazy-token protocol (as MLX's): token t stays on the device as step
    # t+1's input and its copy is read by the host only after step t+1 is queued, so the
    # host's work on token t overlaps the GPU's on step t+1. Greedy ids equal NumPy's.
    dev = EmulatedDevice()
    C = CudaBackend(dev, graphs=graphs, kv_dtype=np.float32)  # NumPy's ids: float32 cache
    ckpt = tiny_llama("Q4_1")
    queued: list[int] = []  # launches so far when each forward (eager or replayed) is queued
    start = C.start_generation

    def counted(*a):  # noqa: ANN002, ANN202
        sampler = start(*a)
        decode = sampler.decode
        sampler.decode = lambda *b: (decode(*b), queued.append(dev.launches))[0]
        return sampler

    C.start_generation = counted
    sp = SamplingParams(temperature=0.0)
    steps = generate_step(_build(llama, ckpt, C), [1, 5, 9, 2], sp, np.random.default_rng(1),
                          max_len=64)
    dev.transfers.clear()
    toks = list(itertools.islice(steps, 8))
    steps.close()
    reads = [at for (d, _, label), at in zip(dev.transfers.events, dev.transfers.at,
                                             strict=True) if label == "sampled id"]
    ups = [e for e in dev.transfers.events if e[0] == "h2d"]
    assert len(reads) == 8 and ups == [("h2d", 32, "input")], dev.transfers.events  # prompt
    # queued[t] is step t+1's forward, which token t feeds: token t is read after it and
    # before step t+2 is queued, exactly one step behind.
    assert len(queued) == 8
    ends = [*queued, float("inf")]
    for t, at in enumerate(reads):
        assert ends[t] <= at < ends[t + 1], (t, at, queued)
    ref = generate_step(_build(llama, ckpt, N), [1, 5, 9, 2], sp, np.random.default_rng(1),
                        max_len=64)
    assert toks == list(itertools.islice(ref, 8))


def test_decode_loop_check_sees_an_implicit_read() -> None:
    # The check above would catch a float() of a device array in the loop (on a GPU, a
    # hidden synchronising copy): a backend that peeks at the top logit every token.
    class Peeking(CudaBackend):
        def sample_id(self, logits, params, recent, rng):  # noqa: ANN001, ANN201
            float(self.xp.max(logits))
            return super().sample_id(logits, params, recent, rng)

    dev = EmulatedDevice()
    model = _build(llama, tiny_llama("Q4_1"), Peeking(dev))
    steps = generate_step(model, [1, 5, 9, 2], SamplingParams(temperature=0.0),
                          np.random.default_rng(1), max_len=64)
    next(steps)
    dev.transfers.clear()
    next(steps)
    assert [label for _, _, label in dev.transfers.events] == ["implicit float()", "sampled id"]
    steps.close()


def test_sampling_matches_the_reference_distribution(device: Device) -> None:
    # Same filters, same inverse-CDF draw: the same ids for the same uniforms.
    C = CudaBackend(device)
    logits = np.random.default_rng(3).standard_normal(500).astype(np.float32) * 3
    sp = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02,
                        repetition_penalty=1.2)
    hist = [4, 9, 9, 100]
    a = [C.sample(C.array(logits), sp, hist, np.random.default_rng(s)) for s in range(30)]
    b = [N.sample(logits, sp, hist, np.random.default_rng(s)) for s in range(30)]
    assert a == b


# --- bundled models ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("layers", [2, pytest.param(30, marks=pytest.mark.long)])
def test_smollm2_q4_1_layers_match_numpy(layers: int) -> None:
    # Every layer runs the same kernels on the same shapes, so 2 layers (with the embedding
    # and the output head) cover the path in the default suite; all 30 (~60 s on the
    # emulator, docs/cuda.md) are opt-in. Measured on all 30: logits within 7e-5 of
    # NumPy's (largest |logit| 35) on the 10-token prompt; the bound leaves float32 room.
    from inference.formats import read_checkpoint

    ckpt = read_checkpoint(smollm2_gguf())
    assert ckpt.config["num_hidden_layers"] == 30
    args = llama.ModelArgs.from_dict({**ckpt.config, "num_hidden_layers": layers})
    C = CudaBackend(EmulatedDevice(), kv_dtype=np.float32)  # half cache: test_cuda_kv_f16
    mc = llama.Model(args, C, Weights(ckpt, C))
    mn = llama.Model(args, N, Weights(ckpt, N))
    prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30]  # 10 tokens: GEMM path
    got = C.to_numpy(mc(C.array(np.array([prompt])), mc.make_cache()))
    want = mn(np.array([prompt]), mn.make_cache())
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-3)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    sp = SamplingParams(temperature=0.0)
    a = generate_step(mc, prompt[:4], sp, np.random.default_rng(0), max_len=16)
    b = generate_step(mn, prompt[:4], sp, np.random.default_rng(0), max_len=16)
    assert list(itertools.islice(a, 5)) == list(itertools.islice(b, 5))


@pytest.mark.long  # ~48 s on 2 cores: opt-in (INFERDESK_LONG=1), figures in docs/cuda.md
def test_smollm2_decode_with_q8_1_activations() -> None:
    # The default integer mat-vec through all 30 layers, 6 positions on the mat-vec path.
    # Measured: max |logit - NumPy's| 0.86 (largest |logit| 35.2: 2.4%), top-1 equal at all
    # 6, greedy equal for 15 of 16 tokens from a 4-token prompt. Bars: 5%, all 6, first 8.
    from inference.formats import read_checkpoint

    ckpt = read_checkpoint(smollm2_gguf())
    args = llama.ModelArgs.from_dict(ckpt.config)
    C = CudaBackend(EmulatedDevice(), kv_dtype=np.float32)  # the q8_1 path's own error
    assert C.q8_1_activations
    mc = llama.Model(args, C, Weights(ckpt, C))
    mn = llama.Model(args, N, Weights(ckpt, N))
    ids = np.array([[1, 9690, 198, 2683, 359, 253]])
    got = C.to_numpy(mc(C.array(ids), mc.make_cache()))
    want = mn(ids, mn.make_cache())
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()
    sp = SamplingParams(temperature=0.0)
    a = generate_step(mc, [1, 9690, 198, 2683], sp, np.random.default_rng(0), max_len=16)
    b = generate_step(mn, [1, 9690, 198, 2683], sp, np.random.default_rng(0), max_len=16)
    assert list(itertools.islice(a, 8)) == list(itertools.islice(b, 8))


@pytest.mark.slow
def test_minilm_forward_matches_numpy() -> None:
    from inference.formats import read_checkpoint

    ckpt = read_checkpoint(minilm_dir())
    args = bert.ModelArgs.from_dict(ckpt.config)
    C = CudaBackend(EmulatedDevice())
    mc, mn = bert.Model(args, C, Weights(ckpt, C)), bert.Model(args, N, Weights(ckpt, N))
    ids = np.array([[101, 7592, 2088, 999, 102, 0, 0], [101, 2023, 2003, 1037, 3231, 6251, 102]])
    mask = (ids != 0).astype(np.float32)
    pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
    types = np.zeros((2, 1), np.int64)
    got = C.to_numpy(mc(C.array(ids), C.array(pos), C.array(types), C.array(mask)))
    want = mn(ids, pos, types, mask)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    cos = (got * want).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(want, axis=-1)
    assert cos.min() >= 0.99999
