"""Dequantization must equal gguf.quants (the oracle) bit for bit, and mlx for "MLX"."""

from __future__ import annotations

import time

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as oracle

from inference.errors import UnsupportedModelError
from inference.formats.quants import (
    BLOCK_TYPES,
    MLX_GROUP_SIZES,
    block_type,
    dequantize,
    dequantize_mlx,
    dequantize_raw,
    unpack_mlx,
)
from inference.formats.tensor import TensorData
from tests.bundled import smollm2_gguf

# rows x blocks per row; the last crosses the kernels' chunk boundary for every type.
SHAPES = [(1, 1), (3, 5), (17, 2), (9, 600)]


def random_rows(qtype: str, rows: int, blocks: int, seed: int = 0) -> np.ndarray:
    """Random bytes, with every float16 scale field replaced by a finite value."""
    rng = np.random.default_rng(seed)
    bt = BLOCK_TYPES[qtype]
    raw = rng.integers(0, 256, (rows, blocks * bt.type_size), dtype=np.uint8)
    view = raw.reshape(rows, blocks, bt.type_size)
    for fname in ("d", "dmin", "m"):
        if fname in bt.layout:
            off, _ = bt.layout[fname]
            scale = (rng.standard_normal((rows, blocks)) * 0.05).astype(np.float16)
            view[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, blocks, 2)
    return raw


@pytest.mark.parametrize("qtype", list(BLOCK_TYPES))
@pytest.mark.parametrize("rows,blocks", SHAPES)
def test_equals_gguf_oracle(qtype: str, rows: int, blocks: int) -> None:
    raw = random_rows(qtype, rows, blocks, seed=rows * 1000 + blocks)
    ref = oracle(raw, gguf.GGMLQuantizationType[qtype])
    got = dequantize_raw(raw, qtype)
    assert got.dtype == np.float32
    assert got.shape == ref.shape == (rows, blocks * BLOCK_TYPES[qtype].block_size)
    assert np.array_equal(got, ref, equal_nan=True)


def test_table_agrees_with_gguf() -> None:
    for name, bt in BLOCK_TYPES.items():
        q = gguf.GGMLQuantizationType[name]
        assert (bt.block_size, bt.type_size) == gguf.GGML_QUANT_SIZES[q], name
        assert bt.ggml_id == int(q), name
        assert bt.block_size % bt.sub_block == 0, name
        # fields tile the block without overlap
        spans = sorted(bt.layout.values())
        assert spans[0][0] == 0 and sum(n for _, n in spans) == bt.type_size, name
    assert BLOCK_TYPES["Q4_K"].bits_per_weight == 4.5
    assert BLOCK_TYPES["Q8_0"].row_bytes(64) == 68


def test_q4_0_nibble_order() -> None:
    # d = 1.0; byte i holds element i (low nibble) and element i + 16 (high nibble).
    block = np.zeros(18, dtype=np.uint8)
    block[0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)
    block[2:] = np.arange(16, dtype=np.uint8) | (15 - np.arange(16, dtype=np.uint8)) << 4
    got = dequantize_raw(block[None, :], "Q4_0")[0]
    assert got[:16].tolist() == [float(i - 8) for i in range(16)]
    assert got[16:].tolist() == [float(7 - i) for i in range(16)]


def test_float_types_and_tensordata() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    assert np.array_equal(dequantize(TensorData("a", x.shape, "F32", x)), x)
    h = x.astype(np.float16)
    assert np.array_equal(dequantize(TensorData("b", x.shape, "F16", h)), h.astype(np.float32))
    bf_bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated bf16
    bf_raw = bf_bits.view(np.uint8).reshape(4, 6, 16)
    want = (bf_bits.astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(dequantize(TensorData("c", x.shape, "BF16", bf_raw)), want)
    q = random_rows("Q6_K", 6, 1).reshape(2, 3, -1)
    out = dequantize(TensorData("d", (2, 3, 256), "Q6_K", q))
    assert out.shape == (2, 3, 256)
    assert np.array_equal(out.reshape(6, 256), oracle(q.reshape(6, -1),
                                                      gguf.GGMLQuantizationType.Q6_K))


def test_unknown_type_is_typed_error() -> None:
    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        dequantize(TensorData("blk.0.w", (1, 256), "IQ2_XXS", np.zeros((1, 66), np.uint8)))
    with pytest.raises(UnsupportedModelError):
        block_type("Q1_5")


# --- MLX affine quantization, against mlx itself -------------------------------------------

mx = pytest.importorskip("mlx.core")


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("group", MLX_GROUP_SIZES)
def test_mlx_equals_mlx_dequantize(bits: int, group: int) -> None:
    rng = np.random.default_rng(bits * 7 + group)
    w = mx.array(rng.standard_normal((5, 384)).astype(np.float32))
    q, s, b = mx.quantize(w, group_size=group, bits=bits)
    ref = np.array(mx.dequantize(q, s, b, group_size=group, bits=bits))
    got = dequantize_mlx(np.array(q), np.array(s), np.array(b), group, bits)
    assert np.array_equal(got, ref)
    t = TensorData("w", (5, 384), "MLX", np.array(q),
                   {"scales": np.array(s), "biases": np.array(b), "group_size": group,
                    "bits": bits})
    assert np.array_equal(dequantize(t), ref)


@pytest.mark.parametrize("bits", [3, 4, 6])
def test_mlx_half_scales(bits: int) -> None:
    # With float16 scales mlx rounds scale*q+bias in half precision; we return float32,
    # so the oracle is mlx on the same codes with the scales widened to float32.
    rng = np.random.default_rng(bits)
    w = mx.array(rng.standard_normal((3, 256)).astype(np.float16))
    q, s, b = mx.quantize(w, group_size=64, bits=bits)
    s32, b32 = s.astype(mx.float32), b.astype(mx.float32)
    ref = np.array(mx.dequantize(q, s32, b32, group_size=64, bits=bits))
    got = dequantize_mlx(np.array(q), np.array(s), np.array(b), 64, bits)
    assert np.array_equal(got, ref)


def test_mlx_codes_are_a_little_endian_bitstream() -> None:
    codes = np.arange(32, dtype=np.uint64) % 8  # 3-bit codes 0..7 repeated
    stream = sum(int(c) << (3 * i) for i, c in enumerate(codes))
    words = np.array([(stream >> (32 * k)) & 0xFFFFFFFF for k in range(3)], dtype=np.uint32)
    assert unpack_mlx(words[None, :], 3)[0].tolist() == codes.tolist()


# --- the whole bundled model, timed ---------------------------------------------------------

def test_whole_smollm2_dequantizes_fast_and_exactly() -> None:
    from inference.formats.gguf_file import open_gguf  # gguf.GGUFReader, opened faster

    reader = open_gguf(smollm2_gguf())
    t0 = time.perf_counter()
    outs = {t.name: dequantize_raw(t.data, t.tensor_type.name) for t in reader.tensors}
    elapsed = time.perf_counter() - t0
    assert sum(o.size for o in outs.values()) == 134_515_008
    # Measured ~0.6 s on a quiet 2-core machine; the sanity bound is far above what a busy
    # machine adds and only catches a return to per-block Python (minutes).
    assert elapsed < 60.0, f"dequantizing SmolLM2 took {elapsed:.2f} s"
    for t in reader.tensors:
        if t.name in ("blk.3.attn_q.weight", "blk.29.ffn_down.weight", "output_norm.weight"):
            assert np.array_equal(outs[t.name], oracle(t.data, t.tensor_type))
