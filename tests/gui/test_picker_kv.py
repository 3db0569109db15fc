"""The picker's KV cache choice: remembered, priced in the memory estimate, passed to the
load, and refused in one sentence by a backend without that type (the app keeps going)."""

from __future__ import annotations

import numpy as np

from tests.gui.conftest import job_result, spec_of, wait_until


def _choose(combo, value: str) -> None:  # noqa: ANN001
    combo.setCurrentIndex(combo.findData(value))


def test_half_cache_is_estimated_loaded_and_remembered(make_window, qtbot) -> None:
    w = make_window()
    p = w.picker
    wait_until(lambda: bool(p.specs) and p.backend_infos, 60_000, "models and backends")
    _choose(p.backend_combo, "cpu")
    with job_result(qtbot, w.jobs, "estimate", timeout=120_000,
                    check=lambda e: (e.backend, e.kv_dtype) == ("cpu", "float16")):
        _choose(p.kv_combo, "float16")
    assert w.settings.get("models/kv_dtype", "", str) == "float16"
    spec = spec_of(w, "causal")
    e = p.estimates[str(spec.path)]
    assert e.kv == 2 * 30 * 3 * 64 * e.context * 2  # SmolLM2's layers, kv heads, dims; 2 bytes
    with job_result(qtbot, w.jobs, "load", timeout=120_000):
        p.load(spec)
    wait_until(lambda: w.jobs.job == "", 30_000, "the worker to go idle")
    assert w.jobs.models.get("causal").backend.kv_dtype == np.float16


def test_a_backend_without_the_type_says_so(make_window, qtbot) -> None:
    w = make_window()
    p = w.picker
    wait_until(lambda: bool(p.specs) and p.backend_infos, 60_000, "models and backends")
    _choose(p.backend_combo, "numpy")
    _choose(p.kv_combo, "float16")
    with qtbot.waitSignal(w.jobs.failed, timeout=60_000) as failed:
        p.load(spec_of(w, "causal"))
    kind, message = failed.args
    assert kind == "load" and message == ("The numpy backend keeps its KV cache in float32, "
                                          "not float16.")
    assert w.banner.isVisible() and w.jobs.alive()
    _choose(p.kv_combo, "")
    # ``check``: the refused load's own end may still be on its way (a busy machine).
    with job_result(qtbot, w.jobs, "load", timeout=120_000, check=lambda _: True):
        p.load(spec_of(w, "causal"))
