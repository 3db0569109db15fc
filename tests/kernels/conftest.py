"""Fixtures of the kernel tests: the emulated device, and a real GPU when there is one."""

from __future__ import annotations

import pytest

from kernels.cuda.device import CupyDevice, Device, cuda_unavailable_reason
from tests.kernels.emulator.device import EmulatedDevice

_gpu: Device | None = None


@pytest.fixture(scope="session")
def emu() -> EmulatedDevice:
    EmulatedDevice.prebuild()  # cold cache: the g++ builds run in parallel
    return EmulatedDevice()


@pytest.fixture(scope="session")
def gpu() -> Device:
    global _gpu
    reason = cuda_unavailable_reason()
    if reason:
        pytest.skip(reason)
    if _gpu is None:
        _gpu = CupyDevice()
    return _gpu


def fake_gpu(monkeypatch: pytest.MonkeyPatch, device: type) -> None:
    """Make ``backend="cuda"`` load on ``device`` without a GPU: the NVIDIA driver library
    counts as loadable, CUDA as available, and the backend's device is ``device``."""
    import inference.backends as backends
    import inference.backends.cuda as cuda_backend

    real = backends._loads
    monkeypatch.setattr(backends, "_loads", lambda lib: lib == "libcuda.so.1" or real(lib))
    monkeypatch.setattr(cuda_backend, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(cuda_backend, "CupyDevice", device)


@pytest.fixture(params=["emulator", pytest.param("gpu", marks=pytest.mark.gpu)])
def dev(request: pytest.FixtureRequest) -> Device:
    """Every kernel case runs on the emulator, and on the GPU when one is present."""
    return request.getfixturevalue("emu" if request.param == "emulator" else "gpu")
