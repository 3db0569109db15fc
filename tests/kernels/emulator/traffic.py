"""The emulator's memory-transaction model: 32-byte sectors per warp-level load/store.

A GPU serves a warp's load or store instruction in 32-byte sectors: the instruction costs
every sector that any of its active lanes touches, used or not. The emulator logs each
lane's typed global access (``ld_global``/``st_global`` in common.cuh, and the functions built
on them); accesses of the lanes of one warp that reach the same site for the n-th time
between the same two barriers form one instruction. Per kernel argument this gives:

- **sector efficiency** = bytes the lanes asked for / (32 x sectors the instructions
  touched), nvprof's gld_efficiency: 100% when consecutive lanes read consecutive words;
- **bytes moved per useful byte** = 32 x sectors / distinct bytes of the argument the
  kernel touched at all: 1.0 when a buffer is streamed exactly once, more when it is read
  by several warps (x in a mat-vec) or in partial sectors.

A model, not a profiler: it sees only accesses through those functions (plain pointer
dereferences are invisible), assumes no cache, and counts shared memory not at all.

    python -m tests.kernels.emulator.traffic     # the decode mat-vec tables of docs/cuda.md
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.cuda.plan import Launch
from tests.kernels.emulator.device import EmulatedDevice

SECTOR = 32


@dataclass
class Stream:
    """One kernel argument's loads (or stores), summed over launches."""

    instructions: int = 0  # warp-level instructions
    requested: int = 0  # bytes the active lanes asked for
    sectors: int = 0  # 32-byte sectors those instructions touched (a sector per instruction)
    footprint: int = 0  # distinct bytes of the argument touched, per launch

    @property
    def efficiency(self) -> float:
        return self.requested / (SECTOR * self.sectors) if self.sectors else 1.0

    @property
    def moved_per_useful(self) -> float:
        return SECTOR * self.sectors / self.footprint if self.footprint else 0.0

    @property
    def bytes_moved(self) -> int:
        return SECTOR * self.sectors

    def add(self, other: Stream) -> None:
        self.instructions += other.instructions
        self.requested += other.requested
        self.sectors += other.sectors
        self.footprint += other.footprint


