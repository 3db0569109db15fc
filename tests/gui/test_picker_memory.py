"""The picker's memory estimate: the layout the chosen backend builds, at the user's context,
within 25% of what the model is measured to take."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gui.format import human_bytes
from inference.backends import create
from inference.memory_estimate import estimate
from inference.store import resolve
from tests.gui.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.25  # the bound: the figure a user plans with, not a byte count


def _measure(name: str, backend: str, context: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "tests.gui.measure_model_memory", name,
                          backend, str(context)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# The slow reference backend's chat run (a 1,000-token prefill in float32 NumPy, twice)
# is measured once in docs/app.md rather than on every run.
@pytest.mark.parametrize("name,backend,context", [
    ("smollm2", "cpu", 1024), ("minilm", "cpu", 0), ("minilm", "numpy", 0)])
def test_estimate_is_within_25_percent_of_the_measured_growth(name, backend, context
                                                             ) -> None:
    est = estimate(resolve(name), create(backend), context or None)
    got = _measure(name, backend, context)
    assert got["backend"] == backend
    ratio = est.total / got["peak"]
    print(f"{name} on {backend}: estimated {human_bytes(est.total)} (weights "
          f"{human_bytes(est.weights)}, KV {human_bytes(est.kv)}, scratch "
          f"{human_bytes(est.scratch)}), measured peak {human_bytes(got['peak'])} "
          f"(after load {human_bytes(got['loaded'])}): {ratio:.2f}x")
    assert abs(ratio - 1) <= TOLERANCE


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


def test_the_picker_passes_the_users_context(make_window, qtbot) -> None:
    w = make_window()
    p = w.picker
    wait_until(lambda: bool(p.specs) and p.backend_infos, 60_000, "models and backends")
    with qtbot.waitSignal(w.handle.estimated, timeout=120_000,
                          check_params_cb=lambda _b, c, _e: c == 2048):
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
