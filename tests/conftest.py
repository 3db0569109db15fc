"""Shared fixtures: the bundled models loaded once per session on the reference backend.

Tests marked ``long`` are opt-in (``INFERDESK_LONG=1``): heavy repeats of a path the
default suite already covers with a cheaper case, kept runnable with their figures in docs/,
so ``make test`` stays within CI's 10 minutes on 2 cores."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network

import pytest  # noqa: E402

import inference  # noqa: E402,F401 - first, as the app and CLI: it sets OpenBLAS up before numpy
from tests import early  # noqa: E402

LONG = os.environ.get("INFERDESK_LONG") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "early(steps=fn): subprocess steps started when the "
                            "session's tests are chosen (tests/early.py)")


def pytest_collection_finish(session: pytest.Session) -> None:
    # Under pytest-xdist every worker collects every test but runs only those it is sent,
    # which it learns one batch at a time: a worker's early test starts its own steps when
    # it runs (early.result), so each check runs once, in the process that asserts on it.
    # The other worker keeps the second core busy meanwhile.
    if not hasattr(session.config, "workerinput"):
        early.start(session.items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    early.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if LONG:
        return
    skip = pytest.mark.skip(reason="opt-in: INFERDESK_LONG=1 runs it (figures in docs/)")
    for item in items:
        if item.get_closest_marker("long"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _numba_threads_restored():
    """A test that sets the cpu backend's threads (``set_threads``, ``adapt_threads``)
    changes numba's count for the calling thread, the main thread for the rest of the
    session: put it back, so no later test depends on the order (the picker's memory
    estimate read 0.58x its measured growth after a one-thread test)."""
    import numba

    before = numba.get_num_threads()
    yield
    if numba.get_num_threads() != before:
        numba.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct Q4_1 on the NumPy reference backend."""
    from inference import load_model

    return load_model("SmolLM2-135M-Instruct.Q4_1", backend="numpy")


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 on the NumPy reference backend."""
    from inference import load_model

    return load_model("all-MiniLM-L6-v2", backend="numpy")


@pytest.fixture(scope="session")
def smollm2_prose_logits(smollm2):
    """The NumPy SmolLM2's logits over the prose golden, computed once: scored against
    transformers (test_parity) and against the cpu backend (test_backend_cpu)."""
    from tests.goldens_io import load_smollm2

    logits = smollm2.logits([int(i) for i in load_smollm2()["texts"]["prose"]["ids"]])
    logits.setflags(write=False)  # shared: no test may change it
    return logits
