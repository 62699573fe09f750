"""Fewer steps for the same tokens, on the real default model: none of them may change a bit of a result.

- **Jump-forward and speculation** (engine/drafting.py, engine/verify.py): greedy outputs, their
  log-probabilities and alternatives are the stepwise path's on the registered schemas, both contract
  templates and 20 plain prompts; seeded sampling draws the same; rows extending beside other rows keep
  their bits; and the drafts were really taken (the test fails if the features never ran).
- **Prefix cache** (engine/prefix_cache.py): a request's tokens and log-probabilities are the same bits with
  the cache empty, partly filled, full, and in a batch; under a small budget, prompts of the same length that
  differ in one chunk never reuse each other's chunks after evictions, and memory stays within the budget;
  a request without a cache scope leaves nothing behind, and one caller's chunks are not another's.
- **Replay** over gRPC of a record made with every feature on is exact.

Each engine here is built on the session server's loaded model and constraint service.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.engine import Collector, tiny_settings

from proctor.contracts.attempt_plans import render_messages
from proctor.contracts.specialise import specialise
from proctor.contracts.templates import TemplateRegistry
from proctor.domain import (
    ChatMessage,
    ConstraintRequest,
    GenerationRequest,
    RepetitionParams,
    SamplingParams,
    StoppingParams,
)
from proctor.engine.engine import Engine

pytestmark = pytest.mark.real_model

OFF = {"jump_forward": False, "speculation": "off", "prefix_cache_mb": 0}
ON = {"speculation": "on"}
PLAIN_PROMPTS = [
    "Write a haiku about the sea.", "List three fruits:", "What is the capital of France?",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "Count from one to ten in words:", "Translate to French: good morning", "Name a planet.",
    "Explain what a contract is.", "你好，请介绍一下你自己。", "Once upon a time, in a small village,",
    "The Receiving Party shall keep the Confidential Information secret. The Receiving Party shall",
    "Give me a recipe for pancakes.", "Why is the sky blue?", "Write a limerick about a cat.",
    "A, B, C, D, E, F,", "Summarise: the supplier delivers the goods; the buyer pays within 30 days.",
    "Describe a sunset in two sentences.", "What are prime numbers?", "Monday, Tuesday, Wednesday,",
    "Tell me a joke about lawyers.",
]
RULES = "".join(f"Rule {i}: answers name the clause they rely on and never invent facts about the parties. "
                for i in range(40))  # about 800 tokens: six chunks of 128


@pytest.fixture(scope="module")
def audit(server: Any) -> Iterator[Any]:
    import grpc

    from proctor_client.v1 import audit_pb2_grpc

    channel = grpc.insecure_channel(server.address)
    yield audit_pb2_grpc.AuditStub(channel)
    channel.close()


def start(server: Any, **overrides: Any) -> Engine:
    engine = Engine(server.running.engine.loaded, tiny_settings(**overrides),
                    constraints=server.running.engine.constraints)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def engines(server: Any) -> Iterator[dict[str, Engine]]:
    built = {"off": start(server, **OFF), "on": start(server, **ON)}
    yield built
    for engine in built.values():
        engine.shutdown(1)


def outcome(engine: Engine, request: GenerationRequest) -> tuple[list[int], list[Any], Any]:
    events = engine.generate_blocking(request, timeout_s=300)
    details = [(d.token_id, d.logprob, d.final_logprob, d.top_logprobs) for e in events for d in e.details]
    return [t for e in events for t in e.token_ids], details, events[-1].usage


def same_on_both(engines: dict[str, Engine], request: GenerationRequest) -> Any:
    """The request's tokens and details on the stepwise engine and with every feature on; the usage with them."""
    off = outcome(engines["off"], request)
    on = outcome(engines["on"], request)
    assert on[0] == off[0], f"{request.request_id}: the tokens differ"
    assert on[1] == off[1], f"{request.request_id}: the log-probabilities or alternatives differ"
    return on[2]


def detailed(request_id: str, **fields: Any) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, token_details=True, top_logprobs=3, **fields)


def test_greedy_plain_prompts_are_the_stepwise_tokens(engines: dict[str, Engine]) -> None:
    accepted = 0
    for index, prompt in enumerate(PLAIN_PROMPTS):
        usage = same_on_both(engines, detailed(f"plain-{index}", prompt=prompt,
                                               stopping=StoppingParams(max_new_tokens=32)))
        accepted += usage.accepted_tokens
        assert usage.decode_steps + 1 + usage.accepted_tokens == usage.completion_tokens
    assert accepted > 0, "speculation never kept a drafted token: the check compared nothing"


