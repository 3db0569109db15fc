"""Typed errors of the engine. ``str(error)`` is one sentence a user can act on."""

from __future__ import annotations


class InferdeskError(Exception):
    """Base class: every error the engine raises on purpose derives from it."""


class ModelNotFoundError(InferdeskError):
    """A name or path that names no model."""


class CorruptModelError(InferdeskError):
    """A model file that exists but cannot be read (truncated, bad magic, bad offsets)."""


class UnsupportedModelError(InferdeskError):
    """A readable model this engine cannot run (architecture or tensor type)."""


class MissingOpError(UnsupportedModelError):
    """A backend lacks an op or quant type the architecture needs."""


class BackendUnavailableError(InferdeskError):
    """The requested backend cannot run on this machine."""


class InvalidInputError(InferdeskError):
    """Bad input from the user: an empty prompt, a wrong parameter."""


class ContextOverflowError(InvalidInputError):
    """A prompt longer than the model's context (callers may shorten it and try again)."""


class CancelledError(InferdeskError):
    """A job stopped because its caller asked it to."""


class OutOfMemoryError(InferdeskError):
    """The backend could not allocate what the job needs."""


class NumericalError(InferdeskError):
    """NaN or infinite values where a model's output must be finite."""
