"""Achieved memory bandwidth of the CUDA kernels against the device's peak.

    python scripts/bench_kernels.py                 # needs an NVIDIA GPU and CuPy
    python scripts/bench_kernels.py --peak-gbs 1008 # if the peak cannot be read from the device

Each case counts the bytes a kernel must move at least (weights, inputs, outputs), times
the kernel with CUDA events (median of repeats, after warm-up) and prints GB/s and the
fraction of peak. Targets on paper: norms >= 80 %, quantized mat-vec >= 70 % at 4096x4096
and larger. :func:`run` takes any device: the tests smoke-test it on their host emulator with
shapes shrunk, where the figures mean nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.cuda import ops  # noqa: E402
from kernels.cuda.device import CupyDevice, Device, cuda_unavailable_reason  # noqa: E402
from kernels.cuda.table import TYPES  # noqa: E402

TARGETS = {"norm": 0.80, "mmv": 0.70}


def peak_gbs(dev: Device) -> float | None:
    """Theoretical DRAM bandwidth: memory clock x 2 (DDR) x bus width, or None."""
    props = getattr(dev, "properties", {})
    clock_khz, bus_bits = props.get("memoryClockRate"), props.get("memoryBusWidth")
    if not clock_khz:
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            clock_khz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) * 1000
            bus_bits = bus_bits or pynvml.nvmlDeviceGetMemoryBusWidth(h)
        except Exception:
            return None
    if not clock_khz or not bus_bits:
        return None
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9


def time_it(dev: Device, fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds per call."""
    for _ in range(3):
        fn()
    times = []
    if isinstance(dev, CupyDevice):
        import cupy

        for _ in range(repeats):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cases(dev: Device, small: bool) -> list[tuple[str, str, int, Callable[[], Any]]]:
    """(group, name, bytes moved, launch)."""
    rng = np.random.default_rng(0)
    up = dev.to_device
    out: list[tuple[str, str, int, Callable[[], Any]]] = []
    s = 16 if small else 1

    for rows, cols in [(1, 4096), (512, 4096), (200, 384), (200, 768), (4096, 4096)]:
        rows, cols = max(1, rows // s), max(32, cols // s)
        x = up(rng.standard_normal((rows, cols), dtype=np.float32))
        w = up(rng.standard_normal(cols, dtype=np.float32))
        nbytes = 2 * x.nbytes + w.nbytes
        out.append(("norm", f"rms_norm {rows}x{cols}", nbytes,
                    lambda x=x, w=w: ops.rms_norm(dev, x, w, 1e-6)))
        out.append(("norm", f"layer_norm {rows}x{cols}", nbytes + w.nbytes,
                    lambda x=x, w=w: ops.layer_norm(dev, x, w, w, 1e-6)))

    for qtype, t in TYPES.items():
        for rows, cols in [(4096, 4096), (14336, 4096), (4096, 14336)]:
            rows, cols = rows // s, max(t.qk, cols // s // t.qk * t.qk)
            if qtype in ("F32", "F16"):
                host = rng.standard_normal((rows, cols)).astype(np.float32 if qtype == "F32"
                                                                 else np.float16)
            else:
                host = rng.integers(0, 256, (rows, t.row_bytes(cols)), dtype=np.uint8)
                host.view(np.uint8)[:, :] &= 0x3F  # keeps every fp16 field finite and small
            m = ops.upload_matrix(dev, host, qtype, (rows, cols))
            x = up(rng.standard_normal((1, cols), dtype=np.float32))
            nbytes = rows * t.row_bytes(cols) + x.nbytes + rows * 4
            out.append(("mmv", f"mul_mat_vec {qtype} {rows}x{cols}", nbytes,
                        lambda m=m, x=x: ops.mul_mat_vec(dev, m, x)))
            if t.dp4a:  # the row above is the integer kernel (with x's q8_1 quantization)
                out.append(("mmv", f"mul_mat_vec {qtype} {rows}x{cols} float", nbytes,
                            lambda m=m, x=x: ops.mul_mat_vec(dev, m, x, q8_1=False)))
            if (rows, cols) == (4096 // s, max(t.qk, 4096 // s // t.qk * t.qk)):
                out.append(("dequant", f"dequantize {qtype}->f16 {rows}x{cols}",
                            rows * t.row_bytes(cols) + rows * cols * 2,
                            lambda m=m: ops.dequantize(dev, m, np.float16)))

    heads, kv_heads, d = 32, 8, 128
    for n_kv in (256, 4096):
        n_kv //= s
        q = up(rng.standard_normal((1, heads, 1, d), dtype=np.float32))
        k = up(rng.standard_normal((1, kv_heads, n_kv, d), dtype=np.float32))
        nbytes = 2 * k.nbytes + 2 * q.nbytes
        out.append(("attn", f"attn_decode {heads}/{kv_heads} heads d{d} n_kv {n_kv}", nbytes,
                    lambda q=q, k=k: ops.attention(dev, q, k, k, 0.088)))
    sc = up(rng.standard_normal((1, 32, 64 // s, 2048 // s), dtype=np.float32))
    out.append(("softmax", f"softmax {sc.shape}", 2 * sc.nbytes,
                lambda: ops.softmax(dev, sc, 0.088, causal_offset=0)))
    return out


def run(dev: Device, peak: float | None, repeats: int, small: bool = False) -> int:
    """Time every case on ``dev`` and print a table; ``small`` shrinks the shapes 16x."""
    print(f"peak: {peak:.0f} GB/s" if peak else "peak: unknown (pass --peak-gbs)")
    print(f"{'kernel':48s} {'time':>10s} {'GB/s':>9s} {'of peak':>8s}  target")
    misses = 0
    for group, name, nbytes, fn in cases(dev, small=small):
        sec = time_it(dev, fn, repeats)
        gbs = nbytes / sec / 1e9
        frac = gbs / peak if peak else float("nan")
        target = TARGETS.get(group)
        big = "4096x" in name or "x4096" in name or "14336" in name
        verdict = ""
        if target and peak and (group == "norm" or big):
            ok = frac >= target
            misses += not ok
            verdict = f"{'ok ' if ok else 'MISS'} >= {target:.0%}"
        shown = f"{frac:8.1%}" if peak else f"{'-':>8s}"
        print(f"{name:48s} {sec * 1e6:8.1f}us {gbs:9.1f} {shown}  {verdict}")
    if peak:
        print(f"{misses} case(s) below target")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--peak-gbs", type=float, default=None, help="device peak GB/s override")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    reason = cuda_unavailable_reason()
    if reason:
        print(f"no GPU to benchmark ({reason})")
        return 0
    dev = CupyDevice()
    print(f"device: {dev.device_name}")
    return run(dev, args.peak_gbs or peak_gbs(dev), args.repeats)


if __name__ == "__main__":
    raise SystemExit(main())