def test_registered_schemas_are_the_stepwise_tokens(server: Any, engines: dict[str, Engine]) -> None:
    registry = server.running.engine.constraints.registry
    refs = [entry.ref for entry in registry.list()]
    assert refs
    forced = 0
    for ref in refs:
        usage = same_on_both(engines, detailed(
            f"schema-{ref}", messages=(ChatMessage("user", f"Fill in a {ref} document as JSON."),),
            stopping=StoppingParams(max_new_tokens=160), constraint=ConstraintRequest("schema_ref", text=ref)))
        forced += usage.accepted_tokens
        assert usage.decode_steps < usage.completion_tokens - 1, f"{ref}: no forced run was extended"
    assert forced > 0


@pytest.mark.parametrize("ref", ["contract/nda", "contract/service-agreement"])
def test_contract_drafts_are_the_stepwise_tokens(server: Any, engines: dict[str, Engine], ref: str) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from contracts import varied_requests  # the benchmark's varied parties, clauses and facts

    templates = TemplateRegistry.load(server.running.engine.constraints.registry)
    template = templates.resolve(ref)
    (contract,) = varied_requests(template, 1, random.Random(27))
    specialised = specialise(template, contract)
    ngram, repeats = template.repetition
    usage = same_on_both(engines, detailed(
        f"draft-{ref}", messages=render_messages(template, contract, specialised),
        stopping=StoppingParams(max_new_tokens=template.max_new_tokens, repetition=RepetitionParams(ngram, repeats)),
        constraint=ConstraintRequest("json_schema", text=specialised.schema_json)))
    assert usage.accepted_tokens > 10, usage


def test_seeded_sampling_draws_the_same(engines: dict[str, Engine]) -> None:
    drafted = 0
    for index, prompt in enumerate(PLAIN_PROMPTS[:6]):
        usage = same_on_both(engines, detailed(f"sampled-{index}", prompt=prompt,
                                               sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=index),
                                               stopping=StoppingParams(max_new_tokens=32)))
        drafted += usage.drafted_tokens
    assert drafted > 0


def test_rows_extending_beside_other_rows_keep_their_bits(engines: dict[str, Engine]) -> None:
    """Six requests at once on the speculating engine, each against itself alone on the stepwise one."""
    requests = [detailed(f"batch-{index}", prompt=prompt, stopping=StoppingParams(max_new_tokens=40))
                for index, prompt in enumerate(PLAIN_PROMPTS[3:9])]
    requests.append(detailed("batch-json", messages=(ChatMessage("user", "A person as JSON."),),
                             stopping=StoppingParams(max_new_tokens=60),
                             constraint=ConstraintRequest("json_schema", text=json.dumps(
                                 {"type": "object", "properties": {"name": {"type": "string"},
                                                                   "kind": {"enum": ["person", "company"]}},
                                  "required": ["name", "kind"]}))))
    alone = [outcome(engines["off"], request)[:2] for request in requests]
    collectors = [Collector() for _ in requests]
    on = engines["on"]
    for request, collector in zip(requests, collectors, strict=True):
        on.submit(on.prepare(request), collector)
    for collector, expected in zip(collectors, alone, strict=True):
        events = collector.wait(300)
        details = [(d.token_id, d.logprob, d.final_logprob, d.top_logprobs) for e in events for d in e.details]
        assert (collector.token_ids, details) == expected


def cached(request_id: str, system: str, question: str, scope: str | None = "tests") -> GenerationRequest:
    return detailed(request_id, messages=(ChatMessage("system", system), ChatMessage("user", question)),
                    stopping=StoppingParams(max_new_tokens=6), prefix_cache_scope=scope)


