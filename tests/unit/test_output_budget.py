"""The output budget (domain/output_budget.py): one resolution of max/min new tokens, asked by every stage."""

from __future__ import annotations

import pytest

from proctor.api.callers import Caller, CallerLimits
from proctor.api.check_request import check_request
from proctor.config import Settings
from proctor.domain import RequestValidationError, StoppingParams
from proctor.domain.output_budget import OutputBudget, OutputLimits, output_budget
from proctor_client import build_request

LIMITS = OutputLimits(server_default=256, server_cap=4096, caller_cap=32, caller_name="small")


def fields(error: pytest.ExceptionInfo[RequestValidationError]) -> list[str]:
    return [violation.field for violation in error.value.violations]


def test_the_caller_cap_lowers_the_default_and_a_minimum_above_it_is_refused() -> None:
    assert output_budget(StoppingParams(), LIMITS) == OutputBudget(32, 0)
    assert output_budget(StoppingParams(min_new_tokens=32), LIMITS) == OutputBudget(32, 32)
    with pytest.raises(RequestValidationError) as error:  # issue 55's defect: it was served 32 tokens, LENGTH
        output_budget(StoppingParams(min_new_tokens=40), LIMITS)
    assert fields(error) == ["stopping.min_new_tokens"]
    assert "40 exceeds max_new_tokens (32, caller 'small''s cap)" in error.value.violations[0].description


def test_an_explicit_maximum_is_held_to_both_caps_and_named() -> None:
    assert output_budget(StoppingParams(max_new_tokens=20, min_new_tokens=5), LIMITS) == OutputBudget(20, 5)
    with pytest.raises(RequestValidationError, match="at most 32 new tokens, got 33") as error:
        output_budget(StoppingParams(max_new_tokens=33), LIMITS)
    assert fields(error) == ["stopping.max_new_tokens"]
    with pytest.raises(RequestValidationError) as error:
        output_budget(StoppingParams(max_new_tokens=0, min_new_tokens=-1), LIMITS)
    assert fields(error) == ["stopping.max_new_tokens", "stopping.min_new_tokens"]
    open_server = OutputLimits(server_default=256, server_cap=100)
    assert output_budget(StoppingParams(), open_server).max_new_tokens == 100  # the default never passes the cap
    with pytest.raises(RequestValidationError, match="server cap 100"):
        output_budget(StoppingParams(max_new_tokens=101), open_server)


def test_the_front_check_resolves_the_budget_once_with_the_callers_cap() -> None:
    caller = Caller("small", frozenset({"generate"}), limits=CallerLimits(max_new_tokens=32))
    settings = Settings()
    resolved = check_request(build_request(prompt="hi"), settings, time_remaining_s=None, caller=caller)
    assert resolved.stopping.max_new_tokens == 32  # written in: the engine and the record read the same number
    with pytest.raises(RequestValidationError) as error:
        check_request(build_request(prompt="hi", min_new_tokens=40), settings, time_remaining_s=None, caller=caller)
    assert fields(error) == ["stopping.min_new_tokens"]
    with pytest.raises(RequestValidationError) as error:  # forced positions are checked against the resolved cap
        check_request(build_request(prompt="hi", forced_tokens={40: 7}), settings, time_remaining_s=None,
                      caller=caller)
    assert fields(error) == ["sampling.forced_tokens[40]"]


def test_the_context_lowers_the_maximum_and_refuses_a_minimum_it_cannot_hold() -> None:
    budget = OutputBudget(100, 10)
    assert budget.within_context(500, 2048) is budget
    capped = budget.within_context(40, 2048)
    assert capped == OutputBudget(40, 10, "capped at 40 new tokens by the context length (2048)")
    with pytest.raises(RequestValidationError, match="the 8 new tokens the context") as error:
        budget.within_context(8, 2048)
    assert fields(error) == ["stopping.min_new_tokens"]


def test_every_stage_reads_the_same_counts() -> None:
    budget = OutputBudget(4, 2)
    assert [budget.left(n) for n in range(6)] == [4, 3, 2, 1, 0, 0]
    assert [budget.reached(n) for n in range(5)] == [False, False, False, False, True]
    assert [budget.last_step(n) for n in range(5)] == [False, False, False, True, True]
    assert [budget.holds_end(n) for n in range(4)] == [True, True, False, False]
    assert [budget.draft_room(n) for n in range(4)] == [3, 2, 1, 0]
    budget.require(4, "four tokens")
    with pytest.raises(RequestValidationError, match="4 tokens cannot hold five tokens: ask for at least 5"):
        budget.require(5, "five tokens")
