"""Host work per decode token of the CUDA backend, measured on a device whose kernels take
no time: every launch goes through the backend's own code (argument checks, launch
plans, allocations, the sampler) and then does nothing, so a step's wall time is the
host's work alone (what bounds tokens/s on a fast GPU).

    python scripts/cuda_host_time.py [--tokens 200] [--json out.json]
    python scripts/cuda_host_time.py --batched 4 [--swap-every 16]   # the server's steps

Shapes: Llama 3.2 1B (16 layers, 2048 wide, GQA 4), Qwen3 1.7B (28 layers, per-head q/k
norms) and Gemma 2 2B (26 layers, 2304 wide, alternate sliding layers of window 4096,
soft-caps, norms after attention and MLP), weights of zeros (the kernels
never read them), greedy. Each is decoded with captured steps (graphs; ``--tokens``
tokens) and eagerly (at most 40); the figure is the median of per-token times after the
first 8 tokens (the capture). Load: the measuring thread competes with whatever else
runs, so quote the machine's load with it.

Not counted: CuPy's own cost per call on a GPU (a RawKernel launch, a pool allocation, an
asynchronous copy: a few microseconds each); the JSON lists the calls a token makes
(``launches_per_token``) so they can be added.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference.backends.cuda import CudaBackend  # noqa: E402
from inference.formats.tensor import Checkpoint, TensorData  # noqa: E402
from inference.generate import generate_step  # noqa: E402
from inference.kv_cache import BatchedCaches  # noqa: E402
from inference.models import llama  # noqa: E402
from inference.models.common import Weights  # noqa: E402
from inference.sampling import SamplingParams  # noqa: E402
from kernels.cuda.device import Device, Graph, PendingRead  # noqa: E402
from kernels.cuda.plan import Launch  # noqa: E402


class NoopGraph(Graph):
    def _replay(self) -> None:  # one call, as cudaGraphLaunch
        pass


class NoopDevice(Device):
    """Zeroed host buffers stand in for device memory; kernels and graphs do nothing.
    Copies are real (they are host work on a GPU too), except weights' uploads, which
    keep the host array (no copy of gigabytes of zeros)."""

    name = "noop"
    device_name = "no-op device (host work only)"
    supports_graphs = True

    def _load(self, module: str) -> Any:
        return None

    def function(self, module: str, name: str) -> Any:
        return None

    def _run(self, module: str, name: str, launch: Launch, args: tuple[Any, ...]) -> None:
        if self._recording is not None:
            self._recording += 1

    _recording: int | None = None

    def begin_capture(self) -> None:
        self._recording, self._keep = 0, []

    def end_capture(self) -> Graph:
        g = NoopGraph(self, self._keep or [])
        self._recording = self._keep = None
        return g

    def abort_capture(self) -> None:
        self._recording = self._keep = None

    def address(self, a: Any) -> int:
        return a.ctypes.data

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return self._kept(np.zeros(shape, dtype))

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return self.empty(shape, dtype)

    def to_device(self, a: np.ndarray, label: str = "") -> np.ndarray:
        self.transfers.record("h2d", a.nbytes, label)
        return a if a.nbytes > 1 << 20 else np.array(a, copy=True)

    def to_host(self, a: np.ndarray, label: str = "") -> np.ndarray:
        self.transfers.record("d2h", a.nbytes, label)
        return np.array(a, copy=True)

    def write(self, dst: np.ndarray, a: np.ndarray, label: str = "") -> None:
        self.transfers.record("h2d", a.nbytes, label)
        np.copyto(dst, a.reshape(dst.shape))

    def read_later(self, a: np.ndarray, label: str = "") -> PendingRead:
        return PendingRead(self.transfers, np.array(a, copy=True), label)

    def synchronize(self) -> None:
        pass

    def memory(self) -> tuple[int | None, int | None, int | None]:
        return None, None, None

    def release(self) -> None:
        pass


SHAPES = {
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, num_hidden_layers=16,
                         intermediate_size=8192, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                         tie_word_embeddings=True),
    "qwen3-1.7b": dict(model_type="qwen3", hidden_size=2048, num_hidden_layers=28,
                       intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, vocab_size=151936, rope_theta=1000000.0,
                       tie_word_embeddings=True),
    "gemma-2-2b": dict(model_type="gemma2", hidden_size=2304, num_hidden_layers=26,
                       intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4,
                       head_dim=256, vocab_size=256000, sliding_window=4096,
                       layer_types=["sliding_attention", "full_attention"] * 13,
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh"),
}


def _checkpoint(cfg: dict[str, Any]) -> Checkpoint:
    """Zero Q4_K weights (Q6_K embeddings) of the config's shapes."""
    h, n = cfg["hidden_size"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]

    def w(name: str, rows: int, cols: int, qtype: str = "Q4_K") -> TensorData:
        per = {"Q4_K": 144, "Q6_K": 210}[qtype]
        return TensorData(name, (rows, cols), qtype, np.zeros((rows, cols // 256 * per),
                                                              np.uint8))

    def norm(name: str, size: int) -> TensorData:
        return TensorData(name, (size,), "F32", np.ones(size, np.float32))

    ts = {"model.embed_tokens.weight": w("e", vocab, h, "Q6_K"),
          "model.norm.weight": norm("n", h)}
    for i in range(n):
        p = f"model.layers.{i}."
        for name, rows, cols in (("self_attn.q_proj", q, h), ("self_attn.k_proj", kv, h),
                                 ("self_attn.v_proj", kv, h), ("self_attn.o_proj", h, q),
                                 ("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h),
                                 ("mlp.down_proj", h, inter)):
            ts[p + name + ".weight"] = w(name, rows, cols)
        for name in ("input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            ts[p + name + ".weight"] = norm(name, h)
        for name in ("self_attn.q_norm", "self_attn.k_norm"):  # Qwen3, Gemma 3
            ts[p + name + ".weight"] = norm(name, hd)
    return Checkpoint(Path("zeros.gguf"), "gguf", {**cfg, "rms_norm_eps": 1e-6}, ts)


def measure(name: str, graphs: bool, tokens: int) -> dict[str, Any]:
    cfg = SHAPES[name]
    tokens = tokens if graphs else min(tokens, 40)  # eager steps: tens of ms each
    dev = NoopDevice()
    B = CudaBackend(dev, graphs=graphs)
    model = llama.Model(llama.ModelArgs.from_dict(cfg), B, Weights(_checkpoint(cfg), B))
    steps = generate_step(model, list(range(1, 5)), SamplingParams(temperature=0.0),
                          np.random.default_rng(0), max_len=4 + tokens + 16)
    next(steps)
    times, launches = [], []
    for _ in range(tokens):
        n, t = dev.launches, time.perf_counter()
        next(steps)
        times.append(time.perf_counter() - t)
        launches.append(dev.launches - n)
    steps.close()
    steady = times[8:]
    return {"shape": name, "graphs": graphs, "layers": cfg["num_hidden_layers"],
            "tokens": tokens, "median_us_per_token": statistics.median(steady) * 1e6,
            "p90_us_per_token": float(np.percentile(steady, 90)) * 1e6,
            "launches_per_token": statistics.median(launches[8:]),
            "graph_error": B.graph_error}


def measure_batched(name: str, rows: int, steps: int, swap_every: int) -> dict[str, Any]:
    """The server's batched decode as its scheduler drives it: ``rows`` sequences, each
    sampling on the device (``token_sampler``) and read one step behind, one
    ``decode_steps()`` call a step; every ``swap_every`` steps one sequence leaves the batch
    and a waiting one (already prefilled) takes its row. The figure: a step's median wall
    time over its rows, after the first 8 steps."""
    cfg = SHAPES[name]
    dev = NoopDevice()
    B = CudaBackend(dev)
    model = llama.Model(llama.ModelArgs.from_dict(cfg), B, Weights(_checkpoint(cfg), B))
    greedy, rng = SamplingParams(temperature=0.0), np.random.default_rng(0)
    vocab = cfg["vocab_size"]

    def start(first: int) -> list[Any]:  # [cache, sampler, last token, unread token]
        prompt = list(range(first, first + 4))
        cache = model.make_cache(4 + steps + 8)
        logits = model(B.array(np.asarray([prompt], np.int64)), cache, last_only=True)
        sampler = B.token_sampler(greedy, prompt, rng)
        return [cache, sampler, sampler.sample(B.reshape(logits, (vocab,))), None]

    seqs = [start(1 + 4 * i) for i in range(rows)]
    spare = start(1 + 4 * rows)
    decode = B.decode_steps()
    times, launches = [], []
    for n in range(steps):
        if swap_every and n and n % swap_every == 0:  # one leaves, another joins
            out = n // swap_every % rows
            seqs[out], spare = spare, seqs[out]
        t, k = time.perf_counter(), dev.launches
        logits = decode(model, [s[2] for s in seqs], BatchedCaches([s[0] for s in seqs]))
        for i, s in enumerate(seqs):
            row = B.reshape(B.narrow(logits, 0, i, 1), (vocab,))
            s[3], s[2] = s[2], s[1].sample(row)
            s[1].read(s[3])  # the token of the step before, read after this one is queued
        times.append(time.perf_counter() - t)
        launches.append(dev.launches - k)
    steady = times[8:]
    return {"shape": name, "rows": rows, "swap_every": swap_every, "steps": steps,
            "median_us_per_token": statistics.median(steady) / rows * 1e6,
            "median_us_per_step": statistics.median(steady) * 1e6,
            # captures after the first are rare steps the median hides: the mean counts them
            "mean_us_per_token": statistics.fmean(steady) / rows * 1e6,
            "launches_per_step": statistics.median(launches[8:]),
            "captures": decode.captures, "replays": decode.replays,
            "graph_error": B.graph_error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--batched", type=int, default=0, metavar="ROWS",
                    help="the server's batched steps of ROWS sequences instead (graphs on)")
    ap.add_argument("--swap-every", type=int, default=16,
                    help="with --batched: a sequence leaves and another joins every N steps")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.batched:
        rows = [measure_batched(name, args.batched, args.tokens, args.swap_every)
                for name in SHAPES]
        for r in rows:
            print(f"{r['shape']:14} rows={r['rows']} {r['median_us_per_token']:9.1f} us a "
                  f"token ({r['median_us_per_step']:.1f} a step, mean "
                  f"{r['mean_us_per_token']:.1f} a token), {r['launches_per_step']:.0f} "
                  f"launches a step, {r['captures']} captures, {r['replays']} replays, "
                  f"graph error: {r['graph_error']}")
    else:
        rows = [measure(name, graphs, args.tokens) for name in SHAPES
                for graphs in (True, False)]
        for r in rows:
            print(f"{r['shape']:14} graphs={str(r['graphs']):5} {r['median_us_per_token']:9.1f} "
                  f"us a token (p90 {r['p90_us_per_token']:.1f}), "
                  f"{r['launches_per_token']:.0f} launches, graph error: {r['graph_error']}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        args.json.write_text(json.dumps({
            "command": "python scripts/cuda_host_time.py " + " ".join(sys.argv[1:]),
            "commit": commit, "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