def test_the_prefix_cache_gives_the_same_bits_at_every_cache_state(engines: dict[str, Engine]) -> None:
    system = "Cache states. " + RULES
    other_tail = "Cache states. " + RULES[:1000] + "A different ending of the rules from here on. " * 12
    on = engines["on"]
    states = []
    for request_id, text, question in [("empty", system, "Which rule is about facts?"),
                                       ("partial", other_tail, "Which rule is about facts?"),
                                       ("full", system, "Which rule names clauses?"),
                                       ("again", system, "Which rule is about facts?")]:
        request = cached(f"cache-{request_id}", text, question)
        expected = outcome(engines["off"], request)
        got = outcome(on, request)
        assert got[:2] == expected[:2], f"{request_id}: the cache changed the result"
        states.append(got[2].cached_prompt_tokens)
    assert states[0] == 0
    assert 0 < states[1] < states[2], states  # the shared first chunks only, then every chunk but the last token's
    assert states[3] == states[2]
    # In a batch: the full hit again, beside two other rows.
    collectors = [Collector() for _ in range(3)]
    batch = [cached("cache-batch", system, "Which rule is about facts?"),
             detailed("cache-side-1", prompt=PLAIN_PROMPTS[0], stopping=StoppingParams(max_new_tokens=20)),
             detailed("cache-side-2", prompt=PLAIN_PROMPTS[4], stopping=StoppingParams(max_new_tokens=20))]
    for request, collector in zip(batch, collectors, strict=True):
        on.submit(on.prepare(request), collector)
    events = collectors[0].wait(300)
    details = [(d.token_id, d.logprob, d.final_logprob, d.top_logprobs) for e in events for d in e.details]
    assert (collectors[0].token_ids, details) == outcome(engines["off"], batch[0])[:2]
    assert events[-1].usage.cached_prompt_tokens == states[2]


def test_a_small_budget_evicts_and_never_reuses_the_wrong_chunk(server: Any, engines: dict[str, Engine]) -> None:
    small = start(server, prefix_cache_mb=6)  # two chunks of 128 tokens of this model (2.9 MB each)
    try:
        budget = small.prefix_cache.capacity_bytes
        assert small.prefix_cache.enabled
        # Same lengths, differing in the first token only (every chunk's key differs), or in the last chunk only.
        prompts = {"a": "A. " + RULES[:1400], "b": "B. " + RULES[:1400], "c": "A. " + RULES[:1200] + "C" * 200}
        for name in ("a", "b", "c", "a", "b", "c", "a"):
            request = cached(f"evict-{name}", prompts[name], "Which rule is about facts?")
            assert outcome(small, request)[:2] == outcome(engines["off"], request)[:2], name
            assert small.prefix_cache.counts.bytes <= budget
        assert small.prefix_cache.counts.evicted_chunks > 0
        assert len(small.prefix_cache) <= 2
    finally:
        small.shutdown(1)


def test_no_scope_leaves_nothing_and_scopes_do_not_share(server: Any) -> None:
    engine = start(server)
    try:
        prompt = "Scopes. " + RULES[:1500]
        _, _, usage = outcome(engine, cached("private", prompt, "Which rule?", scope=None))
        assert len(engine.prefix_cache) == 0 and usage.cached_prompt_tokens == 0
        outcome(engine, cached("alice-1", prompt, "Which rule?", scope="alice"))
        stored = len(engine.prefix_cache)
        assert stored > 0
        assert outcome(engine, cached("bob-1", prompt, "Which rule?", scope="bob"))[2].cached_prompt_tokens == 0
        assert outcome(engine, cached("alice-2", prompt, "Which rule?", scope="alice"))[2].cached_prompt_tokens > 0
    finally:
        engine.shutdown(1)


def test_a_record_made_with_every_feature_on_replays_exactly(client: Any, audit: Any) -> None:
    from proctor_client.v1 import audit_pb2

    system = "Replay. " + RULES
    first = client.generate(messages=[("system", system), ("user", "Give the rule about facts as JSON.")],
                            json_schema={"type": "object", "properties": {"rule": {"type": "integer"},
                                                                          "why": {"type": "string"}},
                                         "required": ["rule", "why"]},
                            max_new_tokens=60, speculation="on")
    second = client.generate(messages=[("system", system), ("user", "Give the rule about clauses as JSON.")],
                             json_schema={"type": "object", "properties": {"rule": {"type": "integer"},
                                                                           "why": {"type": "string"}},
                                          "required": ["rule", "why"]},
                             max_new_tokens=60, speculation="on")
    assert second.usage.cached_prompt_tokens > 0 and second.usage.accepted_tokens > 0, second.usage
    for original in (first, second):
        result = audit.Replay(audit_pb2.ReplayRequest(audit_id=original.audit_id), timeout=300)
        assert result.exact_match, result.message
        record = json.loads(audit.GetRecord(audit_pb2.GetRecordRequest(audit_id=original.audit_id)).record_json)
        assert record["usage"]["drafted_tokens"] == original.usage.drafted_tokens
