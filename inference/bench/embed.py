"""The embedding workload: the bench sentences at batch 32, on the engine and
(``--compare``) on sentence-transformers, with the cosine between their vectors."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.bench.rounds import interleave, median, side_process
from inference.bench.workloads import BATCH_SIZE, workloads
from inference.threads import set_threads


class EngineEmbed:
    name = "inferdesk"

    def __init__(self, model: Any):
        self.model = model

    def run(self, sentences: Sequence[str], batch_size: int, batching: str = "planned"
            ) -> tuple[float, np.ndarray]:
        t0 = time.perf_counter()
        vecs = self.model.embed(list(sentences), batch_size=batch_size, batching=batching)
        return len(sentences) / (time.perf_counter() - t0), vecs


def bench_embed(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from inference.api import Encoder, load_model
    from inference.store import resolve

    _, sentences = workloads()
    sentences = sentences[: args.sentences]
    spec = resolve(args.embed_model)
    if args.side is not None:
        _embed_side(args, spec, sentences, out)
        return
    if args.compare and not args.in_process:
        out["embed"] = _embed_compare(args, spec)
        return
    model = load_model(spec, backend=args.backend)
    if not isinstance(model, Encoder):
        raise SystemExit(f"inferdesk bench: {spec.name} is not an embedding model")
    out["threads_capped"] = set_threads(args.threads, model.backend)
    res: dict[str, Any] = {"model": spec.name, "backend": model.backend.name,
                           "sentences": len(sentences), "batch_size": BATCH_SIZE}
    runners: list[Any] = [EngineEmbed(model)]
    if args.compare:
        from inference.bench.peers import st_runner

        peer = st_runner(spec.path, args.threads)
        if isinstance(peer, str):
            res["sentence_transformers"] = {"skipped": peer}
        else:
            runners.append(peer)
    for r in runners:
        r.run(sentences[:64], BATCH_SIZE)
    vecs: list[np.ndarray] = [np.zeros(0)] * len(runners)

    def once(r: Any) -> dict[str, float]:
        rate, v = r.run(sentences, BATCH_SIZE)
        vecs[runners.index(r)] = v
        return {"sentences_s": rate}

    samples = interleave(runners, args.rounds, once)
    for key, runner, ss in zip(("inferdesk", "sentence_transformers"), runners, samples,
                               strict=False):
        rates = [s["sentences_s"] for s in ss]
        res[key] = {"sentences_s": round(median(rates), 1),
                    "samples": [round(x, 1) for x in rates]}
        if key != "inferdesk":
            res[key]["version"] = runner.version
    if len(runners) == 2:
        cos = np.sum(vecs[0] * vecs[1], axis=1) / (
            np.linalg.norm(vecs[0], axis=1) * np.linalg.norm(vecs[1], axis=1) + 1e-12)
        res["min_cosine_vs_peer"] = round(float(cos.min()), 6)
        res["ratio"] = {"sentences_s": round(res["inferdesk"]["sentences_s"]
                                             / res["sentence_transformers"]["sentences_s"], 3)}
    out["embed"] = res


def _embed_side(args: argparse.Namespace, spec: Any, sentences: list[str],
                out: dict[str, Any]) -> None:
    """One side's round in this process; the vectors go to --vectors-file for the cosine."""
    backend = None
    if args.side == "peer":
        from inference.bench.peers import st_runner

        runner = st_runner(spec.path, args.threads)
        if isinstance(runner, str):
            out["embed"] = {"skipped": runner}
            return
    else:
        from inference.api import load_model

        model = load_model(spec, backend=args.backend)
        out["threads_capped"] = set_threads(args.threads, model.backend)
        runner, backend = EngineEmbed(model), model.backend.name
    runner.run(sentences[:64], BATCH_SIZE)
    rate, vecs = runner.run(sentences, BATCH_SIZE)
    np.save(args.vectors_file, vecs)
    out["embed"] = {"sentences_s": rate, "version": getattr(runner, "version", None),
                    "pid": os.getpid(), "backend": backend}
    if isinstance(runner, EngineEmbed):  # the same batches as the peer: kernels alone
        out["embed"]["fixed_sentences_s"] = runner.run(sentences, BATCH_SIZE, "fixed")[0]


def _embed_compare(args: argparse.Namespace, spec: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"model": spec.name, "sentences": args.sentences,
                           "batch_size": BATCH_SIZE}
    with tempfile.TemporaryDirectory() as tmp:
        ours_v, theirs_v = Path(tmp) / "ours.npy", Path(tmp) / "theirs.npy"
        ours: list[dict[str, Any]] = []
        theirs: list[dict[str, Any]] = []
        for r in range(args.rounds):
            order = [("engine", ours, ours_v), ("peer", theirs, theirs_v)]
            for side, into, vpath in order if r % 2 == 0 else order[::-1]:
                into.append(side_process(args, side, "embed", ["--vectors-file", str(vpath)]))
        ours = [o["embed"] for o in ours if "embed" in o]
        peer_ok = [t["embed"] for t in theirs if "skipped" not in t.get("embed", t)]
        res["backend"] = ours[0]["backend"] if ours else args.backend
        res["inferdesk"] = {"sentences_s": round(median([o["sentences_s"] for o in ours]), 1),
                            "samples": [round(o["sentences_s"], 1) for o in ours],
                            "processes": "one per round", "pids": [o["pid"] for o in ours]}
        fixed = [o["fixed_sentences_s"] for o in ours if "fixed_sentences_s" in o]
        if fixed:  # batches of BATCH_SIZE by length, as sentence-transformers makes them
            res["inferdesk_fixed_batches"] = {"sentences_s": round(median(fixed), 1),
                                              "samples": [round(x, 1) for x in fixed]}
        if not peer_ok:
            bad = next((t.get("skipped") or t["embed"]["skipped"] for t in theirs), "no round")
            res["sentence_transformers"] = {"skipped": bad}
            return res
        res["sentence_transformers"] = {
            "sentences_s": round(median([t["sentences_s"] for t in peer_ok]), 1),
            "samples": [round(t["sentences_s"], 1) for t in peer_ok],
            "version": peer_ok[0]["version"], "processes": "one per round",
            "pids": [t["pid"] for t in peer_ok]}
        a, b = np.load(ours_v), np.load(theirs_v)
    cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)
    res["min_cosine_vs_peer"] = round(float(cos.min()), 6)
    theirs_s = res["sentence_transformers"]["sentences_s"]
    res["ratio"] = {"sentences_s": round(res["inferdesk"]["sentences_s"] / theirs_s, 3)}
    if "inferdesk_fixed_batches" in res:
        res["ratio"]["fixed_batches_sentences_s"] = round(
            res["inferdesk_fixed_batches"]["sentences_s"] / theirs_s, 3)
    return res


