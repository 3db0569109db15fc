"""The per-type table agrees with gguf-py and with the constants compiled into the kernels."""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from kernels.cuda.device import Device
from kernels.cuda.plan import Launch
from kernels.cuda.table import CUDA_ORDER, TYPES


def test_block_geometry_matches_gguf() -> None:
    for name, t in TYPES.items():
        qt = GGMLQuantizationType[name]
        assert qt.value == t.ggml_id
        assert GGML_QUANT_SIZES[qt] == (t.qk, t.block_bytes), name
        assert t.qk % t.ept == 0 and t.ept in (1, 16, 32)
        # K-quant scales cover 16 or 32 elements: a thread's slice must not straddle two.
        assert t.qk != 256 or t.ept == 16


def test_kernels_see_the_same_constants(dev: Device) -> None:
    out = dev.zeros((4 * len(CUDA_ORDER),), np.int32)
    dev.launch("dequant", "type_info", Launch((1, 1, 1), (32, 1, 1)), (out,))
    got = np.asarray(out if isinstance(out, np.ndarray) else out.get()).reshape(-1, 4)
    for (qk, nbytes, ept, dp4a), name in zip(got.tolist(), CUDA_ORDER, strict=True):
        t = TYPES[name]
        assert (qk, nbytes, ept, bool(dp4a)) == (t.qk, t.block_bytes, t.ept, t.dp4a), name


def test_attention_and_mat_vec_limits_match_the_source() -> None:
    import re

    from kernels.cuda import table
    from kernels.cuda.device import kernel_source, source_path

    src = kernel_source("attention")  # the defines live in attention.cuh
    defines = dict(re.findall(r"#define (ATTN_MAX_\w+) (\d+)", src))
    assert int(defines["ATTN_MAX_D"]) == table.ATTN_MAX_HEAD_DIM
    assert int(defines["ATTN_MAX_ROWS"]) == table.ATTN_MAX_ROWS
    assert int(re.search(r"#define ATTN_TILE (\d+)", src).group(1)) == table.ATTN_TILE
    mmv = source_path("mmv").read_text()
    assert int(re.search(r"#define MMVQ_ROWS (\d+)", mmv).group(1)) == table.MMVQ_ROWS
    assert int(re.search(r"#define MMVQ_COLS (\d+)", mmv).group(1)) == table.MMVQ_COLS
    assert int(re.search(r"#define MMVQ_W_WORDS (\d+)", mmv).group(1)) == table.MMVQ_W_WORDS
    x_words = re.search(r"#define MMVQ_X_WORDS \(MMVQ_COLS / 32 \* Q8_1_BYTES / 16\)", mmv)
    assert x_words and table.MMVQ_X_WORDS == table.MMVQ_COLS // 32 * table.Q8_1_BYTES // 16
    dq = source_path("dequant").read_text()
    assert int(re.search(r"#define DQ_W_WORDS (\d+)", dq).group(1)) == table.DQ_W_WORDS
    assert int(re.search(r"#define DQ_MAX_SEGS (\d+)", dq).group(1)) == table.DQ_MAX_SEGS
    tiles = sorted(int(n) for n in re.findall(r"^MMVQ_SMEM\((\d+)\)$", mmv, re.M))
    assert tuple(tiles) == table.MMV_TILES
    assert int(re.search(r"#define Q8_1_BYTES (\d+)", source_path("q8_1").with_suffix(
        ".cuh").read_text()).group(1)) == table.Q8_1_BYTES


def test_every_dp4a_type_has_a_kernel_per_batch_tile() -> None:
    from kernels.cuda.device import source_path
    from kernels.cuda.table import MMV_TILES, mmv_kernel
    from tests.kernels.emulator.build import scan_kernels

    names = set(scan_kernels(source_path("mmv")))
    want = {mmv_kernel(t, n, "q") for t in TYPES.values() if t.dp4a for n in MMV_TILES}
    rope = {f"mul_mat_vec_q_rope_kv_{t.suffix}_{kv}" for t in TYPES.values() if t.dp4a
            for kv in ("f32", "f16", "bf16")}  # ops.QKV_ROPE_KV
    norm_add = {f"mul_mat_vec_q_norm_add_{t.suffix}" for t in TYPES.values() if t.dp4a}
    assert want | rope | norm_add <= names
    assert {n for n in names if n.startswith("mul_mat_vec_q_")} == want | rope | norm_add


def test_float_and_16bit_mat_vecs_have_a_kernel_per_batch_tile() -> None:
    from kernels.cuda.device import source_path
    from kernels.cuda.table import HALF_TYPES, MMV_TILES, mmv_kernel
    from tests.kernels.emulator.build import scan_kernels

    names = set(scan_kernels(source_path("mmv")))
    want = {mmv_kernel(t, n) for t in TYPES.values() for n in MMV_TILES}
    want_h = {mmv_kernel(TYPES[h], n, "h") for h in HALF_TYPES for n in MMV_TILES}
    assert want | want_h <= names
    assert {n for n in names if n.startswith("mul_mat_vec_h_")} == want_h