def analyze(events: np.ndarray, buffers: list[tuple[int, int]]) -> dict[tuple[int, str], Stream]:
    """Group one launch's access log into instructions; key (argument index, "load" or
    "store"). buffers[i] = (address, bytes) of argument i, or (0, 0) for a non-array."""
    out: dict[tuple[int, str], Stream] = {}
    if events.size == 0:
        return out
    starts = np.array([b[0] for b in buffers], np.uint64)
    order = np.argsort(starts)
    # the argument whose buffer starts at or before the address (aligned loads may run up
    # to 15 bytes past a buffer's end; never before its start)
    pos = np.searchsorted(starts[order], events["addr"], side="right") - 1
    arg = order[np.maximum(pos, 0)]
    key = np.stack([arg, events["store"], events["block"], events["warp"], events["site"],
                    events["epoch"], events["inst"]], 1).astype(np.int64)
    _, inst = np.unique(key, axis=0, return_inverse=True)
    inst = inst.reshape(-1)
    first = events["addr"] // SECTOR
    last = (events["addr"] + events["size"] - 1) // SECTOR
    sec_inst = np.concatenate([inst, inst[last != first]])
    sec = np.concatenate([first, last[last != first]]).astype(np.int64)
    sec_arg = np.concatenate([arg, arg[last != first]])
    sec_store = np.concatenate([events["store"], events["store"][last != first]])
    uniq = np.unique(np.stack([sec_inst, sec], 1), axis=0, return_index=True)[1]
    for a in np.unique(arg):
        for st, kind in ((0, "load"), (1, "store")):
            m = (arg == a) & (events["store"] == st)
            if not m.any():
                continue
            ev = events[m]
            nbytes = ev["size"].astype(np.int64)
            touched = np.unique(np.repeat(ev["addr"].astype(np.int64), nbytes)
                                + (np.arange(nbytes.sum()) - np.repeat(np.cumsum(nbytes) - nbytes,
                                                                        nbytes)))
            out[(int(a), kind)] = Stream(
                instructions=len(np.unique(inst[m])),
                requested=int(nbytes.sum()),
                sectors=int(((sec_arg[uniq] == a) & (sec_store[uniq] == st)).sum()),
                footprint=int(touched.size))
    return out


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = 256) -> np.ndarray:
    """A host buffer starting `align`-aligned, as cudaMalloc's are (256 bytes), with 16
    bytes of slack after it for kernels that load whole aligned words."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + align + 16, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + n].view(dtype).reshape(shape)


class TrafficDevice(EmulatedDevice):
    """An emulated device that runs the memory model on every launch:
    ``traffic[kernel][(argument index, "load"|"store")]`` is a :class:`Stream`. Buffers are
    256-byte aligned like cudaMalloc's (sector counts depend on it) and have no guard
    pages: bounds are the plain EmulatedDevice's job."""

    name = "cuda-emulator-traffic"

    def __init__(self) -> None:
        super().__init__(check_races=False)
        self.traffic: dict[str, dict[tuple[int, str], Stream]] = {}

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        out = aligned_empty(shape, dtype)
        out[...] = np.frombuffer(b"\xff" * out.itemsize, out.dtype)[0]  # poison, as the base
        return out

    def launch(self, module: str, name: str, launch: Launch, args: tuple[Any, ...]) -> None:
        with recording() as log:
            super().launch(module, name, launch, args)
        bufs = [(a.ctypes.data, a.nbytes) if isinstance(a, np.ndarray) else (0, 0) for a in args]
        per_kernel = self.traffic.setdefault(name, {})
        for _, events in log:
            for k, s in analyze(events, bufs).items():
                per_kernel.setdefault(k, Stream()).add(s)


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, np.ndarray]]]:
    """Log every emulated launch in the block (module.access_log)."""
    from tests.kernels.emulator import module

    saved, module.access_log = module.access_log, []
    try:
        yield module.access_log
    finally:
        module.access_log = saved


# --- the decode mat-vec report (docs/cuda.md) -------------------------------------

# Llama 2 7B in llama.cpp's Q4_K_M mix: (name, rows, cols, count per token, type). attn_v and
# ffn_down are Q6_K in 16 of the 32 layers (use_more_bits: the first and last 4, and every
# third between), Q4_K in the rest; the output head is Q6_K; the embedding reads one row.
LLAMA2_7B_Q4_K_M = (
    ("attn_q, attn_k, attn_output", 4096, 4096, 3 * 32, "Q4_K"),
    ("attn_v", 4096, 4096, 16, "Q4_K"),
    ("attn_v", 4096, 4096, 16, "Q6_K"),
    ("ffn_gate, ffn_up", 11008, 4096, 2 * 32, "Q4_K"),
    ("ffn_down", 4096, 11008, 16, "Q4_K"),
    ("ffn_down", 4096, 11008, 16, "Q6_K"),
    ("output", 32000, 4096, 1, "Q6_K"),
)
# Published peak DRAM bandwidth, bytes/s.
GPUS = (("H100 SXM", 3.35e12), ("RTX 4090", 1.008e12), ("T4", 320e9))
SAMPLE_ROWS = 16  # rows emulated per shape: row starts at every alignment a type allows


def mat_vec_streams(qtype: str, cols: int, q8_1: bool, rows: int = SAMPLE_ROWS,
                    batch: int = 1, tile: int | None = None) -> dict:
    """Weight and x load Streams of one emulated decode mat-vec over `batch` rows of x
    (`tile`: the kernel's batch rows per weight read, default the planner's)."""
    from kernels.cuda import ops
    from kernels.cuda.table import TYPES

    dev = TrafficDevice()
    rng = np.random.default_rng(0)
    t = TYPES[qtype]
    raw = rng.integers(0, 256, (rows, t.row_bytes(cols)), dtype=np.uint8)  # codes only
    w = ops.upload_matrix(dev, raw, qtype, (rows, cols))
    x = dev.to_device(np.ones((batch, cols), np.float32))
    ops.mul_mat_vec(dev, w, x, q8_1=q8_1, tile=tile)
    (kernel,) = [k for k in dev.traffic if k.startswith("mul_mat_vec")]
    return {"kernel": kernel, "w": dev.traffic[kernel][(0, "load")],
            "x": dev.traffic[kernel][(1, "load")]}


