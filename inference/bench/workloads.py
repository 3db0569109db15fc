"""The bench's fixed workloads (resources/bench/): the 138-token prompt and 1,000 sentences."""

from __future__ import annotations

from pathlib import Path

import resources

BENCH_DIR = Path(resources.__file__).parent / "bench"
LLM_MODEL = "SmolLM2-135M-Instruct.Q4_1"
EMBED_MODEL = "all-MiniLM-L6-v2"
DECODE_TOKENS = 128
BATCH_SIZE = 32


def workloads() -> tuple[str, list[str]]:
    prompt = (BENCH_DIR / "prompt.txt").read_text(encoding="utf-8")
    sentences = (BENCH_DIR / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return prompt, sentences
