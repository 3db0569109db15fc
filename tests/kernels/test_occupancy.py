"""The occupancy rules (tests/kernels/occupancy.py) against figures of NVIDIA's occupancy
calculator; the table in docs/cuda.md against ptxas (tests/kernels/test_nvcc.py)."""

from __future__ import annotations

import pytest

from tests.kernels.nvcc_check import Resources
from tests.kernels.occupancy import blocks_per_sm


def _r(registers: int, smem: int = 0) -> Resources:
    return Resources(registers, 0, 0, 0, smem, 1)


@pytest.mark.parametrize(("arch", "regs", "threads", "smem", "want"), [
    # 64 registers x 256 threads: 2,048 registers a warp, 32 warps by the register file
    ("sm_86", 64, 256, 0, (4, "registers")),
    ("sm_80", 32, 256, 0, (8, "warps")),  # 64 warps / 8
    ("sm_75", 32, 32, 0, (16, "blocks")),  # Turing: at most 16 blocks
    # the tiled attention kernel's 42,112 static bytes: 1 block on Turing's 64 KB, 2 on
    # sm_86/89's 100 KB (1 KB reserved per block), 3 on sm_80's 164 KB
    ("sm_75", 58, 256, 42112, (1, "shared")),
    ("sm_89", 58, 256, 42112, (2, "shared")),
    ("sm_80", 58, 256, 42112, (3, "shared")),
    ("sm_89", 255, 128, 0, (2, "registers")),  # 255 rounds to 256: 8,192 a warp
])
def test_blocks_per_sm(arch: str, regs: int, threads: int, smem: int, want: tuple) -> None:
    assert blocks_per_sm(_r(regs, smem), arch, threads) == want
