"""Architectures by Hugging Face model_type. Each module has ModelArgs, Model, REQUIRED_OPS."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType

from inference.errors import UnsupportedModelError

# model_type -> the module under inference.models that implements it.
_MODULES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma": "llama",
    "gemma2": "llama",
    "gemma3_text": "llama",
    "phi3": "llama",
    "bert": "bert",
    "xlm-roberta": "bert",
    "roberta": "bert",
    "nomic_bert": "bert",
}


class _Architectures(Mapping[str, ModuleType]):
    """model_type -> architecture module, each imported at its first lookup: a process that
    runs a decoder does not hold the encoders' code, nor the other way round."""

    def __getitem__(self, model_type: str) -> ModuleType:
        return importlib.import_module(f"inference.models.{_MODULES[model_type]}")

    def __contains__(self, model_type: object) -> bool:
        return model_type in _MODULES

    def __iter__(self) -> Iterator[str]:
        return iter(_MODULES)

    def __len__(self) -> int:
        return len(_MODULES)


ARCHITECTURES: Mapping[str, ModuleType] = _Architectures()
CAUSAL = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"}


def architecture(model_type: str, where: str = "this model") -> ModuleType:
    try:
        return ARCHITECTURES[model_type]
    except (KeyError, TypeError):  # TypeError: a model_type that is not a string (a list)
        known = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(
            f"{where} uses architecture '{model_type}', which Inferdesk does not support "
            f"(supported: {known})."
        ) from None
