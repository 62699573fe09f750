"""A request's reasoning section: whether the model thinks before it answers, and for how long (issue 56).

Models that think first (Qwen3, DeepSeek-R1 distills, SmolLM3) write a thought between two markers (``<think>`` and
``</think>``) and then the answer. Inside the thought the model is free (forbidden phrases and the audit still
apply); the constraint starts after the end marker. ``max_tokens`` bounds the thought's own tokens (the markers not
counted, as vLLM's ``thinking_token_budget``): at that count the end marker is forced. ``exclude`` keeps the thought
out of the answer (the audit record still holds it).

The doors read their own fields into these: gRPC ``GenerateRequest.reasoning``; HTTP ``chat_template_kwargs
.enable_thinking``, ``thinking_token_budget``, ``reasoning_effort`` and the Responses API's ``reasoning``.
"""

from __future__ import annotations

from dataclasses import dataclass

# OpenAI's ``reasoning_effort`` as a thought budget in tokens (README: reasoning models). "minimal" thinks not at
# all: the end marker is forced at once.
EFFORT_TOKENS = {"minimal": 0, "low": 512, "medium": 2048, "high": 8192}
MAX_REASONING_TOKENS = 1 << 20  # a bound on the wire value (the output budget bounds it in practice)


@dataclass(frozen=True, slots=True)
class ReasoningParams:
    """``enabled``: None follows the model's chat template (a thinking model thinks); ``max_tokens``: None is
    unbounded (the output budget still ends the thought in time for the answer)."""

    enabled: bool | None = None
    max_tokens: int | None = None
    exclude: bool = False

    def shown(self, thought: str) -> str:
        """The thought as the caller sees it: none with ``exclude`` (the audit record still holds it)."""
        return "" if self.exclude else thought

    @property
    def asked(self) -> bool:
        """Whether the request says anything about reasoning."""
        return self.enabled is not None or self.max_tokens is not None or self.exclude

