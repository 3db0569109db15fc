"""Read a GGUF file into a :class:`Checkpoint` with Hugging Face names and config.

Parsing is ``gguf.GGUFReader``'s (:mod:`.gguf_reader`), with metadata arrays read in one
pass (the reader's element-by-element walk took ~1.4 s for SmolLM2's vocabulary) and
guarded against corrupt input; this module keeps the last few parsed headers
(:class:`_HeaderCache`: a second read of an unchanged file maps it afresh without parsing;
large ones also on disk, :mod:`.cache`, for the next process), maps names and metadata, and
undoes one converter transformation:

llama.cpp's converter permutes the rows of ``q_proj``/``k_proj`` (and their biases) for
llama-arch models so that GGML's adjacent-pair RoPE rotates the right pairs. We undo that
permutation here, on whole (raw, still quantized) rows, so every checkpoint reaches the
model code in Hugging Face order and the model can use the NeoX half-split RoPE always.
Qwen2 and Qwen3 files are not permuted (llama.cpp runs them with NeoX RoPE).

Tensor names without a Hugging Face equivalent (e.g. ``rope_freqs.weight``) keep their
GGUF name. BERT names are the bare ``embeddings.*``/``encoder.*`` form (no ``bert.``
prefix), as in :mod:`inference.formats.safetensors_dir`; ``nomic-bert`` names are
transformers' nomic_bert ones, with ``attn_qkv`` kept fused as ``self_attn.qkv_proj``.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from inference.errors import CorruptModelError, UnsupportedModelError
from inference.formats.cache import MIN_HEADER_BYTES, key_path, load_pickle, save_pickle
from inference.formats.quants import BLOCK_TYPES
from inference.formats.tensor import MAX_LAYERS, Checkpoint, DeferredTensor, TensorData

# GGUF architecture -> (HF model_type, HF architectures entry).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gemma": ("gemma", "GemmaForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
    "phi3": ("phi3", "Phi3ForCausalLM"),
    "bert": ("bert", "BertModel"),
    "nomic-bert": ("nomic_bert", "NomicBertModel"),
}

# Architectures whose q/k rows llama.cpp's converter permuted (see module docstring).
_PERMUTED_ARCHS = {"llama", "mistral"}

_DECODER_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_DECODER_BLOCK = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BERT_NAMES = {
    "token_embd.weight": "embeddings.word_embeddings.weight",
    "position_embd.weight": "embeddings.position_embeddings.weight",
    "token_types.weight": "embeddings.token_type_embeddings.weight",
    "token_embd_norm.weight": "embeddings.LayerNorm.weight",
    "token_embd_norm.bias": "embeddings.LayerNorm.bias",
}
_BERT_BLOCK = {
    "attn_q": "attention.self.query",
    "attn_k": "attention.self.key",
    "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense",
    "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense",
    "ffn_down": "output.dense",
    "layer_output_norm": "output.LayerNorm",
}
_NOMIC_BLOCK = {  # transformers' nomic_bert names; attn_qkv is the fused [q; k; v] rows
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_output_norm": "post_attention_layernorm",
    "ffn_up": "mlp.up_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_down": "mlp.down_proj",
    "layer_output_norm": "post_mlp_layernorm",
}
# Encoder architectures: the prefix of layer i's names and the names inside it.
_ENCODER_BLOCKS = {"bert": ("encoder.layer.", _BERT_BLOCK),
                   "nomic-bert": ("layers.", _NOMIC_BLOCK)}
# Per-architecture differences from _DECODER_BLOCK: Phi-3 keeps its fused projections;
# Gemma 2/3 have a norm after attention and after the MLP, and ffn_norm is the one before
# the MLP (HF's post_attention_layernorm is the norm after attention there).
_GEMMA_SANDWICH = {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_ARCH_BLOCK = {
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "gemma2": _GEMMA_SANDWICH,
    "gemma3": _GEMMA_SANDWICH,
}
# What llama.cpp assumes for Gemma 2/3 where the file says nothing (llama-model.cpp's
# hparams loading): the layer pattern (a layer i is sliding iff i % n < n - 1), Gemma 2's
# window and soft-caps, Gemma 3's local RoPE base, and the layer counts of the 27B sizes,
# whose query scale is hidden / heads instead of head_dim.
_GEMMA_PATTERN = {"gemma2": 2, "gemma3": 6}
_GEMMA2_DEFAULTS = {"sliding_window": 4096, "attn_logit_softcapping": 50.0,
                    "final_logit_softcapping": 30.0}
_GEMMA3_LOCAL_BASE = 10000.0
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")

def open_gguf(path: str | Path) -> Any:
    """Open ``path`` with the guarded ``gguf.GGUFReader`` (:mod:`.gguf_reader`, imported
    only here: importing gguf-py costs ~0.1 s, and a header read from the cache needs none
    of it); typed errors for every way it can fail."""
    from inference.formats.gguf_reader import open_reader

    return open_reader(path)


@dataclass(frozen=True)
class _TensorEntry:
    """Where one tensor lies in the file and how to view it (``rows``: the view's shape)."""

    name: str
    qtype: str
    shape: tuple[int, ...]  # logical, NumPy order
    offset: int
    dtype: np.dtype
    rows: tuple[int, ...]

    def view(self, data: np.ndarray) -> np.ndarray:
        n = math.prod(self.rows) * self.dtype.itemsize
        return data[self.offset:self.offset + n].view(self.dtype).reshape(self.rows)


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's parsed header: its key/values and its tensor directory, no tensor data.

    ``metadata`` holds every key/value under its own name: strings as ``str``, numbers as
    Python scalars, string arrays as :class:`.strings.StringArray` (a list of ``str``
    decoded at its first read; invalid UTF-8 kept with ``surrogateescape``), numeric arrays
    as read-only ``np.ndarray`` (copies, not views of the file)."""

    metadata: dict[str, Any]
    tensors: tuple[_TensorEntry, ...]
    length: int  # bytes of the file the header takes
    digest: bytes  # of those bytes


class _HeaderCache:
    """The headers of the last few GGUF files read, by resolved path.

    An entry serves a read only while the file has the size and mtime it was parsed at and
    the same header bytes (a hash of them, ~1 ms: a same-size rewrite within one tick of
    the file system's clock keeps the mtime). Only parsed headers are kept, never tensor
    data or the file's map, so a model's memory map lives exactly as long as the model;
    failed parses are not kept, so a bad file gives its error at every read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, tuple[tuple[int, int], GGUFHeader]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, stamp: tuple[int, int], data: np.ndarray) -> GGUFHeader | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None or found[0] != stamp:
                return None
            self._entries.move_to_end(key)
        header = found[1]
        return header if _digest(data[:header.length]) == header.digest else None

    def put(self, key: str, stamp: tuple[int, int], header: GGUFHeader) -> None:
        with self._lock:
            self._entries[key] = (stamp, header)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def drop(self, key: str) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_HEADERS = _HeaderCache(4)


def forget_header(path: str | Path) -> None:
    """Drop the parsed header of the GGUF file at ``path`` from this process's cache: a
    loaded model keeps what it needs of it, and the vocabulary as Python strings is what
    stays (27 MiB resident for Llama 3's 128k tokens and 280k merges). A later read takes
    the header from the disk cache (~0.1 s) or parses the file."""
    _HEADERS.drop(str(Path(path).resolve()))


def _digest(data: np.ndarray) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def read_header(path: str | Path) -> tuple[GGUFHeader, np.ndarray]:
    """The parsed header of the GGUF file at ``path`` (from the cache when the file is
    unchanged) and the file's bytes, freshly memory-mapped; typed errors."""
    path = Path(path)
    key, stamp = str(path.resolve()), None
    try:
        if path.is_file():
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
            data = np.memmap(path, mode="r").view(np.ndarray)
            header = _HEADERS.get(key, stamp, data) or _from_disk(key, stamp, data)
            if header is not None:
                return header, data
    except (OSError, ValueError):  # unreadable or empty: the reader says which
        pass
    reader = open_gguf(path)
    from inference.formats.gguf_reader import describe_error, field_value

    try:
        metadata = {name: field_value(f) for name, f in reader.fields.items()
                    if not name.startswith("GGUF.")}
    except (ValueError, IndexError, TypeError) as e:
        raise CorruptModelError(f"{path} has unreadable metadata ({describe_error(e)}).") from None
    entries = tuple(
        _TensorEntry(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())),
                     int(t.data_offset), t.data.dtype, tuple(t.data.shape))
        for t in reader.tensors)
    data = reader.data
    header = GGUFHeader(metadata, entries, int(reader.data_offset),
                        _digest(data[:reader.data_offset]))
    if stamp is not None and stamp[0] == len(data):  # parsed what was stat'ed
        _HEADERS.put(key, stamp, header)
        if header.length >= MIN_HEADER_BYTES:
            save_pickle(_header_path(key, stamp), header)
    return header, data


