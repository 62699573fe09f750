"""What a plugin is: a name, a version and a factory that turns request parameters into an instance.

A plugin instance belongs to one request. It sees that request's state through ``SequenceView``
(never the batch): the prompt and generated token ids and the text released so far.

* A **logits processor** is called once per step with the request's logits row ``[V]`` (float32,
  after the masks) and changes it in place. It cannot bring back a masked token: the masks are
  applied again after all processors.
* A **stopping criterion** is called after each committed token and returns ``None`` to go on or
  a short reason to stop (the request then ends with ``STOP_CRITERION`` and that reason).
* An **input screen** is called once, before any generation, with the rendered input
  (``ScreenInput``) and returns a ``Verdict``: allow, or block (the call is answered with a
  canned reply, finish reason ``BLOCKED``).
* An **output moderator** is called once with the finished output (``ModerationInput``) and
  returns a ``Verdict``: allow, or block (the output is withheld and replaced by a canned reply,
  finish reason ``MODERATED``; the audit record keeps the withheld output).

Screens and moderators never touch tensors: this module imports torch only for type checking, so
the API layer (which runs them, see ``moderation.py``) stays torch-free.

``create(params, context)`` receives the request's parameters as plain JSON values and raises
``PluginParamsError`` (or ``ValueError``) with a message for bad ones: the caller gets
``INVALID_ARGUMENT`` naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import torch

Kind = Literal["logits_processor", "stopping_criterion", "input_screen", "output_moderator"]


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
class ScreenInput:
    """What an input screen sees: the input as the model would see it (chat template applied) and,
    for a chat request, the messages as sent (role, content); ``None`` for a plain prompt."""

    text: str
    messages: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True, slots=True)
class ModerationInput:
    """What an output moderator sees: the finished output and the input it answers."""

    output: str
    input: ScreenInput


@dataclass(frozen=True, slots=True)
class Verdict:
    """A screen's or moderator's decision. ``reply`` (block only) is the text the caller gets instead;
    empty: the plugin's default. ``reason`` is recorded in the audit trail and returned to the caller,
    so it should name the rule that fired, not quote the input or output."""

    allowed: bool
    score: float | None = None
    reason: str = ""
    reply: str = ""

    @classmethod
    def allow(cls, score: float | None = None, reason: str = "") -> Verdict:
        return cls(True, score, reason)

    @classmethod
    def block(cls, reason: str, reply: str, score: float | None = None) -> Verdict:
        return cls(False, score, reason, reply)


class InputScreen(Protocol):
    def __call__(self, screen_input: ScreenInput) -> Verdict: ...


class OutputModerator(Protocol):
    def __call__(self, moderation_input: ModerationInput) -> Verdict: ...


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
    create: Callable[[dict[str, Any], PluginContext],
                     LogitsProcessor | StoppingCriterion | InputScreen | OutputModerator]
    description: str = ""
