"""`inferdesk bench --serve` runs our server as `inferdesk serve` in a process of its own,
as it runs llama-cpp-python's (each side its own interpreter, the clients in the bench's)."""

from __future__ import annotations

import pytest

from inference.bench import serve as bs


def test_serve_subprocess_answers_a_stream(monkeypatch):
    port = bs._free_port()
    argv = bs._inferdesk_argv("smollm2", "cpu", 1, port)
    assert argv[argv.index("--threads") + 1] == "1"
    monkeypatch.setattr(bs, "STREAMS", (1, 2))
    with bs._server(argv, port) as (url, name):
        assert url == f"http://127.0.0.1:{port}/v1"
        assert name.startswith("SmolLM2")
        times = bs._stream_times(url, name, "Hello", 4)
        rows = bs.measure(url, name, "Hello", 3)
        with pytest.raises(RuntimeError, match="answered 404"):
            bs._stream_times(url, "no-such-model", "Hello", 2)
    assert 1 <= len(times) <= 4  # one timestamp per streamed text chunk
    assert times == sorted(times)
    for row in rows.values():  # the old fields and the new ones
        assert {"aggregate_tok_s", "tokens", "short", "wall_s", "itl_p50_ms", "itl_p99_ms",
                "decode_tok_s", "ttft_p50_ms"} <= set(row)
        assert row["ttft_p50_ms"] > 0
    assert "speedup_vs_1" in rows["2"]


def test_decode_rate_counts_tokens_after_the_first_over_first_to_last():
    # Two streams decode 2 + 1 tokens between 1.0 (earliest first) and 2.2 (latest last);
    # a stream with one token has nothing to decode.
    assert bs.decode_rate([[1.0, 1.5, 2.0], [1.2, 2.2], [3.0]]) == 2.5
    assert bs.decode_rate([[1.0]]) is None and bs.decode_rate([]) is None


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
