"""The `inferdesk` command. Plain `inferdesk` opens the desktop app."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from inference.backends.base import SamplingParams
from inference.errors import InferdeskError, InvalidInputError
from inference.events import DoneEvent, TokenEvent

BACKEND_CHOICES = ["auto", "cuda", "mlx", "cpu", "numpy"]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def cmd_models(args: argparse.Namespace) -> int:
    from inference.store import discover

    specs = discover(extra_paths=args.path or ())
    print(f"{'name':40} {'kind':8} {'arch':8} {'format':11} {'quant':14} {'params':>8} "
          f"{'file':>9} {'est. mem':>9}  source")
    for s in specs:
        print(f"{s.name[:40]:40} {s.kind:8} {s.architecture:8} {s.format:11} "
              f"{','.join(s.quant_types)[:14]:14} {s.n_params / 1e6:7.0f}M "
              f"{_human_bytes(s.file_size):>9} {_human_bytes(s.est_memory):>9}  {s.source}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from inference.backends import probe_all

    for p in probe_all():
        print(f"{p.name:6} {'yes' if p.available else 'no ':3}  {p.reason}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from inference.api import CausalLM, load_model

    model = load_model(args.model, backend=args.backend)
    if not isinstance(model, CausalLM):
        raise InvalidInputError(f"{model.name} is an embedding model; use `inferdesk embed`.")
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                              seed=args.seed)
    kwargs = {"messages": [{"role": "user", "content": args.prompt}]} if args.chat else {
        "prompt": args.prompt}
    done: DoneEvent | None = None
    for ev in model.generate(**kwargs, max_tokens=args.max_tokens, sampling=sampling,
                             stop=args.stop or ()):
        if isinstance(ev, TokenEvent) and not args.json:
            sys.stdout.write(ev.text)
            sys.stdout.flush()
        elif isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    if args.json:
        print(json.dumps({
            "model": model.name, "backend": model.backend.name, "text": done.text,
            "token_ids": done.token_ids, "n_prompt": done.n_prompt,
            "n_generated": done.n_generated, "finish_reason": done.finish_reason,
            "prefill_tok_s": done.prefill_tok_s, "decode_tok_s": done.decode_tok_s,
            "ttft_s": done.ttft_s,
        }))
    else:
        print()
        print(f"[{done.n_generated} tokens, {done.finish_reason}; ttft {done.ttft_s:.3f} s, "
              f"prefill {done.prefill_tok_s:.1f} tok/s, decode {done.decode_tok_s:.1f} tok/s; "
              f"{model.backend_reason}]", file=sys.stderr)
    return 0


def _read_lines(path: str) -> list[str]:
    if path == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise InvalidInputError(f"{path}: no such input file.") from None
        except UnicodeDecodeError:
            raise InvalidInputError(f"{path}: not UTF-8 text.") from None
    return text.splitlines()


def cmd_embed(args: argparse.Namespace) -> int:
    from inference.api import Encoder, load_model

    sentences = _read_lines(args.input)
    if args.skip_blank:
        sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise InvalidInputError(f"{args.input}: no sentences to embed.")
    model = load_model(args.model, backend=args.backend)
    if not isinstance(model, Encoder):
        raise InvalidInputError(f"{model.name} is not an embedding model.")

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\rembedded {done}/{total}", end="", file=sys.stderr, flush=True)

    vecs = model.embed(sentences, batch_size=args.batch_size, progress=progress)
    try:
        np.save(args.output, vecs)
    except OSError as e:
        raise InvalidInputError(f"{args.output}: cannot write ({e.strerror}).") from None
    if not args.quiet:
        print(f"\nwrote {vecs.shape[0]} x {vecs.shape[1]} to {args.output} "
              f"({model.backend_reason})", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferdesk", description=__doc__)
    sub = p.add_subparsers(dest="command")

    m = sub.add_parser("models", help="list the models Inferdesk can find")
    m.add_argument("--path", action="append", help="also describe this file or directory")
    m.set_defaults(func=cmd_models)

    b = sub.add_parser("backends", help="which backends can run here, and why not")
    b.set_defaults(func=cmd_backends)

    g = sub.add_parser("generate", help="generate text with a causal model")
    g.add_argument("--model", required=True, help="store name or path")
    g.add_argument("--prompt", required=True)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--min-p", type=float, default=0.0)
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    g.add_argument("--json", action="store_true", help="print one JSON object at the end")
    g.set_defaults(func=cmd_generate)

    e = sub.add_parser("embed", help="embed sentences (one per line) into a .npy file")
    e.add_argument("--model", required=True, help="store name or path")
    e.add_argument("--input", required=True, help="text file, or - for stdin")
    e.add_argument("--output", required=True, help="output .npy path")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--skip-blank", action="store_true", help="drop empty lines")
    e.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=cmd_embed)

    from inference.server.cli import add_parser as add_serve

    add_serve(sub, BACKEND_CHOICES)

    from inference.bench import add_parser as add_bench

    add_bench(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command is None:
        from gui.app import main as gui_main

        return gui_main()
    try:
        return args.func(args)
    except InferdeskError as e:
        print(f"inferdesk: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("inferdesk: error: out of memory; try a smaller model or batch.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inferdesk: interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
