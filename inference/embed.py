"""Sentence embeddings: the pipeline a model declares, batching planner, pooling (mean, CLS,
last token), L2 normalisation."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.errors import CancelledError, CorruptModelError, UnsupportedModelError
from inference.models.protocol import EncoderModel

POOLING_MODES = ("mean", "cls", "lasttoken")
# llama.cpp's pooling enum in GGUF (general: <arch>.pooling_type) -> our names.
GGUF_POOLING = {1: "mean", 2: "cls", 3: "lasttoken"}
# sentence-transformers' older Pooling config: one flag per mode.
_POOLING_FLAGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                  "pooling_mode_lasttoken": "lasttoken", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                  "pooling_mode_weightedmean_tokens": "weightedmean"}


@dataclass(frozen=True)
class Pipeline:
    """What a sentence-transformers model directory declares around its encoder:
    ``modules.json`` (Transformer -> Pooling -> Normalize), ``1_Pooling/config.json``, and
    the sequence limit of ``sentence_bert_config.json`` (or the tokenizer's)."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None

    @classmethod
    def from_dir(cls, path: str | Path, gguf_pooling: int = -1) -> Pipeline:
        """The pipeline of ``path``. Without modules.json: a GGUF's own pooling_type if it
        has one, else mean pooling without normalisation (sentence-transformers' default
        for a bare transformers model). A GGUF file is its own pipeline, whatever lies
        beside it: its pooling_type (mean if unset) and L2 normalisation, which llama.cpp's
        embedding tools apply by default."""
        path = Path(path)
        if path.is_file() and path.suffix.lower() == ".gguf":
            return cls(pooling=GGUF_POOLING.get(gguf_pooling, "mean"), normalize=True)
        d = path if path.is_dir() else path.parent
        modules = _json(d / "modules.json", [])
        pooling = GGUF_POOLING.get(gguf_pooling, "mean")
        normalize = False
        for m in modules if isinstance(modules, list) else []:
            kind = str(m.get("type", "")) if isinstance(m, dict) else ""
            name = kind.rsplit(".", 1)[-1]
            if name == "Pooling":
                pooling = _pooling_mode(_json(d / str(m.get("path", "")) / "config.json", {}))
            elif name == "Normalize":
                normalize = True
            elif name not in ("Transformer", "") and not name.startswith("Transformer"):
                raise UnsupportedModelError(
                    f"{d.name}'s modules.json has a {name} module after the encoder, which "
                    "Inferdesk does not apply; its vectors would differ from the model's.")
        return cls(pooling=pooling, normalize=normalize, max_seq_length=_seq_limit(d))


def declares_pooling(path: str | Path) -> bool:
    """Whether the model directory at ``path`` is a sentence-transformers model (its
    modules.json names a Pooling module): a decoder there is an embedder."""
    d = Path(path)
    modules = _json(d / "modules.json", []) if d.is_dir() else []
    return isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling") for m in modules)


def _pooling_mode(cfg: dict[str, Any]) -> str:
    mode = cfg.get("pooling_mode")
    modes = [mode] if isinstance(mode, str) else [
        name for key, name in _POOLING_FLAGS.items() if cfg.get(key)]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        shown = " + ".join(modes) or "none"
        raise UnsupportedModelError(
            f"The model pools its tokens by {shown}; Inferdesk pools by one of "
            f"{', '.join(POOLING_MODES)}.")
    return modes[0]


def _seq_limit(d: Path) -> int | None:
    """sentence_bert_config.json's max_seq_length, else the tokenizer's model_max_length
    when it is a real limit (transformers writes ~1e30 for "none")."""
    st = _json(d / "sentence_bert_config.json", {})
    if "max_seq_length" in st:
        length = st["max_seq_length"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 2:
            raise CorruptModelError(f"max_seq_length in sentence_bert_config.json is "
                                    f"{length!r}; expected a whole number of at least 2.")
        return length
    tok = _json(d / "tokenizer_config.json", {}).get("model_max_length")
    if isinstance(tok, int) and not isinstance(tok, bool) and 2 <= tok <= 1 << 20:
        return tok
    return None


def _json(path: Path, default: Any) -> Any:
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptModelError(f"{path}: not valid JSON ({e}).") from e


@dataclass(frozen=True)
class BatchLimits:
    """What one forward call may hold.

    ``max_batch`` and ``max_tokens`` are the backend's per-call limits (a backend whose
    kernels take per-row arguments caps rows; none may assume a batch fits because it
    did in testing). ``memory_budget`` bounds the activations of one call in bytes.
    ``min_fill``: an input joins a chunk only if it is at least this fraction of the chunk's
    longest, so padding stays under ~10% of any chunk (on the 1,000 bench sentences at
    batch 32: 3.9% padded tokens instead of 9.3%, for 43 chunks instead of 32).
    """

    max_batch: int = 256
    max_tokens: int = 32768
    memory_budget: int = 256 * 2**20
    min_fill: float = 0.9


def encoder_call_bytes(hidden: int, intermediate: int, heads: int, n: int, length: int) -> int:
    """Peak float32 activation bytes of one encoder forward over ``n`` inputs of ``length``:
    hidden states, q/k/v and the FFN intermediate per token, plus attention scores and their
    softmax temporaries (three n x heads x length^2 arrays at once in the reference)."""
    per_token = 4 * (6 * hidden + 2 * intermediate)
    return n * length * per_token + 3 * 4 * n * heads * length * length


def plan_batches(lengths: Sequence[int], limits: BatchLimits,
                 call_bytes: Callable[[int, int], int] | None = None) -> list[list[int]]:
    """Group input indices into chunks of similar length (sorted, longest first), each within
    ``limits``; ``call_bytes(n, length)`` prices a chunk against the memory budget.
    Sorting and ``min_fill`` keep padding small; results do not depend on the grouping. A
    single input always forms a chunk, whatever its size."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])

    def fits(n: int, width: int) -> bool:
        return (n <= limits.max_batch and n * width <= limits.max_tokens
                and (call_bytes is None or call_bytes(n, width) <= limits.memory_budget))

    chunks: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        width = lengths[cur[0]] if cur else lengths[i]  # longest in the chunk (sorted)
        if cur and (not fits(len(cur) + 1, width) or lengths[i] < limits.min_fill * width):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    return chunks


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Average the token vectors the mask marks (padding excluded), as sentence-transformers."""
    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str = "mean") -> np.ndarray:
    """One vector per row of right-padded ``hidden``: the mean of its tokens, its first
    token (CLS), or its last real token (decoder embedders such as Qwen3-Embedding)."""
    if mode == "cls":
        return hidden[:, 0].copy()
    if mode == "lasttoken":
        last = np.maximum(mask.sum(axis=1).astype(np.int64) - 1, 0)
        return hidden[np.arange(hidden.shape[0]), last].copy()
    return mean_pool(hidden, mask)


def pool_packed(hidden: np.ndarray, starts: np.ndarray, mode: str = "mean") -> np.ndarray:
    """:func:`pool` for inputs packed back to back (``hidden`` (N, d), input ``i`` being
    rows ``starts[i] .. starts[i + 1]``, none empty)."""
    if mode == "cls":
        return hidden[starts[:-1]].copy()
    if mode == "lasttoken":
        return hidden[starts[1:] - 1].copy()
    lengths = np.diff(starts).astype(np.float32)[:, None]
    return np.add.reduceat(hidden, starts[:-1], axis=0) / lengths


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def fixed_batches(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Input indices in batches of ``size`` by length, longest first, as sentence-transformers
    makes them: no memory budget and no fill rule (the bench's like-for-like row)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + size] for i in range(0, len(order), size)]


def embed_ids(
    model: EncoderModel,
    token_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
    limits: BatchLimits,
    normalize: bool = True,
    pooling: str = "mean",
    progress: Callable[[int, int], None] | None = None,
    cancel: threading.Event | None = None,
    batching: str = "planned",
) -> np.ndarray:
    """Run an encoder over tokenized inputs; one row per input, in input order. Batches are
    planned by length within ``limits`` (:func:`plan_batches`), or with ``batching="fixed"``
    are ``limits.max_batch`` inputs each (:func:`fixed_batches`). A model that ``packs``
    (bert.Model on a backend with ``packs_rows``) runs each batch's tokens back to back
    without padding rows; others get the batch right-padded with a key mask."""
    B = model.B
    n = len(token_ids)
    out = np.zeros((n, model.args.hidden_size), dtype=np.float32)
    done = 0
    a = model.args

    slots = B.parallel_calls()  # calls in flight at once share the memory budget

    def call_bytes(rows: int, length: int) -> int:
        return slots * encoder_call_bytes(a.hidden_size, a.intermediate_size,
                                          a.num_attention_heads, rows, length)

    def check_cancel() -> None:
        if cancel is not None and cancel.is_set():
            raise CancelledError(f"Embedding cancelled after {done} of {n} inputs.")

    packs = getattr(model, "packs", False)

    def run(chunk: list[int]) -> np.ndarray:
        check_cancel()  # in the worker: chunks not yet started never start
        if packs and all(token_ids[i] for i in chunk):
            return run_packed(chunk)
        width = max(len(token_ids[i]) for i in chunk)
        ids = np.full((len(chunk), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(chunk), width), dtype=np.float32)
        for r, i in enumerate(chunk):
            ids[r, : len(token_ids[i])] = token_ids[i]
            mask[r, : len(token_ids[i])] = 1.0
        pos = np.broadcast_to(np.arange(width, dtype=np.int64), ids.shape)
        hidden = model(B.array(ids), B.array(np.ascontiguousarray(pos)),
                       B.array(np.zeros((len(chunk), 1), dtype=np.int64)), B.array(mask))
        return pool(B.to_numpy(hidden), mask, pooling)

    def run_packed(chunk: list[int]) -> np.ndarray:
        """The chunk's tokens back to back, no padding (model.packed)."""
        lens = [len(token_ids[i]) for i in chunk]
        starts = np.zeros(len(chunk) + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        ids = np.concatenate([np.asarray(token_ids[i], dtype=np.int64) for i in chunk])
        pos = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
        hidden = model.packed(B.array(ids[None]), B.array(pos[None]),
                              B.array(np.zeros((1, 1), dtype=np.int64)), starts)
        return pool_packed(B.to_numpy(hidden)[0], starts, pooling)

    lengths = [len(t) for t in token_ids]
    chunks = (fixed_batches(lengths, limits.max_batch) if batching == "fixed"
              else plan_batches(lengths, limits, call_bytes))
    for chunk, pooled in zip(chunks, B.map_calls(run, chunks), strict=True):
        out[chunk] = pooled
        done += len(chunk)
        if progress is not None:
            progress(done, n)
        check_cancel()  # here: results of chunks already in flight are not waited for
    return l2_normalize(out) if normalize else out
