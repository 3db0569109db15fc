#!/bin/sh
# The first run on an NVIDIA GPU: everything the CUDA backend could only estimate without one,
# measured in one go, with every figure in one JSON file (each part's seconds included).
# Running time on paper (docs/cuda.md, "Not yet checked on a GPU"): about 2.5-4 minutes.
#
#   sh scripts/gpu_first_run.sh [out.json]        # default: gpu-first-run-<commit>.json
#
# Without a GPU it stops at once (exit 2) and says why.
#
#   1. the GPU-marked tests (pytest -m gpu): every kernel case again on the device
#   2. CUDA-event timings of decode attention (a 7B shape: 32 query heads over 8 and over
#      32 kv heads, head_dim 128, float16 cache) at 256 and 2,048 cached keys, next to the
#      mat-vecs of one layer (Q4_K 4096x4096, 14336x4096 and 4096x14336), with GB/s, and
#      the fused layer's tails: Gemma 2 9B's down projection with its norm + residual and
#      Qwen3 8B's q/k/v with its per-head q/k norms, each against the kernel without
#   3. NVRTC: every module compiled cold (an empty CuPy cache) in parallel and on one
#      thread, then warm (the cache filled), each in a fresh process
#   4. a decode at a 1B shape (Llama 3.2 1B: 16 layers, 2048 wide, GQA 4, random Q4_K
#      weights): tokens/s with graphs on, graph capture errors, launches per token
#   5. host work per token (scripts/cuda_host_time.py: the backend on a device whose
#      kernels take no time, 1B, Qwen3 1.7B and Gemma 2 2B shapes, graphs on and off; and
#      the server's batched steps of 4 sequences, one replaced every 16 steps)
#
# INFERDESK_FIRST_RUN_EMULATOR=1 runs parts 2, 4 and 5 on the host: 2 and 4 with tiny shapes
# on the device class that INFERDESK_FIRST_RUN_DEVICE names as module:Class (the tests pass
# their host emulator; a smoke test of this script, whose figures there mean nothing but
# part 5's).
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${1:-gpu-first-run-$COMMIT.json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
now() { "$PY" -c 'import time; print(f"{time.time():.2f}")'; }
T_START=$(now)

if [ "${INFERDESK_FIRST_RUN_EMULATOR:-0}" != 1 ]; then
    REASON=$("$PY" -c 'from kernels.cuda.device import cuda_unavailable_reason as r; print(r() or "")')
    if [ -n "$REASON" ]; then
        echo "No GPU to measure: $REASON. This script needs an NVIDIA GPU with CuPy;" \
             "INFERDESK_FIRST_RUN_EMULATOR=1 runs its host parts." >&2
        exit 2
    fi
    echo "== 1. GPU-marked tests"
    set +e
    QT_QPA_PLATFORM=offscreen "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/kernels \
        tests/test_backend_matrix.py >"$WORK/tests.log" 2>&1
    TESTS_RC=$?
    set -e
    tail -n 3 "$WORK/tests.log"
    T_TESTS=$(now)
    echo "== 3. NVRTC cold (parallel, one thread) and warm"
    for run in cold:0 cold1:1 warm:0; do
        name=${run%%:*} serial=${run##*:}
        [ "$name" = warm ] || rm -rf "$WORK/cupy-cache"
        CUPY_CACHE_DIR="$WORK/cupy-cache" "$PY" - "$serial" >"$WORK/nvrtc-$name.txt" <<'PY'
import sys, time
from kernels.cuda.device import CupyDevice
dev = CupyDevice()
t = time.perf_counter()
dev.load_all(workers=1 if sys.argv[1] == "1" else None)
print(f"{time.perf_counter() - t:.3f}")
PY
        echo "$name: $(cat "$WORK/nvrtc-$name.txt") s"
    done
    T_NVRTC=$(now)
    HOST_TOKENS=200
else
    TESTS_RC=-1
    for name in cold cold1 warm; do echo null >"$WORK/nvrtc-$name.txt"; done
    echo "(emulator: tests and NVRTC skipped; shapes shrunk)"
    T_TESTS=$T_START T_NVRTC=$T_START HOST_TOKENS=30
fi

echo "== 5. host work per token (no-op device)"
"$PY" scripts/cuda_host_time.py --tokens "$HOST_TOKENS" --json "$WORK/host.json"
"$PY" scripts/cuda_host_time.py --batched 4 --tokens "$HOST_TOKENS" --json "$WORK/host-batched.json"
T_HOST=$(now)
export T_START T_TESTS T_NVRTC T_HOST

echo "== 2 and 4. kernel timings and a 1B-shape decode"
"$PY" - "$OUT" "$COMMIT" "$TESTS_RC" "$WORK" <<'PY'
import importlib, json, os, platform, statistics, sys, time
from pathlib import Path

import numpy as np

from inference.backends.cuda import CudaBackend
from inference.formats.tensor import Checkpoint, TensorData
from inference.generate import generate_step
from inference.models import llama
from inference.models.common import Weights
from inference.sampling import SamplingParams
from kernels.cuda import ops
from kernels.cuda.device import CupyDevice
from kernels.cuda.table import TYPES

out_path, commit, tests_rc, work = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
emu = os.environ.get("INFERDESK_FIRST_RUN_EMULATOR") == "1"
if emu:
    module, _, cls = os.environ["INFERDESK_FIRST_RUN_DEVICE"].partition(":")
    dev = getattr(importlib.import_module(module), cls)()
else:
    dev = CupyDevice()
s = 16 if emu else 1  # shapes shrink on the emulator
rng = np.random.default_rng(0)


def events(fn, repeats=50):
    """Median milliseconds of fn() between CUDA events (perf_counter on the emulator)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(1 if emu else repeats):
        if emu:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
            continue
        import cupy

        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b))
    return statistics.median(times)


SCALE_FIELDS = {"Q4_K": (0, 2), "Q6_K": (208,)}  # byte offsets of a block's float16 scales


def kquant(qtype, rows, cols):
    """Random blocks whose float16 scales are small (so 16 layers stay finite)."""
    t = TYPES[qtype]
    blocks = rng.integers(0, 256, (rows, cols // t.qk, t.block_bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        d = rng.uniform(0.0005, 0.005, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, off:off + 2] = d.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


report = {"commit": commit, "device": getattr(dev, "device_name", dev.name),
          "sm_count": dev.limits.sm_count, "python": platform.python_version(),
          "emulator": emu, "gpu_tests_exit_code": tests_rc, "attention": [], "matvec": []}
for name in ("cold", "cold1", "warm"):
    report[f"nvrtc_{name}_s"] = json.loads((work / f"nvrtc-{name}.txt").read_text() or "null")

d = 128
for heads, kv_heads in ((32, 8), (32, 32)):
    for n_kv in (256, 2048):
        n = max(32, n_kv // s)
        q = dev.to_device(rng.standard_normal((1, heads, 1, d), dtype=np.float32))
        k = dev.to_device(rng.standard_normal((1, kv_heads, n, d)).astype(np.float16))
        v = dev.to_device(rng.standard_normal((1, kv_heads, n, d)).astype(np.float16))
        ms = events(lambda: ops.attention(dev, q, k, v, 0.088, causal_offset=n - 1))
        nbytes = k.nbytes + v.nbytes
        report["attention"].append({"heads": heads, "kv_heads": kv_heads, "head_dim": d,
                                    "n_kv": n, "ms": ms, "gb_s": nbytes / ms / 1e6})
for rows, cols in ((4096, 4096), (14336, 4096), (4096, 14336)):
    rows, cols = rows // s, cols // s // 256 * 256
    w = ops.upload_matrix(dev, kquant("Q4_K", rows, cols), "Q4_K", (rows, cols))
    x = dev.to_device(rng.standard_normal((1, cols), dtype=np.float32))
    ms = events(lambda: ops.mul_mat_vec(dev, w, x))
    report["matvec"].append({"type": "Q4_K", "rows": rows, "cols": cols, "ms": ms,
                             "gb_s": w.data.nbytes / ms / 1e6})

# The fused layer's tails (docs/cuda.md, assumption E): the same mat-vec with and without
# the work its last block does. Gemma 2 9B's down projection (3584 x 14336) plain and with
# the post-feedforward norm + residual; Qwen3 8B's q/k/v (48 heads of 128 over 4096) with
# RoPE and the KV writes, without and with the per-head q/k norms.
hidden, inter = 3584 // s, 14336 // s // 256 * 256
w = ops.upload_matrix(dev, kquant("Q4_K", hidden, inter), "Q4_K", (hidden, inter))
xq = ops.quantize_q8_1(dev, dev.to_device(rng.standard_normal((1, inter), dtype=np.float32)))
res = dev.to_device(rng.standard_normal((1, hidden), dtype=np.float32))
nw = dev.to_device(np.ones(hidden, np.float32))
done = ops.tail_counters(dev, 64)
plain = events(lambda: ops.mul_mat_vec_q8_1(dev, w, xq, 1, residual=res))
tail = events(lambda: ops.mul_mat_vec_q8_1_norm_add(dev, w, xq, 1, nw, 1e-6, res, done))
report["tails"] = [{"kernel": "mul_mat_vec_q_norm_add_q4_k", "rows": hidden, "cols": inter,
                    "ms_plain": plain, "ms_fused": tail, "tail_us": (tail - plain) * 1e3}]
heads, kvh, hd, cols = (4, 1, 128, 256) if emu else (32, 8, 128, 4096)
rows = (heads + 2 * kvh) * hd
w = ops.upload_matrix(dev, kquant("Q4_K", rows, cols), "Q4_K", (rows, cols))
xq = ops.quantize_q8_1(dev, dev.to_device(rng.standard_normal((1, cols), dtype=np.float32)))
kc, vc = (dev.to_device(np.zeros((1, kvh, 64, hd), np.float16)) for _ in range(2))
pos = dev.to_device(np.array([5], np.int32))
norms = (dev.to_device(np.ones(hd, np.float32)), dev.to_device(np.ones(hd, np.float32)))
plain = events(lambda: ops.qkv_rope_kv(dev, w, xq, kc, vc, pos, pos, 1e6, heads, kvh))
tail = events(lambda: ops.qkv_rope_kv(dev, w, xq, kc, vc, pos, pos, 1e6, heads, kvh,
                                      qk_norms=norms, done=done))
report["tails"].append({"kernel": "mul_mat_vec_q_rope_kv_q4_k_f16", "rows": rows, "cols": cols,
                        "ms_plain": plain, "ms_fused": tail, "tail_us": (tail - plain) * 1e3})

t_kernels = time.time()
# A 1B shape (Llama 3.2 1B) with random Q4_K weights and a Q6_K output head.
hidden, inter, layers, vocab, heads, kvh = ((256, 512, 2, 1024, 4, 1) if emu
                                            else (2048, 8192, 16, 128256, 32, 8))
cfg = {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
       "intermediate_size": inter, "num_attention_heads": heads,
       "num_key_value_heads": kvh, "vocab_size": vocab,
       "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "rope_theta": 500000.0}
hd = hidden // heads
ts = {"model.embed_tokens.weight": TensorData("e", (vocab, hidden), "Q6_K",
                                              kquant("Q6_K", vocab, hidden))}
for i in range(layers):
    p = f"model.layers.{i}."
    for n, shape in [("q", (hidden, hidden)), ("k", (kvh * hd, hidden)),
                     ("v", (kvh * hd, hidden)), ("o", (hidden, hidden))]:
        ts[p + f"self_attn.{n}_proj.weight"] = TensorData(n, shape, "Q4_K", kquant("Q4_K", *shape))
    for n, shape in [("gate", (inter, hidden)), ("up", (inter, hidden)), ("down", (hidden, inter))]:
        ts[p + f"mlp.{n}_proj.weight"] = TensorData(n, shape, "Q4_K", kquant("Q4_K", *shape))
    for n in ("input_layernorm", "post_attention_layernorm"):
        ts[p + n + ".weight"] = TensorData(n, (hidden,), "F32", np.ones(hidden, np.float32))
ts["model.norm.weight"] = TensorData("n", (hidden,), "F32", np.ones(hidden, np.float32))
ckpt = Checkpoint(Path("random-1b.gguf"), "gguf", cfg, ts)
B = CudaBackend(dev)
model = llama.Model(llama.ModelArgs.from_dict(cfg), B, Weights(ckpt, B))
n_tok = 8 if emu else 128
steps = generate_step(model, list(range(1, 17)), SamplingParams(temperature=0.0),
                      np.random.default_rng(0), max_len=16 + n_tok + 8)
next(steps)  # prefill and the first token
launches = dev.launches
t = time.perf_counter()
for _ in range(n_tok):
    next(steps)
B.synchronize()
sec = time.perf_counter() - t
steps.close()
report["decode_1b"] = {"layers": layers, "hidden": hidden, "tokens": n_tok,
                       "tokens_per_s": n_tok / sec, "ms_per_token": sec / n_tok * 1e3,
                       "python_launches_per_token": (dev.launches - launches) / n_tok,
                       "graphs": B.graphs, "graph_error": B.graph_error}
report["host_work"] = json.loads((work / "host.json").read_text())["rows"]
report["host_work_batched"] = json.loads((work / "host-batched.json").read_text())["rows"]
env = {k: float(os.environ[k]) for k in ("T_START", "T_TESTS", "T_NVRTC", "T_HOST")}
end = time.time()
report["seconds"] = {"gpu_tests": env["T_TESTS"] - env["T_START"],
                     "nvrtc": env["T_NVRTC"] - env["T_TESTS"],
                     "host_work": env["T_HOST"] - env["T_NVRTC"],
                     "kernel_timings": t_kernels - env["T_HOST"],
                     "decode_1b": end - t_kernels, "total": end - env["T_START"]}
Path(out_path).write_text(json.dumps(report, indent=1) + "\n")
for a in report["attention"]:
    print(f"attention {a['heads']}/{a['kv_heads']} heads n_kv {a['n_kv']}: {a['ms']:.3f} ms "
          f"{a['gb_s']:.0f} GB/s")
for m in report["matvec"]:
    print(f"mat-vec Q4_K {m['rows']}x{m['cols']}: {m['ms']:.3f} ms {m['gb_s']:.0f} GB/s")
for m in report["tails"]:
    print(f"{m['kernel']} {m['rows']}x{m['cols']}: {m['ms_plain']:.3f} ms plain, "
          f"{m['ms_fused']:.3f} ms with its tail ({m['tail_us']:.1f} us)")
print(f"1B decode: {report['decode_1b']['tokens_per_s']:.1f} tokens/s, graph error: "
      f"{report['decode_1b']['graph_error']}")
for r in report["host_work"]:
    print(f"host work {r['shape']} graphs={r['graphs']}: {r['median_us_per_token']:.1f} us "
          "a token")
for r in report["host_work_batched"]:
    print(f"host work {r['shape']} batched, {r['rows']} rows: {r['median_us_per_token']:.1f} us "
          f"a token, {r['captures']} captures")
total = report["seconds"]["total"]
print(f"took {total:.0f} s" + ("" if total <= 480 else " (over the 8-minute budget)"))
print(f"wrote {out_path}")
PY
