"""Model file readers: GGUF files and Hugging Face safetensors directories -> Checkpoint."""

from __future__ import annotations

from pathlib import Path

from inference.errors import ModelNotFoundError, UnsupportedModelError
from inference.formats.tensor import Checkpoint, TensorData

__all__ = ["Checkpoint", "TensorData", "read_checkpoint"]


def read_checkpoint(path: str | Path) -> Checkpoint:
    """Read a ``.gguf`` file or a model directory (config.json + *.safetensors).

    Nothing is dequantized or copied: tensors are views into memory-mapped files.
    """
    from inference.formats.gguf_file import read_gguf
    from inference.formats.safetensors_dir import read_safetensors_dir

    path = Path(path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"No model file or directory at {path}.")
    if path.is_dir():
        if (path / "config.json").is_file():
            return read_safetensors_dir(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return read_gguf(ggufs[0])
        raise UnsupportedModelError(
            f"{path} is a directory without config.json"
            + (f" and with {len(ggufs)} .gguf files; name one of them." if ggufs
               else " or a .gguf file, so it holds no model this engine reads.")
        )
    if path.suffix.lower() == ".safetensors":
        return read_safetensors_dir(path.parent)
    return read_gguf(path)
