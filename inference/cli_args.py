"""Command-line arguments shared by `inferdesk` subcommands (generate, serve, bench), in a
module of their own so the subcommands' modules import it and not one another."""

from __future__ import annotations

import argparse

BACKEND_CHOICES = ["auto", "cuda", "mlx", "cpu", "numpy"]
KV_DTYPES = ["float32", "float16", "bfloat16"]  # what a backend offers: Backend.use_kv_dtype


def add_kv_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-dtype", choices=KV_DTYPES,
                   help="KV cache element type (default: the backend's; float16 halves the "
                        "cache's memory and the bytes decode reads)")


def add_prefill_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill-dtype", choices=KV_DTYPES,
                   help="the cuda backend's prefill GEMM input type (default float32; "
                        "other backends refuse it)")
