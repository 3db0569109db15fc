"""`inferdesk bench`: fixed workloads, timed, printed as JSON.

Workloads (resources/bench/):
- LLM: the 138-token prompt.txt is prefilled (prefill tok/s), then 128 tokens are decoded
  greedily, EOS ignored (decode tok/s);
- embeddings: the 1,000 sentences of sentences.txt at batch 32 (sentences/s).
With ``--compare`` llama-cpp-python and sentence-transformers run the same workloads with
the same thread count, each round of each side in a fresh process of its own (thread pools
of two stacks in one process interfere: OpenMP, OpenBLAS and torch each spin their own), in
alternating order round by round (so drift in a shared machine's load hits both sides); the
ratios of the medians are reported. ``--in-process`` keeps both sides in this process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import resources
from inference.backends.base import host_rss
from inference.cli import add_kv_dtype
from inference.generate import generate_step
from inference.sampling import SamplingParams
from inference.threads import set_threads

BENCH_DIR = Path(resources.__file__).parent / "bench"
LLM_MODEL = "SmolLM2-135M-Instruct.Q4_1"
EMBED_MODEL = "all-MiniLM-L6-v2"
DECODE_TOKENS = 128
BATCH_SIZE = 32


def workloads() -> tuple[str, list[str]]:
    prompt = (BENCH_DIR / "prompt.txt").read_text(encoding="utf-8")
    sentences = (BENCH_DIR / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return prompt, sentences


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


class EngineEmbed:
    name = "inferdesk"

    def __init__(self, model: Any):
        self.model = model

    def run(self, sentences: Sequence[str], batch_size: int, batching: str = "planned"
            ) -> tuple[float, np.ndarray]:
        t0 = time.perf_counter()
        vecs = self.model.embed(list(sentences), batch_size=batch_size, batching=batching)
        return len(sentences) / (time.perf_counter() - t0), vecs


def write_record(out_dir: str | Path, name: str, script: str, fields: dict[str, Any]) -> Path:
    """A benchmark script's raw figures as ``out_dir/<UTC minute>-<name>.json``, with the
    command that made them, the CPU, the load average and the date."""
    out = Path(out_dir) / f"{time.strftime('%Y%m%d-%H%M')}-{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": f"python {script} " + " ".join(sys.argv[1:]), "cpu": cpu_info(),
        "load_avg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), **fields},
        indent=1))
    print(f"wrote {out}")
    return out


def _settle() -> None:
    # Let the previous runner's spinning OpenMP/BLAS workers go to sleep before timing.
    time.sleep(0.3)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def cpu_info() -> dict[str, Any]:
    """The CPU's model name and the vector extensions that decide which kernels run."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = value.split()
    except OSError:
        pass
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni",
              "avx512_bf16", "amx_tile", "neon", "asimd", "asimddp", "i8mm", "sve")
    return {"model": model, "vector_flags": [f for f in wanted if f in flags]}


