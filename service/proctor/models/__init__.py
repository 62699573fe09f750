"""Model installation, fingerprinting and loading."""

from proctor.models.default_model import install_default_model
from proctor.models.errors import ModelError
from proctor.models.loader import LoadedModel, load_model

__all__ = ["LoadedModel", "ModelError", "install_default_model", "load_model"]
