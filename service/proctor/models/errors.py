"""The one error type for model installation and loading, so callers can report it cleanly."""

from __future__ import annotations


class ModelError(RuntimeError):
    """A model could not be installed, found or loaded; the message says what to do."""
