"""Hostile and careless input through the `inferdesk` CLI: exit 2 with one `inferdesk: error:`
line, never a traceback; output files written whole or not at all."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import numpy as np
import pytest

from inference import cli
from tests.hostile_models import TINY


def run(argv: list[str], capsys) -> tuple[int, str]:
    code = cli.main(argv)
    err = capsys.readouterr().err
    return code, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("inferdesk: error: "), err
    return lines[0]


def embed(tmp_path: Path, text: str | bytes, output: str, capsys) -> tuple[int, str]:
    src = tmp_path / "in.txt"
    src.write_bytes(text.encode() if isinstance(text, str) else text)
    return run(["embed", "--model", "minilm", "--backend", "numpy", "--quiet",
                "--input", str(src), "--output", output], capsys)


# --- 6. output files ------------------------------------------------------------------------

def test_output_is_written_exactly_where_named(tmp_path: Path, capsys) -> None:
    out = tmp_path / "vectors"
    code, err = embed(tmp_path, "one\ntwo\n", str(out), capsys)
    assert code == 0, err
    assert np.load(out).shape == (2, 384)
    assert not (tmp_path / "vectors.npy").exists()


def test_output_that_is_a_directory_is_refused(tmp_path: Path, capsys) -> None:
    code, err = embed(tmp_path, "one\n", str(tmp_path), capsys)
    assert code == 2 and "directory" in one_error_line(err)
    assert not Path(f"{tmp_path}.npy").exists()


def test_output_gets_the_permissions_a_new_file_gets(tmp_path: Path, capsys) -> None:
    """The temporary file's private 0600 used to stay on the output."""
    old = os.umask(0o022)
    try:
        code, err = embed(tmp_path, "one\n", str(tmp_path / "v.npy"), capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    assert (tmp_path / "v.npy").stat().st_mode & 0o777 == 0o644


def test_a_symlink_at_output_is_refused_not_replaced(tmp_path: Path, capsys) -> None:
    target = tmp_path / "elsewhere.npy"
    target.write_bytes(b"kept")
    link = tmp_path / "link.npy"
    link.symlink_to(target)
    code, err = embed(tmp_path, "one\n", str(link), capsys)
    assert code == 2 and "symbolic link" in one_error_line(err)
    assert link.is_symlink() and target.read_bytes() == b"kept"


def test_output_path_is_checked_before_the_run(tmp_path: Path, capsys, monkeypatch) -> None:
    import inference.api

    loaded = []
    monkeypatch.setattr(inference.api, "load_model", lambda *a, **k: loaded.append(a))
    code, err = embed(tmp_path, "one\n", str(tmp_path / "no such folder" / "v.npy"), capsys)
    assert code == 2 and "cannot write in" in one_error_line(err)
    assert not loaded


def test_a_failed_write_keeps_the_existing_file(tmp_path: Path, capsys, monkeypatch) -> None:
    out = tmp_path / "good.npy"
    np.save(out, np.arange(6, dtype=np.float32))
    before = out.read_bytes()

    def disk_full(file, arr, *a, **k) -> None:
        f = open(file, "wb") if isinstance(file, str | Path) else file  # noqa: SIM115
        f.write(b"\x93NUMPY truncated")
        f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(np, "save", disk_full)
    code, err = embed(tmp_path, "one\n", str(out), capsys)
    assert code == 2 and "No space left on device" in one_error_line(err)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.npy", "in.txt"]  # no temp left


# --- 9. inputs that are not text files, seeds, line splitting -----------------------------

def test_rows_follow_newlines_only(tmp_path: Path, capsys, minilm) -> None:
    lines = ["a\rb", "c\x0bd\x1ce", "f\u2028g", "last"]
    out = tmp_path / "v.npy"
    code, err = embed(tmp_path, "\r\n".join(lines[:2]) + "\n" + "\n".join(lines[2:]) + "\n",
                      str(out), capsys)
    assert code == 0, err
    vecs = np.load(out)
    assert vecs.shape == (4, 384)
    # Same inputs, same backend, same batch: equal up to float32 summation order.
    np.testing.assert_allclose(vecs, minilm.embed(lines), atol=1e-5)


@pytest.mark.parametrize("kind", ["dev_zero", "fifo", "empty_dir"])
def test_models_that_are_not_model_files(tmp_path: Path, capsys, kind: str) -> None:
    if kind == "dev_zero":
        path = "/dev/zero"
    elif kind == "fifo":
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
    else:
        path = str(tmp_path)
    code, err = run(["generate", "--model", path, "--prompt", "hi"], capsys)
    assert code == 2
    one_error_line(err)


def test_input_that_is_a_directory(tmp_path: Path, capsys) -> None:
    code, err = run(["embed", "--model", "minilm", "--input", str(tmp_path), "--output",
                     str(tmp_path / "o.npy")], capsys)
    assert code == 2 and "directory" in one_error_line(err)


def test_binary_stdin(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xff\xfe\x00\x81")))
    code, err = run(["embed", "--model", "minilm", "--input", "-", "--output",
                     str(tmp_path / "o.npy")], capsys)
    assert code == 2 and "UTF-8" in one_error_line(err)
    assert not (tmp_path / "o.npy").exists()


def test_endless_input_is_bounded(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(cli, "MAX_INPUT_BYTES", 1 << 20)
    code, err = run(["embed", "--model", "minilm", "--input", "/dev/zero", "--output",
                     str(tmp_path / "o.npy")], capsys)
    assert code == 2 and "more than" in one_error_line(err)


def test_seed_minus_one(capsys) -> None:
    code, err = run(["generate", "--model", str(TINY / "llama"), "--backend", "numpy",
                     "--prompt", "hello", "--temperature", "0.8", "--seed", "-1",
                     "--max-tokens", "2"], capsys)
    assert code == 0, err


@pytest.mark.parametrize("flag,value", [("--temperature", "nan"), ("--top-p", "2"),
                                        ("--repetition-penalty", "-1"), ("--seed", "-7")])
def test_bad_sampling_flags(capsys, flag: str, value: str) -> None:
    code, err = run(["generate", "--model", str(TINY / "llama"), "--backend", "numpy",
                     "--prompt", "hello", flag, value], capsys)
    assert code == 2
    one_error_line(err)
