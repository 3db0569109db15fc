"""Readers for the reference goldens in tests/goldens/ (written by scripts/make_goldens.py),
shared by the tests (through tests/goldens_io.py) and the parity scripts.

Plain numpy and dicts; no torch. Formats: tests/goldens/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

GOLDENS_DIR = Path(__file__).resolve().parents[1] / "tests" / "goldens"

# Tolerance bars (tests/goldens/README.md).
MINILM_MIN_COSINE = 0.9999
SMOLLM2_MIN_TOP1_AGREEMENT = 0.99
SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1 = 0.01


def load_npz(name: str) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of tests/goldens/``name`` and its ``meta`` JSON, apart."""
    with np.load(GOLDENS_DIR / name, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads(str(arrays.pop("meta")))



KQUANT_DIR_ENV = "INFERDESK_KQUANT_DIR"
KQUANT_TYPES = ("Q4_K_M", "Q3_K_M", "Q5_K_M", "Q6_K")  # the files the goldens describe
KQUANT_MISSING = (f"set {KQUANT_DIR_ENV} to the files that "
                  "`scripts/make_kquant_goldens.py --files DIR --check` makes")


def kquant_file(qtype: str) -> tuple[Path, dict[str, np.ndarray], dict] | None:
    """SmolLM2 requantized by llama.cpp into ``qtype`` (Q4_K_M, ...), from the folder
    ``INFERDESK_KQUANT_DIR`` names, with the goldens of tests/goldens/smollm2_kquants.npz
    (arrays, meta); None if the file is not there. A file whose sha256 is not the one the
    goldens were made from raises ValueError: the goldens would not apply to it."""
    import hashlib
    import os

    folder = os.environ.get(KQUANT_DIR_ENV)
    path = Path(folder or ".") / f"SmolLM2-135M-Instruct.{qtype}.gguf"
    if not folder or not path.is_file():
        return None
    arrays, meta = load_npz("smollm2_kquants.npz")
    if hashlib.sha256(path.read_bytes()).hexdigest() != meta["files"][qtype]["sha256"]:
        raise ValueError(f"{path} is not the file the K-quant goldens were made from")
    return path, arrays, meta


def load_minilm_sentences() -> list[str]:
    """The fixed sentence set, in golden order (includes "" and a >256-token line)."""
    return json.loads((GOLDENS_DIR / "minilm_sentences.json").read_text(encoding="utf-8"))


def load_minilm() -> dict:
    """MiniLM goldens.

    Keys: sentences (list[str]); embeddings (n, 384) float32, the bundled pipeline's default
    output (L2-normalised, see meta["normalized"]); embeddings_unnormalized (n, 384) float32,
    mean-pooled before Normalize; n_tokens (n,) int32 tokens the encoder saw incl. [CLS]/[SEP]
    (<= max_seq_length); n_tokens_untruncated (n,) int32; input_ids list of n int32 arrays;
    meta (dict: versions, modules, max_seq_length, model sha256).
    """
    a, meta = load_npz("minilm_embeddings.npz")
    splits = np.cumsum(a["n_tokens"])[:-1]
    return {
        "sentences": load_minilm_sentences(),
        "embeddings": a["embeddings"],
        "embeddings_unnormalized": a["embeddings_unnormalized"],
        "n_tokens": a["n_tokens"],
        "n_tokens_untruncated": a["n_tokens_untruncated"],
        "input_ids": np.split(a["input_ids"], splits),
        "meta": meta,
    }


def load_smollm2() -> dict:
    """SmolLM2 Q4_1 teacher-forced goldens.

    Returns {"texts": {name: {...}}, "greedy": {...}, "meta": dict}. Each text (names: chat,
    code, prose) has: text (str); ids (n,) int32, fed whole as one sequence; top_ids (n, 10)
    int32 and top_logp (n, 10) float32, the reference's 10 most likely next tokens after
    ids[:i+1], best first (top-1 = column 0); next_logp (n-1,) float32, log p(ids[i+1]).
    greedy: prompt_ids, ids (the reference's 48-token greedy reply; informative only), text.
    """
    a, meta = load_npz("smollm2_logprobs.npz")
    texts = {}
    for name, text in meta["texts"].items():
        texts[name] = {"text": text} | {
            field: a[f"{name}.{field}"] for field in ("ids", "top_ids", "top_logp", "next_logp")
        }
    greedy = {
        "prompt": meta["greedy_prompt"],
        "prompt_ids": a["greedy.prompt_ids"],
        "ids": a["greedy.ids"],
        "text": meta["greedy_text"],
    }
    return {"texts": texts, "greedy": greedy, "meta": meta}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (idempotent: log-probs pass through unchanged)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def smollm2_agreement(golden: dict, logits: np.ndarray) -> tuple[float, float]:
    """Score engine logits (or log-probs), shape (n, vocab), for one golden text.

    Returns (top-1 agreement, mean |engine log p(ref top-1) - ref log p(ref top-1)|) over
    all n positions.
    """
    ref_top1 = golden["top_ids"][:, 0]
    if logits.shape[0] != ref_top1.shape[0]:
        raise ValueError(f"expected {ref_top1.shape[0]} rows of logits, got {logits.shape[0]}")
    logp = log_softmax(logits)
    rows = np.arange(len(ref_top1))
    agreement = float((logp.argmax(axis=-1) == ref_top1).mean())
    dlogp = np.abs(logp[rows, ref_top1] - golden["top_logp"][:, 0])
    return agreement, float(dlogp.mean())


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity in float64 (two zero rows count as identical)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = (a * b).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / (na * nb)
    return np.where((na == 0) & (nb == 0), 1.0, cos)


def decode_logits(model: Any, ids: list[int]) -> np.ndarray:
    """Logits of every position, one token per call (the decode mat-vec path, through the
    backend's decode steps: on cpu, replays of a captured step)."""
    B = model.backend
    cache = model.model.make_cache(len(ids))
    step = B.decode_steps()
    return np.stack([np.array(B.to_numpy(step(model.model, B.array(np.asarray([[t]])), cache))
                              [0, 0]) for t in ids])
