"""scripts/bench_kernels.py runs (here on the emulator: its figures mean something on a GPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_kernels.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kernels", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_bench_script_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.kernels.emulator.device import EmulatedDevice

    assert _script().run(EmulatedDevice(), None, repeats=1, small=True) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("mul_mat_vec Q4_K") for line in lines)
    assert any(line.startswith("rms_norm") for line in lines)


def test_bench_script_without_gpu_says_why() -> None:
    from kernels.cuda.device import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is present: the real benchmark would run")
    r = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and reason in r.stdout


FIRST_RUN = SCRIPT.parent / "gpu_first_run.sh"


def test_first_run_script_without_gpu_says_why() -> None:
    from kernels.cuda.device import cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("a GPU is present: the real first run would take minutes")
    r = subprocess.run(["sh", str(FIRST_RUN)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PY": sys.executable})
    assert r.returncode == 2 and reason in r.stderr and not r.stdout  # at once, nothing run


@pytest.mark.long  # ~20 s: the script's Python on the emulator with tiny shapes
def test_first_run_script_on_the_emulator(tmp_path: Path) -> None:
    out = tmp_path / "first-run.json"
    r = subprocess.run(["sh", str(FIRST_RUN), str(out)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PY": sys.executable,
                                         "INFERDESK_FIRST_RUN_EMULATOR": "1",
                                         "INFERDESK_FIRST_RUN_DEVICE":
                                         "tests.kernels.emulator.device:EmulatedDevice"})
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert len(report["attention"]) == 4 and len(report["matvec"]) == 3
    assert report["decode_1b"]["graph_error"] is None
    assert {r["shape"] for r in report["host_work"]} == {"llama-3.2-1b", "qwen3-1.7b",
                                                          "gemma-2-2b"}
    assert [t["kernel"] for t in report["tails"]] == ["mul_mat_vec_q_norm_add_q4_k",
                                                      "mul_mat_vec_q_rope_kv_q4_k_f16"]
    assert [r["captures"] for r in report["host_work_batched"]] == [1, 1, 1]
    assert report["seconds"]["total"] > 0
