"""The bench's explanation of decode speed: the per-token split inside / outside backend
ops, and the one-row mat-vec speed per weight type of the file. Figures are not checked
(the suite asserts no speed), only that they are measured from the real model and add up."""

from __future__ import annotations

from inference.bench.kernels import decode_breakdown, weight_types
from inference.formats import read_checkpoint


def test_decode_breakdown_splits_each_token(smollm2):
    ids = smollm2.tokenize("The old lighthouse keeper")
    d = decode_breakdown(smollm2, ids, 3)
    assert d["tokens"] == 3
    # Inside + outside is the wall time, to the rounding of each figure (1e-3 ms).
    assert abs(d["ops_ms_per_token"] + d["outside_ops_ms_per_token"] - d["ms_per_token"]) < 0.01
    assert d["ops_ms_per_token"] > 0 and d["outside_ops_ms_per_token"] >= 0
    # Every layer runs its linears: at least 7 linear calls per layer per token.
    assert d["op_calls_per_token"] >= 7 * len(smollm2.model.layers)
    assert "linear" in d["top_ops_ms_per_token"]
    assert smollm2.backend.__dict__.keys().isdisjoint({"linear"})  # profiling switched off


def test_weight_types_cover_each_type_of_the_file(smollm2):
    ckpt = read_checkpoint(smollm2.spec.path)
    got = weight_types(ckpt, smollm2.backend)
    want = {t.qtype for t in ckpt.tensors.values() if len(t.shape) == 2}
    assert set(got) == want  # SmolLM2's file: Q4_1 layers and a Q8_0 embedding/output
    for qtype, w in got.items():
        t = ckpt.tensors[w["tensor"]]
        assert t.qtype == qtype and list(t.shape) == w["shape"]
        assert w["gweights_s"] > 0
