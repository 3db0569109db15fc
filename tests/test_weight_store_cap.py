"""The packed-weight stores are kept within a byte cap, least recently used first out; a
load that maps a store makes it the most recent; the cap comes from the environment; the
stores are listed (and cleared) by ``inferdesk cache``. Tiny files stand in for stores."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from inference import cli
from inference.backends.cpu import pack
from inference.backends.cpu.pack import DEFAULT_CAP, PackedWeight, PackStore, evict, stores
from inference.formats.cache import key_path


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE", str(tmp_path / "weights"))
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE_MAX", "1000")
    return tmp_path / "weights" / "packed"


def _fake_store(root: Path, name: str, used: float, size: int = 300) -> Path:
    """A complete store of ``size`` bytes (packed.bin and a 2-byte index) last used at
    ``used`` (seconds since the epoch)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "packed.bin").write_bytes(b"\0" * (size - 2))
    (folder / "index.json").write_text("{}")
    os.utime(folder / "index.json", (used, used))
    return folder


@pytest.mark.parametrize(("text", "want"), [
    ("1000", 1000), ("4K", 4096), ("2.5M", int(2.5 * 2**20)), ("20G", 20 << 30),
    ("20GiB", 20 << 30), ("0", 0), ("", DEFAULT_CAP), ("lots", DEFAULT_CAP)])
def test_the_cap_from_the_environment(monkeypatch, text, want):
    monkeypatch.setenv("INFERDESK_WEIGHT_CACHE_MAX", text)
    assert pack.store_cap() == want


def test_least_recently_used_go_first(root):
    a, b, c = (_fake_store(root, n, t) for n, t in (("a", 100), ("b", 200), ("c", 300)))
    assert [e.folder for e in stores()] == [a, b, c]
    assert evict(0) == []  # 900 of 1000 bytes: all kept
    assert evict(300) == [a]  # room for 300 more: the oldest goes
    assert evict(800, keep=b) == [c]  # never the one kept (the store being written)
    assert [e.folder for e in stores()] == [b]


def test_a_store_of_another_layout_goes_before_any_of_this_one(root, capsys):
    """After an upgrade that changes the layout, the old stores can never be read again:
    they make room first, however recently they were used."""
    ours = _fake_store(root, "ours", 100)
    (ours / "index.json").write_text(json.dumps({"__layout__": pack.LAYOUT_VERSION}))
    os.utime(ours / "index.json", (100, 100))
    older = _fake_store(root, "older", 200)
    (older / "index.json").write_text(json.dumps({"__layout__": "0-old"}))
    os.utime(older / "index.json", (200, 200))
    unrecorded = _fake_store(root, "unrecorded", 300)  # written before layouts were recorded
    assert [e.folder for e in stores()] == [older, unrecorded, ours]
    assert [e.current for e in stores()] == [False, False, True]
    assert cli.main(["cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("an older layout" in line for line in lines) == 2
    assert evict(400) == [older, unrecorded]  # ~950 + 400 over 1000: both old ones, not ours
    assert ours.exists()


def test_mapping_a_store_makes_it_the_most_recent(root):
    old, new = _fake_store(root, "old", 100), _fake_store(root, "new", 200)
    (old / "index.json").write_text(json.dumps({"__bytes__": 298, "__model__": "m.gguf"}))
    os.utime(old / "index.json", (100, 100))
    assert PackStore(old).map is not None  # a load opened it
    assert [e.folder for e in stores()] == [new, old]
    assert evict(600) == [new]


def test_a_written_store_makes_room_and_names_its_model(root, monkeypatch):
    monkeypatch.setattr(pack, "MIN_STORE_BYTES", 0)
    monkeypatch.setattr(pack, "FREE_MARGIN", 0)
    a, b = _fake_store(root, "a", 100, size=150), _fake_store(root, "b", 200, size=150)
    blocks = np.zeros((1, 5, pack.LANES), np.float32)  # 640 bytes and an index of ~110
    store = PackStore(root / "new", model="/models/m.gguf")
    store.new.append(("w", {}, PackedWeight(blocks, 4, 8.0, (pack.LANES, 32))))
    store.write()
    listed = stores()
    assert [e.folder for e in listed][-1] == root / "new" and listed[-1].model == "/models/m.gguf"
    assert listed[-1].current  # its layout recorded
    assert sum(e.nbytes for e in listed) <= 1000
    assert not a.exists() and b.exists()  # only as many old ones as the new one needed


def test_a_store_larger_than_the_cap_is_not_written(root, monkeypatch):
    monkeypatch.setattr(pack, "MIN_STORE_BYTES", 0)
    keep = _fake_store(root, "keep", 100)
    blocks = np.zeros((8, 5, pack.LANES), np.float32)  # over 1000 bytes
    store = PackStore(root / "new")
    store.new.append(("w", {}, PackedWeight(blocks, 4, 8.0, (pack.LANES, 256))))
    store.write()
    assert [e.folder for e in stores()] == [keep]  # nothing evicted for nothing


def test_the_cache_command_lists_and_clears(root, capsys):
    _fake_store(root, "a", 100)
    assert key_path("packed", "x").parent == root
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "1 stores" in out and "(model not recorded)" in out
    assert cli.main(["cache", "--clear"]) == 0
    assert stores() == [] and "removed 1 stores (300 B)" in capsys.readouterr().out


def test_a_load_removes_the_writing_folders_a_killed_load_left(root):
    import subprocess
    import sys

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True)
    dead = root / f"{pack.WRITING}{int(ended.stdout)}-abc"  # its writer has exited
    alive = root / f"{pack.WRITING}{os.getpid()}-abc"  # being written by this process
    unnamed_old = root / f"{pack.WRITING}xyz"  # no pid in the name: by age alone
    unnamed_new = root / f"{pack.WRITING}uvw"
    for d in (dead, alive, unnamed_old, unnamed_new):
        d.mkdir(parents=True)
        (d / "packed.bin").write_bytes(b"\0" * 8)
    old = (unnamed_old / "packed.bin").stat().st_mtime - 2 * pack.STALE_WRITING_S
    for p in (unnamed_old, unnamed_old / "packed.bin"):
        os.utime(p, (old, old))
    kept = _fake_store(root, "kept", 1.0)
    with pack.pack_store("model.gguf|1|2|digest"):
        pass
    assert sorted(p.name for p in root.iterdir()) == sorted([alive.name, unnamed_new.name,
                                                            kept.name])
