"""`inferdesk bench --e2e`: what a user waits for, in whole fresh processes.

Each round runs, in this order and reversed on odd rounds, one ``inferdesk generate``
process (``python -m inference.cli generate --json``) and, with ``--compare``, one
llama-cpp-python process loading the same file: the bench prompt, the same number of
tokens (end-of-sequence does not stop either), greedy, the same threads. Per process:

- ``wall_s``: from starting the process to its exit (imports, load, generation, exit);
- ``load_s``: the model's load as the process timed it (llama.cpp: ``Llama()``);
- ``ttft_s``: from the end of the load to the first token (tokenizing and prefill);
- ``first_decode_s``: the first decode step; ``steady_decode_tok_s``: the decode rate after
  ``STEADY_AFTER`` steps; ``decode_tok_s``: over all decode steps;
- ``peak_rss_bytes``: the process's peak resident memory (``wait4``), and
  ``rss_after_load_bytes`` as the process read it after the load;
- ours also ``compile_s``: seconds numba spent compiling kernels.

Warm rounds use the kernel and weight caches as they are (one untimed run fills them
first); ``--cold`` adds rounds of ours with both caches pointed at a new empty folder
(``NUMBA_CACHE_DIR``), as on the first run after install. Medians and the ratios of ours
to llama.cpp's are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inference.bench.rounds import median
from inference.bench.workloads import workloads

STEADY_AFTER = 4  # decode steps that may still compile, capture the step or start threads
FIELDS = ("wall_s", "load_s", "ttft_s", "prefill_tok_s", "first_decode_s", "decode_tok_s",
          "steady_decode_tok_s", "peak_rss_bytes", "rss_after_load_bytes", "compile_s")
PEER_SCRIPT = Path(__file__).with_name("peers.py")


def decode_split(times: list[float]) -> dict[str, float | None]:
    """From token arrival times (the first is the prefill's): the first decode step's
    seconds, the decode rate over all steps and after ``STEADY_AFTER`` steps."""
    if len(times) < 2:
        return {"first_decode_s": None, "decode_tok_s": None, "steady_decode_tok_s": None}
    k = min(STEADY_AFTER, len(times) - 2)
    return {"first_decode_s": times[1] - times[0],
            "decode_tok_s": (len(times) - 1) / (times[-1] - times[0]),
            "steady_decode_tok_s": (len(times) - 1 - k) / (times[-1] - times[k])}


def run_process(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``argv`` to its end: its JSON (last line of stdout), wall seconds and peak RSS;
    or {"failed": its last line of stderr}."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0 or not stdout.strip():
        return {"failed": (stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    res = json.loads(stdout.strip().splitlines()[-1])
    res.update(wall_s=wall, peak_rss_bytes=usage.ru_maxrss * 1024)  # Linux: kilobytes
    return res


def ours_argv(args: argparse.Namespace, path: str, prompt: str) -> list[str]:
    return [sys.executable, "-m", "inference.cli", "generate", "--model", path,
            "--prompt", prompt, "--max-tokens", str(args.decode_tokens), "--ignore-eos",
            "--backend", args.backend, "--threads", str(args.threads), "--json",
            *(["--kv-dtype", args.kv_dtype] if args.kv_dtype else [])]


def _sample(res: dict[str, Any]) -> dict[str, Any]:
    if "failed" in res:
        return res
    res.update(decode_split(res.pop("token_times_s")))
    res.pop("token_ids", None)
    res.pop("text", None)
    return res


def _summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [s for s in samples if "failed" not in s]
    out: dict[str, Any] = {k: median([s[k] for s in ok]) for k in FIELDS
                           if ok and all(s.get(k) is not None for s in ok)}
    out["samples"] = samples
    if not ok:
        out["failed"] = samples[0]["failed"] if samples else "no round ran"
    return out


def bench_e2e(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from inference.store import resolve

    spec = resolve(args.llm_model)
    prompt, _ = workloads()
    path = str(spec.path)
    ours: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        prompt_file.write_text(prompt, encoding="utf-8")
        peer_argv = [sys.executable, "-c",  # a script file: no engine import in its time
                     "import runpy, sys; sys.argv = sys.argv[1:]; "
                     "runpy.run_path(sys.argv[0], run_name='__main__')",
                     str(PEER_SCRIPT), path, str(prompt_file), str(args.decode_tokens),
                     str(args.threads)]
        run_process(ours_argv(args, path, prompt))  # fills the caches: warm rounds follow
        sides = [(ours, lambda: run_process(ours_argv(args, path, prompt)))]
        if args.compare:
            sides.append((peer, lambda: run_process(peer_argv)))
        for r in range(args.rounds):
            for into, run in sides if r % 2 == 0 else sides[::-1]:
                into.append(_sample(run()))
        for r in range(args.cold):
            cache = Path(tmp) / f"cold-{r}"
            env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
            cold.append(_sample(run_process(ours_argv(args, path, prompt), env)))
    res: dict[str, Any] = {
        "model": spec.name, "file_bytes": spec.file_size, "tokens": args.decode_tokens,
        "threads": args.threads, "steady_after_steps": STEADY_AFTER,
        "inferdesk": _summary(ours)}
    if cold:
        res["inferdesk_cold"] = _summary(cold)
    if args.compare:
        res["llama_cpp"] = _summary(peer)
        a, b = res["inferdesk"], res["llama_cpp"]
        res["ratio"] = {k: round(a[k] / b[k], 3) for k in FIELDS if k in a and k in b and b[k]}
        if cold and "wall_s" in res["inferdesk_cold"] and "wall_s" in b:
            res["ratio"]["cold_wall_s"] = round(res["inferdesk_cold"]["wall_s"] / b["wall_s"], 3)
    out["e2e"] = res


def summary(res: dict[str, Any]) -> list[str]:
    """Lines for the terminal."""
    lines = [f"end to end, {res['model']}, {res['tokens']} tokens, {res['threads']} threads:"]
    for key, name in (("inferdesk", "ours"), ("inferdesk_cold", "ours, empty caches"),
                      ("llama_cpp", "llama.cpp")):
        s = res.get(key)
        if not s:
            continue
        if "failed" in s:
            lines.append(f"  {name}: failed: {s['failed']}")
            continue
        lines.append(
            f"  {name}: wall {s['wall_s']:.2f} s, load {s['load_s']:.2f} s, "
            f"ttft {s['ttft_s']:.2f} s, first decode step {s.get('first_decode_s', 0):.3f} s, "
            f"steady decode {s.get('steady_decode_tok_s', 0):.1f} tok/s, "
            f"peak RSS {s['peak_rss_bytes'] / 2**20:.0f} MiB"
            + (f", compiling {s['compile_s']:.1f} s" if "compile_s" in s else ""))
    if "ratio" in res:
        lines.append("  ours / llama.cpp: " + ", ".join(f"{k} {v}x" for k, v in
                                                      res["ratio"].items()))
    return lines
