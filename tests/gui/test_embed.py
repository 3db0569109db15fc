"""Embeddings with the real bundled MiniLM: progress, heatmap, projection, search, export."""

from __future__ import annotations

import csv
import itertools
import time

import numpy as np

from gui import analysis
from gui.jobs import on_progress
from gui.worker import EmbedResult, Progress
from tests.gui.conftest import drain, job_result

EMBED_TIMEOUT_MS = 120_000
SUBJECTS = ["The cat", "A dog", "My neighbour", "The pilot", "A small robot", "The chef",
            "Our teacher", "The river", "A violinist", "The old car"]
VERBS = ["sleeps near", "talks about", "paints", "repairs", "dreams of"]
OBJECTS = ["the garden", "a broken clock", "the ocean", "a bowl of soup"]


def sentences(n: int) -> list[str]:
    combos = itertools.product(SUBJECTS, VERBS, OBJECTS)
    return [f"{s} {v} {o}." for s, v, o in itertools.islice(combos, n)]


def test_embed_200_sentences_fills_heatmap_projection_and_search(loaded_window, qtbot,
                                                                tmp_path) -> None:
    w = loaded_window
    w.tabs.setCurrentWidget(w.embed)
    pane = w.embed
    pane.set_sentences(sentences(200))
    assert len(pane.sentences()) == 200
    progress = []
    on_progress(w.jobs, Progress, lambda p: progress.append((p.done, p.total)), "embed")
    with job_result(qtbot, w.jobs, "embed", timeout=EMBED_TIMEOUT_MS) as got:
        assert pane.embed()
        assert not pane.embed_button.isEnabled() and pane.cancel_button.isEnabled()
    result = got.args[0]
    assert result.vectors.shape == (200, 384)
    assert progress and progress[-1] == (200, 200)
    image = pane.heat_item.image
    assert image is not None and image.shape == (200, 200) and np.isfinite(image).all()
    np.testing.assert_allclose(np.diag(image), 1.0, atol=1e-4)
    assert len(pane.scatter.data) == 200
    assert pane.progress.value() == 200 and "200 sentences" in pane.status.text()
    # Sentences about the same subject sit closer than unrelated ones.
    same = image[0, 1:20].mean()  # "The cat ..." rows 0-19
    other = image[0, 100:200].mean()
    assert same > other

    with job_result(qtbot, w.jobs, "query", timeout=30_000) as hits:
        assert pane.query("A cat is sleeping near the garden", k=5)
    assert hits.args[0].hits[0][0] == "The cat sleeps near the garden."
    assert pane.results.count() == 5 and len(pane.hits.data) == 5

    for name in ("vectors.npy", "vectors.csv"):
        with job_result(qtbot, w.jobs, "export", timeout=30_000):
            pane.export(str(tmp_path / name))
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), result.vectors)
    rows = list(csv.reader((tmp_path / "vectors.csv").open(encoding="utf-8")))
    assert len(rows) == 201 and rows[1][0] == sentences(1)[0] and len(rows[1]) == 385


def test_cancel_embedding_keeps_the_worker_usable(loaded_window, qtbot) -> None:
    w = loaded_window
    pane = w.embed
    pane.set_sentences(sentences(200) * 5)
    cancel = on_progress(w.jobs, Progress, lambda _p: pane.cancel(), "embed")  # after a batch
    with qtbot.waitSignal(w.jobs.cancelled, timeout=EMBED_TIMEOUT_MS) as got:
        assert pane.embed()
    w.jobs.progress.disconnect(cancel)
    drain(w)  # the cancelled job has finished: the next result is the next embedding's
    assert got.args == ["embed"] and "cancelled" in pane.status.text()
    assert pane.embed_button.isEnabled() and not pane.cancel_button.isEnabled()
    pane.set_sentences(sentences(8))
    with job_result(qtbot, w.jobs, "embed", timeout=EMBED_TIMEOUT_MS):
        pane.embed()
    assert pane.heat_item.image.shape == (8, 8)


def test_thousands_of_sentences_draw_quickly(loaded_window) -> None:
    """The GUI-thread part of showing 20 000 results stays far below a frame budget."""
    rng = np.random.default_rng(0)
    n = 20_000
    vectors = analysis.normalise(rng.normal(size=(n, 384)).astype(np.float32))
    t0 = time.perf_counter()
    heat, block = analysis.heatmap(vectors)  # worker-side work, timed for the record
    proj = analysis.project_2d(vectors)
    worker_s = time.perf_counter() - t0
    result = EmbedResult([f"s{i}" for i in range(n)], vectors, heat, block, proj, 1.0)
    pane = loaded_window.embed
    loaded_window.tabs.setCurrentWidget(pane)
    t0 = time.perf_counter()
    pane._on_embedded(result)
    pane.repaint()
    gui_s = time.perf_counter() - t0
    assert heat.shape[0] <= analysis.HEATMAP_MAX_SIDE and block == 50
    assert len(pane.scatter.data) == n
    print(f"worker {worker_s:.2f} s, GUI thread {gui_s:.2f} s for {n} results")
    # A sanity bound only (the figure is printed above): a busy machine can stretch any
    # wall-clock time; what must never happen is per-point Python work on the GUI thread,
    # which took minutes for 20 000 points.
    assert gui_s < 10.0, f"drawing {n} results took {gui_s:.2f} s on the GUI thread"
    small = analysis.normalise(rng.normal(size=(8, 384)).astype(np.float32))
    pane._on_embedded(EmbedResult([f"s{i}" for i in range(8)], small,
                                  *analysis.heatmap(small), analysis.project_2d(small), 1.0))


def test_a_thousand_real_sentences_stay_readable(loaded_window, qtbot) -> None:
    """1,000 sentences through the real MiniLM: the heatmap is sampled into blocks and
    says so, the scatter keeps every point, and k stays below n."""
    w = loaded_window
    pane = w.embed
    w.tabs.setCurrentWidget(pane)
    topics = ("cats", "stocks", "bread", "football", "rain")
    pane.set_sentences([f"Sentence {i} is about {topics[i % 5]}." for i in range(1000)])
    with job_result(qtbot, w.jobs, "embed", timeout=EMBED_TIMEOUT_MS):
        assert pane.embed()
    r = pane.result
    assert len(r.sentences) == 1000 and r.block == 3
    assert r.heatmap.shape[0] <= analysis.HEATMAP_MAX_SIDE
    assert "sampled" in pane.status.text() and "3×3" in pane.status.text()
    assert "blocks of 3" in pane.heat_plot.getPlotItem().titleLabel.text
    assert len(pane.scatter.data) == 1000 and pane.scatter.data["size"].max() <= 5
    assert pane.k_box.maximum() == 999
