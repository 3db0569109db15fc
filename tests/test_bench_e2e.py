"""bench --e2e's measuring: a child process's JSON, wall time and peak memory; the decode
split from token arrival times; the peer's process imports no engine code."""

from __future__ import annotations

import ast
import sys

import pytest

from inference.bench.e2e import PEER_SCRIPT, decode_split, run_process


def test_run_process_reads_json_wall_and_peak_rss() -> None:
    # A child that holds ~64 MB at its peak: wait4's ru_maxrss is that child's alone.
    code = "import json; b = bytearray(64 << 20); print('noise'); print(json.dumps({'x': 1}))"
    res = run_process([sys.executable, "-c", code])
    assert res["x"] == 1 and res["wall_s"] > 0
    assert res["peak_rss_bytes"] >= 64 << 20
    bad = run_process([sys.executable, "-c", "import sys; sys.exit('one sentence')"])
    assert bad == {"failed": "one sentence"}


def test_decode_split() -> None:
    # prefill at 1.0 s, then 0.5 s steps for 4 steps, then 0.1 s steps
    times = [1.0, 1.5, 2.0, 2.5, 3.0, 3.1, 3.2, 3.3]
    s = decode_split(times)
    assert s["first_decode_s"] == pytest.approx(0.5)
    assert s["decode_tok_s"] == pytest.approx(7 / 2.3)
    assert s["steady_decode_tok_s"] == pytest.approx(3 / 0.3)
    assert decode_split([1.0]) == {"first_decode_s": None, "decode_tok_s": None,
                                   "steady_decode_tok_s": None}


def test_peer_script_imports_no_engine_code() -> None:
    """Its process's wall time is llama.cpp's, not the engine's imports."""
    tree = ast.parse(PEER_SCRIPT.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(n.split(".")[0] in ("inference", "kernels", "gui") for n in names)
