"""Shared harness for the constraint benches (constraints_soundness.py, maskbench.py).

Each engine runs in its own worker process that loads the tokenizer and builds the backend once.
For each schema the parent sends (spec, instance texts); the worker compiles (timed) and answers
at once, then feeds every instance token by token through a fresh matcher and answers with the
outcomes. A compile that does not answer within the time limit is a timeout (a compile failure):
the worker is killed and a fresh one started for the next schema (pathological schemas hang some
engines in native code that Python cannot interrupt).

Feeding an instance (``check_instance``): the text is tokenized as the model would see it
(``add_special_tokens=False``); at each step the mask is filled (timed with perf_counter_ns), the
token must be allowed by the mask, then it is consumed with ``advance``; at the end ``can_end()``
must hold. The EOS bit of the final mask is compared with ``can_end()`` too (the protocol says they
agree); a disagreement, or ``advance`` refusing a token its mask allowed, is an adapter bug and is
recorded in ``Outcome.note``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "clients" / "python" / "src", ROOT / "service"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from proctor.constraints.spec import ConstraintSpec  # noqa: E402

BENCHDATA = ROOT.parent / "shared" / "benchdata"
MODEL_DIR = ROOT / ".proctor" / "models" / "SmolLM2-135M-Instruct"
ENGINES = ("xgrammar", "llguidance", "outlines")
AUTO = "auto"
# The validated fallback as a pseudo-engine: the schema relaxed for FALLBACK's engine
# (proctor.constraints.json_schema.relax), compiled by it, and every instance also judged by the
# server's validator against the full schema (what the server does before returning an output).
FALLBACK = "fallback"
# llguidance called directly on the schema as written: no guard, no rewrites (its own lenient=False
# refusals only) — the baseline the issue measured against.
RAW_LLGUIDANCE = "llguidance-raw"


def require_benchdata(sub: str) -> Path:
    path = BENCHDATA / sub
    if not path.is_dir():
        sys.exit(f"benchmark data not found at {path}: these benches read ../shared/benchdata/{sub} "
                 f"(see ../shared/benchdata/README.md); nothing to run")
    return path


def instance_text(data: object) -> str:
    """Compact JSON, as a constrained model emits it with flexible_whitespace off."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


# --------------------------------------------------------------------------------------------
# Feeding instances


@dataclass(slots=True)
class Outcome:
    status: str  # "accepted" | "rejected_step" | "rejected_end" | "error"
    step: int | None = None  # the token index rejected (rejected_step)
    n_tokens: int = 0
    mask_ns: list[int] = field(default_factory=list)
    note: str = ""  # an adapter inconsistency (not an engine verdict), or the error
    validator_valid: bool | None = None  # fallback only: the server's validator on the full schema

    @property
    def accepted(self) -> bool:
        return self.status == "accepted"

    @property
    def served(self) -> bool:
        """Would the server return this text as a valid output (mask, then validator when it judges)?"""
        return self.accepted and self.validator_valid is not False

    def describe(self) -> str:
        if self.status == "rejected_step":
            return f"rejected at token {self.step}/{self.n_tokens}"
        if self.status == "rejected_end":
            return "rejected at end"
        return self.status + (f" ({self.note})" if self.note else "")


_STATE: dict[str, Any] = {}


def load_tokenizer(model_dir: Path = MODEL_DIR) -> Any:
    from transformers import AutoTokenizer

    if "tokenizer" not in _STATE:
        if not (model_dir / "tokenizer.json").is_file():
            sys.exit(f"the tokenizer is not installed at {model_dir}; run `make setup`")
        _STATE["tokenizer"] = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True,
                                                            clean_up_tokenization_spaces=False)
    return _STATE["tokenizer"]


def eos_token_ids(tokenizer: Any) -> tuple[int, ...]:
    return (int(tokenizer.eos_token_id),)


def make_backend(name: str, tokenizer: Any) -> Any:
    from proctor.constraints.backends import create_backend

    if name == FALLBACK:
        return FallbackBackend(create_backend(fallback_engine(), tokenizer, len(tokenizer), eos_token_ids(tokenizer)))
    if name == RAW_LLGUIDANCE:
        return RawLLGuidance(create_backend("llguidance", tokenizer, len(tokenizer), eos_token_ids(tokenizer)))
    return create_backend(name, tokenizer, len(tokenizer), eos_token_ids(tokenizer))