# Batched decode (the server's scheduler): weight bytes per token by batch size.
BATCH_SIZES = (1, 2, 3, 4, 8)


def batch_report(qtype: str = "Q4_K", cols: int = 4096, rows: int = SAMPLE_ROWS,
                 q8_1: bool = True) -> dict:
    """Per batch size: weight bytes moved per token (sectors x 32 / batch) with the planner's
    tile and with one weight read per row (tile 1), and the x sector efficiency."""
    out = {}
    for b in BATCH_SIZES:
        tiled, one = (mat_vec_streams(qtype, cols, q8_1, rows, b, tile) for tile in (None, 1))
        out[b] = {"kernel": tiled["kernel"], "w_per_token": tiled["w"].bytes_moved / b,
                  "w_per_token_tile1": one["w"].bytes_moved / b, "x": tiled["x"].efficiency}
    return out


def decode_report(model: tuple = LLAMA2_7B_Q4_K_M) -> dict:
    """Per (type, cols) and path: sector efficiencies; per path: bytes per token."""
    from kernels.cuda.table import TYPES, q8_1_row_bytes

    shapes = sorted({(q, c) for _, _, c, _, q in model})
    eff = {(q, c, p): mat_vec_streams(q, c, p == "q8_1") for q, c in shapes
           for p in ("float", "q8_1")}
    tokens = {}
    for path in ("float", "q8_1"):
        file_b = w_moved = x_moved = 0.0
        for _, rows, cols, n, q in model:
            st = eff[(q, cols, path)]
            wb = rows * TYPES[q].row_bytes(cols)
            file_b += n * wb
            w_moved += n * wb * st["w"].moved_per_useful
            # x: the float path reads x once per row; the integer path once per block of 4
            # rows (q8_1 bytes), sectors at the measured efficiency.
            xb = rows * 4 * cols if path == "float" else -(-rows // 4) * q8_1_row_bytes(cols)
            x_moved += n * xb / st["x"].efficiency
        tokens[path] = {"file": file_b, "w_moved": w_moved, "x_moved": x_moved}
    return {"efficiency": eff, "tokens": tokens}


def main() -> None:
    r = decode_report()
    print("sector efficiency, decode mat-vec (emulated, batch 1, "
          f"{SAMPLE_ROWS} rows): weights / x")
    for (q, c, p), st in r["efficiency"].items():
        print(f"  {st['kernel']:22s} {q} cols {c:5d} {p:5s}: weights {st['w'].efficiency:6.1%} "
              f"(moved/useful {st['w'].moved_per_useful:.2f}), x {st['x'].efficiency:6.1%}")
    print("Llama 2 7B Q4_K_M, per token (on paper):")
    for p, t in r["tokens"].items():
        floors = ", ".join(f"{g} {bw / t['w_moved']:.0f} tok/s" for g, bw in GPUS)
        print(f"  {p:5s}: weights {t['file'] / 1e9:.3f} GB in the file, "
              f"{t['w_moved'] / 1e9:.3f} GB in sectors; x {t['x_moved'] / 1e9:.3f} GB in "
              f"sectors; weight-sector bound {floors}")
    cols = 4096
    # the integer kernel; the 16-bit vector kernel; the float kernel (F32 weights)
    for q, q8_1 in (("Q4_K", True), ("BF16", False), ("F32", False)):
        print(f"batched decode, {q} {SAMPLE_ROWS} x {cols} (emulated): weight bytes per token")
        for b, r in batch_report(q, cols, q8_1=q8_1).items():
            print(f"  batch {b}: {r['kernel']:24s} {r['w_per_token']:8.0f} B "
                  f"(one read per row: {r['w_per_token_tile1']:.0f} B), x {r['x']:6.1%}")


if __name__ == "__main__":
    main()
