"""Named logits processors and stopping criteria that requests ask for by name (see docs/plugins.md)."""

from proctor.decoding.plugins.api import (
    LogitsProcessor,
    PluginContext,
    PluginParamsError,
    PluginSpec,
    SequenceView,
    StoppingCriterion,
)
from proctor.decoding.plugins.registry import PluginRegistry

__all__ = ["LogitsProcessor", "PluginContext", "PluginParamsError", "PluginRegistry", "PluginSpec",
           "SequenceView", "StoppingCriterion"]
