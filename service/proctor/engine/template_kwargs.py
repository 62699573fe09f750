"""The extra variables a request passes to the chat template (``chat_template_kwargs``), checked against it.

vLLM passes them through as they come; a name the template never reads then does nothing, silently. Here a name
is refused (INVALID_ARGUMENT naming ``chat_template_kwargs.<name>``) only when the template cannot take it: the
names it reads are found once per template with jinja2's own parser. ``reasoning.enabled`` becomes
``enable_thinking`` (Qwen3's and SmolLM3's switch) when the template reads that and the caller did not set it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from proctor.domain import GenerationRequest, RequestValidationError

FIELD = "chat_template_kwargs"
# The variables transformers itself passes to every template: never a caller's to set.
RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
                      "bos_token", "eos_token", "unk_token", "pad_token"})


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The names ``template`` reads and does not set itself (jinja2's meta analysis)."""
    import jinja2
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(jinja2.Environment().parse(template)))
    except jinja2.TemplateSyntaxError:
        return frozenset()


def template_kwargs(tokenizer: Any, request: GenerationRequest) -> dict[str, Any]:
    """The request's template variables (RequestValidationError naming a name the template cannot take)."""
    kwargs: dict[str, Any] = json.loads(request.chat_template_kwargs) if request.chat_template_kwargs else {}
    template = getattr(tokenizer, "chat_template", None)
    readable = template_variables(template) if isinstance(template, str) else frozenset()
    bad = sorted(name for name in kwargs if name in RESERVED or name not in readable)
    if bad:
        raise RequestValidationError.single(
            f"{FIELD}.{bad[0]}", f"this model's chat template does not take {', '.join(map(repr, bad))}"
            + (f" (it reads {', '.join(sorted(readable - RESERVED))})" if readable - RESERVED else ""))
    enabled = request.reasoning.enabled
    if enabled is not None and "enable_thinking" in readable and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = enabled
    return kwargs
