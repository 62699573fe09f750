"""Keep Hugging Face libraries off the network: the models Proctor loads are local unless the user allows the hub.

``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once, at import, so the context manager also flips its
module constant; ``local_files_only=True`` on every local load is the other half of the guarantee.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

_FLAGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE = {"1", "true", "yes", "on"}


def _env_offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in _FLAGS)


def hub_allowed() -> bool:
    """False when the user set ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE`` (or the hub library says offline)."""
    if _env_offline():
        return False
    constants = sys.modules.get("huggingface_hub.constants")
    return not (constants is not None and getattr(constants, "HF_HUB_OFFLINE", False))


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Run the block with the hub switched off, then restore the previous state."""
    saved_env = {name: os.environ.get(name) for name in _FLAGS}
    constants = sys.modules.get("huggingface_hub.constants")
    saved_constant = getattr(constants, "HF_HUB_OFFLINE", None) if constants is not None else None
    for name in _FLAGS:
        os.environ[name] = "1"
    if constants is not None:
        constants.__dict__["HF_HUB_OFFLINE"] = True  # a module constant, read when hub functions run
    try:
        yield
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        now = sys.modules.get("huggingface_hub.constants")
        if now is not None:  # imported before or during the block: put back what the environment says
            now.__dict__["HF_HUB_OFFLINE"] = saved_constant if constants is not None else _env_offline()
