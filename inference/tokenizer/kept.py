"""A GGUF tokenizer in the form it is kept in between loads, and back.

Reading a tokenizer back from its tokenizer.json (``Tokenizer.from_str``) makes the
tokenizers library parse the whole JSON into a generic tree before it builds the model:
Gemma 3's 262k tokens and 515k merges take ~0.9 s of one core, holding the GIL. The kept
form is the model's own inputs instead, as the model's constructor takes them: the
vocabulary as a dict (piece -> id), each merge as the tuple of its two pieces (the same
string objects as the vocabulary's keys, so the pickle holds each piece once), with their
counts, and the small parts (normalizer, pre-tokenizer, decoder, post-processor, added
tokens) in their own serialized states. Building the model from those (:func:`restore`)
is about half the time; nothing is rebuilt in Python between the unpickling and the
constructor (SmolLM2's 49k tokens and merges: 48-52 ms, against 62-70 from a list of
pieces, an array of ids and the merges' ids).

:func:`restore` returns None for anything it cannot rebuild exactly as kept; the caller
then builds the tokenizer from the file.
"""

from __future__ import annotations

import pickle
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE, WordPiece

FORM = 3  # raise when what :func:`dump` writes changes
_PARTS = ("normalizer", "pre_tokenizer", "decoder", "post_processor")
_MODELS = {"BPE": BPE, "WordPiece": WordPiece}


@dataclass
class ModelRecipe:
    """What a tokenizers model was built from: ``kind`` ("BPE" or "WordPiece"), the
    vocabulary (piece -> id), BPE's merges as pairs of pieces, and the other arguments;
    ``merge_ids``, where the builder has them: the merges' piece ids (left, right, ...)."""

    kind: str
    vocab: Mapping[str, int]
    merges: Sequence[tuple[str, str]] = ()
    options: dict[str, Any] = field(default_factory=dict)
    merge_ids: array | None = None

    def build(self) -> Any:
        if self.kind == "BPE":
            merges = self.merges if isinstance(self.merges, list) else list(self.merges)
            return BPE(vocab=self.vocab, merges=merges, **self.options)
        return _MODELS[self.kind](vocab=self.vocab, **self.options)


def dump(backend: HFTokenizer, recipe: ModelRecipe) -> dict[str, Any]:
    """The kept form of ``backend``, whose model ``recipe`` built."""
    vocab = dict(recipe.vocab)
    merges: list[tuple[str, str]] = []
    if recipe.kind == "BPE":
        ids = recipe.merge_ids
        if ids is None:
            ids = array("I", map(vocab.__getitem__, chain.from_iterable(recipe.merges)))
        by_id = {i: piece for piece, i in vocab.items()}  # the dict's own key objects
        piece = by_id.get  # an id no piece keeps (a duplicate's): None, refused by restore
        merges = list(zip(map(piece, ids[0::2]), map(piece, ids[1::2]), strict=True))
    parts = {name: pickle.dumps(getattr(backend, name), protocol=pickle.HIGHEST_PROTOCOL)
             for name in _PARTS if getattr(backend, name) is not None}
    added = sorted(backend.get_added_tokens_decoder().items())
    return {"form": FORM, "kind": recipe.kind, "vocab": vocab, "n_vocab": len(vocab),
            "merges": merges, "n_merges": len(merges), "options": dict(recipe.options),
            "parts": parts, "added": [(int(i), _added_state(t)) for i, t in added]}


def restore(kept: Any) -> HFTokenizer | None:
    """The tokenizer :func:`dump` kept, or None if ``kept`` is not such a form or does
    not rebuild to the same added tokens."""
    if not isinstance(kept, dict) or kept.get("form") != FORM or kept.get("kind") not in _MODELS:
        return None
    try:
        vocab, merges = kept["vocab"], kept["merges"]
        if (not isinstance(vocab, dict) or not isinstance(merges, list)
                or len(vocab) != kept["n_vocab"] or len(merges) != kept["n_merges"]):
            return None
        backend = HFTokenizer(ModelRecipe(kept["kind"], vocab, merges, kept["options"]).build())
        for name, state in kept["parts"].items():
            if name not in _PARTS:
                return None
            setattr(backend, name, pickle.loads(state))
        added = [(i, AddedToken(**state)) for i, state in kept["added"]]
        special = [t for _, t in added if t.special]
        plain = [t for _, t in added if not t.special]
        if special:
            backend.add_special_tokens(special)
        if plain:
            backend.add_tokens(plain)
    except Exception:  # a damaged entry (tokenizers raises plain Exception): rebuilt
        return None
    now = sorted((int(i), _added_state(t)) for i, t in backend.get_added_tokens_decoder().items())
    return backend if now == [(i, s) for i, s in kept["added"]] else None


def _added_state(token: AddedToken) -> dict[str, Any]:
    return {"content": token.content, "special": token.special, "rstrip": token.rstrip,
            "lstrip": token.lstrip, "single_word": token.single_word,
            "normalized": token.normalized}
