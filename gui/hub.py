"""Search the Hugging Face Hub by text and list a repository's model files (no Qt).

Runs on the downloads worker. ``api`` is a ``huggingface_hub.HfApi`` (tests pass a fake
one). Any failure to reach the Hub becomes one sentence (:class:`HubUnreachableError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from inference.errors import ModelNotFoundError
from inference.store import HubUnreachableError, _check_dns

SEARCH_LIMIT = 30
MODEL_SUFFIXES = (".gguf", ".safetensors")
# GGUF file names carry their quant type: "model-Q4_K_M.gguf", "model.q8_0.gguf", "f16".
_QUANT = re.compile(r"(?:^|[-_.])((?:IQ|Q)\d(?:_[A-Z0-9]+)*|BF16|F16|F32)(?=[-_.]|$)",
                    re.IGNORECASE)
OFFLINE = ("The Hugging Face Hub cannot be reached (offline?): searching needs the network; "
           "models already on this computer are listed above.")


@dataclass
class HubModel:
    repo_id: str
    downloads: int
    likes: int
    formats: list[str]  # "gguf" / "safetensors" tags


@dataclass
class HubFile:
    name: str
    size: int | None  # bytes
    quant: str  # "Q4_K_M", "F16", … or "" when the name does not say


def quant_of(filename: str) -> str:
    m = _QUANT.search(filename.rsplit("/", 1)[-1].removesuffix(".gguf"))
    return m.group(1).upper() if m else ""


def _api(api: Any) -> Any:
    if api is not None:
        return api
    from huggingface_hub import HfApi

    _check_dns("the search")
    return HfApi()


def _unreachable(exc: BaseException) -> HubUnreachableError:
    return HubUnreachableError(OFFLINE + f" ({type(exc).__name__})")


def search_models(query: str, api: Any = None, limit: int = SEARCH_LIMIT) -> list[HubModel]:
    """Model repositories matching ``query`` that hold GGUF or safetensors weights, most
    downloaded first."""
    query = " ".join(query.split())
    if not query:
        return []
    try:
        api = _api(api)
        found = list(api.list_models(search=query, sort="downloads", limit=limit,
                                     full=False))
    except HubUnreachableError:
        raise HubUnreachableError(OFFLINE) from None
    except Exception as exc:  # noqa: BLE001 - every transport failure: one sentence
        raise _unreachable(exc) from None
    out = []
    for m in found:
        tags = [t for t in (getattr(m, "tags", None) or []) if t in ("gguf", "safetensors")]
        out.append(HubModel(m.id, int(getattr(m, "downloads", 0) or 0),
                            int(getattr(m, "likes", 0) or 0), tags))
    return out


def repo_files(repo_id: str, api: Any = None) -> list[HubFile]:
    """The model files in ``repo_id`` with their sizes and quant types, smallest first."""
    try:
        api = _api(api)
        info = api.model_info(repo_id, files_metadata=True)
    except HubUnreachableError:
        raise HubUnreachableError(OFFLINE) from None
    except Exception as exc:  # noqa: BLE001
        if type(exc).__name__ in ("RepositoryNotFoundError", "GatedRepoError"):
            raise ModelNotFoundError(f"The Hugging Face Hub has no accessible repository "
                                     f"{repo_id}.") from None
        raise _unreachable(exc) from None
    files = [HubFile(s.rfilename, getattr(s, "size", None), quant_of(s.rfilename))
             for s in (info.siblings or []) if s.rfilename.endswith(MODEL_SUFFIXES)]
    return sorted(files, key=lambda f: (f.size is None, f.size or 0, f.name))
