"""The captured decode step (CUDA graphs) on the emulated device.

The emulator models a capture as the list of launches it records and a replay as running
that list again through the same checked launch path, so a replayed step runs the same
kernels as a GPU's graph would, and its results can be compared with the eager step's.

Tolerances: the kernels a replay runs differ from the eager step's only in where the
position comes from (rope, attention, the KV row write) and in attention's split-K grid,
planned for the bucket's keys rather than the step's: float32 sums in another order,
atol 1e-5 on logits of magnitude ~1-10.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.backends.cuda import CudaBackend
from inference.formats import read_checkpoint
from inference.formats.tensor import TensorData
from inference.generate import prefill
from inference.models import CAUSAL, llama
from inference.sampling import SamplingParams
from kernels.cuda import ops, plan, step
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.test_cuda_backend import N, _build, tiny_llama

GREEDY = SamplingParams(temperature=0.0)
PROMPT = (1, 5, 9, 2)


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def test_position_kernels_match_the_eager_kernels() -> None:
    # Awkward shapes (head_dim 40, 3 kv heads, GQA 2, batch 2, cache rows 150), with the
    # two-order race check on. attn_vec_f32_e2_pos is planned for 150 keys but reads 98 from the
    # device: its last split sees no key and must weigh nothing.
    dev = EmulatedDevice(check_races=True)
    rng = np.random.default_rng(0)
    p = 97
    pos = dev.to_device(np.array([p], np.int32))
    x = dev.to_device(_f32(rng, 2, 1, 6, 40))
    ff = dev.to_device((1 + rng.random(20)).astype(np.float32))
    for neox in (True, False):
        got = step.rope(dev, x, pos, 1e4, neox=neox, freq_factors=ff)
        want = ops.rope(dev, x, p, 1e4, neox=neox, seq_axis=1, freq_factors=ff)
        np.testing.assert_array_equal(dev.to_host(got), dev.to_host(want))

    k = dev.to_device(_f32(rng, 2, 3, 150, 40))
    v = dev.to_device(_f32(rng, 2, 3, 150, 40))
    row = dev.to_device(_f32(rng, 2, 3, 1, 40))
    want_k = dev.to_host(k)
    want_k[:, :, p] = dev.to_host(row)[:, :, 0]
    assert step.kv_store(dev, row, k, pos) is k
    np.testing.assert_array_equal(dev.to_host(k), want_k)

    q = dev.to_device(_f32(rng, 2, 6, 1, 40))
    for softcap in (None, 5.0):
        got = step.attention(dev, q, k, v, 0.15, pos, 150, softcap=softcap)
        want = ops.attention(dev, q, k[:, :, :p + 1], v[:, :, :p + 1], 0.15, causal_offset=p,
                             softcap=softcap)
        np.testing.assert_allclose(dev.to_host(got), dev.to_host(want), rtol=0, atol=1e-6)

    a, b = (dev.to_device(_f32(rng, 3, 77)) for _ in range(2))
    np.testing.assert_array_equal(dev.to_host(step.add(dev, a, b)), dev.to_host(a) + dev.to_host(b))

    tok, ids = dev.to_device(np.array([41], np.int32)), dev.to_device(np.zeros((1, 1), np.int32))
    step.step_inputs(dev, tok, ids, pos, 12)
    assert (dev.to_host(ids)[0, 0], dev.to_host(pos)[0]) == (41, 12)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ops.KV_BF16])
def test_kv_slots_stand_for_the_buffers_they_point_to(dtype: Any) -> None:
    # A batched graph's kernels read a row's cache through its KV slot (address and stride
    # over heads in device memory): planned on a 150-row cache, they write and read a 90-row
    # one exactly as if it were passed (race check on; head_dim 64, GQA 2).
    dev = EmulatedDevice(check_races=True)
    rng = np.random.default_rng(2)
    p = 61

    def cache(rows: int) -> Any:
        return dev.to_device(ops.to_bf16_bits(np, _f32(rng, 1, 2, rows, 64)) if dtype is ops.KV_BF16
                             else _f32(rng, 1, 2, rows, 64).astype(dtype))

    planned_k, planned_v, k, v = cache(150), cache(150), cache(90), cache(90)
    before = dev.to_host(planned_k).copy()
    sh = k.strides[1] // k.itemsize
    slot = dev.to_device(np.array([dev.address(k), sh, dev.address(v), sh], np.int64))
    pos = dev.to_device(np.array([p], np.int32))
    row = dev.to_device(_f32(rng, 1, 2, 1, 64))
    want_k = dev.to_device(dev.to_host(k))
    step.kv_store(dev, row, want_k, pos)
    step.kv_store(dev, row, planned_k, pos, slot=slot[0:2])
    np.testing.assert_array_equal(dev.to_host(k), dev.to_host(want_k))
    np.testing.assert_array_equal(dev.to_host(planned_k), before)  # only the slot's buffer

    q = dev.to_device(_f32(rng, 1, 4, 1, 64))
    want = dev.to_host(step.attention(dev, q, k, v, 0.125, pos, 150, softcap=5.0))
    got = step.attention(dev, q, planned_k, planned_v, 0.125, pos, 150, softcap=5.0, slot=slot)
    np.testing.assert_array_equal(dev.to_host(got), want)

    toks = [dev.to_device(np.array([t], np.int32)) for t in (7, 300, 12)]
    addrs = dev.to_device(np.array([dev.address(t) for t in toks], np.int64))
    ids = dev.to_device(np.zeros((3, 1), np.int32))
    step.step_ids(dev, addrs, ids)
    assert dev.to_host(ids)[:, 0].tolist() == [7, 300, 12]


def test_checked_argmax_gives_minus_one_for_rows_not_finite() -> None:
    # Greedy sampling's one launch: the first maximum (NaN skipped, as unchecked), or -1
    # where the row holds a NaN or an infinity; race-checked (the flag is shared memory).
    dev = EmulatedDevice(check_races=True)
    x = np.random.default_rng(1).standard_normal((4, 3000)).astype(np.float32)
    x[1, 2999], x[2, 7], x[3, 1500] = np.nan, np.inf, -np.inf
    got = dev.to_host(ops.argmax(dev, dev.to_device(x), checked=True))
    assert got.tolist() == [int(np.argmax(x[0])), -1, -1, -1]
    assert dev.to_host(ops.argmax(dev, dev.to_device(x))).tolist()[:2] == \
        np.nanargmax(x[:2], axis=-1).tolist()


def test_a_replay_runs_the_captured_launches_as_one() -> None:
    dev = EmulatedDevice()
    a = dev.to_device(np.arange(5, dtype=np.float32))
    dev.begin_capture()
    y = step.add(dev, a, a)
    z = step.add(dev, y, a)  # y: allocated during capture, kept alive by the graph
    graph = dev.end_capture()
    assert dev.to_host(z).tobytes() == b"\xff" * 20  # captured, not run: still poisoned
    launches = dev.launches
    graph.launch()
    assert dev.launches == launches + 1
    np.testing.assert_array_equal(dev.to_host(z), 3 * np.arange(5))
    a[...] = 1  # a replay reads the buffers as they are now
    graph.launch()
    np.testing.assert_array_equal(dev.to_host(z), [3] * 5)
    assert any(k is y for k in graph.keep)


STEPS = 8  # positions 4..11
# An eager step of the 2-layer model with q8_1 activations: ops.decode_layer's launches a
# layer (plan.decode_layer_kernels), the embedding, final norm, LM head and argmax, and the
# LM head's quantize_q8_1. Float activations: 10 kernels a layer op by op, 4 more.
FUSED_LAYER = len(plan.decode_layer_kernels(plan.LayerShape()))
EAGER_Q8_1 = 2 * FUSED_LAYER + 4 + 1
EAGER_F32 = 2 * 10 + 4


@cache  # shared by the tests below: each emulated step costs ~50 ms
def _decode(graphs: bool, min_keys: int = CudaBackend.graph_min_keys, layers: int = 2,
            steps: int = STEPS, softcap: float | None = None, prompt: tuple[int, ...] = PROMPT,
            grow: bool = False) -> tuple[list[int], list[np.ndarray], list[int], Any]:
    """Greedy decode through the sampler's protocol: ids, logits, launches per step.
    ``grow``: a cache that grows in 8-row steps instead of one allocated up front."""
    cfg = {} if softcap is None else {"final_logit_softcapping": softcap}
    ckpt = tiny_llama("Q4_1", layers=layers)
    ckpt.config.update(cfg)
    dev = EmulatedDevice()
    C = CudaBackend(dev, graphs=graphs, kv_dtype=np.float32)  # NumPy's ids and logits
    C.graph_min_keys = min_keys
    model = _build(llama, ckpt, C)
    cache = model.make_cache(None if grow else 40)
    if grow:
        cache.step = 8
    sampler = C.start_generation(GREEDY, prompt, np.random.default_rng(0))
    tok = sampler.sample(C.reshape(prefill(model, prompt, cache), (96,)))
    ids, logits, launches = [], [], []
    for _ in range(steps):
        n = dev.launches
        out = sampler.decode(model, tok, cache)
        ids.append(sampler.read(tok))
        tok = sampler.sample(C.reshape(out, (96,)))
        launches.append(dev.launches - n)
        logits.append(dev.to_host(out).reshape(-1))
    return ids, logits, launches, C


def _numpy_ids(steps: int, softcap: float | None = None) -> list[int]:
    ckpt = tiny_llama("Q4_1")
    if softcap is not None:
        ckpt.config["final_logit_softcapping"] = softcap
    model = _build(llama, ckpt, N)
    cache = model.make_cache(40)
    out, ids = prefill(model, PROMPT, cache), []
    for _ in range(steps):
        ids.append(int(np.argmax(out.reshape(-1))))
        out = model(np.array([[ids[-1]]]), cache, last_only=True)
    return ids


@pytest.mark.parametrize("min_keys", [8, 256])
def test_replayed_decode_matches_eager_and_numpy(min_keys: int) -> None:
    # 256: one capture, attention planned for 256 keys with its extra splits empty.
    # 8, with a cache growing by 8 rows: positions 4..7 replay a capture for 8 keys; the
    # step at 8 grows the cache (eagerly); 9..11 replay a new capture (new buffers, 16 keys).
    eager_ids, eager_logits, eager_n, _ = _decode(graphs=False)
    ids, logits, n, C = _decode(graphs=True, min_keys=min_keys, grow=min_keys == 8)
    assert C.graph_error is None
    assert ids == eager_ids == _numpy_ids(STEPS)
    for a, b in zip(logits, eager_logits, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    # A replayed step: step_inputs, the graph, the greedy argmax; a capture step more.
    eager = EAGER_Q8_1 if C.q8_1_activations else EAGER_F32
    assert eager_n == [eager] * STEPS
    if min_keys == 8:
        assert [c == 3 for c in n] == [False, True, True, True, False, False, True, True], n
        assert n[4] == eager
    else:
        assert n[1:] == [3] * (STEPS - 1), n


def test_sampled_generation_with_penalty_matches_numpy() -> None:
    # Top-k/top-p/min-p draws with a repetition penalty whose window lives on the device
    # (extended there by each sampled id): the same uniforms draw the same ids as NumPy.
    from itertools import islice

    from inference.generate import generate_step

    sp = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02,
                        repetition_penalty=1.3, repetition_window=6)
    ckpt = tiny_llama("Q4_1")
    C = CudaBackend(EmulatedDevice(), kv_dtype=np.float32)
    C.q8_1_activations = False  # float mat-vecs: NumPy's logits, so the same draws
    got = generate_step(_build(llama, ckpt, C), list(PROMPT), sp,
                        np.random.default_rng(5), max_len=32)
    want = generate_step(_build(llama, ckpt, N), list(PROMPT), sp, np.random.default_rng(5),
                         max_len=32)
    assert list(islice(got, 8)) == list(islice(want, 8))


def test_replayed_step_launches_do_not_grow_with_layers() -> None:
    # The bound: with graphs, a decode step's Python-level launches through the
    # device are the same for 2 and 6 layers (3: inputs, graph, argmax); eager grows 10 a layer.
    two = _decode(graphs=True)[2][:2]
    six = _decode(graphs=True, layers=6, steps=2, prompt=(1,))[2]
    assert two[1] == six[1] == 3  # step 0 captured the graph
    # The capture records ops.decode_layer's launches a layer (q8_1 activations), else 14.
    per_layer = FUSED_LAYER if CudaBackend(EmulatedDevice()).q8_1_activations else 14
    assert six[0] - two[0] == 4 * per_layer


def test_final_softcap_is_captured() -> None:
    # Gemma 2's final-logit soft-cap is a kernel in a captured step (softcap_f32): every
    # step after the capture is one replay, and the ids are NumPy's.
    ids, logits, n, C = _decode(graphs=True, steps=3, softcap=3.0)
    assert C.graph_error is None and n[1:] == [3, 3]
    assert ids == _numpy_ids(3, softcap=3.0)
    assert max(abs(x).max() for x in logits) <= 3.0


class _CupySoftcap(CudaBackend):
    """A backend whose soft-cap is a CuPy operator in every step, as before it had a kernel."""

    def softcap(self, x: Any, cap: float) -> Any:
        self._eager_only("softcap")
        return (cap * self.xp.tanh(x / cap)).astype(np.float32)


def test_a_step_the_graph_cannot_hold_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    # An op a graph cannot hold refuses the capture: every step of the generation runs
    # eagerly, with the reason kept, and the ids are unchanged.
    import inference.backends.cuda as cuda_backend

    monkeypatch.setattr(cuda_backend, "CudaBackend", _CupySoftcap)
    monkeypatch.setitem(globals(), "CudaBackend", _CupySoftcap)
    ids, _, n, C = _decode.__wrapped__(graphs=True, steps=2, softcap=3.0)
    assert isinstance(C, _CupySoftcap)
    assert C.graph_error is not None and "softcap" in C.graph_error
    # n[0] also paid for the launches of the refused capture
    assert n[1] == (EAGER_Q8_1 if C.q8_1_activations else EAGER_F32)
    assert ids == _numpy_ids(2, softcap=3.0)


def test_biases_and_the_embedding_scale_are_captured() -> None:
    # Qwen2's q/k/v biases (add_f32 over each row) and Gemma's embedding scale (scale_f32)
    # are kernels in a captured step: replayed logits within 1e-5 of eager ones, NumPy's ids.
    for model_type, extra in (("qwen2", "bias"), ("llama", "scale")):
        ckpt = tiny_llama("Q4_1")
        ckpt.config["model_type"] = model_type
        rng = np.random.default_rng(3)
        if extra == "bias":
            for i in range(2):
                for n, rows in (("q", 256), ("k", 128), ("v", 128)):
                    b = (rng.standard_normal(rows) * 0.1).astype(np.float32)
                    ckpt.tensors[f"model.layers.{i}.self_attn.{n}_proj.bias"] = TensorData(
                        n, (rows,), "F32", b)
        else:
            ckpt.config["embed_scale"] = True
        runs = {}
        for graphs in (False, True):
            C = CudaBackend(EmulatedDevice(), graphs=graphs, kv_dtype=np.float32)
            model = _build(llama, ckpt, C)
            cache = model.make_cache(40)
            sampler = C.start_generation(GREEDY, PROMPT, np.random.default_rng(0))
            tok = sampler.sample(C.reshape(prefill(model, PROMPT, cache), (96,)))
            ids, logits = [], []
            for _ in range(3):
                out = sampler.decode(model, tok, cache)
                ids.append(sampler.read(tok))
                tok = sampler.sample(C.reshape(out, (96,)))
                logits.append(C.to_numpy(out).reshape(-1))
            assert C.graph_error is None, (model_type, C.graph_error)
            runs[graphs] = ids, logits
        assert runs[True][0] == runs[False][0], model_type
        for a, b in zip(runs[True][1], runs[False][1], strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
        mn = _build(llama, ckpt, N)
        cache = mn.make_cache(40)
        out, want = prefill(mn, PROMPT, cache), []
        for _ in range(3):
            want.append(int(np.argmax(out.reshape(-1))))
            out = mn(np.array([[want[-1]]]), cache, last_only=True)
        assert runs[True][0] == want, model_type


def test_profiled_decode_runs_eagerly() -> None:
    # An OpProfiler times each op of each step; a replay would hide them, so while one
    # is active every step calls the model (2 layers: 2 attention calls a forward).
    from inference.backends.base import OpProfiler
    from inference.generate import generate_step

    C = CudaBackend(EmulatedDevice())
    model = _build(llama, tiny_llama("Q4_1"), C)
    with OpProfiler(C) as prof:
        steps = generate_step(model, list(PROMPT), GREEDY, np.random.default_rng(0), max_len=16)
        [next(steps) for _ in range(3)]  # prefill and 3 decode steps (one step ahead)
        steps.close()
    assert prof.counts["attention"] == 2 * 4


TINY = Path(__file__).resolve().parents[1] / "goldens" / "tiny"


@pytest.mark.parametrize("family", sorted(CAUSAL))
def test_every_decoder_family_decodes_by_replay(family: str) -> None:
    # The tiny golden model of each decoder family (its config's switches: biases, q/k
    # norms, fused projections, Gemma's scales, soft-caps and sliding layers of window 8)
    # decodes 16 greedy tokens through captured steps: after each capture, a step is one
    # launch per distinct KV row shift (a sliding layer's row is its position minus its
    # start) plus the graph plus the argmax. Caches grow in 16-row steps, so captures
    # follow growth, and the window layers slide (start > 0) and replay past it.
    # Tolerance: replays differ from eager steps only in attention's split-K grid (planned
    # for the bucket's keys): float32 sums in another order, atol 1e-5.
    ckpt = read_checkpoint(TINY / family)
    runs = {}
    for graphs in (False, True):
        dev = EmulatedDevice()
        C = CudaBackend(dev, graphs=graphs, kv_dtype=np.float32)
        C.graph_min_keys = 8
        model = _build(llama, ckpt, C)
        cache = model.make_cache(None)
        cache.step = 16
        vocab = ckpt.config["vocab_size"]
        sampler = C.start_generation(GREEDY, PROMPT, np.random.default_rng(0))
        tok = sampler.sample(C.reshape(prefill(model, PROMPT, cache), (vocab,)))
        ids, logits, launches = [], [], []
        for _ in range(16):
            n = dev.launches
            out = sampler.decode(model, tok, cache)
            ids.append(sampler.read(tok))
            tok = sampler.sample(C.reshape(out, (vocab,)))
            launches.append(dev.launches - n)
            logits.append(dev.to_host(out).reshape(-1))
        runs[graphs] = ids, logits, launches, sampler.steps, cache
    ids, logits, launches, steps, cache = runs[True]
    assert steps.eager_reason is None
    assert ids == runs[False][0]
    for a, b in zip(logits, runs[False][1], strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    shifts = 2 if any(cache.start) else 1
    replayed = [n for n in launches if n <= shifts + 2]
    assert steps.captures >= 1 and len(replayed) >= 12, launches
    assert min(runs[False][2]) > 4 * (shifts + 2)  # an eager step: kernels of every layer
    if any(w is not None for w in cache.windows):
        assert any(cache.start) and launches[-2] == 4  # replayed after sliding
