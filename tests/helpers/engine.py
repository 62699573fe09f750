"""Helpers for engine tests: settings without warm-up, an event sink that collects a request's events, and a
plain and a beam request served together."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from proctor.config import Settings
from proctor.domain import TokenEvent

TINY_CONTEXT = 512


def tiny_settings(**overrides: object) -> Settings:
    """Settings for engine tests: no warm-up, independent of the caller's PROCTOR_* environment."""
    return Settings.load({"warmup": False, "device": "cpu", "dtype": "float32", **overrides}, environ={})


@dataclass
class Collector:
    """An event sink that records a request's events and signals when the final one arrived."""

    events: list[TokenEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    first: threading.Event = field(default_factory=threading.Event)

    def __call__(self, event: TokenEvent) -> None:
        self.events.append(event)
        self.first.set()
        if event.finished:
            self.done.set()

    def wait(self, timeout_s: float = 60) -> list[TokenEvent]:
        assert self.done.wait(timeout_s), "the request did not finish in time"
        return self.events

    @property
    def token_ids(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def final(self) -> TokenEvent:
        return self.events[-1]


def serve_plain_and_beams(engine: Any, prompt: str = "The printing press") -> list[list[int]]:
    """A plain request and a 2-beam one of 4 tokens each, in one batch on ``engine``: each one's token ids (the
    engine tests of the other executors compare them with the default step's)."""
    from proctor.domain import GenerationRequest, SamplingParams, StoppingParams

    stopping = StoppingParams(max_new_tokens=4, ignore_eos=True)
    requests = [GenerationRequest(request_id="plain", prompt=prompt, stopping=stopping),
                GenerationRequest(request_id="beams", prompt="The printing press", stopping=stopping,
                                  sampling=SamplingParams(num_beams=2))]
    sinks = [Collector() for _ in requests]
    for request, sink in zip(requests, sinks, strict=True):
        engine.submit(engine.prepare(request), sink)
    for sink in sinks:
        sink.wait(300)
        assert sink.final.error is None, sink.final.error
    return [sink.token_ids for sink in sinks]


def with_constraints(engine: Any, loaded: Any, model_dir: Any) -> Any:
    """``engine`` (not started) with constraints compiled in-process for ``loaded``'s tokenizer, started."""
    from proctor.constraints.compiler import ConstraintCompiler
    from proctor.constraints.service import ConstraintService

    compiler = ConstraintCompiler(tokenizer=loaded.tokenizer, model_path=str(model_dir), vocab_size=loaded.vocab_size,
                                  eos_token_ids=loaded.eos_token_ids, tokenizer_fingerprint="tiny", isolate=False)
    engine.constraints = ConstraintService(compiler)
    engine.start()
    return engine
