"""One forward a step (issue 42): whatever shares the forward, a row's bits are its own.

A step feeds pieces of prompts, the running rows' last tokens and drafts in one forward (engine/scheduler.py,
engine/batch.py). That keeps the replay guarantee only if every position's logits are the bits the row gets
alone. A property test drives a runner through random mixes of joins, prompt pieces, decode rows, drafts (kept
in part: trims) and leaves (the last row moving into the hole), and compares every position's logits with one
forward of the row's whole history on a runner of its own. Per family (dense and q4), per weight mode of the
tiny default-shaped model (dense, fp16, q8, q4), and per GGUF block type. Plus the plan itself: the step's
budget holds, and no running row is ever left out of a step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.engine import Collector
from helpers.gguf_writer import tiny_loaded_from_gguf, write_gguf
from helpers.requirements import missing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_families import FAMILIES, build

from proctor.domain import GenerationRequest, StoppingParams
from proctor.engine.status import RequestStatus
from proctor.executor import fused_decode
from proctor.executor.gguf_linear import BLOCK_TYPES
from proctor.executor.protocol import Feed
from proctor.executor.slot_forward import SlotForward
from proctor.executor.smoothing import calibration_ids
from proctor.executor.weights import fbgemm_available

SLOTS = 4
STEPS = 5
MIX = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow])


def kernels() -> None:
    if not fbgemm_available() or fused_decode.load_problem() is not None:
        missing(f"the decode kernels: {fused_decode.load_problem() or 'no fbgemm'}")


@dataclass
class Row:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)  # in the cache
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # position → the logits computed there

    @property
    def pending(self) -> list[int]:
        return self.prompt[len(self.tokens):] if len(self.tokens) < len(self.prompt) else []


def run_mix(make: Callable[[int], Any], data: st.DataObject, vocab: int) -> list[Row]:
    """Drive a runner of SLOTS slots through a random mix; every row that ever ran, with its recorded logits."""
    token = st.integers(3, vocab - 1)
    runner = make(SLOTS)
    rows: list[Row] = []
    gone: list[Row] = []
    for _ in range(STEPS):
        if rows and data.draw(st.booleans(), "leave"):  # engine/batch.remove: the last row moves into the hole
            index = data.draw(st.integers(0, len(rows) - 1))
            last = len(rows) - 1
            if index != last:
                runner.move(last, index)
            else:
                runner.free(index)
            gone.append(rows[index])
            rows[index] = rows[last]
            rows.pop()
        while len(rows) < SLOTS and data.draw(st.booleans(), "join"):
            rows.append(Row(data.draw(st.lists(token, min_size=1, max_size=90), "prompt")))
        feeds = []
        for slot, row in enumerate(rows):
            pending = row.pending
            if pending:  # a piece of its prompt
                tokens = pending[:data.draw(st.integers(1, len(pending)), "piece")]
            else:  # its last token and a draft (any tokens: each position's bits must still be its own)
                tokens = data.draw(st.lists(token, min_size=1, max_size=4), "decode")
            feeds.append(Feed(slot, tokens, data.draw(st.integers(0, len(tokens)), "logits")))
        if not feeds:
            continue
        out = runner.forward(feeds)
        assert out.shape[0] == sum(feed.logits for feed in feeds)
        offset = 0
        for feed, row in zip(feeds, rows, strict=True):
            end = len(row.tokens) + len(feed.tokens)
            row.tokens += feed.tokens
            for index in range(feed.logits):
                row.logits[end - feed.logits + index] = out[offset + index]
            offset += feed.logits
        for slot, (feed, row) in enumerate(zip(feeds, rows, strict=True)):
            if len(row.tokens) > len(row.prompt) and len(feed.tokens) > 1 and data.draw(st.booleans(), "trim"):
                keep = data.draw(st.integers(len(row.tokens) - len(feed.tokens) + 1, len(row.tokens)), "keep")
                runner.trim(slot, keep)
                del row.tokens[keep:]
                row.logits = {position: value for position, value in row.logits.items() if position < keep}
        assert runner.lengths[:len(rows)] == [len(row.tokens) for row in rows]
    return gone + rows


def check_mix(make: Callable[[int], Any], data: st.DataObject, vocab: int, label: str) -> None:
    with torch.inference_mode():
        for row in run_mix(make, data, vocab):
            if not row.logits:
                continue
            alone = make(1).forward([Feed(0, row.tokens, len(row.tokens))])
            for position, value in row.logits.items():
                assert torch.equal(value, alone[position]), (
                    f"{label}: position {position} of a row of {len(row.tokens)} differs from the row alone "
                    f"(max gap {(value - alone[position]).abs().max():.3g})")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, build(request.param)


@pytest.mark.parametrize("weights", ["dense", "q4"])
@MIX
@given(data=st.data())
def test_every_family_keeps_each_rows_bits_in_any_mix(family: tuple[str, Any], weights: str,
                                                     data: st.DataObject) -> None:
    name, model = family
    if weights != "dense":
        kernels()
    check_mix(lambda slots: SlotForward(model, slots, torch.device("cpu"), weights), data,
              model.config.vocab_size, f"{name} {weights}")


@pytest.mark.parametrize("weights", ["dense", "fp16", "q8", "q4"])
@MIX
@given(data=st.data())
def test_every_weight_mode_keeps_each_rows_bits_in_any_mix(tiny_model, tokenizer, weights: str,  # type: ignore[no-untyped-def]
                                                           data: st.DataObject) -> None:
    if weights != "dense":
        kernels()
    calibration = calibration_ids(tokenizer)
    check_mix(lambda slots: SlotForward(tiny_model, slots, torch.device("cpu"), weights, calibration), data,
              tiny_model.config.vocab_size, weights)


@pytest.fixture(scope="module", params=sorted(BLOCK_TYPES), ids=[BLOCK_TYPES[t][0] for t in sorted(BLOCK_TYPES)])
def block_model(request: pytest.FixtureRequest, default_gguf: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[str, Any, int]:
    kernels()
    name = BLOCK_TYPES[request.param][0]
    # 256 inputs a row: the K types' blocks are 256 weights long.
    model = build("llama", hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    path = write_gguf(model, default_gguf, tmp_path_factory.mktemp("blocks") / f"{name}.gguf", matrix_type=name)
    return name, tiny_loaded_from_gguf(path), model.config.vocab_size  # the file's tokenizer is larger


@MIX
@given(data=st.data())
def test_every_gguf_block_type_keeps_each_rows_bits_in_any_mix(block_model: tuple[str, Any, int],
                                                               data: st.DataObject) -> None:
    name, model, vocab = block_model
    check_mix(lambda slots: SlotForward(model, slots, torch.device("cpu"), "gguf"), data, vocab, f"gguf {name}")


def test_a_prompt_fed_as_rows_is_the_models_forward(family: tuple[str, Any]) -> None:
    """The rows path computes a prompt as transformers does (float32, within 1e-4), not only consistently."""
    name, model = family
    ids = torch.randint(3, model.config.vocab_size, (48,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        ours = SlotForward(model, 1, torch.device("cpu")).forward([Feed(0, ids, len(ids))])
        theirs = model(input_ids=torch.tensor([ids])).logits[0].float()
    assert (ours - theirs).abs().max().item() < 1e-4, name


def request(request_id: str, prompt: str, n: int) -> GenerationRequest:
    return GenerationRequest(request_id=request_id, prompt=prompt,
                             stopping=StoppingParams(max_new_tokens=n, ignore_eos=True))


def test_the_plan_keeps_the_budget_and_feeds_every_running_row_every_step(make_engine) -> None:  # type: ignore[no-untyped-def]
    budget = 24
    engine = make_engine(start=False, max_batch_size=4, max_step_tokens=budget, speculation="on")
    long = " ".join(f"line {i} of a long prompt" for i in range(20))
    sinks = {name: Collector() for name in ("a", "b", "c", "d", "e")}
    for name, prompt in zip(sinks, ("Hi", long, "Hello there", long, "One two three four"), strict=True):
        engine.submit(engine.prepare(request(name, prompt, 10)), sinks[name])
    plans = []
    original = engine._scheduler.plan

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        running = [state for state in engine._batch.states if state.status is RequestStatus.RUNNING]
        plan = original(*args, **kwargs)
        plans.append((plan, running))
        return plan

    engine._scheduler.plan = recorded
    with torch.inference_mode():
        for _ in range(200):
            if not engine._step():
                break
    assert all(sink.done.is_set() and len(sink.token_ids) == 10 for sink in sinks.values())
    mixed = 0
    for plan, running in plans:
        fed = [feed.state for feed in plan.feeds if not feed.prompt]
        assert [id(state) for state in fed] == [id(state) for state in running]
        singles = len(fed) + sum(len(feed.tokens) for feed in plan.feeds if feed.prompt)
        assert plan.tokens <= max(budget, singles) and singles <= budget, plan.tokens
        mixed += bool(fed) and any(feed.prompt for feed in plan.feeds)
    assert mixed, "no step fed a prompt beside decoding rows"
