"""The CUDA backend works the first time or steps aside with one sentence.

A machine with the NVIDIA driver but no NVRTC (CuPy without its toolkit wheels) must not be
picked by `auto` and then fail mid-generation: the probe compiles and runs a kernel and
checks its numbers, and the backend compiles every module when it starts. Fake devices
here are the emulator with its compiler or its results broken on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import inference.backends.cuda as cuda_backend
from inference.backends import select_backend
from inference.backends.base import OPS
from inference.errors import BackendUnavailableError
from kernels.cuda.device import MODULES, kernel_source
from kernels.cuda.ops import check_device
from tests.kernels.conftest import fake_gpu
from tests.kernels.emulator.device import EmulatedDevice

ROOT = Path(__file__).resolve().parents[2]


class NoCompilerDevice(EmulatedDevice):
    """A GPU whose CuPy has no NVRTC: every module fails to compile."""

    def _load(self, module: str):  # noqa: ANN202
        raise RuntimeError("CuPy failed to load libnvrtc.so.12: cannot open shared object file")


class NoMmvDevice(EmulatedDevice):
    """Compiles every module but the mat-vec (say, a header only that module needs)."""

    def _load(self, module: str):  # noqa: ANN202
        if module == "mmv":
            raise RuntimeError("catastrophic error: cannot open source file \"cuda_fp16.h\"")
        return super()._load(module)


class WrongNumbersDevice(EmulatedDevice):
    """Compiles and launches, but what comes back is not what the kernel computes."""

    def to_host(self, a: np.ndarray, label: str = "") -> np.ndarray:
        return np.zeros_like(super().to_host(a, label))


def test_self_test_passes_on_a_working_device() -> None:
    assert check_device(EmulatedDevice()) is None


def test_probe_accepts_a_device_that_runs_the_self_test(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    fake_gpu(monkeypatch, EmulatedDevice)
    ok, reason = cuda_backend.probe()
    assert ok and "self-test kernel passed" in reason


def test_auto_skips_cuda_whose_compile_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, NoCompilerDevice)
    ok, reason = cuda_backend.probe()
    assert not ok
    assert reason.startswith("cuda: the self-test kernel does not compile or run (RuntimeError")
    assert "libnvrtc" in reason and "\n" not in reason
    backend, why = select_backend("auto", OPS, {"Q4_1"}, "llama")
    assert backend.name != "cuda"
    assert "skipped cuda: the self-test kernel does not compile or run" in why, why


def test_auto_skips_cuda_that_computes_wrong_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, WrongNumbersDevice)
    assert cuda_backend.probe() == (
        False, "cuda: the self-test kernel returned wrong numbers (a driver/toolkit mismatch?)")


def test_every_module_compiles_at_load_not_at_first_launch() -> None:
    with pytest.raises(BackendUnavailableError) as e:
        cuda_backend.CudaBackend(NoMmvDevice())
    msg = str(e.value)
    assert msg.startswith("The CUDA backend cannot start: the mmv kernels do not compile")
    assert "\n" not in msg
    dev = EmulatedDevice()
    seen: list[tuple[int, int, str]] = []
    cuda_backend.CudaBackend(dev, compile_progress=lambda *a: seen.append(a))
    assert set(dev._module_cache) == set(MODULES)  # all loaded before any launch
    assert dev.launches == 0
    # once at the start, then as each module is ready (in any order: they compile in
    # parallel), counting up to all of them
    n = len(MODULES)
    assert seen[0] == (0, n, "")
    assert [d for d, _, _ in seen[1:]] == list(range(1, n + 1))
    assert sorted(m for _, _, m in seen[1:]) == sorted(MODULES)
    assert all(t == n for _, t, _ in seen)
    seen.clear()
    dev.load_all(progress=lambda *a: seen.append(a))  # all loaded: nothing to do
    assert seen == [(n, n, "")]


class SlowDevice(EmulatedDevice):
    """Each module takes a while to load and records which thread loaded it."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.lock, self.running, self.overlap, self.threads = threading.Lock(), 0, 0, set()

    def _load(self, module: str):  # noqa: ANN202
        import threading
        import time

        with self.lock:
            self.running += 1
            self.overlap = max(self.overlap, self.running)
            self.threads.add(threading.get_ident())
        time.sleep(0.05)  # NVRTC would be busy here, without Python's lock
        with self.lock:
            self.running -= 1
        return super()._load(module)


