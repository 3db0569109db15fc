"""Read a Hugging Face model directory (config.json + *.safetensors) into a Checkpoint.

Tensors are memory-mapped views into the files. We read the safetensors header (an
8-byte little-endian length, then JSON) ourselves instead of calling safetensors'
``safe_open(..., "np").get_tensor``: that API copies every tensor into memory (twice the
file size resident for MiniLM) and cannot represent bfloat16, which NumPy lacks.

- Float tensors keep their dtype: F32/F16 as float32/float16 arrays, BF16 as raw uint8
  bytes ``(*shape[:-1], 2 * shape[-1])`` (qtype "BF16", like GGUF block types), F64 is
  narrowed to float32.
- Integer tensors that are not MLX weights are buffers (e.g. BERT's
  ``embeddings.position_ids``), not weights, and are left out.
- BERT names are normalised to the bare form ``embeddings.*`` / ``encoder.*`` /
  ``pooler.*``: a leading ``bert.`` (BertForMaskedLM and friends) is dropped.
- nomic_bert tensors are saved under the Hub's names (contrastors': ``emb_ln``,
  ``encoder.layers.N.attn.Wqkv``, ``mlp.fc11`` ...; transformers writes them too) and
  nomic-ai's config.json has GPT-2-style keys (``n_embd`` ...): both get transformers' names,
  as its conversion mapping gives them, but the fused ``attn.Wqkv`` stays one tensor,
  ``self_attn.qkv_proj``.
- MLX-quantized directories (``"quantization": {"group_size", "bits"}`` in config.json,
  tensors ``X.weight`` uint32 + ``X.scales`` + ``X.biases``) give TensorData of qtype "MLX"
  with ``extra = {scales, biases, group_size, bits}`` and format "mlx". bfloat16 scales
  and biases are widened to float32 (exact; they are small); the logical shape is
  ``(out, scales.shape[-1] * group_size)``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from inference.errors import CorruptModelError, ModelNotFoundError, UnsupportedModelError
from inference.formats.quants import MLX_BITS, MLX_GROUP_SIZES
from inference.formats.tensor import Checkpoint, TensorData

_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
_INT_DTYPES = {
    "I8": np.int8, "U8": np.uint8, "I16": np.int16, "U16": np.uint16, "I32": np.int32,
    "U32": np.uint32, "I64": np.int64, "U64": np.uint64, "BOOL": np.bool_,
}
_ITEMSIZE = {"BF16": 2} | {k: np.dtype(v).itemsize for k, v in _FLOAT_DTYPES.items()} \
    | {k: np.dtype(v).itemsize for k, v in _INT_DTYPES.items()}
_MAX_HEADER = 100 * 1024 * 1024  # the format caps headers at 100 MB
ENCODER_TYPES = {"bert", "xlm-roberta", "roberta", "nomic_bert"}
# The Hub's nomic_bert checkpoints (nomic-ai, contrastors' code) -> transformers' names, as
# transformers' own conversion mapping renames them: GPT-2-style config keys, and tensor
# name parts in this order (Wqkv stays one tensor of [q; k; v] rows).
_NOMIC_HUB_CONFIG = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers",
                     "n_head": "num_attention_heads", "n_inner": "intermediate_size",
                     "n_positions": "max_position_embeddings",
                     "layer_norm_epsilon": "layer_norm_eps", "rotary_emb_base": "rope_theta"}
_NOMIC_HUB_TENSORS = [("encoder.layers.", "layers."), ("emb_ln", "embeddings.LayerNorm"),
                      ("attn.out_proj", "self_attn.o_proj"), ("attn.Wqkv", "self_attn.qkv_proj"),
                      ("mlp.fc11", "mlp.up_proj"), ("mlp.fc12", "mlp.gate_proj"),
                      ("mlp.fc2", "mlp.down_proj"), ("norm1", "post_attention_layernorm"),
                      ("norm2", "post_mlp_layernorm")]


def is_model_dir(path: Path) -> bool:
    """Whether ``path`` looks like a Hugging Face model directory."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def read_safetensors_dir(path: str | Path) -> Checkpoint:
    """A model directory -> :class:`Checkpoint` (format "safetensors", or "mlx" if quantized)."""
    path = Path(path)
    if not path.exists():
        raise ModelNotFoundError(f"Model directory {path} does not exist.")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ModelNotFoundError(f"{path} has no config.json, so it is not a model directory.")
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise CorruptModelError(f"{config_path} does not hold a JSON object.")
    if config.get("model_type") is not None and not isinstance(config["model_type"], str):
        raise CorruptModelError(f"{config_path}: model_type is {config.get('model_type')!r}; "
                                f"expected the architecture's name as a string.")

    raw: dict[str, tuple[str, tuple[int, ...], np.ndarray, Path]] = {}
    for file in _shard_files(path):
        for name, entry in _map_file(file).items():
            raw[name] = (*entry, file)

    quant = config.get("quantization") or config.get("quantization_config")
    is_mlx = isinstance(quant, dict) and "bits" in quant and any(
        n.endswith(".scales") for n in raw)
    tensors: dict[str, TensorData] = {}
    for name, (dtype, shape, data, file) in raw.items():
        if is_mlx and name.endswith((".scales", ".biases")):
            continue  # consumed with their weight below
        if is_mlx and dtype == "U32" and f"{name[:-len('.weight')]}.scales" in raw:
            t = _mlx_tensor(name, data, raw, quant, file)
        elif dtype in _FLOAT_DTYPES or dtype == "BF16":
            t = _float_tensor(name, dtype, shape, data)
        elif dtype in _INT_DTYPES:
            continue  # buffers such as position_ids, not weights
        else:
            raise UnsupportedModelError(f"{file}: tensor {name} has dtype {dtype}, which this "
                                        f"engine cannot run.")
        tensors[t.name] = t

    if config.get("model_type") in ENCODER_TYPES:
        tensors = {_strip_bert(n): TensorData(_strip_bert(n), t.shape, t.qtype, t.data, t.extra)
                   for n, t in tensors.items()}
        if config["model_type"] == "nomic_bert":
            config, tensors = _nomic_from_hub(config, tensors)
    elif "embed_tokens.weight" in tensors and "model.embed_tokens.weight" not in tensors:
        # A bare decoder (Qwen3Model, as decoder embedders ship) names its tensors without
        # the "model." a ForCausalLM checkpoint puts in front.
        tensors = {f"model.{n}": TensorData(f"model.{n}", t.shape, t.qtype, t.data, t.extra)
                   for n, t in tensors.items()}
    return Checkpoint(path=path, format="mlx" if is_mlx else "safetensors", config=config,
                      tensors=tensors, metadata={}, chat_template=_chat_template(path))


