"""The engine against independent references (goldens from scripts/make_goldens.py).

SmolLM2 Q4_1: transformers loading the same GGUF in float32. Bars (tests/goldens/README.md):
top-1 agreement >= 99% and mean |delta log p(top-1)| <= 0.01, on every text.
MiniLM: sentence-transformers, cosine >= 0.9999 on every sentence.
"""

import numpy as np
import pytest

from tests import goldens_io as g

TEXTS = sorted(g.load_smollm2()["texts"])


@pytest.mark.parametrize("name", TEXTS)
def test_smollm2_logprobs_match_transformers(smollm2, name, request):
    text = g.load_smollm2()["texts"][name]
    logits = (request.getfixturevalue("smollm2_prose_logits") if name == "prose"
              else smollm2.logits(list(text["ids"])))
    agree, dlogp = g.smollm2_agreement(text, logits)
    assert agree >= g.SMOLLM2_MIN_TOP1_AGREEMENT, (name, agree)
    assert dlogp <= g.SMOLLM2_MAX_MEAN_ABS_DLOGP_TOP1, (name, dlogp)


def test_smollm2_tokenizer_matches_reference_ids(smollm2):
    text = g.load_smollm2()["texts"]["code"]
    assert smollm2.tokenize(text["text"], add_special_tokens=False) == list(text["ids"])


def test_minilm_embeddings_match_sentence_transformers(minilm):
    gold = g.load_minilm()
    vecs = minilm.embed(gold["sentences"], batch_size=16)
    assert vecs.shape == gold["embeddings"].shape
    cos = g.cosine_rows(vecs, gold["embeddings"])
    assert cos.min() >= g.MINILM_MIN_COSINE, (int(np.argmin(cos)), float(cos.min()))
    # The long line was truncated to max_seq_length, as the reference did.
    ids = [minilm.tokenize(s) for s in gold["sentences"]]
    assert [len(i) for i in ids] == list(gold["n_tokens"])


def test_minilm_any_chunking_gives_same_vectors(minilm):
    sentences = g.load_minilm_sentences()[:40]
    a = minilm.embed(sentences, batch_size=1)
    b = minilm.embed(sentences, batch_size=7)
    c = minilm.embed(sentences, batch_size=64)
    assert g.cosine_rows(a, b).min() >= 0.99999
    assert g.cosine_rows(a, c).min() >= 0.99999


@pytest.fixture(params=["numpy", "cpu"])
def minilm_chunked(request, minilm):
    """MiniLM where chunks run one after another (numpy) and side by side (cpu, 2 threads)."""
    if request.param == "numpy":
        return minilm
    from inference import load_model

    model = load_model("all-MiniLM-L6-v2", backend="cpu")
    model.backend.set_threads(2)
    return model


def test_embed_progress_per_chunk_and_cancel_within_one_chunk(minilm_chunked):
    import threading

    from inference.errors import CancelledError

    model = minilm_chunked
    sentences = [f"sentence number {i} about topic {i % 7}" for i in range(100)]
    seen = []
    model.embed(sentences, batch_size=10, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (100, 100) and len(seen) == 10
    cancel = threading.Event()
    calls = []

    def stop_after_first(done, total):
        calls.append(done)
        cancel.set()

    with pytest.raises(CancelledError):
        model.embed(sentences, batch_size=10, progress=stop_after_first, cancel=cancel)
    assert calls == [10]  # no chunk reported after the request
    vecs = model.embed(sentences[:30], batch_size=10)  # the model is still usable
    assert vecs.shape == (30, 384) and np.isfinite(vecs).all()
