"""The LLM workload: the bench prompt prefilled, then greedy decode steps, on the engine
and (``--compare``) on llama-cpp-python, with the memory a load takes and what explains the
decode speed (:mod:`.kernels`)."""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inference.backends.base import host_rss
from inference.bench.rounds import compare_in_processes, interleave, median
from inference.bench.workloads import workloads
from inference.generate import generate_step
from inference.sampling import SamplingParams
from inference.threads import set_threads


def _import_backends(requested: str) -> None:
    from inference.backends import auto_order, probe

    for name in auto_order() if requested == "auto" else (requested,):
        try:
            probe(name)
        except Exception:  # an unknown name is reported by load_model itself
            pass


def weight_bytes_per_token(model: Any) -> int:
    """Bytes of weights one decode step reads, from the backend's own layout: every
    matrix and vector the model holds, once (a tied embedding counts once, as the output
    head it is); an untied embedding table counts one row. The KV cache is not included."""
    seen: dict[int, int] = {}

    def walk(o: Any) -> None:
        if id(o) in seen or isinstance(o, (int, float, str, bool)) or o is None:
            return
        if hasattr(o, "nbytes"):
            seen[id(o)] = int(o.nbytes)
        elif isinstance(o, (list, tuple)):
            for x in o:
                walk(x)
        elif type(o).__module__.startswith("inference.models"):
            for x in vars(o).values():
                walk(x)

    walk(model)
    total = sum(seen.values())
    emb = model.embed_tokens
    if emb is not getattr(model, "lm_head", emb):
        total -= int(emb.nbytes) - int(emb.nbytes) // int(emb.shape[0])
    return total


class EngineLLM:
    name = "inferdesk"

    def __init__(self, model: Any):
        self.model = model

    def run(self, ids: Sequence[int], n_decode: int) -> dict[str, Any]:
        """The engine's own token loop (generate_step): prefill + first sample, then
        n_decode greedy steps; EOS does not stop it."""
        m = self.model.model
        t0 = time.perf_counter()
        steps = generate_step(m, list(ids), SamplingParams(temperature=0.0),
                              np.random.default_rng(0), max_len=len(ids) + n_decode + 1)
        toks = [next(steps)]
        t1 = time.perf_counter()
        for _ in range(n_decode):
            toks.append(next(steps))
        t2 = time.perf_counter()
        steps.close()
        return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": n_decode / (t2 - t1),
                "tokens": toks}


