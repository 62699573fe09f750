"""Turning a validated request into prompt token ids and resolved limits (before admission).

Runs on the caller's side (a worker thread), not on the decode thread: chat templating and
tokenizing a long prompt must not stall other requests. Errors name the request field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proctor.domain import GenerationRequest, RequestValidationError

if TYPE_CHECKING:
    from proctor.constraints.service import PreparedConstraint


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    request: GenerationRequest
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    length_detail: str
    constraint: PreparedConstraint | None = None


def render_prompt(tokenizer: Any, request: GenerationRequest) -> tuple[str, bool]:
    """Return (text, add_special_tokens). Chat messages go through the model's chat template."""
    if request.messages is None:
        return request.prompt or "", True
    if not getattr(tokenizer, "chat_template", None):
        raise RequestValidationError.single("messages", "this model has no chat template; send a plain prompt")
    turns = [{"role": m.role, "content": m.content} for m in request.messages]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return text, False


def prepare_request(tokenizer: Any, request: GenerationRequest, *, context_length: int,
                    default_max_new_tokens: int, max_new_tokens_limit: int,
                    vocab_size: int | None = None) -> PreparedRequest:
    if vocab_size is not None:
        for index, token_id in enumerate(request.stopping.stop_token_ids):
            if token_id >= vocab_size:
                raise RequestValidationError.single(
                    f"stopping.stop_token_ids[{index}]", f"{token_id} is outside the vocabulary (size {vocab_size})")
    text, add_special = render_prompt(tokenizer, request)
    field = "messages" if request.messages is not None else "prompt"
    ids = tokenizer(text, add_special_tokens=add_special)["input_ids"]
    if not ids:
        raise RequestValidationError.single(field, "the input encodes to zero tokens")
    if len(ids) >= context_length:
        raise RequestValidationError.single(
            field, f"the input is {len(ids)} tokens; the model's context is {context_length} tokens "
                   "and at least one must remain for output")
    requested = request.stopping.max_new_tokens
    budget = min(requested if requested is not None else default_max_new_tokens, max_new_tokens_limit)
    room = context_length - len(ids)
    detail = ""
    if room < budget:
        detail = f"capped at {room} new tokens by the context length ({context_length})"
        budget = room
    return PreparedRequest(request, tuple(ids), budget, detail)
