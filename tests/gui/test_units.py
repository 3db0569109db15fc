"""Pieces without models: analysis numbers, the SQLite store, formatting, settings."""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from gui import analysis
from gui.conversations import ConversationStore
from gui.embed_pane import split_sentences
from gui.format import human_bytes, human_count, message_stats
from tests.gui.conftest import make_settings


def test_heatmap_block_means_equal_full_matrix_block_means() -> None:
    rng = np.random.default_rng(0)
    v = analysis.normalise(rng.normal(size=(1000, 16)))
    small, block = analysis.heatmap(v, max_side=100)
    assert block == 10 and small.shape == (100, 100)
    full = v @ v.T
    expect = full.reshape(100, 10, 100, 10).mean(axis=(1, 3))
    np.testing.assert_allclose(small, expect, atol=1e-5)
    exact, block = analysis.heatmap(v[:50], max_side=100)
    assert block == 1 and exact.shape == (50, 50)
    np.testing.assert_allclose(np.diag(exact), 1.0, atol=1e-5)


def test_heatmap_uneven_blocks_and_projection_and_nearest() -> None:
    rng = np.random.default_rng(1)
    v = analysis.normalise(rng.normal(size=(1003, 8)))
    img, block = analysis.heatmap(v, max_side=100)
    assert img.shape[0] == img.shape[1] <= 100 and np.isfinite(img).all()
    proj = analysis.project_2d(v)
    assert proj.shape == (1003, 2) and np.isfinite(proj).all()
    # The first principal axis carries at least as much variance as the second.
    assert proj[:, 0].var() >= proj[:, 1].var()
    hits = analysis.nearest(v, v[7], k=3)
    assert hits[0][0] == 7 and abs(hits[0][1] - 1) < 1e-5
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)


def test_store_roundtrip_truncate_and_export(tmp_path) -> None:
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create("Chat", "Be brief.")
    u = store.add_message(cid, "user", "Hi **there**")
    a = store.add_message(cid, "assistant", "")
    store.update_message(a, "Hello!", {"n_generated": 2, "ttft_s": 0.1, "total_s": 0.2,
                                       "decode_tok_s": 20.0, "finish_reason": "eos"})
    # Another connection (a later process) sees every write at once: nothing waits in memory.
    other = sqlite3.connect(tmp_path / "c.sqlite3")
    assert other.execute("SELECT content FROM messages WHERE id = ?", (a,)).fetchone() == (
        "Hello!",)
    md = store.export_markdown(cid)
    assert "# Chat" in md and "Hi **there**" in md and "2 tokens" in md
    doc = json.loads(store.export_json(cid))
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    assert doc["system_prompt"] == "Be brief."
    store.delete_from(cid, u)
    assert store.messages(cid) == []
    store.delete(cid)
    assert store.conversations() == []
    store.close()


def test_format_helpers() -> None:
    assert human_bytes(None) == "—" and human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(3 * 1024**3) == "3.0 GiB"
    assert human_count(134_515_008) == "135M" and human_count(22_713_216) == "23M"
    line = message_stats({"n_generated": 10, "ttft_s": 0.5, "decode_tok_s": 20.0,
                          "total_s": 1.0, "finish_reason": "cancelled"})
    assert "10 tokens" in line and "TTFT 500 ms" in line and "10.0 tok/s overall" in line
    assert "cancelled" in line


def test_split_sentences_keeps_every_line_exactly() -> None:
    # Blank lines stay as rows (row i is line i); a final newline starts no new line.
    assert split_sentences("a\n\n  b  \n\t\nc\r\n") == ["a", "", "  b  ", "\t", "c"]


def test_settings_types_roundtrip(tmp_path) -> None:
    s = make_settings(tmp_path / "s.ini")
    s.set_sampling({"temperature": 0.25, "max_tokens": 77, "seed": 5})
    s.add_extra_path("/x/model.gguf")
    s.sync()
    s2 = make_settings(tmp_path / "s.ini")
    sampling = s2.sampling()
    assert sampling["temperature"] == 0.25 and sampling["max_tokens"] == 77
    assert isinstance(sampling["max_tokens"], int)
    assert s2.extra_paths() == ["/x/model.gguf"]
    s2.remove_extra_path("/x/model.gguf")
    assert s2.extra_paths() == []
