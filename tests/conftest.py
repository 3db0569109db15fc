"""Shared fixtures: the bundled models loaded once per session on the reference backend."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the network

import pytest  # noqa: E402


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
