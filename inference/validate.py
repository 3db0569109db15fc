"""Checks at the engine's boundary: config values and tensor shapes at load, token ids and
argument types at every public entry, and the numerical health of outputs.

Each check fails with one sentence that names the key or tensor and says what was expected
and what was found. What an architecture expects is data (:class:`ArchSpec`), not code: a
new architecture registers its spec with :func:`register` (or its module defines
``ARCH_SPEC``) and gets every check below.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
import threading
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.errors import CorruptModelError, InvalidInputError, NumericalError
from inference.events import GenerationEvent
from inference.formats.tensor import MAX_LAYERS
from inference.sampling import SamplingParams, check_params


@dataclass(frozen=True)
class ArchSpec:
    """What one architecture expects of its config and tensors.

    ``positive``: integer fields that must be >= 1; ``at_most``: upper bounds of fields the
    engine builds per-item structures from before any tensor is read (a layer count of
    2^32 would otherwise allocate lists of that length); ``finite_positive``: float fields
    that must be finite and > 0; ``within``: fields that must lie in ``(low, high]`` (a RoPE
    base of 1e-30 or an epsilon of 5 is finite and positive, and garbage);
    ``divides``: pairs (a, b) with b % a == 0; ``even``: fields that
    must be even (RoPE rotates pairs). ``tensors`` maps a tensor name (``{i}`` stands for
    each layer index) to its shape, each dimension a config field, a product of fields
    written "a*b", or an int. Tensors absent from the file are not checked here (the model
    asks for the ones it needs and names any that is missing).
    """

    positive: tuple[str, ...] = ()
    at_most: Mapping[str, int] = field(default_factory=dict)
    finite_positive: tuple[str, ...] = ()
    within: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    divides: tuple[tuple[str, str], ...] = ()
    even: tuple[str, ...] = ()
    tensors: Mapping[str, tuple[int | str, ...]] = field(default_factory=dict)


_DECODER = ArchSpec(
    positive=("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
              "sliding_window"),
    at_most={"num_hidden_layers": MAX_LAYERS},
    finite_positive=("rms_norm_eps", "rope_theta"),
    # A RoPE base at most 1 makes every frequency 1 or more: positions alias at once.
    within={"rope_theta": (1.0, 1e12), "rope_local_base_freq": (1.0, 1e12),
            "rms_norm_eps": (0.0, 1.0), "query_pre_attn_scalar": (0.0, 1e9),
            "attn_logit_softcapping": (0.0, 1e6), "final_logit_softcapping": (0.0, 1e6)},
    divides=(("num_key_value_heads", "num_attention_heads"),),
    even=("head_dim",),
    tensors={
        "model.embed_tokens.weight": ("vocab_size", "hidden_size"),
        "model.norm.weight": ("hidden_size",),
        "lm_head.weight": ("vocab_size", "hidden_size"),
        "model.layers.{i}.input_layernorm.weight": ("hidden_size",),
        "model.layers.{i}.post_attention_layernorm.weight": ("hidden_size",),
        "model.layers.{i}.self_attn.q_proj.weight": ("num_attention_heads*head_dim",
                                                     "hidden_size"),
        "model.layers.{i}.self_attn.k_proj.weight": ("num_key_value_heads*head_dim",
                                                     "hidden_size"),
        "model.layers.{i}.self_attn.v_proj.weight": ("num_key_value_heads*head_dim",
                                                     "hidden_size"),
        "model.layers.{i}.self_attn.q_proj.bias": ("num_attention_heads*head_dim",),
        "model.layers.{i}.self_attn.k_proj.bias": ("num_key_value_heads*head_dim",),
        "model.layers.{i}.self_attn.v_proj.bias": ("num_key_value_heads*head_dim",),
        "model.layers.{i}.self_attn.o_proj.weight": ("hidden_size",
                                                     "num_attention_heads*head_dim"),
        "model.layers.{i}.mlp.gate_proj.weight": ("intermediate_size", "hidden_size"),
        "model.layers.{i}.mlp.up_proj.weight": ("intermediate_size", "hidden_size"),
        "model.layers.{i}.mlp.down_proj.weight": ("hidden_size", "intermediate_size"),
    },
)

_BERT = ArchSpec(
    positive=("hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
              "vocab_size", "max_position_embeddings", "type_vocab_size"),
    at_most={"num_hidden_layers": MAX_LAYERS},
    finite_positive=("layer_norm_eps",),
    within={"layer_norm_eps": (0.0, 1.0)},
    divides=(("num_attention_heads", "hidden_size"),),
    tensors={
        "embeddings.word_embeddings.weight": ("vocab_size", "hidden_size"),
        "embeddings.position_embeddings.weight": ("max_position_embeddings", "hidden_size"),
        "embeddings.token_type_embeddings.weight": ("type_vocab_size", "hidden_size"),
        "embeddings.LayerNorm.weight": ("hidden_size",),
        "embeddings.LayerNorm.bias": ("hidden_size",),
        **{f"encoder.layer.{{i}}.attention.self.{n}.{k}": (("hidden_size", "hidden_size")
                                                           if k == "weight" else ("hidden_size",))
           for n in ("query", "key", "value") for k in ("weight", "bias")},
        "encoder.layer.{i}.attention.output.dense.weight": ("hidden_size", "hidden_size"),
        "encoder.layer.{i}.attention.output.dense.bias": ("hidden_size",),
        "encoder.layer.{i}.attention.output.LayerNorm.weight": ("hidden_size",),
        "encoder.layer.{i}.attention.output.LayerNorm.bias": ("hidden_size",),
        "encoder.layer.{i}.intermediate.dense.weight": ("intermediate_size", "hidden_size"),
        "encoder.layer.{i}.intermediate.dense.bias": ("intermediate_size",),
        "encoder.layer.{i}.output.dense.weight": ("hidden_size", "intermediate_size"),
        "encoder.layer.{i}.output.dense.bias": ("hidden_size",),
        "encoder.layer.{i}.output.LayerNorm.weight": ("hidden_size",),
        "encoder.layer.{i}.output.LayerNorm.bias": ("hidden_size",),
    },
)

SPECS: dict[str, ArchSpec] = {"llama": _DECODER, "mistral": _DECODER, "qwen2": _DECODER,
                              "qwen3": _DECODER, "gemma": _DECODER, "gemma2": _DECODER,
                              "gemma3_text": _DECODER, "phi3": _DECODER, "bert": _BERT}


def register(model_type: str, spec: ArchSpec) -> None:
    """Declare what ``model_type`` expects; later checks of that type use ``spec``."""
    SPECS[model_type] = spec


def spec_for(model_type: str, module: Any = None) -> ArchSpec:
    own = getattr(module, "ARCH_SPEC", None)
    return own if isinstance(own, ArchSpec) else SPECS.get(model_type, ArchSpec())


# --- config values --------------------------------------------------------------------------

def _kinds(annotation: Any) -> tuple[type, ...]:
    """The plain types an annotation admits (``int | None`` -> (int, NoneType))."""
    if annotation is Any:
        return ()
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(k for a in typing.get_args(annotation) for k in _kinds(a))
    if annotation is None:
        return (type(None),)
    origin = typing.get_origin(annotation)  # list[str] -> list, dict[str, Any] -> dict
    if isinstance(origin, type):
        return (origin,)
    return (annotation,) if isinstance(annotation, type) else ()


def _coerce(key: str, value: Any, kinds: tuple[type, ...]) -> Any:
    """``value`` as one of ``kinds``, or CorruptModelError naming ``key``."""
    if not kinds or isinstance(value, kinds) and not (isinstance(value, bool)
                                                      and bool not in kinds):
        return value
    if value is None and type(None) in kinds:
        return None
    if float in kinds and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if int in kinds and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if int in kinds and isinstance(value, float) and value.is_integer():
        return int(value)
    names = " or ".join("null" if k is type(None) else {"int": "an integer", "float": "a number",
                                                         "bool": "true/false",
                                                         "str": "a string"}.get(k.__name__,
                                                                                k.__name__)
                        for k in kinds)
    raise CorruptModelError(f"Config key {key} is {value!r} ({type(value).__name__}); "
                            f"expected {names}.")


def config_values(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of dataclass ``cls`` found in ``d``, each checked against its annotation,
    then against the architecture's :class:`ArchSpec` (model type from ``d``)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in d and d[f.name] is not None:
            out[f.name] = _coerce(f.name, d[f.name], _kinds(hints.get(f.name, Any)))
    for f in dataclasses.fields(cls):
        if f.name not in out and f.default is dataclasses.MISSING \
                and f.default_factory is dataclasses.MISSING:
            raise CorruptModelError(f"Config key {f.name} is missing; this architecture "
                                    f"needs it.")
    spec = SPECS.get(str(d.get("model_type")), ArchSpec())
    defaults = {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}
    check_config({**defaults, **out}, spec)
    return out


def check_config(values: Mapping[str, Any] | Any, spec: ArchSpec) -> None:
    """Range checks of ``spec`` over a dict or a config object (fields absent are skipped)."""
    get = values.get if isinstance(values, Mapping) else (lambda k: getattr(values, k, None))
    for key in spec.positive:
        v = get(key)
        if v is not None and (not isinstance(v, numbers.Integral) or v < 1):
            raise CorruptModelError(f"Config key {key} is {v!r}; expected a whole number "
                                    f"of at least 1.")
    for key, limit in spec.at_most.items():
        v = get(key)
        if isinstance(v, numbers.Integral) and v > limit:
            raise CorruptModelError(f"Config key {key} is {v}; expected at most {limit}.")
    for key in spec.finite_positive:
        v = get(key)
        if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
            raise CorruptModelError(f"Config key {key} is {v!r}; expected a finite number "
                                    f"above 0.")
    for key, (low, high) in spec.within.items():
        v = get(key)
        if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v)
                                  and low < v <= high):
            raise CorruptModelError(f"Config key {key} is {v!r}; expected a number above "
                                    f"{low:g} and at most {high:g}.")
    for a, b in spec.divides:
        va, vb = get(a), get(b)
        if isinstance(va, int) and isinstance(vb, int) and va > 0 and vb % va:
            raise CorruptModelError(f"Config key {b} is {vb}, which is not a multiple of "
                                    f"{a} ({va}).")
    for key in spec.even:
        v = get(key)
        if isinstance(v, int) and v % 2:
            raise CorruptModelError(f"Config key {key} is {v}; expected an even number "
                                    f"(rotary embeddings rotate pairs).")


# --- tensor shapes --------------------------------------------------------------------------

def _dim(expr: int | str, args: Any) -> int:
    if isinstance(expr, int):
        return expr
    n = 1
    for name in expr.split("*"):
        n *= int(getattr(args, name.strip()))
    return n


def check_tensors(args: Any, tensors: Mapping[str, Any], spec: ArchSpec,
                  where: str = "The model") -> None:
    """Every tensor in ``tensors`` that ``spec`` describes has the shape the config implies.

    Walks the file's tensors, not the config's layer count: a count of 2^31 layers costs
    nothing here (the model then names the first layer whose tensors are missing)."""
    check_config(args, spec)
    for name, t in tensors.items():
        dims = spec.tensors.get(_LAYER.sub(".{i}.", name, count=1))
        if dims is None:
            continue
        expected = tuple(_dim(d, args) for d in dims)
        if tuple(t.shape) != expected:
            raise CorruptModelError(
                f"{where}: tensor {name} has shape {list(t.shape)}, but the config "
                f"implies {list(expected)}.")


_LAYER = re.compile(r"\.(\d+)\.")


# --- public-entry arguments -------------------------------------------------------------

def token_ids(ids: Any, vocab_size: int, what: str = "token ids") -> np.ndarray:
    """``ids`` (a sequence of ints) as int64, each checked against ``[0, vocab_size)``."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence | np.ndarray):
        raise InvalidInputError(f"The {what} must be a list of integers, not "
                                f"{type(ids).__name__}.")
    arr = np.asarray(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
        if arr.dtype == object and all(isinstance(i, numbers.Integral) and
                                       not isinstance(i, bool) for i in ids):
            bad = [int(i) for i in ids if not 0 <= int(i) < vocab_size]
            if bad:
                raise InvalidInputError(_range_msg(what, bad[0], vocab_size))
            return np.asarray([int(i) for i in ids], dtype=np.int64)
        raise InvalidInputError(f"The {what} must be a flat list of integers.")
    ids_in_range(arr, vocab_size, what)
    return arr.astype(np.int64, copy=False)


def ids_in_range(arr: np.ndarray, rows: int, what: str = "token ids") -> None:
    """Every id of the int array ``arr`` in ``[0, rows)``, else InvalidInputError naming
    the first one outside."""
    if arr.size and (arr.min() < 0 or arr.max() >= rows):
        first = int(arr[(arr < 0) | (arr >= rows)][0])
        raise InvalidInputError(_range_msg(what, first, rows))


def tokenizer_fits(tokenizer: Any, rows: int, where: str) -> None:
    """A tokenizer whose ids reach past the embedding table's ``rows`` refused at load: an
    added token or a tokenizer.json from another model would make ids the table lacks."""
    top = tokenizer.max_id
    if top >= rows:
        raise CorruptModelError(
            f"{where}: the tokenizer has ids up to {top} ({tokenizer.id_to_token(top)!r}) but "
            f"the embedding table "
            f"has {rows} rows; the tokenizer belongs to another model or has tokens added "
            f"without resizing the table.")


def _range_msg(what: str, value: int, vocab_size: int) -> str:
    return (f"The {what} include {value}, outside this model's vocabulary "
            f"(0 to {vocab_size - 1}).")


def text_arg(value: Any, name: str) -> str:
    """A str that is valid Unicode (no lone surrogates, which no tokenizer can encode)."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string, not {type(value).__name__}.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInputError(f"{name} holds a lone surrogate at character {e.start}, "
                                f"which is not valid Unicode text.") from None
    return value


def int_arg(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(f"{name} must be an integer, not {type(value).__name__}.")
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise InvalidInputError(f"{name} is {value}; it must be {bound}.")
    return int(value)


def messages_arg(messages: Any) -> list[dict[str, str]]:
    """A chat as a list of {"role": str, "content": str}."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise InvalidInputError("messages must be a list of {\"role\", \"content\"} dicts, "
                                f"not {type(messages).__name__}.")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidInputError(f"Message {i} is a {type(m).__name__}, not a dict with "
                                    f"\"role\" and \"content\".")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise InvalidInputError(f"Message {i} needs a string \"{key}\", not "
                                        f"{type(m.get(key)).__name__}.")
            text_arg(m[key], f"The {key} of message {i}")
        out.append(dict(m))
    return out


def sentences_arg(sentences: Any) -> list[str]:
    if isinstance(sentences, str | bytes):
        raise InvalidInputError("embed() takes a list of sentences, not one string.")
    if not isinstance(sentences, Iterable):
        raise InvalidInputError(f"embed() takes a list of sentences, not "
                                f"{type(sentences).__name__}.")
    out = list(sentences)
    for i, s in enumerate(out):
        text_arg(s, f"Sentence {i}")
    return out


# --- numerical health ---------------------------------------------------------------------

def first_bad_layer(model: Any, run: Callable[[], Any], to_numpy: Callable[[Any], np.ndarray]
                    ) -> str:
    """Run ``run()`` (one forward of ``model``) with each of ``model.layers`` checked, and
    name where a NaN/Inf first appeared: "the embeddings", "layer N" or "the output head"."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        return "the output"
    found: list[str] = []

    class Checked:
        """The layer, with its input and output checked; its attributes stay visible (the
        model reads them, e.g. each layer's attention window when it makes a cache)."""

        def __init__(self, layer: Any, i: int):
            self.layer, self.i = layer, i

        def __getattr__(self, name: str) -> Any:
            return getattr(self.layer, name)

        def __call__(self, *a: Any, **k: Any) -> Any:
            if not found and self.i == 0 and a and not np.isfinite(to_numpy(a[0])).all():
                found.append("the embeddings")
            out = self.layer(*a, **k)
            if not found and not np.isfinite(to_numpy(out)).all():
                found.append(f"layer {self.i}")
            return out

    original = list(layers)
    layers[:] = [Checked(layer, i) for i, layer in enumerate(original)]
    try:
        run()
    finally:
        layers[:] = original
    return found[0] if found else "the output head"


def check_finite(values: np.ndarray, what: str, where: Callable[[], str] | None = None) -> None:
    """NumericalError if ``values`` hold NaN or Inf; ``where()`` names the first bad layer."""
    if not np.isfinite(values).all():
        place = f", first in {where()}" if where is not None else ""
        raise NumericalError(f"The {what} contain NaN or infinite values{place}; the model "
                             f"weights or its settings are broken.")


@dataclass
class GenerateArgs:
    """A generate() call's arguments after the checks every engine makes."""

    prompt: str | None
    messages: list[dict[str, str]] | None
    max_tokens: int
    sampling: SamplingParams
    stop: list[str]
    cancel: threading.Event | None = None
    prompt_ids: Sequence[int] | None = None  # the model checks them against its vocabulary
    continue_final: bool = False
    profile: bool = False
    ignore_eos: bool = False


def generate_args(prompt: Any, messages: Any, max_tokens: Any, sampling: Any, stop: Any,
                  cancel: Any, prompt_ids: Any = None, continue_final: bool = False,
                  profile: bool = False, ignore_eos: bool = False) -> GenerateArgs:
    """The checks before any generation starts, local or remote: one sentence for each
    wrong type, empty input, bad sampling parameter or bad stop list."""
    if prompt_ids is not None and (prompt is not None or messages is not None):
        raise InvalidInputError("Pass one of prompt, messages or prompt_ids.")
    sampling = check_params(SamplingParams() if sampling is None else sampling)
    if isinstance(stop, str) or not all(isinstance(s, str) for s in stop):
        raise InvalidInputError("stop must be a list of strings.")
    if cancel is not None and not hasattr(cancel, "is_set"):
        raise InvalidInputError("cancel must be a threading.Event.")
    if prompt is not None and messages is not None:
        raise InvalidInputError("Pass either prompt or messages, not both.")
    max_tokens = int_arg(max_tokens, "max_tokens", 1)
    flags = dict(cancel=cancel, continue_final=bool(continue_final), profile=bool(profile),
                 ignore_eos=bool(ignore_eos))
    if prompt_ids is not None:
        return GenerateArgs(None, None, max_tokens, sampling, list(stop),
                            prompt_ids=prompt_ids, **flags)
    if messages is not None:
        chat = messages_arg(messages)
        if not any(m["content"].strip() for m in chat):
            raise InvalidInputError("The conversation is empty: write a message first.")
        return GenerateArgs(None, chat, max_tokens, sampling, list(stop), **flags)
    if prompt is None or not text_arg(prompt, "prompt").strip():
        raise InvalidInputError("The prompt is empty: write something to continue.")
    if continue_final:
        raise InvalidInputError("continue_final needs messages, not a prompt.")
    return GenerateArgs(prompt, None, max_tokens, sampling, list(stop), **flags)


class Generates:
    """The one ``generate`` of every causal engine (local :class:`CausalLM`, remote
    :class:`RemoteLM`): its arguments are checked here, in the same words for both, and
    the engine's ``_generate`` receives them as :class:`GenerateArgs`."""

    def generate(
        self,
        prompt: str | None = None,
        messages: Sequence[dict[str, str]] | None = None,
        max_tokens: int = 256,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        profile: bool = False,
        continue_final: bool = False,
        ignore_eos: bool = False,
        prompt_ids: Sequence[int] | None = None,
    ) -> Iterator[GenerationEvent]:
        """Stream TokenEvents then one DoneEvent. Raises InvalidInputError up front.
        ``continue_final``: the last message is a reply to extend, not to answer.
        ``profile``: per-op times in the DoneEvent, where the engine can see them.
        ``ignore_eos``: end-of-sequence tokens do not end it (benchmarks: a fixed count).
        ``prompt_ids``: the prompt already tokenized (``CausalLM.plan``'s ids, e.g. those
        :func:`inference.context.fit` counted), instead of ``prompt`` or ``messages``."""
        return self._generate(generate_args(
            prompt, messages, max_tokens, sampling, stop, cancel, prompt_ids=prompt_ids,
            continue_final=continue_final, profile=profile, ignore_eos=ignore_eos))

    def _generate(self, a: GenerateArgs) -> Iterator[GenerationEvent]:
        raise NotImplementedError
