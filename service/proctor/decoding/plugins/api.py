"""What a plugin is: a name, a version and a factory that turns request parameters into an instance.

A plugin instance belongs to one request. It sees that request's state through ``SequenceView``
(never the batch): the prompt and generated token ids and the text released so far.

* A **logits processor** is called once per step with the request's logits row ``[V]`` (float32,
  after the masks) and changes it in place. It cannot bring back a masked token: the masks are
  applied again after all processors.
* A **stopping criterion** is called after each committed token and returns ``None`` to go on or
  a short reason to stop (the request then ends with ``STOP_CRITERION`` and that reason).

``create(params, context)`` receives the request's parameters as plain JSON values and raises
``PluginParamsError`` (or ``ValueError``) with a message for bad ones: the caller gets
``INVALID_ARGUMENT`` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

Kind = Literal["logits_processor", "stopping_criterion"]


class PluginParamsError(ValueError):
    """Bad parameters for a plugin; the message is shown to the caller."""


class SequenceView(Protocol):
    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def generated(self) -> Sequence[int]: ...
    @property
    def text(self) -> str: ...


class LogitsProcessor(Protocol):
    def __call__(self, view: SequenceView, logits: torch.Tensor) -> None: ...


class StoppingCriterion(Protocol):
    def __call__(self, view: SequenceView) -> str | None: ...


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a factory may need about the loaded model."""

    tokenizer: Any
    vocab_size: int
    eos_token_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class PluginSpec:
    name: str
    version: str
    kind: Kind
    create: Callable[[dict[str, Any], PluginContext], LogitsProcessor | StoppingCriterion]
    description: str = ""
