"""Occupancy from ptxas's figures: how many blocks (and warps) of each kernel an SM holds.

For each architecture nvcc_check compiles for, the SM's limits (CUDA C Programming Guide,
"Compute capabilities" table; CUDA occupancy calculator rules): an SM runs at most
``max_blocks`` blocks and ``max_warps`` warps; registers are allocated per warp in units of
256 (a thread's count rounded up to a multiple of 8); shared memory per block is the static
``__shared__`` ptxas reports plus the planner's dynamic bytes, plus ``reserved`` bytes the
system keeps per block (sm_80+), and is rounded up to the allocation unit. A kernel's
resident blocks per SM is the least the four limits allow.

    python -m tests.kernels.occupancy     # the table, as docs/cuda.md holds it
"""

from __future__ import annotations

from dataclasses import dataclass

from kernels.cuda import plan, table
from tests.kernels.nvcc_check import ARCHS, Resources


@dataclass(frozen=True)
class SmLimits:
    max_warps: int
    max_blocks: int
    registers: int  # 32-bit registers per SM
    shared: int  # bytes of shared memory an SM can give its blocks
    reserved: int  # bytes of shared memory the system keeps per block
    shared_unit: int = 128  # allocation granularity, bytes
    reg_unit: int = 256  # registers allocated per warp in units of this many


SM_LIMITS = {
    "sm_75": SmLimits(32, 16, 65536, 64 * 1024, 0, 256),
    "sm_80": SmLimits(64, 32, 65536, 164 * 1024, 1024),
    "sm_86": SmLimits(48, 16, 65536, 100 * 1024, 1024),
    "sm_89": SmLimits(48, 24, 65536, 100 * 1024, 1024),
    "sm_90": SmLimits(64, 32, 65536, 228 * 1024, 1024),
}
assert set(SM_LIMITS) == set(ARCHS)


def _up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def blocks_per_sm(r: Resources, arch: str, threads: int, dynamic_smem: int = 0
                  ) -> tuple[int, str]:
    """(resident blocks of ``threads`` threads, the limit that binds: warps, blocks,
    registers or shared)."""
    sm = SM_LIMITS[arch]
    warps = -(-threads // 32)
    per_warp = _up(max(r.registers, 1) * 32, sm.reg_unit)
    limits = {"warps": sm.max_warps // warps, "blocks": sm.max_blocks,
              "registers": (sm.registers // per_warp) // warps}
    smem = r.smem + dynamic_smem
    if smem:
        limits["shared"] = sm.shared // _up(smem + sm.reserved, sm.shared_unit)
    bound = min(limits, key=lambda k: (limits[k], k != "warps"))
    return limits[bound], bound


# The launch each kernel is judged at: the largest block its planner picks (the budget's
# max_threads) and, for kernels with dynamic shared memory, a typical decode shape.
ATTN_VEC_TYPICAL = (128, 4)  # head_dim, rows (a 7B/8B model: GQA 4)


def launch_of(kernel: str) -> tuple[int, int]:
    """(threads, dynamic shared bytes) the table assumes for ``kernel``."""
    b = table.budget(kernel)
    if kernel.startswith("attn_vec_"):
        d, rows = ATTN_VEC_TYPICAL
        return 32 * plan.ATTN_VEC_WARPS, plan.attn_vec_shared_bytes(d, rows)
    return b.max_threads, 0


BEGIN = "<!-- occupancy table: python -m tests.kernels.occupancy -->"
END = "<!-- end of the occupancy table -->"


def occupancy_table(res: dict[tuple[str, str], Resources]) -> str:
    """A Markdown table: per kernel and architecture, registers, shared bytes (static +
    dynamic) and resident blocks / warps per SM, with the binding limit."""
    kernels = sorted({k for k, _ in res})
    head = "| kernel | threads | " + " | ".join(ARCHS) + " |"
    rule = "|---|---:|" + "---:|" * len(ARCHS)
    lines = [head, rule]
    for k in kernels:
        threads, dyn = launch_of(k)
        cells = []
        for a in ARCHS:
            r = res[(k, a)]
            blocks, bound = blocks_per_sm(r, a, threads, dyn)
            warps = blocks * -(-threads // 32)
            cells.append(f"{r.registers} r, {r.smem + dyn} B: {blocks} / {warps} ({bound})")
        lines.append(f"| {k} | {threads} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    from tests.kernels.nvcc_check import compile_all

    res, _ = compile_all()
    print(occupancy_table(res), end="")


if __name__ == "__main__":
    main()