def _strip_bert(name: str) -> str:
    """Encoder tensor names without a task head's prefix (BertForX, XLMRobertaForX)."""
    for prefix in ("bert.", "roberta."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _nomic_from_hub(config: dict[str, Any], tensors: dict[str, TensorData]
                    ) -> tuple[dict[str, Any], dict[str, TensorData]]:
    """A nomic_bert checkpoint in transformers' config keys and tensor names. The Hub's
    tensor names are also what transformers itself writes; its config keys only the Hub's
    checkpoints have. Keys without a transformers counterpart stay (the model refuses values
    it does not compute); activation "swiglu" is transformers' SiLU-gated MLP."""
    cfg = {_NOMIC_HUB_CONFIG.get(k, k): v for k, v in config.items()}
    if cfg.get("activation_function") == "swiglu":
        cfg["hidden_act"] = "silu"

    def rename(name: str) -> str:
        for old, new in _NOMIC_HUB_TENSORS:
            name = name.replace(old, new)
        return name

    return cfg, {rename(n): TensorData(rename(n), t.shape, t.qtype, t.data, t.extra)
                 for n, t in tensors.items()}


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelError(f"Cannot read {p}: {e}.") from None


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CorruptModelError(f"{index} has no weight_map.")
        files = [path / f for f in dict.fromkeys(weight_map.values())]
        for f in files:
            if not f.is_file():
                raise CorruptModelError(f"{index} lists shard {f.name}, which is missing.")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{path} holds no *.safetensors file.")
    return files


def _map_file(file: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """Memory-map one .safetensors file: name -> (dtype, shape, uint8 view of its bytes)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n <= 0 or n > _MAX_HEADER or 8 + n > size:
                raise CorruptModelError(f"{file} is not a valid safetensors file "
                                        f"(bad or truncated header).")
            header = json.loads(fh.read(n).decode("utf-8"))
        mm = np.memmap(file, dtype=np.uint8, mode="r").view(np.ndarray)
    except CorruptModelError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CorruptModelError(f"Cannot read {file} as safetensors ({e}).") from None
    if not isinstance(header, dict):
        raise CorruptModelError(f"{file} has a safetensors header that is not a JSON object.")

    out: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {}
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = info["dtype"], tuple(_whole(d) for d in info["shape"])
            begin, end = (_whole(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CorruptModelError(f"{file}: the header entry of {name} is malformed.") from None
        if any(d < 0 for d in shape) or not isinstance(dtype, str):
            raise CorruptModelError(f"{file}: tensor {name} has shape {list(shape)}; "
                                    f"dimensions must be whole numbers of at least 0.")
        count = math.prod(shape)  # Python ints: [2**32, 2**32] must not wrap to 0
        if not 0 <= begin <= end or base + end > size:
            raise CorruptModelError(f"{file}: tensor {name} lies outside the file "
                                    f"(the file is truncated).")
        if dtype in _ITEMSIZE and end - begin != count * _ITEMSIZE[dtype] or (
                dtype not in _ITEMSIZE and count > end - begin):
            raise CorruptModelError(f"{file}: tensor {name} has {end - begin} bytes for "
                                    f"shape {list(shape)} of {dtype}.")
        out[name] = (dtype, shape, mm[base + begin:base + end])
    return out


def _whole(v: Any) -> int:
    """A header integer; floats, strings and booleans are malformed, not rounded."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(v)
    return v


def _float_tensor(name: str, dtype: str, shape: tuple[int, ...], data: np.ndarray) -> TensorData:
    if dtype == "BF16":
        return TensorData(name, shape, "BF16", data.reshape(*shape[:-1], 2 * shape[-1])
                          if shape else data)
    arr = data.view(_FLOAT_DTYPES[dtype]).reshape(shape)
    if dtype == "F64":
        return TensorData(name, shape, "F32", arr.astype(np.float32))
    return TensorData(name, shape, dtype, arr)


def _as_float(dtype: str, shape: tuple[int, ...], data: np.ndarray) -> np.ndarray:
    """Scales/biases as a NumPy float array (bf16 widened exactly to float32)."""
    if dtype == "BF16":
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype in _FLOAT_DTYPES:
        return data.view(_FLOAT_DTYPES[dtype]).reshape(shape)
    raise UnsupportedModelError(f"MLX scales/biases of dtype {dtype} are not supported.")


def _mlx_tensor(name: str, data: np.ndarray, raw: dict[str, Any], quant: dict[str, Any],
                file: Path) -> TensorData:
    prefix = name[:-len(".weight")]
    # mlx-lm writes per-module overrides (mixed-precision recipes) under the module path.
    params = quant.get(prefix) if isinstance(quant.get(prefix), dict) else quant
    group, bits = int(params.get("group_size", 64)), int(params.get("bits", 4))
    _, w_shape, _, _ = raw[name]
    s_dtype, s_shape, s_data, _ = raw[f"{prefix}.scales"]
    if f"{prefix}.biases" not in raw:
        raise CorruptModelError(f"{file}: {prefix}.biases is missing for an MLX weight.")
    b_dtype, b_shape, b_data, _ = raw[f"{prefix}.biases"]
    n_in = s_shape[-1] * group
    if (bits not in MLX_BITS or group not in MLX_GROUP_SIZES or b_shape != s_shape
            or w_shape[:-1] != s_shape[:-1] or w_shape[-1] * 32 != n_in * bits):
        raise CorruptModelError(
            f"{file}: MLX tensor {prefix} has weight {list(w_shape)} and scales "
            f"{list(s_shape)}, which do not fit {bits}-bit groups of {group}.")
    extra = {"scales": _as_float(s_dtype, s_shape, s_data),
             "biases": _as_float(b_dtype, b_shape, b_data),
             "group_size": group, "bits": bits}
    return TensorData(name, (*w_shape[:-1], n_in), "MLX",
                      data.view(np.uint32).reshape(w_shape), extra)


def _chat_template(path: Path) -> str | None:
    """chat_template.jinja, chat_template.json or tokenizer_config.json, first found."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for fname in ("chat_template.json", "tokenizer_config.json"):
        p = path / fname
        if not p.is_file():
            continue
        try:
            template = json.loads(p.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(template, list):  # named templates: prefer "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if isinstance(template, str) and template:
            return template
    return None
