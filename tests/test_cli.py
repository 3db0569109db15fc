"""The inferdesk CLI: real models, JSON output, and one clear line on bad input (exit 2)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from inference.cli import main
from tests.bundled import smollm2_gguf


def test_models_lists_bundled(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct.Q4_1" in out and "all-MiniLM-L6-v2" in out


def test_models_shows_context_and_why_a_file_cannot_run(capsys, tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(10))
    assert main(["models", "--path", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "context" in lines[0]
    smol = next(line for line in lines if line.startswith("SmolLM2"))
    assert " 8192 " in smol
    at = next(i for i, line in enumerate(lines) if line.startswith("broken"))
    assert lines[at + 1].startswith("    cannot run: ") and "broken.gguf" in lines[at + 1]


def test_backends_table(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "numpy" in out and "cuda" in out


def test_generate_json(capsys):
    code = main(["generate", "--model", "smollm2", "--prompt", "What is 2+2?", "--chat",
                 "--max-tokens", "8", "--backend", "numpy", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out) >= {"text", "token_ids", "prefill_tok_s", "decode_tok_s", "ttft_s"}
    assert 0 < len(out["token_ids"]) <= 8 and out["ttft_s"] > 0
    assert out["load_s"] > 0 and out["compile_s"] >= 0 and out["rss_after_load_bytes"] > 0
    assert out["peak_rss_bytes"] >= max(out["rss_after_load_bytes"], out["rss_after_reply_bytes"])
    assert len(out["token_times_s"]) == len(out["token_ids"])
    assert out["token_times_s"] == sorted(out["token_times_s"])


def test_generate_ignore_eos_threads_and_compile_time(capsys):
    """--ignore-eos makes exactly --max-tokens tokens; --threads is what the cpu backend
    uses; a kernel compiled while generating is counted in compile_s."""
    from numba import njit

    code = main(["generate", "--model", "smollm2", "--prompt", "Hi", "--max-tokens", "3",
                 "--ignore-eos", "--backend", "cpu", "--threads", "1", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["n_generated"] == 3 and out["threads"][0] == 1

    from inference.cli import CompileClock

    with CompileClock() as clock:
        njit(lambda x: x + 1)(1)
    assert clock.kernels == 1 and clock.seconds > 0


def test_embed_file_to_npy(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("first line\n\nthird line, after a blank one\n", encoding="utf-8")
    dst = tmp_path / "out.npy"
    assert main(["embed", "--model", "minilm", "--input", str(src), "--output", str(dst),
                 "--backend", "numpy", "--quiet"]) == 0
    vecs = np.load(dst)
    assert vecs.shape == (3, 384)  # blank lines kept by default: one vector per input line
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, rtol=1e-5)


def test_embed_off_a_terminal_writes_one_line(tmp_path, capsys):
    # stderr captured (not a terminal): no count rewritten with carriage returns, only the
    # summary line.
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\n", encoding="utf-8")
    dst = tmp_path / "out.npy"
    assert main(["embed", "--model", "minilm", "--input", str(src), "--output", str(dst),
                 "--backend", "numpy", "--batch-size", "1"]) == 0
    err = capsys.readouterr().err
    assert "embedded" not in err and "\r" not in err, err
    assert err.startswith("wrote 2 x 384 to "), err


def _corrupt_gguf(tmp_path):
    data = smollm2_gguf().read_bytes()[:100_000]
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(data)
    return bad


@pytest.mark.parametrize("case", ["missing", "truncated", "not_gguf", "empty_prompt",
                                  "encoder_for_generate", "missing_input",
                                  "prefill_dtype_off_cuda"])
def test_bad_input_one_line_exit_2(tmp_path, capsys, case):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a model file at all")
    argv = {
        "missing": ["generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "hi"],
        "truncated": ["generate", "--model", str(_corrupt_gguf(tmp_path)), "--prompt", "hi"],
        "not_gguf": ["generate", "--model", str(junk), "--prompt", "hi"],
        "empty_prompt": ["generate", "--model", "smollm2", "--prompt", "", "--backend",
                         "numpy"],
        "encoder_for_generate": ["generate", "--model", "minilm", "--prompt", "hi",
                                 "--backend", "numpy"],
        "missing_input": ["embed", "--model", "minilm", "--input", str(tmp_path / "no.txt"),
                          "--output", str(tmp_path / "o.npy")],
        "prefill_dtype_off_cuda": ["generate", "--model", "smollm2", "--prompt", "hi",
                                   "--backend", "numpy", "--prefill-dtype", "float16"],
    }[case]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inferdesk: error: "), err
    assert "Traceback" not in err[0]


def test_subprocess_exit_code_and_single_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "inference.cli", "generate", "--model",
                        str(tmp_path / "missing.gguf"), "--prompt", "hi"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "missing.gguf" in r.stderr


EXIT_NOW = r"""
import atexit, sys, threading, time
from inference.cli import exit_now

def late() -> None:
    time.sleep(0.2)
    print("thread done")

