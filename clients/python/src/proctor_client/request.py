"""Build a GenerateRequest from keyword arguments, setting only what the caller gave.

Optional proto fields have explicit presence: ``temperature=0`` (greedy) is sent as present, while
``temperature=None`` leaves it unset so the server default applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from proctor_client.v1 import generation_pb2

MessageLike = tuple[str, str] | Mapping[str, str] | generation_pb2.ChatMessage


def build_request(
    prompt: str | None = None,
    messages: Sequence[MessageLike] | None = None,
    *,
    request_id: str = "",
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    no_repeat_ngram_size: int | None = None,
    seed: int | None = None,
    max_new_tokens: int | None = None,
    min_new_tokens: int | None = None,
    stop: Sequence[str] | str = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    top_logprobs: int | None = None,
    token_details: bool = False,
) -> generation_pb2.GenerateRequest:
    """Return a request with exactly one of ``prompt`` (raw text) or ``messages`` (chat turns).

    Raises ValueError when both or neither input is given, or a message is malformed; range checks are left
    to the server, which names the offending field.
    """
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt or messages")
    request = generation_pb2.GenerateRequest(request_id=request_id, token_details=token_details)
    if prompt is not None:
        request.prompt = prompt
    else:
        assert messages is not None
        if isinstance(messages, str | bytes) or not messages:
            raise ValueError("messages must be a non-empty sequence of (role, content) pairs or mappings")
        request.messages.messages.extend(_chat_message(m, i) for i, m in enumerate(messages))

    sampling = {
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "no_repeat_ngram_size": no_repeat_ngram_size,
        "seed": seed,
    }
    for name, value in sampling.items():
        if value is not None:
            setattr(request.sampling, name, value)

    if max_new_tokens is not None:
        request.stopping.max_new_tokens = max_new_tokens
    if min_new_tokens is not None:
        request.stopping.min_new_tokens = min_new_tokens
    # A bare string is one stop string, not a sequence of one-character stops.
    request.stopping.stop.extend([stop] if isinstance(stop, str) else stop)
    request.stopping.stop_token_ids.extend(stop_token_ids)
    if ignore_eos:
        request.stopping.ignore_eos = True
    if top_logprobs is not None:
        request.top_logprobs = top_logprobs
    return request


def _chat_message(message: MessageLike, index: int) -> generation_pb2.ChatMessage:
    """Convert one (role, content) pair, {"role", "content"} mapping or ChatMessage."""
    if isinstance(message, generation_pb2.ChatMessage):
        return message
    if isinstance(message, Mapping):
        try:
            role, content = message["role"], message["content"]
        except KeyError as missing:
            raise ValueError(f"messages[{index}] lacks the key {missing}") from None
    elif isinstance(message, tuple) and len(message) == 2:
        role, content = message
    else:
        raise ValueError(f"messages[{index}] must be a (role, content) pair or a mapping, got {type(message).__name__}")
    if not isinstance(role, str) or not isinstance(content, str):
        raise ValueError(f"messages[{index}]: role and content must be strings")
    return generation_pb2.ChatMessage(role=role, content=content)
