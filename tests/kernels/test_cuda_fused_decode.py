"""The CUDA backend's decode step through ops.decode_layer (the fused layer), eager and
captured, against the same backend running the decoder block op by op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inference.backends.cuda import CudaBackend
from inference.formats.tensor import TensorData
from inference.generate import prefill
from inference.models import llama
from kernels.cuda import plan
from tests.kernels.emulator.device import EmulatedDevice
from tests.kernels.test_cuda_backend import _build, tiny_llama
from tests.kernels.test_cuda_graphs import GREEDY, PROMPT

STEPS = 5
VOCAB = 96


def _family(family: str) -> Any:
    """tiny_llama's Q8_0 layers (head_dim 64, GQA 2) with a family's switches: Qwen2's
    q/k/v biases, Phi-3's fused qkv_proj and gate_up_proj tensors, Gemma's GELU, (1 + w)
    norms and embedding scale; Qwen3's and Gemma 3's per-head q/k norms; Gemma 2/3's norms
    after attention and MLP, soft-caps and a sliding first layer (a window of 4 keys,
    which the 9 positions of a generation outgrow)."""
    ckpt = tiny_llama("Q8_0")
    cfg, ts = ckpt.config, ckpt.tensors
    cfg["model_type"] = family
    rng = np.random.default_rng(3)
    if family in ("gemma2", "gemma3_text"):
        cfg.update(sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                   query_pre_attn_scalar=64)
        if family == "gemma2":
            cfg.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        else:
            cfg["rope_local_base_freq"] = 1e4
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if family in ("qwen3", "gemma3_text"):
            for n in ("q_norm", "k_norm"):
                w = rng.uniform(0.5, 1.5, 64).astype(np.float32)
                ts[p + f"self_attn.{n}.weight"] = TensorData(n, (64,), "F32", w)
        if family in ("gemma2", "gemma3_text"):
            for n in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                w = rng.uniform(-0.2, 0.2, 256).astype(np.float32)
                ts[p + n + ".weight"] = TensorData(n, (256,), "F32", w)
        if family == "qwen2":
            for n, rows in (("q", 256), ("k", 128), ("v", 128)):
                b = (rng.standard_normal(rows) * 0.5).astype(np.float32)
                ts[p + f"self_attn.{n}_proj.bias"] = TensorData(n, (rows,), "F32", b)
        if family == "phi3":
            for fused, parts in (("self_attn.qkv_proj", ["self_attn.q_proj", "self_attn.k_proj",
                                                          "self_attn.v_proj"]),
                                 ("mlp.gate_up_proj", ["mlp.gate_proj", "mlp.up_proj"])):
                tds = [ts.pop(p + n + ".weight") for n in parts]
                rows = sum(t.shape[0] for t in tds)
                data = np.concatenate([t.data for t in tds])
                ts[p + fused + ".weight"] = TensorData(fused, (rows, tds[0].shape[1]),
                                                       tds[0].qtype, data)
    if family.startswith("gemma"):
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
    return ckpt


def _decode(family: str, kv: Any, fused: bool, graphs: bool
            ) -> tuple[list[int], list[np.ndarray], CudaBackend, Any, Any]:
    dev = EmulatedDevice()
    C = CudaBackend(dev, graphs=graphs, kv_dtype=kv)
    C.graph_min_keys = 16
    if not fused:
        C.decode_layer = lambda block, x, cache: None  # type: ignore[method-assign]
    model = _build(llama, _family(family), C)
    cache = model.make_cache(40)
    sampler = C.start_generation(GREEDY, PROMPT, np.random.default_rng(0))
    tok = sampler.sample(C.reshape(prefill(model, PROMPT, cache), (VOCAB,)))
    ids, logits = [], []
    for _ in range(STEPS):
        out = sampler.decode(model, tok, cache)
        ids.append(sampler.read(tok))
        tok = sampler.sample(C.reshape(out, (VOCAB,)))
        logits.append(dev.to_host(out).reshape(-1))
    return ids, logits, C, sampler.steps, model


@pytest.mark.parametrize("family, kv", [("llama", np.float32), ("mistral", np.float16),
                                        ("qwen2", np.float16), ("phi3", np.float32),
                                        ("gemma", np.float16), ("qwen3", np.float16),
                                        ("gemma2", np.float32), ("gemma3_text", np.float16),
                                        ("qwen3", "bfloat16"), ("gemma3_text", "bfloat16")])
def test_fused_decode_layer_matches_the_op_by_op_step(family: str, kv: Any) -> None:
    # Greedy ids equal and logits within 1e-5 of the op-by-op step, eager and replayed.
    # Tolerance: the fused kernels store what the unfused ones store (test_cuda_fused.py,
    # bit for bit) but a replay plans attention's split-K grid for the bucket's keys, and
    # the eager step for the keys it has: float32 sums in another order. The per-head q/k
    # norms and the norms after attention and MLP (Qwen3, Gemma 2/3) sum their squares in
    # another order too: 1e-4 there (logits of norm ~10, float32 rounding through 2 layers).
    atol = 1e-4 if family in ("qwen3", "gemma2", "gemma3_text") else 1e-5
    ref_ids, ref_logits, _, _, _ = _decode(family, kv, fused=False, graphs=False)
    for graphs in (False, True):
        ids, logits, C, steps, model = _decode(family, kv, fused=True, graphs=graphs)
        assert ids == ref_ids
        for a, b in zip(logits, ref_logits, strict=True):
            np.testing.assert_allclose(a, b, rtol=0, atol=atol)
        assert all(C._fused.get(b) is not None for b in model.layers)  # every layer fused
        if graphs:
            assert steps.eager_reason is None and steps.replays >= STEPS - 1
            names = [n for _, n, _, _ in steps.graph.graph.launches]
            splits = 2 if "attn_combine_f32" in names else 1
            shape = C._fused[model.layers[0]].shape(attention_splits=splits)
            stems = plan.decode_layer_kernels(shape)
            assert len(stems) == 8 + (splits > 1)
            first = names.index("rms_norm_q8_1")
            per_layer = [names[first + j * len(stems):first + (j + 1) * len(stems)]
                         for j in range(2)]
            for got in per_layer:
                assert len(got) == len(stems)
                assert all(n.startswith(s) for n, s in zip(got, stems, strict=True)), names
                assert any(n.startswith("mul_mat_vec_q_norm_add") for n in got) == (
                    shape.sandwich_norms), names
            assert names[first + 2 * len(stems)] == "rms_norm_f32", names  # the final norm