# Raised when what a kept header pickles changes: 2, its strings' class moved to
# :mod:`.strings` (a form-1 entry would import gguf-py to be read).
HEADER_FORM = 2


def _header_path(key: str, stamp: tuple[int, int]) -> Path | None:
    """Where the parsed header of the file ``key`` (its resolved path) at ``stamp`` (size,
    mtime) is kept between processes."""
    return key_path("headers", f"{key}|{stamp}|{HEADER_FORM}")


def _from_disk(key: str, stamp: tuple[int, int], data: np.ndarray) -> GGUFHeader | None:
    """The header parsed by an earlier process, if the file is as it was then (stamp in the
    key; the header's bytes hash the same)."""
    header = load_pickle(_header_path(key, stamp))
    if not isinstance(header, GGUFHeader) or _digest(data[:header.length]) != header.digest:
        return None
    for v in header.metadata.values():
        if isinstance(v, np.ndarray):
            v.flags.writeable = False  # shared by every read of the cached header
    _HEADERS.put(key, stamp, header)
    return header


def read_gguf(path: str | Path) -> Checkpoint:
    """A GGUF file -> :class:`Checkpoint` (format "gguf"), memory-mapped, nothing dequantized.

    ``metadata`` is :class:`GGUFHeader`'s (a new dict per read; its values are shared
    with the header cache and must not be changed)."""
    path = Path(path)
    header, data = read_header(path)
    metadata = dict(header.metadata)

    if int(metadata.get("split.count") or 1) > 1:
        raise UnsupportedModelError(
            f"{path} is one of {metadata['split.count']} parts of a split GGUF; merge the "
            f"parts with llama-gguf-split --merge first.")
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path} has architecture {arch!r}, which is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})."
        )

    raw: dict[str, TensorData] = {}
    for t in header.tensors:
        if t.qtype not in BLOCK_TYPES:
            raise UnsupportedModelError(
                f"{path}: tensor {t.name} has type {t.qtype}, which this engine cannot run."
            )
        raw[t.name] = TensorData(t.name, t.shape, t.qtype, t.view(data))

    config = _config(arch, metadata, raw)
    tensors = _rename(arch, raw, config)
    template = metadata.get("tokenizer.chat_template")
    st = path.stat()
    identity = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{header.digest.hex()}"
    return Checkpoint(path=path, format="gguf", config=config, tensors=tensors,
                      metadata=metadata, chat_template=template if template else None,
                      identity=identity)


