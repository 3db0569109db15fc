"""`inferdesk bench --serve` runs our server as `inferdesk serve` in a process of its own,
as it runs llama-cpp-python's (each side its own interpreter, the clients in the bench's)."""

from __future__ import annotations

import pytest

from inference.server import bench_serve as bs


def test_serve_subprocess_answers_a_stream():
    port = bs._free_port()
    argv = bs._inferdesk_argv("smollm2", "cpu", 1, port)
    assert argv[argv.index("--threads") + 1] == "1"
    with bs._server(argv, port) as (url, name):
        assert url == f"http://127.0.0.1:{port}/v1"
        assert name.startswith("SmolLM2")
        times = bs._stream_times(url, name, "Hello", 4)
    assert 1 <= len(times) <= 4  # one timestamp per streamed text chunk
    assert times == sorted(times)


def test_server_that_exits_names_its_error():
    port = bs._free_port()
    argv = bs._inferdesk_argv("/nonexistent/model.gguf", "cpu", 1, port)
    with pytest.raises(RuntimeError, match="exited: inferdesk: error: "), \
            bs._server(argv, port):
        pass


def test_serve_threads_must_be_positive(capsys):
    from inference.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--model", "smollm2", "--threads", "0"])
    assert "must be at least 1" in capsys.readouterr().err
