"""`inferdesk bench --compare` runs every round of each side in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_peer(tmp: Path) -> Path:
    """Stand-ins for torch and sentence-transformers: deterministic vectors from the text,
    and the pid of the process that encoded them (the harness must never be that process)."""
    (tmp / "torch.py").write_text("__version__ = 'fake'\ndef set_num_threads(n): pass\n")
    (tmp / "sentence_transformers.py").write_text(textwrap.dedent("""
        import numpy as np
        __version__ = "fake"

        class SentenceTransformer:
            def __init__(self, path, device):
                self.path = path
                self.backend = "torch"  # as the real one: a string, not an engine backend

            def encode(self, sentences, batch_size, convert_to_numpy, show_progress_bar):
                out = np.zeros((len(sentences), 384), dtype=np.float32)
                for i, s in enumerate(sentences):
                    out[i, len(s) % 384] = 1.0
                return out
        """))
    return tmp


def test_each_side_runs_in_its_own_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake_peer(tmp_path)), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-m", "inference.bench", "--compare", "--only", "embed", "--rounds",
         "2", "--sentences", "40", "--backend", "numpy", "--threads", "1"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["compare_mode"] == "one process per side per round"
    emb = out["embed"]
    ours, theirs = emb["inferdesk"]["pids"], emb["sentence_transformers"]["pids"]
    assert len(ours) == len(theirs) == 2
    assert len(set(ours) | set(theirs)) == 4  # four processes, none of them shared
    assert emb["sentence_transformers"]["version"].startswith("fake")
    assert emb["ratio"]["sentences_s"] == round(
        emb["inferdesk"]["sentences_s"] / emb["sentence_transformers"]["sentences_s"], 3)
    fixed = emb["inferdesk_fixed_batches"]  # the row in the peer's own batches
    assert len(fixed["samples"]) == 2 and fixed["sentences_s"] > 0
    assert emb["ratio"]["fixed_batches_sentences_s"] == round(
        fixed["sentences_s"] / emb["sentence_transformers"]["sentences_s"], 3)
    assert -1.0 <= emb["min_cosine_vs_peer"] < 0.99  # the fake's vectors are not MiniLM's
    assert out["machine"]["cpu"] and isinstance(out["machine"]["vector_flags"], list)
