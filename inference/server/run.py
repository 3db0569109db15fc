"""Starting the server: the loopback/API-key rule, loading the models, and uvicorn (in
the foreground for the CLI, or on a thread for the app and the tests)."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable
from typing import Any

from inference.errors import InvalidInputError
from inference.server.app import LOOPBACK_NAMES, Engine, create_app, host_names
from inference.server.limits import SHUTDOWN_S
from inference.server.prefix_pool import PROMPT_CACHE_IDLE, PROMPT_CACHE_MB


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, port: int, api_key: str | None,
                  names: list[str] | None = None) -> frozenset[str] | None:
    """The ``Host`` header values to answer (None: any). ``names`` as given (``*``: any);
    by default a keyless loopback server answers only to its loopback names, so a web page
    cannot reach it by rebinding its own domain to 127.0.0.1; a server with a key, which
    such a page does not have, answers to any."""
    if names is not None:
        return None if "*" in names else host_names(names, port)
    if api_key or not is_loopback(host):
        return None
    return host_names({*LOOPBACK_NAMES, host}, port)


def check_exposure(host: str, api_key: str | None) -> None:
    """Anything but loopback is reachable by other machines: it needs a key."""
    if not is_loopback(host) and not api_key:
        raise InvalidInputError(
            f"Binding to {host} exposes the server to the network; set --api-key too.")


def load_engine(model: str | None, embed_model: str | None, backend: str = "auto",
                parallel: int = 4, prompt_cache_mb: int = PROMPT_CACHE_MB,
                kv_dtype: str | None = None, prompt_cache_idle: float = PROMPT_CACHE_IDLE
                ) -> Engine:
    """Load the named chat model and/or encoder and start their batching threads;
    ``prompt_cache_mb`` bounds the finished requests' prompt prefixes kept (0: none),
    ``prompt_cache_idle`` the seconds without a request they are kept for (0: no limit);
    ``kv_dtype`` is the chat model's KV cache type (None: the backend's)."""
    from inference.api import load_model
    from inference.remote import is_url

    if not model and not embed_model:
        raise InvalidInputError("Give --model, --embed-model, or both.")
    if is_url(model) or is_url(embed_model):
        raise InvalidInputError("The server serves local models; point clients at the "
                                "remote server itself.")
    llm = enc = None
    aliases: dict[str, str] = {}
    for name, want in ((model, "causal"), (embed_model, "encoder")):
        if not name:
            continue
        m = load_model(name, backend=backend, kv_dtype=kv_dtype if want == "causal" else None)
        if m.kind != want:
            flag, what = ("--model", "a chat") if want == "causal" else (
                "--embed-model", "an embedding")
            raise InvalidInputError(f"{name} is not {what} model; it cannot be the server's "
                                    f"{flag}.")
        aliases[str(name)] = m.name
        if want == "causal":
            llm = m
        else:
            enc = m
    return Engine(llm, enc, parallel=parallel, aliases=aliases,
                  prompt_cache_mb=prompt_cache_mb, prompt_cache_idle=prompt_cache_idle)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise InvalidInputError(f"Cannot listen on {host}:{port}: {e.strerror}.") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """uvicorn serving ``engine`` on a background thread; ``port=0`` takes a free port.
    ``app`` serves another ASGI app instead (tests: a deliberately broken server)."""

    def __init__(self, engine: Engine | None, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None,
                 log: Callable[[dict[str, Any]], None] | None = None, app: Any = None,
                 hosts: list[str] | None = None):
        import uvicorn

        check_exposure(host, api_key)
        self.engine = engine
        self.sock = _bind(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        app = app if app is not None else create_app(
            engine, api_key, log, allowed_hosts=allowed_hosts(host, self.port, api_key, hosts))
        config = uvicorn.Config(app, log_level="warning",
                                lifespan="off", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run,
                                        kwargs={"sockets": [self.sock]},
                                        name="inferdesk-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        for _ in range(int(timeout / 0.05)):
            if self.server.started or not self._thread.is_alive():
                break
            threading.Event().wait(0.05)
        if not self.server.started:
            raise InvalidInputError(f"The server did not start on {self.url}.")
        return self

    def stop(self, close_engine: bool = True) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self.sock.close()
        if close_engine and self.engine is not None:
            self.engine.close()


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8080,
          api_key: str | None = None, hosts: list[str] | None = None,
          shutdown_timeout: float = SHUTDOWN_S) -> None:
    """Serve in the foreground until interrupted (SIGINT/SIGTERM): then new connections
    are refused and open ones get ``shutdown_timeout`` seconds to finish before they are
    closed. ``hosts``: the ``Host`` names answered (:func:`allowed_hosts`)."""
    import uvicorn

    check_exposure(host, api_key)
    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"inferdesk: serving {', '.join(m.name for m in engine.models())} at "
          f"http://{shown}:{bound}/v1", flush=True)
    app = create_app(engine, api_key, allowed_hosts=allowed_hosts(host, bound, api_key, hosts))
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="info", lifespan="off",
                                      timeout_graceful_shutdown=shutdown_timeout)
                       ).run(sockets=[sock])
    finally:
        sock.close()
        engine.close()
