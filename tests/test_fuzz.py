"""Property-based fuzzing (Hypothesis) of the engine's input boundary: the GGUF and
safetensors readers, config parsing, the tokenizer entry points, the CLI argument space, the
recovery of a conversations database holding NULLs and garbage, and the app's settings file.

The property everywhere: the input is accepted, or refused with an InferdeskError whose text
is one line; nothing else escapes (no crash, no traceback), and no case runs past the
deadline (no hang). ``make test`` runs a short pass; ``make fuzz`` (INFERDESK_FUZZ=long) runs
the long one whose figures docs/fuzz.md records.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import struct
import tempfile
from datetime import timedelta
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.errors import InferdeskError
from tests.hostile_models import TINY, write_gguf

LONG = os.environ.get("INFERDESK_FUZZ") == "long"
# Cases per target: the short pass keeps `make test` quick; the long one sums past 10^5.
CASES = {"gguf_bytes": 40_000, "gguf_meta": 3_000, "safetensors": 30_000, "config": 20_000,
         "tokenizer": 10_000, "cli": 2_500, "db": 5_000, "settings": 5_000} if LONG else {
    "gguf_bytes": 60, "gguf_meta": 15, "safetensors": 60, "config": 60, "tokenizer": 30,
    "cli": 12, "db": 12, "settings": 40}


def fuzz(target: str):
    # A case running past the deadline in the long pass counts as a hang (60 s: a busy
    # 2-core machine stalled one ordinary case for 18 s).
    return settings(max_examples=CASES[target], database=None, derandomize=not LONG,
                    deadline=timedelta(seconds=60) if LONG else None,
                    suppress_health_check=list(HealthCheck))


def refused_or_ok(fn, *args, **kwargs):
    """Run fn; an InferdeskError must be one line. Anything else propagates (a failure)."""
    try:
        return fn(*args, **kwargs)
    except InferdeskError as e:
        assert "\n" not in str(e) and str(e), repr(e)
        return None


WORK = Path(tempfile.mkdtemp(prefix="inferdesk-fuzz-"))


@pytest.fixture(scope="module")
def seed_gguf() -> tuple[bytes, int]:
    path = write_gguf(WORK / "seed.gguf")
    data = path.read_bytes()
    return data, int(gguf.GGUFReader(path).data_offset)


# --- GGUF reader: byte mutations of a valid file's header ----------------------------------

@fuzz("gguf_bytes")
@given(data=st.data())
def test_gguf_reader_survives_mutations(seed_gguf, data) -> None:
    from inference.formats import read_checkpoint

    raw, header_end = seed_gguf
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        pos = data.draw(st.integers(0, header_end - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans(), label="truncate"):
        del buf[data.draw(st.integers(0, len(buf))):]
    path = WORK / "m.gguf"
    path.write_bytes(bytes(buf))
    refused_or_ok(read_checkpoint, path)


# --- GGUF metadata values, then a full load ------------------------------------------------

VALUES = st.one_of(st.integers(-2**31, 2**32 - 1), st.floats(width=32),
                   st.text(max_size=8), st.sampled_from([0, 1, 3, 15, 16, 2**31]))
KEYS = ["block_count", "context_length", "embedding_length", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "rope.freq_base",
        "attention.layer_norm_rms_epsilon", "rope.dimension_count", "attention.key_length",
        "vocab_size", "attention.sliding_window", "rope.scaling.type"]


@fuzz("gguf_meta")
@given(meta=st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=4))
def test_gguf_metadata_values_load_or_refuse(meta) -> None:
    from inference import load_model

    meta = {k: (min(v, 2**32 - 1) if isinstance(v, int) and v >= 0 else
                v if not isinstance(v, int) else float(v)) for k, v in meta.items()}
    path = write_gguf(WORK / "meta.gguf", meta=meta)
    model = refused_or_ok(load_model, str(path), backend="numpy")
    if model is not None:
        refused_or_ok(model.logits, [1, 2, 3])


# --- safetensors headers ----------------------------------------------------------------------

DIMS = st.one_of(st.integers(-3, 70), st.sampled_from([2**32, 2**63, 2**64, -2**63]),
                 st.floats(), st.text(max_size=3), st.none())
ENTRY = st.fixed_dictionaries({}, optional={
    "dtype": st.one_of(st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "U32", "Q4", ""]),
                       st.integers(), st.none()),
    "shape": st.one_of(st.lists(DIMS, max_size=4), st.integers(), st.text(max_size=3)),
    "data_offsets": st.one_of(st.lists(st.one_of(st.integers(-10, 2**40), st.floats()),
                                       max_size=3), st.none()),
})
NAMES = st.sampled_from(["model.norm.weight", "model.embed_tokens.weight", "__metadata__",
                         "lm_head.weight", "x.scales", "x.weight", "x.biases"])


@fuzz("safetensors")
@given(header=st.one_of(st.dictionaries(NAMES, st.one_of(ENTRY, st.integers(), st.none()),
                                        max_size=4),
                        st.lists(st.integers(), max_size=2)),
       n_data=st.integers(0, 4096), length_delta=st.integers(-4, 4))
def test_safetensors_reader_survives_any_header(header, n_data, length_delta) -> None:
    from inference.formats.safetensors_dir import read_safetensors_dir

    d = WORK / "st"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text('{"model_type": "llama"}')
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(
        struct.pack("<Q", max(0, len(raw) + length_delta)) + raw + bytes(n_data))
    refused_or_ok(read_safetensors_dir, d)


# --- config parsing -------------------------------------------------------------------------

CONFIG_VALUES = st.one_of(st.integers(-5, 10**6), st.floats(), st.text(max_size=4), st.none(),
                          st.booleans(), st.lists(st.integers(), max_size=2),
                          st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@fuzz("config")
@given(model_type=st.sampled_from(["llama", "qwen2", "mistral", "bert"]),
       changes=st.dictionaries(st.sampled_from(
           ["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
            "max_position_embeddings", "layer_norm_eps", "type_vocab_size", "rope_scaling",
            "rope_parameters", "tie_word_embeddings", "attention_bias"]), CONFIG_VALUES,
           max_size=4))
def test_config_parsing_accepts_or_refuses(model_type, changes) -> None:
    from inference.formats.tensor import TensorData
    from inference.models import architecture
    from inference.validate import check_tensors, spec_for

    base = json.loads((TINY / "llama" / "config.json").read_text()) | {
        "model_type": model_type, "layer_norm_eps": 1e-12, "type_vocab_size": 2}
    cfg = base | changes
    mod = architecture(model_type)
    args = refused_or_ok(mod.ModelArgs.from_dict, cfg)
    if args is not None:
        tensors = {"model.norm.weight": TensorData("n", (64,), "F32", None)}
        refused_or_ok(check_tensors, args, tensors, spec_for(model_type, mod))


# --- tokenizer entry points -----------------------------------------------------------------

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "[CLS]", "[SEP]", "<s>", "</s>",
            "\U000f0001", "\U000f0002", "{{", "{%", "\r", "\n", "\x00", "\ud800"]
TEXT = st.lists(st.one_of(st.text(max_size=20), st.sampled_from(SPECIALS)), max_size=8).map(
    "".join)


@pytest.fixture(scope="module")
def qwen2():
    from inference import load_model

    return load_model(str(TINY / "qwen2"), backend="numpy")


@fuzz("tokenizer")
@given(text=TEXT, ids=st.lists(st.integers(-2**63, 2**63 - 1), max_size=4),
       role=st.sampled_from(["user", "system", "assistant", "tool", ""]))
def test_tokenizer_entry_points(qwen2, minilm, text, ids, role) -> None:
    qwen2_ids = refused_or_ok(qwen2.tokenize, text)
    if qwen2_ids is not None:
        assert all(0 <= i < qwen2.tokenizer.vocab_size for i in qwen2_ids)
    refused_or_ok(qwen2.detokenize, ids)
    refused_or_ok(qwen2._prompt_ids, None, [{"role": role, "content": text}])
    refused_or_ok(qwen2._prompt_ids, text, None)
    enc = refused_or_ok(minilm.tokenize, text)
    if enc is not None:
        assert 2 <= len(enc) <= minilm.max_seq_length


# --- the CLI argument space ---------------------------------------------------------------

def _flag(name: str, values: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(st.just(name), values).map(list)


ODD = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "", "x", "2", "-0", "0.5"])
GENERATE = st.tuples(
    st.just(["generate"]),
    _flag("--model", st.sampled_from([str(TINY / "llama"), str(TINY / "qwen2"), "/dev/zero",
                                      "/", "nonexistent-model", "", "minilm"])),
    _flag("--prompt", TEXT),
    st.lists(st.one_of(
        _flag("--max-tokens", st.sampled_from(["1", "2", "0", "-3", "x", "99999999999999"])),
        _flag("--temperature", ODD), _flag("--top-k", ODD), _flag("--top-p", ODD),
        _flag("--min-p", ODD), _flag("--repetition-penalty", ODD),
        _flag("--seed", st.sampled_from(["-1", "0", "-2", "7", str(2**70), "x"])),
        _flag("--stop", TEXT), st.just(["--chat"]), st.just(["--json"]),
        _flag("--backend", st.sampled_from(["numpy", "gpu"]))), max_size=4),
).map(lambda parts: [a for p in parts[:3] for a in p] + [a for p in parts[3] for a in p])
EMBED = st.tuples(
    st.just(["embed", "--model", "minilm", "--backend", "numpy", "--quiet"]),
    _flag("--input", st.sampled_from(["-", "/dev/null", "/", "/nonexistent", "IN"])),
    _flag("--output", st.sampled_from(["OUT", "OUT.npy", "/", "/proc/version", "", "DIR/"])),
    st.lists(_flag("--batch-size", ODD), max_size=1),
).map(lambda parts: [a for p in parts[:3] for a in p] + [a for p in parts[3] for a in p])


@fuzz("cli")
@given(argv=st.one_of(GENERATE, EMBED, st.lists(st.text(max_size=10), max_size=4)),
       stdin=st.binary(max_size=64), text=TEXT)
def test_cli_argument_space(argv, stdin, text) -> None:
    from inference import cli

    if not argv:  # plain `inferdesk` opens the app
        return
    work = WORK / "cli"
    work.mkdir(exist_ok=True)
    (work / "IN").write_text(text, encoding="utf-8", errors="replace")
    argv = [a.replace("IN", str(work / "IN")).replace("OUT", str(work / "out"))
            .replace("DIR/", str(work) + "/") for a in argv]
    err = io.StringIO()
    sys_stdin = io.TextIOWrapper(io.BytesIO(stdin))
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            _stdin(sys_stdin):
        try:
            code = cli.main(argv)
        except SystemExit as e:  # argparse: usage and one error line, exit 2
            code = e.code
    assert code in (0, 2), (argv, code, err.getvalue()[-500:])
    assert "Traceback" not in err.getvalue()
    if code == 2 and "usage:" not in err.getvalue():
        lines = err.getvalue().strip().splitlines()
        assert lines[-1].startswith("inferdesk: error: "), err.getvalue()


@contextlib.contextmanager
def _stdin(stream):
    import sys

    old, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = old


# --- the conversations database: NULLs and garbage in any column ------------------------------

# Values a damaged or hand-edited file may hold in any column: NULL where the schema forbids
# it, text where a number belongs, bytes, JSON that is not.
_GARBAGE = st.sampled_from([None, "", "x", b"\x00\xff", 1e308, -5, "{not json"])
_CONV_COLS = ("id", "title", "system_prompt", "created", "updated")
_MSG_COLS = ("id", "conversation_id", "role", "content", "stats", "created", "active")


def _conv(i: int, bad: dict) -> tuple:
    row = {"id": i, "title": f"chat {i}", "system_prompt": "", "created": 1.0 + i,
           "updated": 2.0 + i}
    return tuple(bad.get(c, row[c]) for c in _CONV_COLS)


def _msg(i: int, conv: int, bad: dict) -> tuple:
    row = {"id": i, "conversation_id": conv, "role": "user" if i % 2 else "assistant",
           "content": f"message {i}\n  kept exactly ", "stats": "{}", "created": 10.0 + i,
           "active": 1}
    return tuple(bad.get(c, row[c]) for c in _MSG_COLS)


def _damaged(i: int) -> st.SearchStrategy:
    cols = st.sampled_from(_CONV_COLS[1:] if i == 0 else _MSG_COLS[2:])
    # A message's stats only as NULL: text that is not JSON there is
    # test_db_stats_that_are_not_json_are_read.
    return st.dictionaries(cols, _GARBAGE, max_size=2).map(
        lambda bad: {c: (None if c == "stats" else v) for c, v in bad.items()})


_DB_CASE = st.tuples(
    st.lists(_damaged(0), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(1, 8), _damaged(1)), max_size=16))


def _write_db(path: Path, convs: list[tuple], msgs: list[tuple]) -> None:
    """A file with the app's schema whose rows break its NOT NULL constraints: the rows are
    written under the same columns without constraints, then the schema text is swapped."""
    import sqlite3

    from gui.conversations import SCHEMA

    mem = sqlite3.connect(":memory:")
    mem.executescript(SCHEMA)
    real = mem.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' "
                       "AND name IN ('conversations', 'messages')").fetchall()
    mem.close()
    db = sqlite3.connect(path)
    db.executescript(SCHEMA.replace(" NOT NULL", ""))
    db.executemany(f"INSERT INTO conversations ({', '.join(_CONV_COLS)}) VALUES (?,?,?,?,?)",
                   convs)
    db.executemany(f"INSERT INTO messages ({', '.join(_MSG_COLS)}) VALUES (?,?,?,?,?,?,?)",
                   msgs)
    db.commit()
    db.execute("PRAGMA writable_schema=ON")
    db.executemany("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
                   [(sql, name) for name, sql in real])
    db.commit()
    db.close()


@fuzz("db")
@given(case=_DB_CASE)
def test_db_recovery_never_raises_and_keeps_every_valid_row(case) -> None:
    """Opening a file with NULLs in NOT NULL columns and garbage values never raises; every
    row without damage (a message: whose chat exists) is in the opened store, unchanged;
    the counts add up to what the file held."""
    import sqlite3
    import uuid

    from gui.conversations import ConversationStore

    conv_damage, msg_specs = case
    convs = [_conv(i + 1, bad) for i, bad in enumerate(conv_damage)]
    msgs = [_msg(i + 1, conv, bad) for i, (conv, bad) in enumerate(msg_specs)]
    folder = WORK / f"db-{uuid.uuid4().hex}"
    folder.mkdir()
    path = folder / "conversations.sqlite3"
    _write_db(path, convs, msgs)

    store = ConversationStore(path)
    for c in store.conversations():
        store.messages(c.id)
    store.close()
    db = sqlite3.connect(path)
    kept_convs = {r[0]: r for r in db.execute(f"SELECT {', '.join(_CONV_COLS)} FROM "
                                              f"conversations")}
    kept_msgs = {r[0]: r for r in db.execute(f"SELECT {', '.join(_MSG_COLS)} FROM messages")}
    db.close()
    for i, bad in enumerate(conv_damage):
        if not bad:
            assert kept_convs.get(i + 1) == convs[i]
    ids = {c[0] for c in convs}
    for i, (conv, bad) in enumerate(msg_specs):
        if not bad and conv in ids:
            assert kept_msgs.get(i + 1) == msgs[i]
    if store.recovery is not None:
        r = store.recovery
        assert r.conversations == len(kept_convs) and r.messages == len(kept_msgs)
        assert r.conversations + (r.lost_conversations or 0) >= len(convs)
        assert r.messages + (r.lost_messages or 0) == len(msgs)


@pytest.mark.parametrize("stats", ["{not json", "[1, 2]", "3"])
def test_db_stats_that_are_not_json_are_read(stats: str) -> None:
    import uuid

    from gui.conversations import ConversationStore

    folder = WORK / f"db-{uuid.uuid4().hex}"
    folder.mkdir()
    path = folder / "conversations.sqlite3"
    _write_db(path, [_conv(1, {})], [_msg(1, 1, {"stats": stats})])
    store = ConversationStore(path)
    assert [(m.content, m.stats) for m in store.messages(1)] == [(_msg(1, 1, {})[3], {})]


# --- the app's settings file ----------------------------------------------------------
# The keys the app reads, and values a hand-edited or damaged file may hold: numbers of any
# size, NaN and infinities, text, Qt's own @Variant/@ByteArray forms, lists.
_SETTING_KEYS = ["models/context", "window/tab", "server/port", "server/parallel",
                 "server/prompt_cache_mb", "chat/enter_sends", "chat/system_prompt",
                 "models/extra_paths", "appearance/theme", "perf/profile"] + [
    f"sampling/{k}" for k in ("temperature", "top_k", "top_p", "min_p",
                              "repetition_penalty", "max_tokens", "seed")]
_SETTING_VALUES = st.one_of(
    st.integers(-2**80, 2**80).map(str), st.floats(allow_nan=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e400", "", "true", "@Invalid()", "a, b",
                     "@ByteArray(\\x1)", "@Variant(\\0\\0\\0\\x7f)", "\\"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x00"),
            max_size=20))


@fuzz("settings")
@given(values=st.dictionaries(st.sampled_from(_SETTING_KEYS), _SETTING_VALUES, max_size=8))
def test_settings_file_values_are_read_within_range(values) -> None:
    import uuid

    from PySide6.QtCore import QSettings

    from gui.settings import CONTEXT_RANGE, INT_RANGE, SAMPLING_RANGES, Settings

    path = WORK / f"settings-{uuid.uuid4().hex}.ini"
    groups: dict[str, list[str]] = {}
    for key, value in values.items():
        group, name = key.split("/")
        groups.setdefault(group, []).append(f"{name}={value}")
    path.write_text("".join(f"[{g}]\n" + "\n".join(lines) + "\n" for g, lines in groups.items()),
                    encoding="utf-8")
    s = Settings(QSettings(str(path), QSettings.Format.IniFormat))
    assert CONTEXT_RANGE[0] <= s.context() <= CONTEXT_RANGE[1]
    for k, v in s.sampling().items():
        lo, hi = SAMPLING_RANGES[k]
        assert lo <= v <= hi and v == v, (k, v)
    for key in ("window/tab", "server/port", "server/parallel", "server/prompt_cache_mb"):
        v = s.get(key, 0, int)
        assert isinstance(v, int) and INT_RANGE[0] <= v <= INT_RANGE[1], (key, v)
    assert isinstance(s.get("chat/enter_sends", True, bool), bool)
    assert isinstance(s.get("chat/system_prompt", "x", str), str)
    assert all(isinstance(p, str) for p in s.extra_paths())


def test_fuzz_profile_sizes() -> None:
    """The long pass covers at least 10^5 cases (make fuzz's bar)."""
    long_total = 40_000 + 3_000 + 30_000 + 20_000 + 10_000 + 2_500 + 5_000
    assert long_total >= 10**5 and not math.isnan(long_total)
