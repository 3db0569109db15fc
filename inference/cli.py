"""The `inferdesk` command. Plain `inferdesk` opens the desktop app."""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from inference import files
from inference.cli_args import BACKEND_CHOICES, add_kv_dtype, add_prefill_dtype
from inference.errors import InferdeskError, InvalidInputError
from inference.events import DoneEvent, TokenEvent
from inference.sampling import SamplingParams
from inference.units import human_bytes


def cmd_models(args: argparse.Namespace) -> int:
    from inference.store import discover

    specs = discover(extra_paths=args.path or (), include_unreadable=True)
    print(f"{'name':40} {'kind':8} {'arch':11} {'context':>7} {'format':11} {'quant':14} "
          f"{'params':>8} {'file':>9} {'est. mem':>9}  source")
    for s in specs:
        ctx = f"{s.context_length:>7}" if s.context_length else f"{'?':>7}"
        print(f"{s.name[:40]:40} {s.kind:8} {s.architecture[:11]:11} {ctx} {s.format:11} "
              f"{','.join(s.quant_types)[:14]:14} {s.n_params / 1e6:7.0f}M "
              f"{human_bytes(s.file_size):>9} {human_bytes(s.est_memory):>9}  {s.source}")
        if s.problem:
            print(f"    cannot run: {s.problem}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from inference.backends import probe_all

    for p in probe_all():
        print(f"{p.name:6} {'yes' if p.available else 'no ':3}  {p.reason}")
    return 0


class CompileClock:
    """Seconds numba spends compiling kernels while it is open: outermost compiles only (a
    kernel compiled inside another's compile counts once); kernels found in the cache count
    nothing. Without numba it stays at 0."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.kernels = 0
        self._depth = 0
        self._t0 = 0.0
        self._listener: Any = None

    def __enter__(self) -> CompileClock:
        from inference.numba_import import import_numba

        try:
            import_numba()
            from numba.core import event
        except ImportError:
            return self
        clock = self

        class Listener(event.Listener):
            def on_start(self, ev: Any) -> None:
                if clock._depth == 0:
                    clock._t0 = time.perf_counter()
                clock._depth += 1

            def on_end(self, ev: Any) -> None:
                clock._depth -= 1
                if clock._depth == 0:
                    clock.seconds += time.perf_counter() - clock._t0
                    clock.kernels += 1

        self._listener = Listener()
        event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._listener is not None:
            from numba.core import event

            event.unregister("numba:compile", self._listener)


_collection_paused = False  # by pause_collection, from a running collector


def pause_collection() -> None:
    """Pause Python's cyclic garbage collector for a one-shot command's start (numba's
    import, the kernel modules, the model's load). What a start allocates is kept to the
    end (registries, kernels, the model), so the collections its allocations trigger only
    traverse it: 50-60 ms of a bundled-model `generate`, 35-40 of them in two full
    collections. :func:`resume_collection` ends the pause."""
    global _collection_paused
    _collection_paused = gc.isenabled()
    gc.disable()


def resume_collection() -> None:
    """Collection again after :func:`pause_collection` (else nothing), with what the
    process holds so far frozen (``gc.freeze``): the first collection would otherwise
    traverse every object the start allocated, all still in the youngest generation."""
    global _collection_paused
    if _collection_paused:
        _collection_paused = False
        gc.freeze()
        gc.enable()


def say_compiling(done: int, total: int, module: str) -> None:
    """``load_model``'s compile_progress on a terminal: the kernels being compiled or loaded,
    one line rewritten in place, cleared when the last is ready."""
    if not sys.stderr.isatty():
        return
    line = f"kernels {done}/{total}" + (f": {module}" if module else "")
    end = "\r\033[K" if done >= total else ""
    print(f"\r\033[K{line}{end}", end="", file=sys.stderr, flush=True)


def cmd_generate(args: argparse.Namespace) -> int:
    from inference.api import CausalLM, load_model
    from inference.backends.base import host_rss, peak_rss

    if args.threads is not None and args.threads < 1:
        raise InvalidInputError("--threads must be at least 1.")
    with CompileClock() as compiled:
        t0 = time.perf_counter()
        model = load_model(args.model, backend=args.backend, kv_dtype=args.kv_dtype,
                           prefill_dtype=args.prefill_dtype,
                           compile_progress=say_compiling)
        load_s = time.perf_counter() - t0
        load_compile_s = compiled.seconds
        resume_collection()
        if not isinstance(model, CausalLM):
            raise InvalidInputError(f"{model.name} is an embedding model; use `inferdesk embed`.")
        if args.threads is not None:
            from inference.threads import set_threads

            set_threads(args.threads, model.backend)
        rss = host_rss()
        done, times = _generate(model, args)
    if args.json:
        print(json.dumps({
            "model": model.name, "backend": model.backend.name, "text": done.text,
            "token_ids": done.token_ids, "n_prompt": done.n_prompt,
            "n_generated": done.n_generated, "finish_reason": done.finish_reason,
            "prefill_tok_s": done.prefill_tok_s, "decode_tok_s": done.decode_tok_s,
            "ttft_s": done.ttft_s, "token_times_s": times,
            "threads": list(done.threads) if done.threads else None,
            "omp_wait": getattr(model.backend, "omp_wait", None),
            "load_s": load_s, "rss_after_load_bytes": rss, "peak_rss_bytes": peak_rss(),
            "rss_after_reply_bytes": host_rss(), "compile_s": compiled.seconds,
            "compile_during_load_s": load_compile_s, "kernels_compiled": compiled.kernels,
        }))
    else:
        print()
        print(f"[{done.n_generated} tokens, {done.finish_reason}; load {load_s:.2f} s, "
              f"ttft {done.ttft_s:.3f} s, prefill {done.prefill_tok_s:.1f} tok/s, "
              f"decode {done.decode_tok_s:.1f} tok/s; {model.backend_reason}]", file=sys.stderr)
    return 0


def _generate(model: Any, args: argparse.Namespace) -> tuple[DoneEvent, list[float]]:
    """Stream the reply (to stdout unless --json); the DoneEvent and each token's arrival
    in seconds since the call."""
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                              seed=args.seed)
    kwargs = {"messages": [{"role": "user", "content": args.prompt}]} if args.chat else {
        "prompt": args.prompt}
    done: DoneEvent | None = None
    times: list[float] = []
    t0 = time.perf_counter()
    for ev in model.generate(**kwargs, max_tokens=args.max_tokens, sampling=sampling,
                             stop=args.stop or (), ignore_eos=args.ignore_eos):
        if isinstance(ev, TokenEvent):
            if ev.token_id >= 0:  # -1: held-back text released at the end, not a token
                times.append(time.perf_counter() - t0)
            if not args.json:
                sys.stdout.write(ev.text)
                sys.stdout.flush()
        elif isinstance(ev, DoneEvent):
            done = ev
    assert done is not None
    return done, times


# Input read for embedding: a bound, so /dev/zero or an endless pipe ends with a sentence.
MAX_INPUT_BYTES = 1 << 30


def _read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 file (or stdin for "-"), split on \\n and \\r\\n only: one row of
    the output per line of the input, whatever other control characters a line holds."""
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        else:
            if os.path.isdir(path):
                raise InvalidInputError(f"{path} is a directory, not a text file.")
            with open(path, "rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such input file.") from None
    except OSError as e:
        raise InvalidInputError(f"{name}: cannot read ({e.strerror or e}).") from None
    if len(data) > MAX_INPUT_BYTES:
        raise InvalidInputError(f"{name} holds more than {MAX_INPUT_BYTES >> 20} MB of text.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInputError(f"{name} is not UTF-8 text (byte {e.start}).") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no new one
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def check_output(path: str) -> None:
    """Refuse, in one sentence and before any work, an output path that cannot be written:
    a directory, a symbolic link (replacing the link would silently leave its target as it
    was), a folder that does not exist or cannot be written."""
    target = Path(path)
    if target.is_symlink():
        raise InvalidInputError(f"{path} is a symbolic link; name the file it points to, or "
                                f"another file, for the output.")
    if target.is_dir():
        raise InvalidInputError(f"{path} is a directory; give a file name for the output.")
    if not target.parent.is_dir() or not os.access(target.parent, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{path}: cannot write in {target.parent} (no such folder, "
                                f"or no permission).")


def write_atomic(path: str, write: Callable[[Any], None]) -> None:
    """Write ``path`` exactly as named, whole or not at all (:func:`inference.files.write_atomic`):
    a failed write (full disk) leaves any existing file as it was, in one sentence."""
    check_output(path)
    try:
        files.write_atomic(path, write)
    except OSError as e:
        raise InvalidInputError(f"{path}: cannot write ({e.strerror or e}); any existing file "
                                f"there is unchanged.") from None


def cmd_embed(args: argparse.Namespace) -> int:
    from inference.api import Encoder, load_model

    check_output(args.output)
    sentences = _read_lines(args.input)
    if args.skip_blank:
        sentences = [s for s in sentences if s.strip()]
    if not sentences:
        raise InvalidInputError(f"{args.input}: no sentences to embed.")
    model = load_model(args.model, backend=args.backend, compile_progress=say_compiling)
    if not isinstance(model, Encoder):
        raise InvalidInputError(f"{model.name} is not an embedding model.")

    live = not args.quiet and sys.stderr.isatty()  # a count rewritten in place: terminals only

    def progress(done: int, total: int) -> None:
        if live:
            print(f"\r\033[Kembedded {done}/{total}", end="", file=sys.stderr, flush=True)

    vecs = model.embed(sentences, batch_size=args.batch_size, progress=progress)
    write_atomic(args.output, lambda f: np.save(f, vecs))
    if live:
        print("\r\033[K", end="", file=sys.stderr)
    if not args.quiet:
        print(f"wrote {vecs.shape[0]} x {vecs.shape[1]} to {args.output} "
              f"({model.backend_reason})", file=sys.stderr)
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """The packed-weight stores (cpu backend) on disk: each one's size, last use and model
    file, most recent first, and the cap they are kept within; ``--clear`` removes them."""
    from inference.backends.cpu.pack import CAP_ENV, evict, store_cap, stores

    entries = stores()
    if args.clear:
        gone = set(evict(0, cap=0))
        freed = sum(e.nbytes for e in entries if e.folder in gone)
        print(f"removed {len(gone)} stores ({human_bytes(freed)})")
        return 0
    for e in reversed(entries):
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        stale = "" if e.current else "  (an older layout: removed first)"
        print(f"{human_bytes(e.nbytes):>9}  {used}  {e.model or '(model not recorded)'}{stale}")
    where = entries[0].folder.parent if entries else "none yet"
    print(f"{len(entries)} stores, {human_bytes(sum(e.nbytes for e in entries))} of "
          f"{human_bytes(store_cap())} ({CAP_ENV}); folder: {where}")
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
    g.add_argument("--seed", type=int, default=None, help="-1: a random seed")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="generate --max-tokens tokens even past an end-of-sequence token")
    g.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    add_kv_dtype(g)
    add_prefill_dtype(g)
    g.add_argument("--threads", type=int,
                   help="compute threads (default: one per core other processes leave free)")
    g.add_argument("--json", action="store_true",
                   help="print one JSON object at the end (with threads used and seconds "
                        "spent loading and compiling)")
    g.set_defaults(func=cmd_generate, ends_process=True)

    e = sub.add_parser("embed", help="embed sentences (one per line) into a .npy file")
    e.add_argument("--model", required=True, help="store name or path")
    e.add_argument("--input", required=True, help="text file, or - for stdin")
    e.add_argument("--output", required=True,
                   help="output file, written as given (in .npy format)")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--skip-blank", action="store_true", help="drop empty lines")
    e.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=cmd_embed)

    c = sub.add_parser("cache", help="the packed weights kept on disk for faster loads: "
                                     "sizes, models, and the cap on them")
    c.add_argument("--clear", action="store_true", help="remove them all")
    c.set_defaults(func=cmd_cache)

    from inference.server.cli import add_parser as add_serve

    add_serve(sub, BACKEND_CHOICES)

    from inference.bench.command import add_parser as add_bench

    add_bench(sub)
    return p


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` as a normal exit would, less the interpreter's teardown:
    threading's exit hooks run and threads that are not daemons are joined, atexit handlers
    run and both output streams are flushed, then the process ends without freeing its
    modules and objects one by one. That teardown (numba's registries and compiled kernels,
    the model) took 0.18-0.26 s after a bundled-model `generate` (docs/cpu-backend.md,
    "Loading"); the OS frees it all at once."""
    import atexit
    import threading

    # What Py_Finalize runs first: threading's exit hooks (thread pools told to stop), then
    # a join of every non-daemon thread. Joining before those hooks would wait forever on
    # an idle pool's workers.
    shutdown = getattr(threading, "_shutdown", None)
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None:  # an interpreter without them: exit normally
        sys.exit(code)
    shutdown()
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to write
            if code == 0 and stream is sys.stdout:
                code = 1
    os._exit(code)


def main(argv: Sequence[str] | None = None, *, whole_process: bool = False) -> int:
    """The command in ``argv`` (default: the process's arguments); its exit code.
    ``whole_process``: the caller is the process's entry point and exits with that code, so
    a one-shot command (``generate``) ends the process itself (:func:`exit_now`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `inferdesk` alone opens the app (gui.launcher), not this
        parser.print_help()
        return 2
    try:
        if whole_process and getattr(args, "ends_process", False):
            pause_collection()  # the process ends with the command: its start is kept
        code = args.func(args)
        if whole_process and getattr(args, "ends_process", False):
            exit_now(code)
        return code
    except InferdeskError as e:
        print(f"inferdesk: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("inferdesk: error: out of memory; try a smaller model or batch.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inferdesk: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head`): nothing more to write or say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the final flush then has somewhere to go
        return 1


if __name__ == "__main__":
    sys.exit(main(whole_process=True))
