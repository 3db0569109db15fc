"""The picker's memory estimate: the layout the chosen backend builds, at the user's context,
within 25% of what the model is measured to take, for the bundled models and tiny test
models of each layout (HF safetensors F32, an MLX-quantized directory, a K-quant and a
Q4_0 GGUF, a sliding-window Gemma 3, an XLM-R embedder with a Unigram tokenizer).

What is measured (tests/gui/measure_model_memory.py, in a fresh process): the model is
loaded and run once and closed, so the runtime's one-time costs (imports, numba's compiled
kernels, MLX's runtime, caches) are paid; then the growth from just before a second load to
the peak while the second copy runs a job that fills the context. That growth is the
model's own memory, which the estimate models; the fixed runtime cost is not in it.

- ``numpy`` and ``cpu``: process RSS growth, which is what the user's
  machine gives up; the peak is the kernel's high-water mark (``VmHWM``), so short peaks
  count. For the tiny models (a few MB) it also holds per-model Python objects
  (config, tokenizer, model objects: a few hundred KB) that the estimate leaves out.
- ``mlx`` (its CPU device here): growth of ``mx.get_peak_memory`` over
  ``mx.get_active_memory``, MLX's own count of the bytes its arrays hold, because that
  is what the estimate stands for on Metal too, where model memory is the GPU's and not
  process RSS; RSS growth is printed beside it (it adds MLX's buffer cache and graph
  objects).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gui.format import human_bytes
from inference.backends import create
from inference.events import MemorySample
from inference.memory_estimate import estimate
from inference.store import resolve
from tests.gui.conftest import job_result, wait_until

ROOT = Path(__file__).resolve().parents[2]
TINY = "tests/goldens/tiny/"
TOLERANCE = 0.25  # the bound: the figure a user plans with, not a byte count
# On the tiny models (7-9 MiB in all) one prefill's attention scores (4 heads x 512 x 512
# float32: 4 MiB) are half the figure, and whether they reach the measured peak depends on
# the attention path the backend takes, which follows how many threads other processes
# leave it (the suite's own subprocesses among them): measured peaks of one job moved by
# up to 2.4 MiB between runs. A miss within 4 MiB is that, not the estimate's error; the
# models a user plans with are far larger, where the 25% bound applies.
SLACK = 4 << 20


def _measure(name: str, backend: str, context: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "tests.gui.measure_model_memory", name,
                          backend, str(context)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# The slow runs are measured in docs/app.md, not here, to keep the suite within its 10
# minutes: the bundled models on the reference backend (SmolLM2's 1,000-token float32
# prefill twice; MiniLM, 15 s) and on MLX's CPU device (SmolLM2: 45 s at 128 tokens, 308 s
# at 1,024; MiniLM: minutes); the tiny models cover those layouts here. SmolLM2 on `cpu`
# at 1,024 tokens (two loads and two 1,008-token prefills, the suite's slowest case) is
# opt-in (`long`, figures in docs/app.md): the tiny Q4_K and Q4_0 GGUFs take the same path
# (packed_nbytes, the same KV and scratch terms) on `cpu`. The peak is the kernel's RSS
# high-water mark, so the tiny llama's millisecond attention peaks on numpy count (RSS
# sampled every 5 ms caught them only partly: 1.20x and 1.30x).
CASES = [
    pytest.param("smollm2", "cpu", 1024, marks=pytest.mark.long), ("minilm", "cpu", 0),
    (TINY + "llama", "numpy", 512), (TINY + "llama", "cpu", 512), (TINY + "llama", "mlx", 512),
    (TINY + "llama_mlx", "cpu", 512), (TINY + "llama_mlx", "mlx", 512),
    (TINY + "llama3_q4_k.gguf", "cpu", 512), (TINY + "llama3_q4_k.gguf", "mlx", 512),
    (TINY + "qwen3_q4_0.gguf", "cpu", 512), (TINY + "gemma3_text", "cpu", 512),
    ("tests/goldens/embedders/xlmr_e5", "cpu", 0),
]


@pytest.mark.parametrize("name,backend,context", CASES)
def test_estimate_is_within_25_percent_of_the_measured_growth(name, backend, context
                                                             ) -> None:
    if backend == "mlx":
        pytest.importorskip("mlx.core")
    est = estimate(resolve(name), create(backend), context or None)
    got = _measure(name, backend, context)
    assert got["backend"] == backend
    measured = got["mlx_peak"] if backend == "mlx" else got["peak"]
    ratio = est.total / measured
    mlx = f", MLX arrays peak {human_bytes(got['mlx_peak'])}" if backend == "mlx" else ""
    print(f"{name} on {backend}: estimated {human_bytes(est.total)} (weights "
          f"{human_bytes(est.weights)}, KV {human_bytes(est.kv)}, scratch "
          f"{human_bytes(est.scratch)}, tokenizer {human_bytes(est.tokenizer)}), measured "
          f"RSS peak {human_bytes(got['peak'])} "
          f"(after load {human_bytes(got['loaded'])}){mlx}: {ratio:.2f}x")
    assert abs(est.total - measured) <= max(TOLERANCE * measured, SLACK)


def test_kv_cache_follows_the_context_and_the_backend_layout() -> None:
    spec = resolve("smollm2")
    cpu, ref = create("cpu"), create("numpy")
    small, large = estimate(spec, cpu, 1024), estimate(spec, cpu, 8192)
    # 30 layers x 3 KV heads x 64 dims, K and V, float32.
    assert small.kv == 2 * 30 * 3 * 64 * 1024 * 4 and large.kv == 8 * small.kv
    assert large.weights == small.weights
    # NumPy holds every weight in float32; the cpu backend keeps the 4/8-bit codes.
    assert estimate(spec, ref, 1024).weights == spec.n_params * 4
    assert small.weights < spec.file_size * 1.1
    # A cache stored narrower than the activations (cuda's float16 KV cache, its default)
    # counts at its own element size.
    from inference.backends.cuda import KV_DTYPE

    half = create("cpu")
    half.kv_dtype = KV_DTYPE
    assert estimate(spec, half, 1024).kv == small.kv * np.dtype(KV_DTYPE).itemsize // 4


def test_the_tokenizer_counts_in_host_memory_only() -> None:
    from inference.formats import read_checkpoint
    from inference.memory_estimate import (
        TOKENIZER_ENTRY_BYTES,
        WORD_CACHE_ENTRY_BYTES,
        WORD_CACHE_WORDS,
        tokenizer_bytes,
    )

    cache = WORD_CACHE_WORDS * WORD_CACHE_ENTRY_BYTES
    smol, minilm = resolve("smollm2"), resolve("minilm")
    # SmolLM2: BPE, with a word cache; MiniLM: WordPiece, without one.
    assert tokenizer_bytes(read_checkpoint(smol.path)) == 49152 * TOKENIZER_ENTRY_BYTES + cache
    assert tokenizer_bytes(read_checkpoint(minilm.path)) == 30522 * TOKENIZER_ENTRY_BYTES
    on_cpu = estimate(smol, create("cpu"), 1024)
    assert on_cpu.tokenizer == 49152 * TOKENIZER_ENTRY_BYTES + cache
    assert on_cpu.total == on_cpu.weights + on_cpu.kv + on_cpu.scratch + on_cpu.tokenizer
    device = create("cpu")  # a backend whose figure is a device's (MLX, CUDA) leaves it out
    device.memory = lambda: MemorySample(1 << 20, 1 << 30, 1 << 20, 0)
    assert estimate(smol, device, 1024).tokenizer == 0


def test_the_picker_passes_the_users_context(make_window, qtbot) -> None:
    w = make_window()
    p = w.picker
    wait_until(lambda: bool(p.specs) and p.backend_infos, 60_000, "models and backends")
    with job_result(qtbot, w.jobs, "estimate", timeout=120_000,
                    check=lambda e: e.context == 2048):
        p.context_box.setValue(2048)
    assert w.settings.context() == 2048
    row = next(r for r, s in enumerate(p.specs) if s.kind == "causal")
    spec = p.specs[row]
    e = p.estimates[str(spec.path)]
    assert e.context == 2048 and e.kv == 2 * 30 * 3 * 64 * 2048 * 4
    item = p.table.item(row, p.table.columnCount() - 3)  # "Est. memory"
    assert item.text() == human_bytes(e.total) and "2,048 tokens" in item.toolTip()
    fits = p.table.item(row, p.table.columnCount() - 2)
    assert fits.text() in ("yes", "no") and human_bytes(e.total) in fits.toolTip()
    assert "RAM available" in fits.toolTip()
