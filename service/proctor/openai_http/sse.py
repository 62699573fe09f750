"""A streamed call's answer as server-sent events: chat and completions chunks, or the Responses API's events.

The HTTP status and headers went out with the first event, so a call that fails after it ends its stream with
the error, in OpenAI's error object (openai_http/errors.py), instead of a status. A client that leaves closes the
call's stream of events (its record says CANCELLED and the engine stops the request).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import orjson

from proctor.api.answered import Released
from proctor.openai_http.answers import ChunkWriter
from proctor.openai_http.errors import failure_response
from proctor.openai_http.responses import ResponseEvents

DONE = b"data: [DONE]\n\n"


async def chat_events(writer: ChunkWriter, first: Released, rest: AsyncGenerator[Any, None],
                      param_of: Callable[[str], str]) -> AsyncIterator[bytes]:
    """Server-sent events: OpenAI's chunks, the usage chunk when asked for, then ``[DONE]``."""
    async with contextlib.aclosing(rest):  # a client that leaves closes the call (record, engine abort)
        released: Released | None = first
        while released is not None:
            for out in writer.chunks(released):
                yield _data(out)
            if released.event.finished and writer.call.include_usage:
                yield _data(writer.usage_chunk(released))
            try:
                released = await anext(rest)
            except StopAsyncIteration:
                released = None
            except Exception as exc:  # after the first chunk the status is sent: the error goes in the stream
                yield b"data: " + bytes(failure_response(exc, param_of).body) + b"\n\n"
                released = None
    yield DONE


async def response_events(writer: ChunkWriter, events: ResponseEvents, first: Released,
                          rest: AsyncGenerator[Any, None], param_of: Callable[[str], str]) -> AsyncIterator[bytes]:
    """The Responses API's server-sent events (``event:`` and ``data:`` lines), from the chat stream's chunks."""
    async with contextlib.aclosing(rest):  # a client that leaves closes the call (record, engine abort)
        for name, payload in events.start(first.event.request_id):
            yield _event(name, payload)
        released: Released | None = first
        while released is not None:
            for out in writer.chunks(released):
                for name, payload in events.feed(out):
                    yield _event(name, payload)
                if "proctor" in out:  # the final chunk
                    for name, payload in events.finish(out, writer.usage_chunk(released)["usage"]):
                        yield _event(name, payload)
            try:
                released = await anext(rest)
            except StopAsyncIteration:
                released = None
            except Exception as exc:  # after the first event the status is sent: the error goes in the stream
                error = json.loads(bytes(failure_response(exc, param_of).body))["error"]
                yield _event("error", {"type": "error", "sequence_number": events.sequence, **error})
                released = None


def _data(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
