"""Every architecture x every backend here: a missing op or quant type fails CI, not a run.

Also the selection rules: an explicit backend that lacks an op is refused (naming it)
before any weight is converted; ``auto`` falls back and its reason says why.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

import inference.api as api
import inference.backends as backends
from inference.backends.base import Backend
from inference.backends.numpy_backend import NumpyBackend
from inference.errors import BackendUnavailableError, MissingOpError
from inference.formats.tensor import Checkpoint, TensorData
from inference.models import ARCHITECTURES, llama

# The quant types each architecture is usually shipped in, when its module does not declare
# USUAL_QUANT_TYPES itself: GGUF legacy and K-quants (Q4_K_M mixes Q4_K/Q5_K/Q6_K) and
# mlx-community safetensors for decoders; F16/Q8_0/K-quant GGUFs for BERT encoders.
_DECODER = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
            "MLX"}
USUAL_QUANT_TYPES = {"llama": _DECODER, "mistral": _DECODER, "qwen2": _DECODER,
                     "qwen3": _DECODER, "gemma": _DECODER, "gemma2": _DECODER,
                     "gemma3_text": _DECODER, "phi3": _DECODER,
                     "bert": {"F32", "F16", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}}
USUAL_QUANT_TYPES |= {"xlm-roberta": USUAL_QUANT_TYPES["bert"],
                      "roberta": USUAL_QUANT_TYPES["bert"],
                      "nomic_bert": USUAL_QUANT_TYPES["bert"]}

BACKENDS = [p.name for p in backends.probe_all()]
# The CUDA backend on the host emulator: what it declares is what a GPU run checks, so a
# type missing there fails here, not on the first GPU machine.
EMULATED = {"cuda": "cuda-emulated"}


def _make(name: str) -> Backend:
    if name == "cuda-emulated":
        from inference.backends.cuda import CudaBackend
        from tests.kernels.emulator.device import EmulatedDevice

        return CudaBackend(EmulatedDevice())
    p = backends.probe(name)
    if not p.available:
        pytest.skip(f"backend {name!r} unavailable ({p.reason})")
    return backends.create(name)


def usual_quants(arch: str) -> set[str]:
    return set(getattr(ARCHITECTURES[arch], "USUAL_QUANT_TYPES", USUAL_QUANT_TYPES[arch]))


def test_every_architecture_has_a_usual_quant_list():
    assert set(ARCHITECTURES) <= set(USUAL_QUANT_TYPES)


@pytest.fixture(scope="module")
def made() -> dict[str, Backend]:
    return {}


@pytest.mark.parametrize("name", BACKENDS + [EMULATED[n] for n in BACKENDS if n in EMULATED])
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_backend_offers_every_op_and_quant_type(arch, name, made):
    if name not in made:
        made[name] = _make(name)
    b = made[name]
    missing_ops = sorted(ARCHITECTURES[arch].REQUIRED_OPS - b.ops())
    assert not missing_ops, f"no {name} implementation for {', '.join(missing_ops)} ({arch})"
    missing_q = sorted(usual_quants(arch) - backends.ALWAYS_FLOAT - b.quant_types())
    assert not missing_q, f"{name} cannot load {', '.join(missing_q)} weights ({arch})"


# --- selection ----------------------------------------------------------------------------

class NoRmsNorm(NumpyBackend):
    """The reference backend with rms_norm and Q4_K missing; counts weight conversions."""

    name = "fake"
    rms_norm = Backend.rms_norm  # not overridden -> ops() leaves it out
    converted = 0

    def quant_types(self) -> set[str]:
        return super().quant_types() - {"Q4_K"}

    def weight(self, t: TensorData):
        NoRmsNorm.converted += 1
        return super().weight(t)

    def dense(self, t: TensorData):
        NoRmsNorm.converted += 1
        return super().dense(t)


@pytest.fixture
def fake(monkeypatch):
    mod = types.ModuleType("fake_backend_for_tests")
    mod.probe = lambda: (True, "test double")
    mod.create = NoRmsNorm
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(backends._MODULES, "fake", mod.__name__)
    NoRmsNorm.converted = 0
    return mod


def test_fake_backend_really_lacks_the_op(fake):
    assert "rms_norm" not in backends.create("fake").ops()


def test_explicit_backend_lacking_op_is_refused_before_weights_load(fake, monkeypatch):
    ckpt = Checkpoint(Path("tiny.gguf"), "gguf",
                      {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1,
                       "intermediate_size": 64, "num_attention_heads": 2, "vocab_size": 8},
                      {"model.embed_tokens.weight":
                       TensorData("e", (8, 32), "F32", np.zeros((8, 32), np.float32))})
    monkeypatch.setattr(api, "resolve",
                        lambda name, checkpoint=None: types.SimpleNamespace(path=ckpt.path))
    monkeypatch.setattr(api, "read_checkpoint", lambda path: ckpt)
    with pytest.raises(MissingOpError, match="rms_norm"):
        api.load_model("tiny", backend="fake")
    assert NoRmsNorm.converted == 0


def test_explicit_backend_lacking_quant_type_names_it(fake):
    with pytest.raises(MissingOpError, match="Q4_K"):
        backends.select_backend("fake", {"linear"}, {"Q4_K", "F32"}, "llama")


def test_auto_falls_back_and_says_why(fake, monkeypatch):
    monkeypatch.setattr(backends, "auto_order", lambda: ("fake", "numpy"))
    b, why = backends.select_backend("auto", llama.REQUIRED_OPS, {"Q4_1"}, "llama")
    assert b.name == "numpy"
    assert why.startswith("numpy: ") and "fake: lacks rms_norm" in why


def test_auto_skips_unavailable_with_reason(monkeypatch):
    mod = types.ModuleType("absent_backend_for_tests")
    mod.probe = lambda: (False, "no such device")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(backends._MODULES, "absent", mod.__name__)
    monkeypatch.setattr(backends, "auto_order", lambda: ("absent", "numpy"))
    b, why = backends.select_backend("auto", llama.REQUIRED_OPS, set(), "llama")
    assert b.name == "numpy" and "absent: no such device" in why
    with pytest.raises(BackendUnavailableError, match="no such device"):
        backends.select_backend("absent", llama.REQUIRED_OPS, set(), "llama")


def test_auto_order_puts_mlx_last_without_metal():
    order = backends.auto_order()
    import mlx.core as mx

    assert order[0] == "cuda"
    assert (order[1] == "mlx") == bool(mx.metal.is_available())
