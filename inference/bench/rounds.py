"""Rounds of a comparison: each side in a fresh process or interleaved in this one, the
order alternating round by round so drift in a shared machine's load hits both sides."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def settle() -> None:
    # Let the previous runner's spinning OpenMP/BLAS workers go to sleep before timing.
    time.sleep(0.3)


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def side_process(args: argparse.Namespace, side: str, only: str, extra: Sequence[str] = ()
          ) -> dict[str, Any]:
    """One round of one side, in a fresh process; returns its JSON."""
    argv = [sys.executable, "-m", "inference.bench", "--only", only, "--side", side,
            "--threads", str(args.threads), "--rounds", "1", "--backend", args.backend,
            "--llm-model", args.llm_model, "--embed-model", args.embed_model,
            "--decode-tokens", str(args.decode_tokens), "--sentences", str(args.sentences),
            *(["--kv-dtype", args.kv_dtype] if args.kv_dtype else []), *extra]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"{side} process failed: {tail}"}
    return json.loads(proc.stdout)


def compare_in_processes(args: argparse.Namespace, only: str, extra: Sequence[str] = ()
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """args.rounds rounds of (engine, peer) processes, the order alternating per round."""
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = [("engine", ours), ("peer", theirs)]
        for side, into in order if r % 2 == 0 else order[::-1]:
            into.append(side_process(args, side, only, extra))
    return ours, theirs


def interleave(runners: list[Any], rounds: int, once: Callable[[Any], dict[str, float]]
                ) -> list[list[dict[str, float]]]:
    """rounds x runners samples; odd rounds run the runners in reverse order."""
    samples: list[list[dict[str, float]]] = [[] for _ in runners]
    for r in range(rounds):
        order = list(range(len(runners)))
        for i in order if r % 2 == 0 else order[::-1]:
            settle()
            samples[i].append(once(runners[i]))
    return samples

