"""How many threads the engine computes with (bench, `inferdesk serve --threads`)."""

from __future__ import annotations

from typing import Any


def set_threads(n: int, backend: Any = None) -> str:
    """Cap the engine's thread pools at n: BLAS/OpenMP via threadpoolctl, and the backend's
    own pool (numba) through its set_threads hook. BLAS stays at one thread for a backend
    that shares its work out between its own threads (``own_threads``: cpu), whose parts
    each call BLAS. Returns what was capped."""
    done = []
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1 if getattr(backend, "own_threads", False) else n)
        done.append("threadpoolctl")
    except ImportError:
        pass
    hook = getattr(backend, "set_threads", None)
    if hook is not None:
        hook(n)
        done.append(f"{backend.name}.set_threads")
    return ", ".join(done) or "none (install threadpoolctl to cap BLAS threads)"
