"""GGML blocks as affine groups of 32 (inference.formats.affine), against dequantize_raw.

Exact means equal values (``np.array_equal``: -0.0 and +0.0 count as equal, the only
difference there is): the groups' terms folded back per weight in float64 give the file's
float32 weights, for every GGML type, on random blocks (every code and scale pattern) and
on gguf-py's quantizer output.
"""

from __future__ import annotations

import gguf.quants as gq
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from inference.formats.affine import (
    AFFINE_TYPES,
    block_groups,
    collapse,
    expand_activation,
    pack_codes,
    to_affine,
)
from inference.formats.quants import (
    BLOCK_TYPES,
    MLX_BITS,
    dequantize_mlx,
    dequantize_raw,
    unpack_mlx,
)
from tests.bundled import random_blocks

GGML = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

# Bits per weight, codes plus float32 (float16) scale and bias per group of 32 codes.
BITS_PER_WEIGHT = {"Q4_0": (6, 5), "Q4_1": (6, 5), "Q5_0": (7, 6), "Q5_1": (7, 6),
                   "Q8_0": (10, 9), "Q4_K": (6, 5), "Q5_K": (7, 6), "Q3_K": (10, 9),
                   "Q2_K": (8, 6), "Q6_K": (10, 8)}


def test_every_ggml_type_has_an_affine_form():
    assert set(AFFINE_TYPES) == set(GGML)
    assert {t.bits for t in AFFINE_TYPES.values()} <= set(MLX_BITS)


@pytest.mark.parametrize("qtype", GGML)
def test_groups_fold_back_to_the_file_weights(qtype):
    raw = random_blocks(qtype, 24, 512, seed=GGML.index(qtype))
    w, s, z, at = to_affine(raw, qtype)
    codes = unpack_mlx(w, at.bits)
    assert codes.max() < 1 << at.bits
    np.testing.assert_array_equal(collapse(codes, s, z, qtype), dequantize_raw(raw, qtype))


@pytest.mark.parametrize("qtype", GGML)
def test_block_groups_shapes(qtype):
    bt, at = BLOCK_TYPES[qtype], AFFINE_TYPES[qtype]
    raw = random_blocks(qtype, 2, 512).reshape(-1, bt.type_size)
    codes, s, z = block_groups(raw, qtype)
    per = bt.block_size * at.codes_per_weight
    assert codes.shape == (len(raw), per) and codes.dtype == np.uint8
    assert np.broadcast_shapes(s.shape, z.shape, (len(raw), per // 32)) == (len(raw), per // 32)
    assert s.dtype == z.dtype == np.float32


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_real_quantizer_output(qtype):
    x = np.random.default_rng(3).standard_normal((40, 256)).astype(np.float32)
    raw = gq.quantize(x, GGMLQuantizationType[qtype])
    w, s, z, at = to_affine(raw, qtype)
    np.testing.assert_array_equal(collapse(unpack_mlx(w, at.bits), s, z, qtype),
                                  gq.dequantize(raw, GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", GGML)
def test_bits_per_weight(qtype):
    at = AFFINE_TYPES[qtype]
    assert (at.bits_per_weight(4), at.bits_per_weight(2)) == BITS_PER_WEIGHT[qtype]
    raw = random_blocks(qtype, 8, 512)
    w, s, z, _ = to_affine(raw, qtype)
    assert 8 * (w.nbytes + s.nbytes + z.nbytes) == BITS_PER_WEIGHT[qtype][0] * 8 * 512


@pytest.mark.parametrize("qtype", ["Q2_K", "Q6_K"])
def test_expanded_activation_times_groups_is_the_matmul(qtype):
    # The float64 product of the expanded activation with the groups' per-code values is
    # x @ W.T up to the float32 rounding of x / div (Q6_K: div 9; relative 2**-24).
    raw = random_blocks(qtype, 16, 512, seed=5)
    w, s, z, at = to_affine(raw, qtype)
    codes = unpack_mlx(w, at.bits).reshape(16, -1, 32).astype(np.float64)
    per_code = (codes * s[..., None] + z[..., None]).reshape(16, -1)
    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    got = expand_activation(x, at.expand).astype(np.float64) @ per_code.T
    ref = dequantize_raw(raw, qtype).astype(np.float64)
    want = x.astype(np.float64) @ ref.T
    bound = 2.0 ** -23 * (np.abs(x).astype(np.float64) @ np.abs(ref).T)
    assert (np.abs(got - want) <= bound).all()


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_codes_round_trip(bits):
    codes = np.random.default_rng(bits).integers(0, 1 << bits, size=(4, 64), dtype=np.uint8)
    packed = pack_codes(codes, bits)
    ones = np.ones((4, 2), np.float32)
    np.testing.assert_array_equal(dequantize_mlx(packed, ones, 0 * ones, 32, bits), codes)
