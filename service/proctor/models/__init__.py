"""Model installation, fingerprinting and loading.

Exports resolve lazily (PEP 562) so that ``python -m proctor.models.default_model`` does not import
its own module twice, and so that importing a light submodule does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proctor.engine.loaded_model import LoadedModel
    from proctor.models.default_model import install_default_model
    from proctor.models.errors import ModelError
    from proctor.models.loader import load_model

__all__ = ["LoadedModel", "ModelError", "install_default_model", "load_model"]

_HOMES = {
    "LoadedModel": "proctor.engine.loaded_model",
    "load_model": "proctor.models.loader",
    "ModelError": "proctor.models.errors",
    "install_default_model": "proctor.models.default_model",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