# --- metadata ------------------------------------------------------------------------------

def _config(arch: str, md: dict[str, Any], tensors: dict[str, TensorData]) -> dict[str, Any]:
    """GGUF ``{arch}.*`` keys -> Hugging Face config.json fields."""
    model_type, hf_arch = ARCHITECTURES[arch]

    def get(key: str, default: Any = None) -> Any:
        value = md.get(f"{arch}.{key}", default)
        if isinstance(value, str) and key != "rope.scaling.type":  # every other key is a number
            raise CorruptModelError(f"GGUF key {arch}.{key} is the string {value[:40]!r}; "
                                    f"expected a number.")
        if isinstance(value, str) and not value.isprintable():
            raise CorruptModelError(f"GGUF key {arch}.{key} is {value[:40]!r}; expected a "
                                    f"RoPE scaling name.")
        if isinstance(value, float) and not math.isfinite(value):
            raise CorruptModelError(f"GGUF key {arch}.{key} is {value}; expected a finite "
                                    f"number.")
        return value

    hidden = get("embedding_length")
    heads = get("attention.head_count")
    layers = get("block_count")
    if hidden is None or heads is None or layers is None:
        raise CorruptModelError(f"GGUF metadata for {arch} lacks embedding_length, "
                                f"block_count or attention.head_count.")
    if isinstance(layers, (int, float)) and layers > MAX_LAYERS:
        raise CorruptModelError(f"GGUF key {arch}.block_count is {layers}; expected at most "
                                f"{MAX_LAYERS}.")
    heads = _scalar(heads)
    kv_heads = _scalar(get("attention.head_count_kv", heads))
    vocab = get("vocab_size")
    if vocab is None:
        tokens = md.get("tokenizer.ggml.tokens")
        embd = tensors.get("token_embd.weight")
        vocab = len(tokens) if tokens else (embd.shape[0] if embd else None)
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [hf_arch],
        "hidden_size": int(hidden),
        "intermediate_size": int(_scalar(get("feed_forward_length", 0))),
        "num_hidden_layers": int(layers),
        "num_attention_heads": int(heads),
        "vocab_size": int(vocab) if vocab is not None else None,
        "max_position_embeddings": int(get("context_length", 2048)),
    }
    for hf_key, gguf_key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                             ("pad_token_id", "padding_token_id")):
        if f"tokenizer.ggml.{gguf_key}" in md:
            cfg[hf_key] = int(md[f"tokenizer.ggml.{gguf_key}"])

    if arch in _ENCODER_BLOCKS:
        cfg.update(
            hidden_act="gelu" if arch == "bert" else "silu",  # nomic-bert: SwiGLU
            layer_norm_eps=float(get("attention.layer_norm_epsilon", 1e-12)),
            type_vocab_size=int(tensors["token_types.weight"].shape[0])
            if "token_types.weight" in tensors else 2,
            position_embedding_type="absolute" if arch == "bert" else "rotary",
        )
        if arch == "nomic-bert":  # llama.cpp's base where the file has none
            cfg["rope_theta"] = float(get("rope.freq_base", 10000.0))
        if get("pooling_type") is not None:
            cfg["pooling_type"] = int(get("pooling_type"))  # llama.cpp enum: 1 mean, 2 cls
        return cfg

    head_dim = get("attention.key_length") or get("rope.dimension_count") or (
        hidden // heads if heads else 0)  # 0 heads: refused with the config check
    cfg.update(
        hidden_act="silu",
        num_key_value_heads=int(kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
    )
    if arch == "qwen2":
        cfg["attention_bias"] = True  # Qwen2 always has q/k/v biases
    if arch.startswith("gemma"):
        cfg["norm_weight_offset"] = 0.0  # llama.cpp's converter stored 1 + w already
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
    if arch in _GEMMA_PATTERN:
        cfg.update(_gemma_config(arch, get, cfg))
    if arch == "phi3" and "rope_factors_short.weight" in tensors:
        original = get("rope.scaling.original_context_length")
        cfg["rope_scaling"] = {  # the factors themselves are read from the tensors
            "rope_type": "longrope", "short_factor": [1.0] * (int(head_dim) // 2),
            "long_factor": [1.0] * (int(head_dim) // 2),
            "original_max_position_embeddings": int(original or cfg["max_position_embeddings"]),
            "attention_factor": float(get("rope.scaling.attn_factor", 1.0))}
    scaling = get("rope.scaling.type")
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {"rope_type": scaling, "type": scaling,
                               "factor": float(get("rope.scaling.factor", 1.0))}
        if get("rope.scaling.original_context_length"):
            cfg["rope_scaling"]["original_max_position_embeddings"] = int(
                get("rope.scaling.original_context_length"))
    if get("attention.sliding_window"):
        cfg["sliding_window"] = int(get("attention.sliding_window"))
    return cfg


def _gemma_config(arch: str, get: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2/3 settings from the file's keys, else llama.cpp's built-in values.

    Read when present: ``attention.sliding_window``, ``attention.sliding_window_pattern``
    (a per-layer bool array, or llama.cpp's period ``n``), ``attention.scale``,
    ``attn_logit_softcapping``, ``final_logit_softcapping``, ``rope.freq_base_swa``.
    A Gemma 3 file without a window (or window 0) has no sliding layers, as in llama.cpp."""
    layers = cfg["num_hidden_layers"]
    out: dict[str, Any] = {}
    defaults = _GEMMA2_DEFAULTS if arch == "gemma2" else {}
    window = get("attention.sliding_window", defaults.get("sliding_window"))
    pattern = get("attention.sliding_window_pattern", _GEMMA_PATTERN[arch])
    if isinstance(pattern, np.ndarray | list):
        sliding = [bool(x) for x in np.asarray(pattern).reshape(-1)]
        if len(sliding) != layers:
            raise CorruptModelError(
                f"GGUF key {arch}.attention.sliding_window_pattern has {len(sliding)} "
                f"entries for {layers} layers.")
    else:
        n = int(pattern)
        sliding = [n == 0 or i % n < n - 1 for i in range(layers)]
    if not window:
        sliding = [False] * layers
    out["layer_types"] = ["sliding_attention" if s else "full_attention" for s in sliding]
    out["sliding_window"] = int(window) if window else None
    scale = get("attention.scale")
    if scale:
        out["query_pre_attn_scalar"] = float(scale) ** -2.0
    elif layers == _GEMMA_27B_LAYERS[arch]:
        out["query_pre_attn_scalar"] = cfg["hidden_size"] / cfg["num_attention_heads"]
    else:
        out["query_pre_attn_scalar"] = cfg["head_dim"]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        value = get(key, defaults.get(key))
        out[key] = float(value) if value else None
    if arch == "gemma3":
        out["rope_local_base_freq"] = float(get("rope.freq_base_swa", _GEMMA3_LOCAL_BASE))
    return out


def _scalar(v: Any) -> Any:
    """Per-layer arrays (allowed for head counts) collapse to their single value."""
    if isinstance(v, np.ndarray | list):
        values = set(np.asarray(v).tolist())
        if len(values) != 1:
            raise UnsupportedModelError(f"Per-layer head counts {sorted(values)} are not "
                                        f"supported.")
        return values.pop()
    return v


# --- tensor names and the q/k un-permutation -------------------------------------------------

def hf_name(arch: str, name: str) -> str:
    """The Hugging Face name of GGUF tensor ``name`` (unchanged if it has none)."""
    encoder = _ENCODER_BLOCKS.get(arch)
    top = _BERT_NAMES if encoder else _DECODER_NAMES
    if name in top:
        return top[name]
    m = _BLOCK_RE.match(name)
    if m:
        layer, part, kind = m.groups()
        if encoder:
            prefix, block = encoder
            return f"{prefix}{layer}.{block[part]}.{kind}" if part in block else name
        block = {**_DECODER_BLOCK, **_ARCH_BLOCK.get(arch, {})}
        if part in block:
            return f"model.layers.{layer}.{block[part]}.{kind}"
    return name


def unpermute_rows(a: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of q/k rows (works on raw quantized rows too).

    The converter maps HF row ``h*D + j*D/2 + i`` to ``h*D + 2*i + j`` (adjacent pairs);
    this is ``transformers``' ``reverse_permute_weights``: reshape (heads, D/2, 2, ...),
    swap the middle axes, reshape back.
    """
    rows = a.shape[0]
    if n_head < 1 or rows % (2 * n_head):
        raise CorruptModelError(f"{rows} q/k rows cannot be split into {n_head} heads.")
    w = a.reshape(n_head, rows // n_head // 2, 2, *a.shape[1:])
    return np.ascontiguousarray(w.swapaxes(1, 2)).reshape(a.shape)


def _rename(arch: str, raw: dict[str, TensorData], cfg: dict[str, Any]) -> dict[str, TensorData]:
    out: dict[str, TensorData] = {}
    for name, t in raw.items():
        data = t.data
        if arch in _PERMUTED_ARCHS:
            m = _BLOCK_RE.match(name)
            if m and m.group(2) in ("attn_q", "attn_k"):
                q = m.group(2) == "attn_q"
                heads = cfg["num_attention_heads"] if q else cfg["num_key_value_heads"]
                if heads < 1 or data.shape[0] % (2 * heads):
                    raise CorruptModelError(
                        f"GGUF key {arch}.attention.head_count{'' if q else '_kv'} is {heads}, "
                        f"which does not split the {data.shape[0]} rows of {name}.")
                new = hf_name(arch, name)
                out[new] = DeferredTensor(  # permuted on first use: a cached weight never is
                    new, t.shape, t.qtype, partial(unpermute_rows, data, heads),
                    (data.dtype, tuple(data.shape[1:])), int(data.nbytes))
                continue
        new = hf_name(arch, name)
        out[new] = TensorData(new, t.shape, t.qtype, data)
    return out
