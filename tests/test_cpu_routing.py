"""Which kernel each product of the cpu backend reaches, by weight type, row count,
activation mode and CPU capabilities: held against tests/goldens/cpu_routes.json, the
routes as they were before the prefill's choice moved into the routing table. Nothing
runs a kernel: the backend's entry points to each kernel are replaced by recorders, and
the CPU's capabilities (AVX2, VNNI row groups, the K-quant integer dot) are set per case,
so the table is the same on every machine.

    INFERDESK_WRITE_ROUTES=1 pytest tests/test_cpu_routing.py   # rewrite the golden
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.backends.cpu import backend as cpu_backend
from inference.backends.cpu import features, kdot, matvec_int, raw
from inference.backends.cpu.replay import NotCapturable
from tests.bundled import random_tensor

GOLDEN = Path(__file__).parent / "goldens" / "cpu_routes.json"
QTYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
          "Q4_K", "Q5_K", "Q6_K")
PAIRS = (("Q4_0", "Q8_0"), ("Q4_K", "Q6_K"), ("Q4_0", "F16"), ("Q8_0", "F32"))
ROWS = (8, 9)  # MATVEC_ROWS and one more: the last decode and the first prefill
# (form, VNNI row groups, K-quant integer dot available)
CPUS = [("avx2" if avx2 else "neon", vnni, kd)
        for avx2, vnni, kd in itertools.product((True, False), repeat=3)]


class _Stop(Exception):
    pass


def _recording(b: Any, seen: list[str]) -> None:
    """Replace each way into a kernel by one that notes its name and runs nothing."""
    names = {id(np.matmul): "blas", id(kdot.linear): "kdot", id(raw.matvec): "raw"}

    def taped(fn: Any, *args: Any) -> None:
        seen.append(names.get(id(fn), getattr(fn, "__name__", "?")))

    def plan(name: str) -> Any:
        def make(first: Any, w: Any) -> tuple[np.ndarray, Any, int, int]:
            seen.append(name)
            rows = first.shape[0] if isinstance(first, np.ndarray) else first[0].shape[0]
            return np.zeros((rows, w.shape[0]), np.float32), lambda a, c: None, 0, 1
        return make

    def integer_products(x: np.ndarray, ws: Any, big: bool) -> list[np.ndarray]:
        seen.extend("integer" for _ in ws)
        return [np.zeros((x.shape[0], w.shape[0]), np.float32) for w in ws]

    def matvec(x: np.ndarray, w: Any) -> np.ndarray:
        seen.append("matvec_float" if b.activations == "float" else "matvec_int")
        return np.zeros((x.shape[0], w.shape[0]), np.float32)

    b._taped = taped
    b._matvec = matvec
    b._integer_products = integer_products
    b._plan = plan("dequant_sgemm")
    b._gemm_plan = plan("gemm_int")
    b._rows_plan = plan("rows_int")
    b._quantized = lambda x, bits, done: (x,)
    b._share = lambda *a, **k: None


def _routes() -> dict[str, str]:
    """{"<activations> <weight type(s)>": the routes of each case of ``order``, by space}."""
    mp = pytest.MonkeyPatch()
    out: dict[str, list[str]] = {"order": []}
    try:
        mp.setattr(cpu_backend, "_concurrent_kernels", lambda: True)
        for activations in cpu_backend.ACTIVATIONS:
            b = cpu_backend.CpuBackend(activations=activations)
            weights = {q: b.weight(random_tensor(q, 64, 256, seed=1)) if q != "F32"
                       else np.ones((64, 256), np.float32) for q in QTYPES}
            for (form, vnni, kd), rows, capturing in itertools.product(
                    CPUS, ROWS, (False, True)):
                mp.setattr(features, "form", lambda f=form: f)
                mp.setattr(matvec_int, "vnni_groups", lambda v=vnni: v)
                mp.setattr(kdot, "available", lambda k=kd: k)
                x = np.ones((rows, 256), np.float32)
                cases = [(q,) for q in QTYPES] + [p for p in PAIRS]
                for case in cases:
                    seen: list[str] = []
                    _recording(b, seen)
                    b._tape = object() if capturing else None
                    try:
                        if len(case) == 1:
                            b.linear(x, weights[case[0]])
                        else:
                            b.linears(x, [(weights[q], None) for q in case])
                    except NotCapturable:
                        seen.append("not capturable")
                    finally:
                        b._tape = None
                    order = f"{form},vnni={vnni},kdot={kd},rows={rows},capturing={capturing}"
                    if activations == cpu_backend.ACTIVATIONS[0] and case == cases[0]:
                        out["order"].append(order)
                    key = f"{activations} {'+'.join(case)}"
                    out.setdefault(key, []).append("+".join(seen).replace(" ", "_"))
    finally:
        mp.undo()
    return {k: " ".join(v) for k, v in out.items()}


def test_each_product_reaches_the_kernel_it_did() -> None:
    got = _routes()
    if os.environ.get("INFERDESK_WRITE_ROUTES"):
        GOLDEN.write_text(json.dumps(got, indent=0) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got["order"] == want["order"] and got.keys() == want.keys()
    order = want["order"].split()
    differ = [(k, case, g, w) for k in want if k != "order"
              for case, g, w in zip(order, got[k].split(), want[k].split(), strict=True)
              if g != w]
    assert not differ, f"{len(differ)} routes changed, e.g. {differ[:3]}"
