"""GGUF header cache: a second read of an unchanged file reuses the parsed header; any change
to the file is seen; bad files fail at every read; no map outlives the checkpoint."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from inference.errors import CorruptModelError
from inference.formats.gguf_file import _HEADERS, read_gguf
from tests.test_formats_gguf import write_decoder

EMBED = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("cache") / "tiny.gguf"
    write_decoder(path, seed=0)
    return path.read_bytes()


@pytest.fixture
def tiny(tmp_path: Path, tiny_bytes: bytes) -> Path:
    _HEADERS.clear()
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny_bytes)
    return path


def _same_stamp_rewrite(path: Path, data: bytes) -> None:
    """Write ``data`` over ``path`` keeping its size and mtime (a rewrite within one tick of
    a coarse file-system clock looks like this)."""
    st = path.stat()
    assert len(data) == st.st_size
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_metadata_equals_gguf_py(tiny: Path) -> None:
    """The one-pass array parse against gguf-py's own reader (strings and numbers)."""
    md = read_gguf(tiny).metadata
    ref = gguf.GGUFReader(tiny)
    for name, field in ref.fields.items():
        if name.startswith("GGUF."):
            continue
        want = field.contents()
        got = md[name]
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == want, name


def test_second_read_reuses_the_header_with_fresh_tensor_views(tiny: Path) -> None:
    a, b = read_gguf(tiny), read_gguf(tiny)
    tokens = "tokenizer.ggml.tokens"
    assert a.metadata[tokens] is b.metadata[tokens]  # the cached parse
    assert a.metadata is not b.metadata  # each reader gets its own dict
    assert not a.metadata["tokenizer.ggml.token_type"].flags.writeable
    assert a.tensors[EMBED].data is not b.tensors[EMBED].data
    assert np.array_equal(a.tensors[EMBED].data, b.tensors[EMBED].data)


def test_new_tensor_bytes_are_seen_under_the_same_header(tiny: Path, tmp_path: Path) -> None:
    before = read_gguf(tiny).tensors[EMBED].data.copy()
    other = tmp_path / "other.gguf"
    expected = write_decoder(other, seed=1)  # same header, other weights
    _same_stamp_rewrite(tiny, other.read_bytes())
    after = read_gguf(tiny).tensors[EMBED].data
    assert np.array_equal(after, expected[EMBED]) and not np.array_equal(after, before)


def test_a_changed_header_is_parsed_again(tiny: Path) -> None:
    assert read_gguf(tiny).metadata["tokenizer.ggml.tokens"][5] == "tok5"
    raw = tiny.read_bytes()
    _same_stamp_rewrite(tiny, raw.replace(b"tok5", b"kot5", 1))  # same size and mtime
    assert read_gguf(tiny).metadata["tokenizer.ggml.tokens"][5] == "kot5"
    tiny.write_bytes(raw)  # a new mtime
    assert read_gguf(tiny).metadata["tokenizer.ggml.tokens"][5] == "tok5"


def test_a_file_gone_bad_fails_at_every_read(tiny: Path) -> None:
    raw = tiny.read_bytes()
    read_gguf(tiny)
    tiny.write_bytes(raw[:len(raw) // 2])  # truncated: no cached success for it
    errors = []
    for _ in range(2):
        with pytest.raises(CorruptModelError, match="tiny.gguf") as e:
            read_gguf(tiny)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    tiny.write_bytes(raw)
    read_gguf(tiny)
    _same_stamp_rewrite(tiny, raw[:100] + b"\xff" * 8 + raw[108:])  # a corrupt header
    for _ in range(2):
        with pytest.raises(CorruptModelError, match="tiny.gguf"):
            read_gguf(tiny)
    tiny.write_bytes(raw)
    assert read_gguf(tiny).config["model_type"] == "llama"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_no_map_of_the_file_outlives_the_checkpoint(tiny: Path) -> None:
    def mapped() -> bool:
        return str(tiny.resolve()) in Path("/proc/self/maps").read_text()

    ck = read_gguf(tiny)
    assert mapped()
    del ck
    gc.collect()
    assert not mapped()  # the header stays cached, the file's map does not
    ck = read_gguf(tiny)  # served from the cache: mapped again, and released again
    assert mapped()
    del ck
    gc.collect()
    assert not mapped()


def test_a_header_parsed_by_an_earlier_process_comes_from_disk(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from inference.formats import gguf_file

    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_file, "MIN_HEADER_BYTES", 0)
    want = read_gguf(tiny).metadata
    assert list((tmp_path / "cache" / "headers").iterdir())
    _HEADERS.clear()  # as in a new process
    parse = gguf_file.open_gguf
    monkeypatch.setattr(gguf_file, "open_gguf", lambda p: pytest.fail("parsed again"))
    got = read_gguf(tiny).metadata
    assert got["tokenizer.ggml.tokens"] == want["tokenizer.ggml.tokens"]
    assert not got["tokenizer.ggml.token_type"].flags.writeable
    _HEADERS.clear()
    _same_stamp_rewrite(tiny, tiny.read_bytes().replace(b"tok5", b"kot5", 1))
    monkeypatch.setattr(gguf_file, "open_gguf", parse)
    assert read_gguf(tiny).metadata["tokenizer.ggml.tokens"][5] == "kot5"  # not the disk's


def test_a_kept_header_is_read_back_without_gguf_py(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a kept header pickles names no class of the gguf-py reader's module: reading
    it back in a new process imports none of gguf-py (~20 ms of a load)."""
    import pickle
    import pickletools

    from inference.formats import gguf_file

    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_file, "MIN_HEADER_BYTES", 0)
    read_gguf(tiny)
    (kept,) = (tmp_path / "cache" / "headers").iterdir()
    modules = {arg for op, arg, _ in pickletools.genops(kept.read_bytes())
               if "UNICODE" in op.name and str(arg).startswith("inference")}
    assert "inference.formats.strings" in modules  # the vocabulary's StringArray
    assert not any("gguf_reader" in m for m in modules), modules
    assert pickle.loads(kept.read_bytes()).metadata["tokenizer.ggml.tokens"]


def test_a_load_by_path_reads_the_file_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A load given a model file's path reads it once, for its description and its load
    (each read builds every tensor's view and hashes the header)."""
    from inference import store
    from inference.api import load_model
    from inference.formats import gguf_file

    path = store.resolve("SmolLM2-135M-Instruct.Q4_1").path
    monkeypatch.setattr(store, "_spec_cache", {})  # as in a new process
    reads: list[Path] = []
    read = gguf_file.read_gguf
    monkeypatch.setattr(gguf_file, "read_gguf", lambda p: (reads.append(Path(p)), read(p))[1])
    model = load_model(str(path), backend="numpy", n_layers=1)
    assert reads == [path]
    assert model.spec.path == path and model.spec.architecture == "llama"