def _side(args: argparse.Namespace, side: str, only: str, extra: Sequence[str] = ()
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


def _compare_in_processes(args: argparse.Namespace, only: str, extra: Sequence[str] = ()
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """args.rounds rounds of (engine, peer) processes, the order alternating per round."""
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = [("engine", ours), ("peer", theirs)]
        for side, into in order if r % 2 == 0 else order[::-1]:
            into.append(_side(args, side, only, extra))
    return ours, theirs


def _interleave(runners: list[Any], rounds: int, once: Callable[[Any], dict[str, float]]
                ) -> list[list[dict[str, float]]]:
    """rounds x runners samples; odd rounds run the runners in reverse order."""
    samples: list[list[dict[str, float]]] = [[] for _ in runners]
    for r in range(rounds):
        order = list(range(len(runners)))
        for i in order if r % 2 == 0 else order[::-1]:
            _settle()
            samples[i].append(once(runners[i]))
    return samples


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
        from inference.bench_peers import llama_cpp_runner

        peer = llama_cpp_runner(spec.path, args.threads, n_ctx=len(ids) + args.decode_tokens + 8)
        if isinstance(peer, str):
            res["llama_cpp"] = {"skipped": peer}
        else:
            runners.append(peer)
    for r in runners:  # warm-up: JIT compiles, page-ins, thread pools
        r.run(ids[:16], 4)
    samples = _interleave(runners, args.rounds, lambda r: r.run(ids, args.decode_tokens))
    keys = ("inferdesk", "llama_cpp")
    for key, runner, ss in zip(keys, runners, samples, strict=False):
        res[key] = {
            "prefill_tok_s": round(_median([s["prefill_tok_s"] for s in ss]), 1),
            "decode_tok_s": round(_median([s["decode_tok_s"] for s in ss]), 1),
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
    mat-vec speed of each weight type in the file (:mod:`inference.bench_kernels`)."""
    from inference.bench_kernels import decode_breakdown, step_replay, weight_types
    from inference.formats import read_checkpoint

    res["decode_breakdown"] = decode_breakdown(model, ids, min(n_decode, 32))
    replay = step_replay(model, ids, n_decode)
    if replay is not None:
        res["step_replay"] = replay
    res["weight_types"] = weight_types(read_checkpoint(spec.path), model.backend)


def _llm_peer_side(args: argparse.Namespace, spec: Any, out: dict[str, Any]) -> None:
    from inference.bench_peers import llama_cpp_runner

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
        ours, theirs = _compare_in_processes(args, "llm", ["--ids-file", str(ids_file)])
    ours = [o["llm"] for o in ours if "llm" in o]
    skipped = [t.get("skipped") or t["llm"].get("skipped") for t in theirs
               if "skipped" in t or "skipped" in t.get("llm", {})]
    theirs = [t["llm"] for t in theirs if "llm" in t and "skipped" not in t["llm"]]
    for key, ss in (("inferdesk", ours), ("llama_cpp", theirs)):
        res[key] = {
            "prefill_tok_s": round(_median([s["prefill_tok_s"] for s in ss]), 1),
            "decode_tok_s": round(_median([s["decode_tok_s"] for s in ss]), 1),
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
        from inference.bench_peers import st_runner

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

    samples = _interleave(runners, args.rounds, once)
    for key, runner, ss in zip(("inferdesk", "sentence_transformers"), runners, samples,
                               strict=False):
        rates = [s["sentences_s"] for s in ss]
        res[key] = {"sentences_s": round(_median(rates), 1),
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
        from inference.bench_peers import st_runner

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
                into.append(_side(args, side, "embed", ["--vectors-file", str(vpath)]))
        ours = [o["embed"] for o in ours if "embed" in o]
        peer_ok = [t["embed"] for t in theirs if "skipped" not in t.get("embed", t)]
        res["backend"] = ours[0]["backend"] if ours else args.backend
        res["inferdesk"] = {"sentences_s": round(_median([o["sentences_s"] for o in ours]), 1),
                            "samples": [round(o["sentences_s"], 1) for o in ours],
                            "processes": "one per round", "pids": [o["pid"] for o in ours]}
        fixed = [o["fixed_sentences_s"] for o in ours if "fixed_sentences_s" in o]
        if fixed:  # batches of BATCH_SIZE by length, as sentence-transformers makes them
            res["inferdesk_fixed_batches"] = {"sentences_s": round(_median(fixed), 1),
                                              "samples": [round(x, 1) for x in fixed]}
        if not peer_ok:
            bad = next((t.get("skipped") or t["embed"]["skipped"] for t in theirs), "no round")
            res["sentence_transformers"] = {"skipped": bad}
            return res
        res["sentence_transformers"] = {
            "sentences_s": round(_median([t["sentences_s"] for t in peer_ok]), 1),
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


def _summary(out: dict[str, Any]) -> str:
    lines = []
    llm = out.get("llm")
    if llm:
        o = llm["inferdesk"]
        lines.append(f"LLM {llm['model']} on {llm['backend']}: prefill {o['prefill_tok_s']} tok/s, "
                     f"decode {o['decode_tok_s']} tok/s, "
                     f"{llm['weight_bytes_per_token'] / 1e6:.1f} MB of weights read per token")
        d = llm.get("decode_breakdown")
        if d:
            lines.append(f"  per decode token: {d['ms_per_token']} ms profiled, "
                         f"{d['ops_ms_per_token']} in backend ops, "
                         f"{d['outside_ops_ms_per_token']} outside them, "
                         f"{d['op_calls_per_token']} op calls")
        r = llm.get("step_replay")
        if r:
            lines.append(f"  decode step replayed: {r['replayed_ms_per_token']} ms a token "
                         f"({r['replay_calls_per_token']} calls), eager "
                         f"{r['eager_ms_per_token']} ms: the model's and ops' Python "
                         f"{r['python_ms_per_token']} ms a token"
                         + (f" (not replayed: {r['eager_reason']})" if r["eager_reason"]
                            else ""))
        for qtype, w in llm.get("weight_types", {}).items():
            lines.append(f"  {qtype} mat-vec ({w['tensor']} {w['shape'][0]}x{w['shape'][1]}): "
                         f"{w['gweights_s']} Gweights/s")
        p = llm.get("llama_cpp", {})
        if "ratio" in llm:
            lines.append(f"  llama.cpp: prefill {p['prefill_tok_s']}, decode {p['decode_tok_s']}"
                         f" -> ratio prefill {llm['ratio']['prefill_tok_s']}x, "
                         f"decode {llm['ratio']['decode_tok_s']}x")
        elif "skipped" in p:
            lines.append(f"  llama.cpp skipped: {p['skipped']}")
    emb = out.get("embed")
    if emb:
        lines.append(f"embed {emb['model']} on {emb['backend']}: "
                     f"{emb['inferdesk']['sentences_s']} sentences/s")
        p = emb.get("sentence_transformers", {})
        if "ratio" in emb:
            lines.append(f"  sentence-transformers: {p['sentences_s']} sentences/s -> ratio "
                         f"{emb['ratio']['sentences_s']}x")
        if "fixed_batches_sentences_s" in emb.get("ratio", {}):
            lines.append(f"  in the peer's batches ({emb['batch_size']} by length): "
                         f"{emb['inferdesk_fixed_batches']['sentences_s']} sentences/s -> "
                         f"ratio {emb['ratio']['fixed_batches_sentences_s']}x")
        elif "skipped" in p:
            lines.append(f"  sentence-transformers skipped: {p['skipped']}")
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.threads < 1 or args.rounds < 1 or args.decode_tokens < 1 or args.sentences < 1:
        from inference.errors import InvalidInputError

        raise InvalidInputError("--threads, --rounds, --decode-tokens and --sentences must be "
                                "at least 1.")
    out: dict[str, Any] = {
        "machine": {"cpu": cpu_info()["model"], "vector_flags": cpu_info()["vector_flags"],
                    "cores": os.cpu_count(), "python": platform.python_version(),
                    # Other processes' load skews multi-threaded timings badly (README).
                    "loadavg_1m_at_start": round(os.getloadavg()[0], 2)},
        "threads": args.threads, "rounds": args.rounds, "compare": args.compare,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.compare:
        out["compare_mode"] = "in-process" if args.in_process else "one process per side per round"
    if args.serve:
        from inference.server.bench_serve import bench_serve

        bench_serve(args, out)
    elif args.only in (None, "llm"):
        bench_llm(args, out)
    if args.only in (None, "embed") and not args.serve:
        bench_embed(args, out)
    if args.side is not None:  # a child of --compare: JSON only, read by the parent
        print(json.dumps(out))
        return 0
    print(json.dumps(out, indent=2))
    print(_summary(out), file=sys.stderr)
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    b = subparsers.add_parser("bench", help="time fixed LLM and embedding workloads (JSON)")
    b.add_argument("--backend", default="auto", help="auto, or a backend name (see backends)")
    add_kv_dtype(b)
    b.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="threads for the engine and the peers (default: all cores)")
    b.add_argument("--compare", action="store_true",
                   help="also run llama-cpp-python and sentence-transformers, if installed")
    b.add_argument("--in-process", action="store_true",
                   help="with --compare: run the peers in this process (they interfere)")
    b.add_argument("--rounds", type=int, default=3, help="timed rounds per runner (median)")
    b.add_argument("--only", choices=["llm", "embed"], help="run one workload only")
    b.add_argument("--model", "--llm-model", dest="llm_model", default=LLM_MODEL,
                   help="the LLM to time: a store name or a .gguf path (default: bundled)")
    b.add_argument("--serve", action="store_true",
                   help="instead: the OpenAI server under 1, 4 and 8 concurrent streams")
    # One side of one --compare round, run by the parent in a fresh process.
    b.add_argument("--side", choices=["engine", "peer"], help=argparse.SUPPRESS)
    b.add_argument("--ids-file", help=argparse.SUPPRESS)
    b.add_argument("--vectors-file", help=argparse.SUPPRESS)
    b.add_argument("--embed-model", default=EMBED_MODEL, help=argparse.SUPPRESS)
    # Smaller workloads for tests; the published figures use the defaults.
    b.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS, help=argparse.SUPPRESS)
    b.add_argument("--sentences", type=int, default=1000, help=argparse.SUPPRESS)
    b.set_defaults(func=cmd_bench)
    return b


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m inference.bench ...`: the same as `inferdesk bench ...`."""
    from inference.errors import InferdeskError

    p = argparse.ArgumentParser(prog="inferdesk")
    add_parser(p.add_subparsers(dest="command"))
    args = p.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except InferdeskError as e:
        print(f"inferdesk: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