class RawLLGuidance:
    """llguidance on the schema text as given, with the adapter's options (the same matcher, no guard)."""

    name = RAW_LLGUIDANCE

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def compile(self, spec: ConstraintSpec) -> Any:
        import llguidance

        from proctor.constraints.errors import ConstraintError
        from proctor.constraints.json_schema import json_options

        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(spec.text,
                                                                     overrides=json_options(spec.flexible_whitespace))
        except Exception as exc:
            raise ConstraintError(str(exc)[:300]) from exc
        return self._inner._build(spec, grammar)


def fallback_engine() -> str:
    from proctor.constraints.auto import FALLBACK as BY_KIND

    return BY_KIND["json_schema"]


class FallbackBackend:
    """Relax the schema and compile the superset with the fallback engine, as the server's compiler does."""

    name = FALLBACK

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def compile(self, spec: ConstraintSpec) -> Any:
        from proctor.constraints.compiler import compile_relaxed

        return compile_relaxed(spec, self._inner.name, self._inner.compile)[0]


def check_instance(backend: Any, compiled: Any, text: str, *, tokenizer: Any = None) -> Outcome:
    """Feed ``text`` token by token through a fresh matcher of ``compiled``; see the module doc."""
    from proctor.constraints.backend import allocate_bitmask

    del backend  # the compiled constraint carries everything; kept for the protocol's shape
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    vocab = len(tok)
    ids = tok(text, add_special_tokens=False).input_ids
    matcher = compiled.new_matcher()
    mask = allocate_bitmask(1, vocab)
    words = mask.numpy()[0]  # shares memory with the tensor
    times: list[int] = []

    def fill() -> None:
        mask.fill_(-1)  # an adapter that leaves words unwritten shows up as under-constrained
        start = time.perf_counter_ns()
        matcher.fill_bitmask(mask, 0)
        times.append(time.perf_counter_ns() - start)

    def allowed(token: int) -> bool:
        return bool((int(words[token >> 5]) >> (token & 31)) & 1)

    for k, token in enumerate(ids):
        fill()
        if not allowed(token):
            return Outcome("rejected_step", k, len(ids), times)
        if not matcher.advance(token):
            return Outcome("rejected_step", k, len(ids), times, note="advance() refused a token its mask allowed")
    fill()
    end = bool(matcher.can_end())
    eos_bit = any(allowed(e) for e in eos_token_ids(tok))
    note = "" if eos_bit == end else f"final mask EOS bit {eos_bit} but can_end() {end}"
    return Outcome("accepted" if end else "rejected_end", None, len(ids), times, note)


# --------------------------------------------------------------------------------------------
# Worker processes


@dataclass(slots=True)
class EngineResult:
    engine: str
    compiled: bool
    compile_ns: int = 0
    error: str = ""  # the refusal reason, "timeout", or "crash: ..."
    kind: str = ""  # "" | "refused" | "timeout" | "exception" | "crash" | "check-timeout"
    outcomes: list[Outcome] = field(default_factory=list)
    chosen: str = ""  # for AUTO: the engine used


