"""The compile service with real worker processes: time limit kills a runaway compile, the worker is
replaced, AUTO falls back on refusal, results and failures are cached."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proctor.constraints.compiler import CompileLimits, ConstraintCompiler
from proctor.constraints.errors import ConstraintError
from proctor.constraints.spec import ConstraintSpec, GrammarSyntax


@pytest.fixture(scope="module")
def compiler(default_model_dir: Path, tokenizer: object) -> Iterator[ConstraintCompiler]:
    compiler = ConstraintCompiler(tokenizer=tokenizer, model_path=str(default_model_dir), vocab_size=49152,
                                  eos_token_ids=(2,), tokenizer_fingerprint="test",
                                  limits=CompileLimits(timeout_s=1.0))
    compiler.prewarm()
    yield compiler
    compiler.close()


def test_a_runaway_compile_is_killed_at_the_limit_and_the_worker_replaced(compiler: ConstraintCompiler) -> None:
    slow = ConstraintSpec.regex(r"[^\n]{1,900}x[^\n]{1,900}")  # xgrammar takes many seconds on this
    start = time.monotonic()
    with pytest.raises(ConstraintError, match="time limit of 1 s"):
        compiler.compile(slow, "xgrammar")
    assert time.monotonic() - start < 5
    assert compiler.stats()["worker_restarts"] >= 1
    quick = compiler.compile(ConstraintSpec.regex("[0-9]{3}"), "xgrammar")  # a fresh worker serves the next one
    assert quick.backend == "xgrammar" and not quick.cache_hit
    start = time.monotonic()
    with pytest.raises(ConstraintError, match="time limit"):  # the failure is cached: no second wait
        compiler.compile(slow, "xgrammar")
    assert time.monotonic() - start < 0.5


def test_auto_falls_back_and_results_are_cached(compiler: ConstraintCompiler) -> None:
    grammar = ConstraintSpec.grammar('root ::= "yes" | "no"', GrammarSyntax.EBNF)
    first = compiler.compile(grammar)
    assert first.backend == "xgrammar" and not first.cache_hit
    again = compiler.compile(grammar)
    assert again.cache_hit and again.compiled is first.compiled
    schema = ConstraintSpec.json_schema({"type": "integer", "not": {"multipleOf": 2}})
    relaxed = compiler.compile(schema)  # no engine enforces `not`: the validated fallback
    assert relaxed.backend == "llguidance" and not relaxed.exact and relaxed.relaxed == ("not at #",)
    with pytest.raises(ConstraintError) as caught:
        compiler.compile(schema, exact_only=True)
    message = str(caught.value)
    assert "not" in message and "llguidance" in message and "xgrammar" in message


def test_schema_limits_come_from_settings_and_are_checked_on_the_text(compiler: ConstraintCompiler) -> None:
    """Size, then depth, before anything parses the schema (the depth is far past Python's recursion limit)."""
    from proctor.constraints.service import ConstraintService
    from proctor.domain import ConstraintRequest, RequestValidationError

    service = ConstraintService(compiler, max_schema_depth=8)
    deep = '{"type":"array","items":' * 5000 + "{}" + "}" * 5000
    with pytest.raises(RequestValidationError, match=r"5001 levels deep; the limit \(max_schema_depth\) is 8"):
        service.to_spec(ConstraintRequest("json_schema", text=deep))
    big = json.dumps({"enum": ["x" * 1000] * 1100})
    with pytest.raises(RequestValidationError, match=r"the limit \(max_constraint_bytes\) is 1048576"):
        service.to_spec(ConstraintRequest("json_schema", text=big))
    service.to_spec(ConstraintRequest("json_schema", text='{"type":"array","items":{"type":"string"}}'))


def test_a_compile_asked_for_while_the_workers_warm_waits_for_them(default_model_dir: Path, tokenizer: object) -> None:
    """Warm-up off the server's ready path (app.py): a compile that comes first is served by the worker being
    started, not by another one, and the work queued behind the warm-up runs once it is done."""
    compiler = ConstraintCompiler(tokenizer=tokenizer, model_path=str(default_model_dir), vocab_size=49152,
                                  eos_token_ids=(2,), tokenizer_fingerprint="test-background")
    warmed: list[float] = []
    try:
        compiler.prewarm(lambda: warmed.append(time.monotonic()), background=True)
        result = compiler.compile(ConstraintSpec.regex("[a-c]{2}"), "llguidance")
        assert result.backend == "llguidance" and not result.cache_hit
        assert compiler.stats()["worker_restarts"] == 0
        deadline = time.monotonic() + 60
        while not warmed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert warmed, "the warm-up never finished"
        assert compiler._pool is not None and compiler._pool._idle.qsize() == 1  # the one worker, adopted
    finally:
        compiler.close()


def test_a_background_warm_up_thread_yields_the_cores_to_the_engine() -> None:
    """The warm-up's thread runs at WARM_UP_NICENESS (Linux niceness is per thread), the rest of the process
    where it was: requests served while the tables are built are not slowed by them."""
    import os
    import threading

    from proctor.constraints.compiler import WARM_UP_NICENESS, _lower_this_threads_priority

    seen: list[int] = []

    def run() -> None:
        _lower_this_threads_priority()
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [max(before, WARM_UP_NICENESS)]  # never raised above the process's own
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # this thread untouched
