"""Architectures by Hugging Face model_type. Each module has ModelArgs, Model, REQUIRED_OPS."""

from __future__ import annotations

from types import ModuleType

from inference.errors import UnsupportedModelError
from inference.models import bert, llama

ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama,
    "mistral": llama,
    "qwen2": llama,
    "qwen3": llama,
    "gemma": llama,
    "gemma2": llama,
    "gemma3_text": llama,
    "phi3": llama,
    "bert": bert,
    "xlm-roberta": bert,
    "roberta": bert,
    "nomic_bert": bert,
}
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