def _worker_main(engine: str, conn: Any, model_dir: str) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import torch

        torch.set_num_threads(1)
        from proctor.constraints.errors import ConstraintError

        tokenizer = load_tokenizer(Path(model_dir))
        backend = make_backend(engine, tokenizer)
    except BaseException as exc:
        conn.send(("setup-failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        spec, texts = job
        start = time.perf_counter_ns()
        validate = _validator_for(spec) if engine == FALLBACK else None
        try:
            compiled = backend.compile(spec)
        except ConstraintError as exc:
            conn.send(("compiled", False, time.perf_counter_ns() - start, "refused", exc.reason))
            continue
        except Exception as exc:
            conn.send(("compiled", False, time.perf_counter_ns() - start, "exception",
                       f"{type(exc).__name__}: {exc}"[:500]))
            continue
        conn.send(("compiled", True, time.perf_counter_ns() - start, "", ""))
        outcomes = []
        for text in texts:
            try:
                outcome = check_instance(backend, compiled, text, tokenizer=tokenizer)
                if validate is not None:
                    outcome.validator_valid = validate(text)
                outcomes.append(outcome)
            except Exception as exc:
                outcomes.append(Outcome("error", note=f"{type(exc).__name__}: {exc}"[:500]))
        conn.send(("checked", outcomes))


UNSATISFIABLE = ("admits no value", "admits no finite value", "Unsatisfiable schema", "cannot accept any value",
                 "enum array must not be empty")


def unsatisfiable(result: EngineResult) -> bool:
    """A refusal because the schema admits no value at all, from every engine tried (a correct verdict)."""
    reasons = [r for r in result.error.split("; ") if r]
    return bool(reasons) and all(any(m in r for m in UNSATISFIABLE) for r in reasons)


def _validator_for(spec: ConstraintSpec) -> Any:
    from proctor.constraints.json_schema import validate_json_output

    schema = spec.schema
    return lambda text: validate_json_output(text, schema, truncated=False).valid


class EngineWorker:
    """One engine's worker process, restarted after a timeout or a crash."""

    def __init__(self, engine: str, ctx: Any, setup_timeout: float = 600.0) -> None:
        self.engine = engine
        self._ctx = ctx
        self._setup_timeout = setup_timeout
        self._proc: Any = None
        self._conn: Any = None
        self.restarts = 0

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(self.engine, child, str(MODEL_DIR)),
                                       daemon=True, name=f"bench-{self.engine}")
        self._proc.start()
        child.close()
        self._conn = parent
        if not self._conn.poll(self._setup_timeout):
            self.kill()
            raise RuntimeError(f"{self.engine}: worker did not start within {self._setup_timeout:.0f} s")
        message = self._conn.recv()
        if message[0] != "ready":
            self.kill()
            raise RuntimeError(f"{self.engine}: backend setup failed: {message[1]}")

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
        if self._proc is not None:
            self._proc.join(5)
        self.kill()

    def _receive(self, timeout: float) -> Any:
        """The next message, or None on timeout / worker death (the worker is then killed)."""
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            pass
        code = self._proc.exitcode if self._proc is not None else None
        self.kill()
        self.restarts += 1
        return ("dead", code)

    def run(self, spec: ConstraintSpec, texts: Sequence[str], timeout: float, check_timeout: float) -> EngineResult:
        if self._proc is None:
            self._start()
        self._conn.send((spec, list(texts)))
        start = time.perf_counter_ns()
        message = self._receive(timeout)
        if message[0] == "dead":
            elapsed = time.perf_counter_ns() - start
            if message[1] is None:
                return EngineResult(self.engine, False, elapsed, f"timeout after {timeout:g} s", "timeout")
            return EngineResult(self.engine, False, elapsed, f"worker died (exit code {message[1]})", "crash")
        _, ok, compile_ns, kind, reason = message
        if not ok:
            return EngineResult(self.engine, False, compile_ns, reason, kind)
        message = self._receive(check_timeout)
        if message[0] == "dead":
            what = "check-timeout" if message[1] is None else "crash"
            return EngineResult(self.engine, False, compile_ns, f"{what} while feeding instances", what)
        return EngineResult(self.engine, True, compile_ns, outcomes=message[1])


class Runner:
    """Runs specs through the engines' workers, one engine at a time (timings stay clean)."""

    def __init__(self, timeout: float, check_timeout: float = 300.0) -> None:
        self.timeout = timeout
        self.check_timeout = check_timeout
        self._ctx = mp.get_context("spawn")
        self._workers: dict[str, EngineWorker] = {}

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()

    def start(self, engines: Iterable[str]) -> None:
        """Start workers up front so setup time is not charged to the first schema."""
        for engine in engines:
            worker = self._worker(engine)
            if worker._proc is None:
                worker._start()

    def _worker(self, engine: str) -> EngineWorker:
        if engine not in self._workers:
            self._workers[engine] = EngineWorker(engine, self._ctx)
        return self._workers[engine]

    def run(self, engine: str, spec: ConstraintSpec, texts: Sequence[str]) -> EngineResult:
        return self._worker(engine).run(spec, texts, self.timeout, self.check_timeout)

    def restarts(self) -> dict[str, int]:
        return {name: w.restarts for name, w in self._workers.items()}


# --------------------------------------------------------------------------------------------
# AUTO


def auto_order(spec: ConstraintSpec) -> tuple[str, ...]:
    """AUTO's exact engines in order, then the validated fallback for JSON schemas (as the server does)."""
    from proctor.constraints.auto import FALLBACK as BY_KIND
    from proctor.constraints.auto import backend_order, policy_key

    return (*backend_order(spec), *((FALLBACK,) if policy_key(spec) in BY_KIND else ()))


def engines_needed(spec: ConstraintSpec, requested: Sequence[str]) -> list[str]:
    needed = [e for e in requested if e != AUTO]
    if AUTO in requested:
        needed += [e for e in auto_order(spec) if e not in needed]
    return needed


def auto_result(spec: ConstraintSpec, results: dict[str, EngineResult]) -> EngineResult:
    """AUTO: the first engine in auto_order(spec) that compiles; compile time = all tried."""
    spent = 0
    reasons = []
    for name in auto_order(spec):
        result = results.get(name)
        if result is None:
            break
        spent += result.compile_ns
        if result.compiled:
            return replace(result, engine=AUTO, compile_ns=spent, chosen=name)
        reasons.append(f"{name}: {result.error}")
    return EngineResult(AUTO, False, spent, "; ".join(reasons), "refused")


def evaluate(runner: Runner, spec: ConstraintSpec, texts: Sequence[str],
             requested: Sequence[str]) -> dict[str, EngineResult]:
    """Run the requested engines; AUTO's own engines run in order only until one compiles."""
    results = {engine: runner.run(engine, spec, texts) for engine in requested if engine != AUTO}
    if AUTO in requested:
        for name in auto_order(spec):
            if name not in results:
                results[name] = runner.run(name, spec, texts)
            if results[name].compiled:
                break
        results[AUTO] = auto_result(spec, results)
    return {e: results[e] for e in requested}


# --------------------------------------------------------------------------------------------
# CLI, progress, statistics, tables


def add_common_args(parser: argparse.ArgumentParser, *, default_limit: int | None, default_timeout: float) -> None:
    parser.add_argument("--engines", default="xgrammar,llguidance,outlines,auto",
                        help="comma-separated: xgrammar, llguidance, outlines, auto")
    parser.add_argument("--limit", type=int, default=default_limit, help="at most N items per split (0: all)")
    parser.add_argument("--splits", default="", help="comma-separated split names (default: all)")
    parser.add_argument("--timeout", type=float, default=default_timeout, help="compile time limit per schema, s")
    parser.add_argument("--progress-every", type=int, default=20, help="progress line every N schemas")
    parser.add_argument("--save", type=Path, default=None, help="write the per-item results as JSON here")


def parse_engines(text: str) -> list[str]:
    engines = [e.strip() for e in text.split(",") if e.strip()]
    known = (*ENGINES, RAW_LLGUIDANCE, FALLBACK, AUTO)
    unknown = [e for e in engines if e not in known]
    if unknown:
        sys.exit(f"unknown engines {unknown}; choose from {', '.join(known)}")
    return engines


class Progress:
    def __init__(self, total: int, every: int, label: str) -> None:
        self.total, self.every, self.label = total, max(1, every), label
        self.done = 0
        self.start = time.monotonic()

    def step(self, extra: str = "") -> None:
        self.done += 1
        if self.done % self.every == 0 or self.done == self.total:
            elapsed = time.monotonic() - self.start
            eta = elapsed / self.done * (self.total - self.done)
            print(f"[{self.label}] {self.done}/{self.total} schemas, {elapsed:.0f} s elapsed, ETA {eta:.0f} s"
                  + (f" ({extra})" if extra else ""), file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def command_line() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for package in ("xgrammar", "llguidance", "outlines_core"):
        try:
            parts.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            parts.append(f"{package} (not installed)")
    return ", ".join(parts)


def result_json(result: EngineResult) -> dict[str, Any]:
    return {
        "engine": result.engine, "chosen": result.chosen, "compiled": result.compiled,
        "compile_ms": result.compile_ns / 1e6, "kind": result.kind, "error": result.error,
        "outcomes": [{"status": o.status, "step": o.step, "n_tokens": o.n_tokens, "note": o.note,
                      "mask_us_median": statistics.median(o.mask_ns) / 1e3 if o.mask_ns else None,
                      "validator_valid": o.validator_valid}
                     for o in result.outcomes],
    }


def report_notes_and_save(notes: dict[str, list[str]], saved: object, save: Path | None, what: str) -> None:
    """Print adapter inconsistencies (stderr) and write the per-item results when asked."""
    for engine, lines in notes.items():
        print(f"\nAdapter inconsistencies / exceptions, {engine} ({len(lines)}):", file=sys.stderr)
        for line in lines[:30]:
            print("  " + line, file=sys.stderr)
    if save:
        save.write_text(json.dumps(saved, ensure_ascii=False, indent=1), encoding="utf-8")
        print(f"\nper-{what} results: {save}")