atexit.register(lambda: print("atexit ran"))
threading.Thread(target=late).start()
from concurrent.futures import ThreadPoolExecutor  # idle workers wait for work: not joined first
pool = ThreadPoolExecutor(2)
pool.submit(int).result()
sys.stdout.write("unflushed line")
exit_now(3)
"""


@pytest.mark.parametrize("private_hooks", [True, False])
def test_exit_now_ends_as_a_normal_exit_would(private_hooks):
    """What a normal exit does before the interpreter's teardown still happens: threads
    joined, atexit handlers run, the output flushed; the code is the process's. Without
    the interpreter's private exit hooks it is a normal exit, with the same output."""
    code = EXIT_NOW if private_hooks else EXIT_NOW.replace(
        "exit_now(3)", "del atexit._run_exitfuncs\nexit_now(3)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["unflushed linethread done", "atexit ran"], r.stdout


def test_subprocess_generate_ends_with_its_whole_output():
    """`generate` ends its process itself (exit_now): the JSON line is complete, code 0."""
    r = subprocess.run([sys.executable, "-m", "inference.cli", "generate", "--model",
                        "SmolLM2-135M-Instruct.Q4_1", "--prompt", "Hi", "--max-tokens", "2",
                        "--ignore-eos", "--backend", "cpu", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1])["n_generated"] == 2


ONE_SHOT_GC = r"""
import gc, os, sys
import inference.api as api
import inference.cli as cli

phase = ["start"]
collected = {"start": 0, "load": 0, "reply": 0}
gc.callbacks.append(lambda p, info: p == "stop" and collected.__setitem__(
    phase[0], collected[phase[0]] + 1))
real_load = api.load_model


def load_model(*a, **k):
    phase[0] = "load"
    model = real_load(*a, **k)
    phase[0] = "reply"
    return model


api.load_model = load_model
real_exit = os._exit
os._exit = lambda code: (print("collected", collected["load"], "enabled", gc.isenabled(),
                               "frozen", gc.get_freeze_count() > 0, file=sys.stderr),
                         sys.stderr.flush(), real_exit(code))
cli.main(["generate", "--model", "SmolLM2-135M-Instruct.Q4_1", "--prompt", "Hi",
          "--max-tokens", "2", "--ignore-eos", "--backend", "cpu", "--json"],
         whole_process=True)
"""


def test_a_one_shot_generate_loads_without_garbage_collection():
    """The process `generate` ends loads its model with the cyclic collector paused (what
    the load allocates is kept: a collection would only traverse it), then collects again
    for the reply, with the load's objects frozen out of the collections."""
    r = subprocess.run([sys.executable, "-c", ONE_SHOT_GC], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1])["n_generated"] == 2
    line = r.stderr.splitlines()[-1].split()
    assert line == ["collected", "0", "enabled", "True", "frozen", "True"], r.stderr[-3000:]


def test_an_in_process_generate_keeps_the_collector(capsys):
    """main() called in-process (not the process's entry point) leaves the collector alone."""
    import gc

    from inference.cli import main

    # earlier tests in this process may have frozen objects (the GUI's collector guard);
    # frozen objects that die leave the count, a freeze would add the load's ~10^5
    frozen = gc.get_freeze_count()
    assert main(["generate", "--model", "SmolLM2-135M-Instruct.Q4_1", "--prompt", "Hi",
                 "--max-tokens", "1", "--backend", "cpu", "--json"]) == 0
    capsys.readouterr()
    assert gc.isenabled() and gc.get_freeze_count() <= frozen


def test_a_reader_that_leaves_ends_generate_quietly():
    """`inferdesk generate ... | head -c 0`: exit code 1, no traceback on stderr."""
    p = subprocess.Popen([sys.executable, "-m", "inference.cli", "generate", "--model",
                          "SmolLM2-135M-Instruct.Q4_1", "--prompt", "Hi", "--max-tokens", "8",
                          "--ignore-eos", "--backend", "cpu"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()  # before the first token is written
    err = p.stderr.read()
    assert p.wait(timeout=300) == 1 and "Traceback" not in err, err[-3000:]


def test_load_reports_progress_and_can_be_cancelled():
    import threading

    from inference import load_model
    from inference.errors import CancelledError

    seen = []
    model = load_model("minilm", backend="numpy", progress=lambda d, t: seen.append((d, t)))
    assert model.kind == "encoder" and len(seen) > 50
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and seen[-1][0] == seen[-1][1]
    cancel = threading.Event()

    def stop_halfway(done, total):
        if done > total // 2:
            cancel.set()

    with pytest.raises(CancelledError):
        load_model("smollm2", backend="numpy", progress=stop_halfway, cancel=cancel)


def test_generate_and_embed_show_compiling_through_the_one_hook(monkeypatch, tmp_path):
    # The CLI passes load_model's compile_progress, as the app does: there is no other hook.
    import inference.api
    from inference import cli
    from inference.errors import InvalidInputError

    seen = []

    def fake_load(name, **kw):
        seen.append(kw.get("compile_progress"))
        raise InvalidInputError("stop here")

    monkeypatch.setattr(inference.api, "load_model", fake_load)
    sentences = tmp_path / "in.txt"
    sentences.write_text("one\n")
    assert main(["generate", "--model", "m", "--prompt", "hi"]) != 0
    assert main(["embed", "--model", "m", "--input", str(sentences),
                 "--output", str(tmp_path / "out.npy")]) != 0
    assert seen == [cli.say_compiling, cli.say_compiling]
