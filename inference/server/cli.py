"""`inferdesk serve`: its arguments and command (added to the CLI by inference.cli)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from inference.cli_args import add_kv_dtype
from inference.server.limits import MAX_PARALLEL, SHUTDOWN_S
from inference.server.prefix_pool import PROMPT_CACHE_ENTRIES, PROMPT_CACHE_IDLE, PROMPT_CACHE_MB


def cmd_serve(args: argparse.Namespace) -> int:
    from inference.server.run import check_exposure, load_engine, serve

    key = args.api_key or os.environ.get("INFERDESK_API_KEY") or None
    check_exposure(args.host, key)  # before minutes of loading, not after
    engine = load_engine(args.model, args.embed_model, args.backend, args.parallel,
                         args.prompt_cache_mb, args.kv_dtype, args.prompt_cache_idle)
    if args.threads is not None:
        from inference.threads import set_threads

        for m in engine.models():
            set_threads(args.threads, m.backend)
    hosts = [h for h in args.allowed_hosts.split(",") if h.strip()] if args.allowed_hosts \
        else None
    serve(engine, args.host, args.port, key, hosts, args.shutdown_timeout)
    return 0


def _parallel(text: str) -> int:
    n = int(text)
    if not 1 <= n <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_PARALLEL}")
    return n


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        n = int(text)
        if n < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        return n
    return parse


def _seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a number of seconds") from None
    if not 0 <= n < float("inf"):
        raise argparse.ArgumentTypeError("must be 0 or more seconds")
    return n


def add_parser(sub: Any, backends: list[str]) -> None:
    s = sub.add_parser("serve", help="serve models over an OpenAI-compatible HTTP API")
    s.add_argument("--model", help="chat model: store name or path")
    s.add_argument("--embed-model", help="embedding model: store name or path")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (anything but loopback needs --api-key)")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' "
                                     "(or set INFERDESK_API_KEY)")
    s.add_argument("--allowed-hosts", metavar="NAMES",
                   help="comma-separated host names the server answers to in the Host "
                        "header ('*': any; default without --api-key on loopback: "
                        "localhost, 127.0.0.1, [::1] and --host)")
    s.add_argument("--shutdown-timeout", type=_seconds, default=SHUTDOWN_S, metavar="SECONDS",
                   help="on SIGTERM or Ctrl-C, how long open requests may take to finish "
                        f"(default {SHUTDOWN_S:g})")
    s.add_argument("--parallel", type=_parallel, default=4,
                   help=f"chat requests decoded together (1-{MAX_PARALLEL})")
    s.add_argument("--backend", choices=backends, default="auto")
    add_kv_dtype(s)
    s.add_argument("--threads", type=_at_least(1),
                   help="compute threads (BLAS and the cpu kernels; default: one per core "
                        "other processes leave free, chosen again as their load changes)")
    s.add_argument("--prompt-cache-mb", type=_at_least(0), default=PROMPT_CACHE_MB,
                   help="memory for finished requests' prompt prefixes, reused by later "
                        f"requests starting the same way (at most {PROMPT_CACHE_ENTRIES} "
                        f"kept; 0 disables; default {PROMPT_CACHE_MB})")
    s.add_argument("--prompt-cache-idle", type=_seconds, default=PROMPT_CACHE_IDLE,
                   metavar="SECONDS",
                   help="release the prompt cache after this long without a request "
                        f"(0: never; default {PROMPT_CACHE_IDLE:g})")
    s.set_defaults(func=cmd_serve)
