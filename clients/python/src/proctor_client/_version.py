"""The installed distribution's version, kept apart so every module can import it without cycles."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__: str = version("proctor-client")
except PackageNotFoundError:  # running from a source tree (PYTHONPATH) without an install
    __version__ = "0.0.0+source"