def test_modules_compile_in_parallel_and_progress_stays_on_the_caller() -> None:
    import threading

    dev = SlowDevice()
    callers: set[int] = set()
    dev.load_all(progress=lambda *a: callers.add(threading.get_ident()), workers=4)
    assert dev.overlap > 1 and len(dev.threads) > 1
    assert callers == {threading.get_ident()}  # an app can touch its progress bar from it


def test_create_tells_the_app_about_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, EmulatedDevice)
    seen: list[tuple[int, int, str]] = []
    cuda_backend.create(lambda *a: seen.append(a))
    assert seen[0][2] == "" and seen[-1][0] == seen[-1][1] == len(MODULES)
    cuda_backend.create()  # without a hook the steps are only logged


def test_load_model_passes_compile_progress_to_the_app(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    # The one hook, for the app and the CLI: load_model(compile_progress=fn) reaches the
    # backend's module compile, on the loading thread (a GUI worker emits a signal from fn).
    import threading

    from inference import load_model

    fake_gpu(monkeypatch, EmulatedDevice)
    seen: list[tuple[int, int, str]] = []
    callers: set[int] = set()

    def progress(*a: object) -> None:
        seen.append(a)  # type: ignore[arg-type]
        callers.add(threading.get_ident())

    m = load_model(str(ROOT / "tests" / "goldens" / "tiny" / "llama"), backend="cuda",
                   compile_progress=progress)
    assert m.backend.name == "cuda"
    assert seen[0][2] == ""
    assert seen[-1][0] == seen[-1][1] == len(MODULES)
    assert callers == {threading.get_ident()}


_HALF_USE = re.compile(r"\b(__half\w*|__float2half\w*|__ushort_as_half|load_f16)\b")


@pytest.mark.parametrize("module", MODULES)
def test_cuda_fp16_h_only_where_half_is_used(module: str) -> None:
    src = kernel_source(module)
    includes = "#include <cuda_fp16.h>" in src
    uses = bool(_HALF_USE.search(src.replace("#include <cuda_fp16.h>", "")))
    assert includes == uses, f"{module}: includes cuda_fp16.h={includes}, uses half={uses}"
    if module in ("norm", "softmax", "rope", "attention", "unary", "argmax"):
        assert not includes  # these must compile with NVRTC alone, no toolkit headers


def test_cuda_extras_bring_nvrtc_for_cuda_12_and_13() -> None:
    # `pip install --dry-run cupy-cuda12x[ctk]==14.2.0` resolves nvidia-cuda-nvrtc-cu12,
    # nvidia-cuda-runtime-cu12 (cuda_fp16.h) and nvidia-cublas-cu12; the 13x one the
    # unsuffixed CUDA 13 wheels. Without [ctk] CuPy brings no NVRTC.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(d.startswith("cupy-cuda12x[ctk]") for d in extras["cuda12"])
    assert any(d.startswith("cupy-cuda13x[ctk]") for d in extras["cuda13"])
    assert extras["cuda"] == extras["cuda12"]


def test_modules_without_half_compile_with_nvrtc_and_no_headers() -> None:
    """What a machine with NVRTC but without the toolkit headers can build: every module
    that does not use half, with no -I at all."""
    from tests.kernels.test_nvcc import _nvrtc

    nvrtc = _nvrtc()
    if nvrtc is None:
        pytest.skip("NVRTC not loadable (pip install nvidia-cuda-nvrtc)")
    for m in MODULES:
        src = kernel_source(m)
        if "cuda_fp16.h" in src:
            continue
        prog = nvrtc.createProgram(src, f"{m}.cu", [], [])
        try:
            nvrtc.compileProgram(prog, ["-std=c++17", "--gpu-architecture=compute_75"])
        except Exception as e:
            raise AssertionError(f"{m}: {nvrtc.getProgramLog(prog)}") from e
        finally:
            nvrtc.destroyProgram(prog)
