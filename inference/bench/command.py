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
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from inference.bench.record import git_commit, machine
from inference.bench.workloads import DECODE_TOKENS, EMBED_MODEL, LLM_MODEL
from inference.cli_args import add_kv_dtype


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
    if (args.threads < 1 or args.rounds < 1 or args.decode_tokens < 1 or args.sentences < 1
            or args.cold < 0):
        from inference.errors import InvalidInputError

        raise InvalidInputError("--threads, --rounds, --decode-tokens and --sentences must be "
                                "at least 1, --cold at least 0.")
    out: dict[str, Any] = {
        "machine": machine(), "commit": None if args.side else git_commit(),
        "threads": args.threads, "rounds": args.rounds, "compare": args.compare,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.compare:
        out["compare_mode"] = ("in-process" if args.in_process and not args.e2e
                               else "one process per side per round")
    if args.e2e:
        from inference.bench.e2e import bench_e2e, summary

        bench_e2e(args, out)
        print(json.dumps(out, indent=2))
        print("\n".join(summary(out["e2e"])), file=sys.stderr)
        return 0
    from inference.bench.embed import bench_embed  # here: every CLI command builds this
    from inference.bench.llm import bench_llm  # parser, and only a bench runs them

    if args.serve:
        from inference.bench.serve import bench_serve

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
    b.add_argument("--e2e", action="store_true",
                   help="instead: whole fresh `inferdesk generate` processes (and llama.cpp's "
                        "with --compare): wall, load, first token, decode, peak memory")
    b.add_argument("--cold", type=int, default=0, metavar="N",
                   help="with --e2e: also N runs with empty kernel and weight caches")
    # One side of one --compare round, run by the parent in a fresh process.
    b.add_argument("--side", choices=["engine", "peer"], help=argparse.SUPPRESS)
    b.add_argument("--ids-file", help=argparse.SUPPRESS)
    b.add_argument("--vectors-file", help=argparse.SUPPRESS)
    b.add_argument("--embed-model", default=EMBED_MODEL, help=argparse.SUPPRESS)
    # Smaller workloads for tests; the published figures use the defaults.
    b.add_argument("--decode-tokens", type=int, default=DECODE_TOKENS,
                   help=f"tokens to generate (default {DECODE_TOKENS})")
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
