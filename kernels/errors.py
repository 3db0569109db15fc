"""Errors of the device-code layer. ``kernels`` imports nothing from the engine above it;
the engine validates user input before any launch, so these mean a caller asked for a
launch the device cannot run (a bug or an unsupported shape), stated in one sentence."""

from __future__ import annotations


class LaunchError(ValueError):
    """A kernel launch outside what the kernel or the device supports."""


class KernelLoadError(RuntimeError):
    """A kernel module that does not compile or load on this device (no NVRTC, no CUDA
    headers, a driver too old for the code), stated in one sentence."""