def bench_llm(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from inference.api import CausalLM, load_model
    from inference.store import resolve

    prompt, _ = workloads()
    spec = resolve(args.llm_model)
    if args.side == "peer":  # this process runs llama.cpp only
        _llm_peer_side(args, spec, out)
        return
    _import_backends(args.backend)  # library code is not the model's memory
    gc.collect()
    rss0 = host_rss()
    model = load_model(spec, backend=args.backend, kv_dtype=args.kv_dtype)
    out["kv_dtype"] = str(getattr(model.backend, "kv_dtype", "float32"))
    gc.collect()
    rss1 = host_rss()
    if not isinstance(model, CausalLM):
        raise SystemExit(f"inferdesk bench: {spec.name} is not a causal model")
    out["threads_capped"] = set_threads(args.threads, model.backend)
    ids = model.tokenize(prompt)
    a = model.args
    kv = 2 * len(model.model.layers) * a.num_key_value_heads * a.head_dim * (
        len(ids) + args.decode_tokens + 1) * 4
    res: dict[str, Any] = {
        "model": spec.name, "backend": model.backend.name, "backend_reason": model.backend_reason,
        "prompt_tokens": len(ids), "decode_tokens": args.decode_tokens,
        "memory": {"file_bytes": spec.file_size, "rss_load_delta_bytes": rss1 - rss0,
                   "kv_cache_bytes": kv,
                   "rss_load_delta_over_file": round((rss1 - rss0) / spec.file_size, 3),
                   # the memory rule: resident after load <= 1.5x the file + the KV cache
                   "rss_limit_bytes": int(1.5 * spec.file_size) + kv},
    }
    res["weight_bytes_per_token"] = weight_bytes_per_token(model.model)
    runners: list[Any] = [EngineLLM(model)]
    if args.side == "engine":
        r = runners[0]
        r.run(ids[:16], 4)  # warm-up: JIT compiles, page-ins, thread pools
        out["llm"] = {**res, "ids": ids, **r.run(ids, args.decode_tokens)}
        return
    if args.compare and not args.in_process:
        _llm_compare(args, res, ids)
        res["memory"]["rss_after_run_bytes"] = host_rss()
        _explain_decode(res, model, spec, ids, args.decode_tokens)
        out["llm"] = res
        return
    if args.compare:
        from inference.bench.peers import llama_cpp_runner

        peer = llama_cpp_runner(spec.path, args.threads, n_ctx=len(ids) + args.decode_tokens + 8)
        if isinstance(peer, str):
            res["llama_cpp"] = {"skipped": peer}
        else:
            runners.append(peer)
    for r in runners:  # warm-up: JIT compiles, page-ins, thread pools
        r.run(ids[:16], 4)
    samples = interleave(runners, args.rounds, lambda r: r.run(ids, args.decode_tokens))
    keys = ("inferdesk", "llama_cpp")
    for key, runner, ss in zip(keys, runners, samples, strict=False):
        res[key] = {
            "prefill_tok_s": round(median([s["prefill_tok_s"] for s in ss]), 1),
            "decode_tok_s": round(median([s["decode_tok_s"] for s in ss]), 1),
            "prefill_samples": [round(s["prefill_tok_s"], 1) for s in ss],
            "decode_samples": [round(s["decode_tok_s"], 1) for s in ss],
        }
        if key != "inferdesk":
            res[key]["version"] = runner.version
    if len(runners) == 2:
        ours, theirs = res["inferdesk"], res["llama_cpp"]
        same = sum(x == y for x, y in zip(samples[0][0]["tokens"], samples[1][0]["tokens"],
                                          strict=True))
        res["greedy_tokens_equal"] = f"{same}/{args.decode_tokens + 1}"
        res["ratio"] = {k: round(ours[k] / theirs[k], 3) for k in ("prefill_tok_s",
                                                                   "decode_tok_s")}
    res["memory"]["rss_after_run_bytes"] = host_rss()
    _explain_decode(res, model, spec, ids, args.decode_tokens)
    out["llm"] = res


def _explain_decode(res: dict[str, Any], model: Any, spec: Any, ids: list[int],
                    n_decode: int) -> None:
    """After the timed rounds: the per-token split (inside / outside backend ops) and the
    mat-vec speed of each weight type in the file (:mod:`.kernels`)."""
    from inference.bench.kernels import decode_breakdown, step_replay, weight_types
    from inference.formats import read_checkpoint

    res["decode_breakdown"] = decode_breakdown(model, ids, min(n_decode, 32))
    replay = step_replay(model, ids, n_decode)
    if replay is not None:
        res["step_replay"] = replay
    res["weight_types"] = weight_types(read_checkpoint(spec.path), model.backend)


def _llm_peer_side(args: argparse.Namespace, spec: Any, out: dict[str, Any]) -> None:
    from inference.bench.peers import llama_cpp_runner

    ids = json.loads(Path(args.ids_file).read_text())
    peer = llama_cpp_runner(spec.path, args.threads, n_ctx=len(ids) + args.decode_tokens + 8)
    if isinstance(peer, str):
        out["llm"] = {"skipped": peer}
        return
    peer.run(ids[:16], 4)
    out["llm"] = {"version": peer.version, **peer.run(ids, args.decode_tokens)}


def _llm_compare(args: argparse.Namespace, res: dict[str, Any], ids: list[int]) -> None:
    """Engine and llama.cpp rounds, each in its own process, on the same token ids."""
    with tempfile.TemporaryDirectory() as tmp:
        ids_file = Path(tmp) / "ids.json"
        ids_file.write_text(json.dumps(ids))
        ours, theirs = compare_in_processes(args, "llm", ["--ids-file", str(ids_file)])
    ours = [o["llm"] for o in ours if "llm" in o]
    skipped = [t.get("skipped") or t["llm"].get("skipped") for t in theirs
               if "skipped" in t or "skipped" in t.get("llm", {})]
    theirs = [t["llm"] for t in theirs if "llm" in t and "skipped" not in t["llm"]]
    for key, ss in (("inferdesk", ours), ("llama_cpp", theirs)):
        res[key] = {
            "prefill_tok_s": round(median([s["prefill_tok_s"] for s in ss]), 1),
            "decode_tok_s": round(median([s["decode_tok_s"] for s in ss]), 1),
            "prefill_samples": [round(s["prefill_tok_s"], 1) for s in ss],
            "decode_samples": [round(s["decode_tok_s"], 1) for s in ss],
            "processes": "one per round",
        }
    if skipped or not theirs:
        res["llama_cpp"] = {"skipped": skipped[0] if skipped else "no peer round finished"}
        return
    res["llama_cpp"]["version"] = theirs[0]["version"]
    same = sum(x == y for x, y in zip(ours[0]["tokens"], theirs[0]["tokens"], strict=True))
    res["greedy_tokens_equal"] = f"{same}/{args.decode_tokens + 1}"
    res["ratio"] = {k: round(res["inferdesk"][k] / res["llama_cpp"][k], 3)
                    for k in ("prefill_tok_s", "decode_tok_s")}


