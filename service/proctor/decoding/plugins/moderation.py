"""Running input screens and output moderators for one call (docs/plugins.md, "Screens and moderators").

Torch-free on purpose: the API layer runs these, once per call, off the decode loop. Screens run in
request order and the first block ends the screening (later screens do not run); moderators all run
on the same output, and the first block decides the reply. A plugin that raises, or returns something
other than a ``Verdict``, fails its own call only (``ModerationFault`` → INTERNAL): the call never
falls back to the unscreened input or the unmoderated output.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proctor.decoding.plugins.api import ModerationInput, ScreenInput, Verdict
from proctor.domain import EngineFault, ModerationVerdict

log = logging.getLogger("proctor.plugins")
DEFAULT_REPLY = "I'm sorry, but I can't help with that."


@dataclass(frozen=True, slots=True)
class ModerationPlugin:
    """One instantiated screen or moderator of a call."""

    name: str
    version: str
    kind: str  # "input_screen" or "output_moderator"
    instance: Callable[[Any], object]  # a Verdict is expected; anything else fails its call (run_plugin)


@dataclass(frozen=True, slots=True)
class Outcome:
    """The verdicts of the plugins that ran; ``blocked_by`` the first that blocked (its ``reply`` is sent)."""

    verdicts: tuple[ModerationVerdict, ...] = ()
    blocked_by: ModerationVerdict | None = None
    reply: str = ""

    @property
    def blocked(self) -> bool:
        return self.blocked_by is not None

    @property
    def detail(self) -> str:
        """The finish detail of a blocked call: which plugin, and why."""
        b = self.blocked_by
        return f"{b.kind}:{b.name}: {b.reason}" if b is not None else ""


class ModerationFault(EngineFault):
    """A screen or moderator failed; the call ends with INTERNAL. ``verdicts``: those recorded, the failed one last."""

    def __init__(self, message: str, verdicts: tuple[ModerationVerdict, ...]) -> None:
        super().__init__(message)
        self.verdicts = verdicts


def _run(plugin: ModerationPlugin, argument: ScreenInput | ModerationInput,
         verdicts: list[ModerationVerdict]) -> tuple[ModerationVerdict, str]:
    """Call one plugin; record its verdict (or the failure, then raise ``ModerationFault``)."""
    try:
        verdict = plugin.instance(argument)
        if not isinstance(verdict, Verdict):
            raise TypeError(f"returned {type(verdict).__name__}, not a Verdict")
        if verdict.score is not None and not (isinstance(verdict.score, int | float) and math.isfinite(verdict.score)):
            raise ValueError(f"score must be a finite number or None, got {verdict.score!r}")
    except Exception as exc:
        log.exception("%s %s failed", plugin.kind, plugin.name)
        message = f"{plugin.kind} {plugin.name} failed: {type(exc).__name__}: {exc}"
        verdicts.append(ModerationVerdict(plugin.name, plugin.version, plugin.kind, "error", None, message))
        raise ModerationFault(message, tuple(verdicts)) from exc
    recorded = ModerationVerdict(plugin.name, plugin.version, plugin.kind, "allow" if verdict.allowed else "block",
                                 None if verdict.score is None else float(verdict.score), str(verdict.reason))
    verdicts.append(recorded)
    return recorded, verdict.reply or DEFAULT_REPLY


def screen_input(screens: Sequence[ModerationPlugin], screen_input: ScreenInput) -> Outcome:
    """Run the screens in order until one blocks."""
    verdicts: list[ModerationVerdict] = []
    for screen in screens:
        recorded, reply = _run(screen, screen_input, verdicts)
        if recorded.verdict == "block":
            return Outcome(tuple(verdicts), recorded, reply)
    return Outcome(tuple(verdicts))


def moderate_output(moderators: Sequence[ModerationPlugin], moderation_input: ModerationInput,
                    earlier: tuple[ModerationVerdict, ...] = ()) -> Outcome:
    """Run every moderator on the output (each verdict is recorded); the first block decides the reply.
    ``earlier``: the screens' verdicts, kept in front."""
    verdicts: list[ModerationVerdict] = list(earlier)
    blocked_by: ModerationVerdict | None = None
    chosen = ""
    for moderator in moderators:
        recorded, reply = _run(moderator, moderation_input, verdicts)
        if recorded.verdict == "block" and blocked_by is None:
            blocked_by, chosen = recorded, reply
    return Outcome(tuple(verdicts), blocked_by, chosen)
