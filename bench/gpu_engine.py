"""The engine's real decode loop on one device, for the one-shot CUDA check (``bench/gpu.sh``).

Why it exists: ``bench/step.py`` times the slot forward alone. This runs the whole ``Engine`` —
scheduler thread, slot cache, chunked prefill, sampling pipeline, stop rules, events — on a
random-weight model of the default model's exact shape (speed does not depend on the weights; the
model files cannot travel to the GPU machine), with the real tokenizer, and reports:

* 1, 16 and 64 concurrent greedy requests of 128 new tokens (EOS ignored): aggregate tokens/s,
  median time to first token, median decode step;
* determinism: request 0's tokens (and logprobs) alone equal its tokens among the others;
* a stop string, a stop token, a forbidden phrase and a seeded sampled request, each checked;
* with ``--schema``, the same widths again with a JSON schema on every request (llguidance: its wheel and
  jsonschema's travel in the tokenizer directory, ``wheels/``), its tok/s and step against the plain run's.

Needs only torch, transformers, tokenizers and numpy (and, for ``--schema``, the carried wheels; no network).
The tokenizer directory holds the default model's small files only (``--prepare`` makes it; no weights):

    python bench/gpu_engine.py --prepare                      # once, here: .proctor/gpu-tokenizer
    python bench/gpu_engine.py --device cpu --dtype float32 --streams 1,4 --new-tokens 16   # local try
    python3 bench/gpu_engine.py --json out.json               # the GPU machine: cuda, bfloat16

Exit status: 0 when every check passed, 1 on an error (engine fault, timeout, wrong token count),
2 when a stopping/forbidden/sampling check failed. Determinism is reported, never fatal.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.decoding.forbidden.normalize import fold_text  # noqa: E402
from proctor.domain import (  # noqa: E402
    ConstraintRequest,
    FinishReason,
    ForbiddenParams,
    GenerationRequest,
    SamplingParams,
    StoppingParams,
    TokenEvent,
)
from proctor.engine.engine import Engine  # noqa: E402
from proctor.models import LoadedModel  # noqa: E402

SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
                "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}  # as bench/step.py
# Llama-3.1-8B's shape, but for the vocabulary: the carried tokenizer's (49,152 rows of LM head, not 128,256).
LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 49152, "max_position_embeddings": 8192, "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
SHAPES = {"default": SMOLLM2_135M, "llama-8b": LLAMA_8B}
SOURCE = ROOT / ".proctor" / "models" / "SmolLM2-135M-Instruct"
TOKENIZER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                   "chat_template.jinja")
CONTEXT = 2048
# Every request's schema under --schema: 50 short strings at least, so 128 tokens never close it (each request runs
# its full length, as the plain ones do), with a structural token every few tokens.
SCHEMA = json.dumps({"type": "object", "required": ["name", "age", "notes"], "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0},
    "notes": {"type": "array", "minItems": 50, "items": {"type": "string", "maxLength": 24}}}})
# What --schema needs that a GPU machine's image lacks (no network there): downloaded by --prepare, for each Python a
# machine may run (rpds-py, under jsonschema, is built per version; llguidance is abi3).
WHEELS = ("llguidance==1.9.1", "jsonschema", "referencing", "jsonschema-specifications", "attrs", "rpds-py",
          "typing-extensions")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
STORY = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told stories about "
         "the storms he had seen, the ships he had lost and the friends who had sailed with him. ")


class CheckError(RuntimeError):
    """An error the run cannot go on from (exit 1)."""


@dataclass
class Sink:
    """A request's events; ``done`` is set on the final one (called on the engine thread)."""

    events: list[TokenEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, event: TokenEvent) -> None:
        self.events.append(event)
        if event.finished:
            self.done.set()

    @property
    def ids(self) -> list[int]:
        return [t for e in self.events for t in e.token_ids]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.events)

    @property
    def logprobs(self) -> list[float]:
        return [d.logprob for e in self.events for d in e.details]

    @property
    def final(self) -> TokenEvent:
        return self.events[-1]


@dataclass
class Steps:
    """A StepObserver (observability/hooks.py) that keeps every decode step's time and row count."""

    decode: list[tuple[float, int]] = field(default_factory=list)

    def prefill(self, seconds: float, requests: int) -> None:
        pass

    def decode_step(self, seconds: float, rows: int) -> None:
        self.decode.append((seconds, rows))

    def masks(self, seconds: float, removed_by: list[str]) -> None:
        pass


def prepare(source: Path, target: Path) -> None:
    """Copy the tokenizer and config files (never the weights) of the default model into ``target``."""
    missing = [name for name in TOKENIZER_FILES if not (source / name).is_file()]
    if missing:
        raise CheckError(f"{source} lacks {', '.join(missing)}: install the default model (`make setup`)")
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, target / name)
    size = sum((target / name).stat().st_size for name in TOKENIZER_FILES)
    print(f"copied {len(TOKENIZER_FILES)} files ({size / 2**20:.1f} MiB) to {target}")
    wheels = target / "wheels"
    wheels.mkdir(exist_ok=True)
    for version in PYTHONS:  # binary wheels only, for a manylinux x86_64 machine of each Python
        platforms = [arg for tag in ("manylinux2014", "manylinux_2_17", "manylinux_2_31")
                     for arg in ("--platform", f"{tag}_x86_64")]  # pip matches only the tags named
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        *platforms, "--python-version", version, "-d", str(wheels), *WHEELS], check=True)
    size = sum(path.stat().st_size for path in wheels.iterdir())
    print(f"downloaded {len(list(wheels.iterdir()))} wheels ({size / 2**20:.1f} MiB) to {wheels}; carry {target} to "
          "the GPU machine")


def build(tokenizer_dir: Path, device: torch.device, dtype: torch.dtype, shape: str = "default") -> LoadedModel:
    """A random-weight model of ``shape`` with the real tokenizer, as tests/conftest.py ``tiny_loaded``, built on
    ``device`` itself (8B's weights never exist on the host)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise CheckError(f"no tokenizer at {tokenizer_dir}: run `python bench/gpu_engine.py --prepare` and carry "
                         "that directory")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), clean_up_tokenization_spaces=False,
                                              local_files_only=True)
    dimensions = SHAPES[shape]
    if len(tokenizer) != dimensions["vocab_size"]:
        raise CheckError(f"the tokenizer has {len(tokenizer)} tokens, the model shape {dimensions['vocab_size']}")
    # initializer_range 0.2 (as tests/conftest.py): at the default 0.02 the random model repeats one token with
    # near-flat logits, which leaves the stop checks nothing to find. The shape, hence the speed, is the same.
    config = LlamaConfig(**dimensions, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    model.requires_grad_(False)
    return LoadedModel(
        model=model, tokenizer=tokenizer, model_id=f"{shape}-random", path=tokenizer_dir,
        weights_sha256="random-seed-0", tokenizer_sha256="gpu-check", dtype=dtype, device=device,
        eos_token_ids=(tokenizer.eos_token_id,), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, context_length=CONTEXT, vocab_size=len(tokenizer),
        special_token_ids=frozenset(int(i) for i in tokenizer.all_special_ids))


def prompt(index: int) -> str:
    """Prompts of different lengths; every 8th one is longer than a prefill chunk (128 tokens: staged)."""
    if index % 8 == 7:
        return f"Story {index}. " + STORY * 5
    return f"Story {index}. " + STORY[: 30 + (index * 37) % (len(STORY) - 30)]


def constrained(engine: Engine, tokenizer_dir: Path) -> None:
    """Give ``engine`` llguidance (in this process: no compile workers), for ``--schema``."""
    from proctor.constraints.compiler import ConstraintCompiler
    from proctor.constraints.service import ConstraintService

    loaded = engine.loaded
    compiler = ConstraintCompiler(tokenizer=loaded.tokenizer, model_path=str(tokenizer_dir),
                                  vocab_size=loaded.vocab_size, eos_token_ids=loaded.eos_token_ids,
                                  tokenizer_fingerprint="gpu-check", isolate=False)
    engine.constraints = ConstraintService(compiler)


def greedy(index: int, new_tokens: int, **fields: Any) -> GenerationRequest:
    stopping = fields.pop("stopping", StoppingParams(max_new_tokens=new_tokens, ignore_eos=True))
    return GenerationRequest(request_id=f"r{index}-{uuid.uuid4().hex[:8]}", prompt=prompt(index), stopping=stopping,
                             token_details=index == 0, **fields)


def run(engine: Engine, requests: list[GenerationRequest], timeout_s: float) -> tuple[list[Sink], float]:
    """Submit all at once; wait for every final event; fail on an engine error. Returns sinks, wall seconds."""
    prepared = [engine.prepare(r) for r in requests]  # tokenizing is not part of the decode loop
    sinks = [Sink() for _ in requests]
    start = time.perf_counter()
    for p, sink in zip(prepared, sinks, strict=True):
        engine.submit(p, sink)
    deadline = start + timeout_s
    for request, sink in zip(requests, sinks, strict=True):
        if not sink.done.wait(max(0.0, deadline - time.perf_counter())):
            raise CheckError(f"{request.request_id} did not finish within {timeout_s:.0f} s")
        final = sink.final
        if final.error or final.finish_reason in (FinishReason.ERROR, FinishReason.CANCELLED):
            raise CheckError(f"{request.request_id} ended {final.finish_reason}: {final.error or final.finish_detail}")
    return sinks, time.perf_counter() - start


Figures = dict[str, Any]


def throughput(engine: Engine, steps: Steps, streams: int, new_tokens: int, timeout_s: float,
               schema: bool = False) -> tuple[Figures, Sink]:
    """``streams`` concurrent greedy requests, each exactly ``new_tokens`` tokens (each under SCHEMA with
    ``schema``); the figures and request 0."""
    steps.decode.clear()
    fields: dict[str, Any] = {"constraint": ConstraintRequest("json_schema", text=SCHEMA, backend="llguidance")
                              } if schema else {}
    sinks, wall = run(engine, [greedy(i, new_tokens, **fields) for i in range(streams)], timeout_s)
    for i, sink in enumerate(sinks):
        if len(sink.ids) != new_tokens or sink.final.finish_reason is not FinishReason.LENGTH:
            raise CheckError(f"stream {i} of {streams}: {len(sink.ids)} tokens, {sink.final.finish_reason}")
    ttft = [s.final.timings.time_to_first_token_ms for s in sinks if s.final.timings is not None]
    full = [t for t, rows in steps.decode if rows == streams] or [t for t, _ in steps.decode]
    return {"streams": streams, "tokens": streams * new_tokens, "wall_s": wall,
            "tokens_per_s": streams * new_tokens / wall, "ttft_median_ms": statistics.median(ttft),
            "ttft_max_ms": max(ttft), "decode_steps": len(steps.decode),
            "step_ms_median_full_batch": statistics.median(full) * 1000,
            "step_ms_median_all": statistics.median(t for t, _ in steps.decode) * 1000}, sinks[0]


def stop_checks(engine: Engine, base: Sink, new_tokens: int, timeout_s: float) -> dict[str, Any]:
    """A stop string, a stop token and a forbidden phrase taken from request 0's free output; a seeded sample."""
    text, ids, checks = base.text, base.ids, {}

    def one(**fields: Any) -> Sink:
        return run(engine, [greedy(0, new_tokens, **fields)], timeout_s)[0][0]

    at = next((p for p in range(len(text) // 3, len(text) - 3)
               if text[p:p + 3].isprintable() and text[p:p + 3].strip() and text.find(text[p:p + 3]) == p), None)
    if at is None:
        checks["stop_string"] = {"ok": None, "skipped": "no 3-character string occurs first after a third of the text"}
    else:
        stop = text[at:at + 3]
        out = one(stopping=StoppingParams(max_new_tokens=new_tokens, ignore_eos=True, stop=(stop,)))
        checks["stop_string"] = {"ok": out.final.finish_reason is FinishReason.STOP_STRING and out.text == text[:at],
                                 "stop": stop, "finish": out.final.finish_reason.value, "text_chars": len(out.text),
                                 "expected_chars": at}
    k = len(ids) // 2
    first = ids.index(ids[k])
    out = one(stopping=StoppingParams(max_new_tokens=new_tokens, ignore_eos=True, stop_token_ids=(ids[k],)))
    checks["stop_token"] = {"ok": out.final.finish_reason is FinishReason.STOP_TOKEN and out.ids == ids[:first + 1],
                            "token": ids[k], "finish": out.final.finish_reason.value, "tokens": len(out.ids),
                            "expected_tokens": first + 1}
    words = ["".join(ch for ch in w if ch.isalpha())[:6] for w in text.split()]
    words = [w for w in words if len(w) >= 3]
    if not words:
        checks["forbidden"] = {"ok": None, "skipped": "the free output has no word of 3+ letters"}
    else:
        phrase = words[len(words) // 2]
        out = one(forbidden=ForbiddenParams((phrase.upper(),)))
        absent = fold_text(phrase) not in fold_text(out.text)
        checks["forbidden"] = {"ok": absent and len(out.ids) == new_tokens
                               and out.final.finish_reason is FinishReason.LENGTH,
                               "phrase": phrase, "absent": absent, "finish": out.final.finish_reason.value,
                               "tokens": len(out.ids), "changed_output": out.ids != ids}
    sampled = [run(engine, [greedy(1, new_tokens, sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=1234))],
                   timeout_s)[0][0].ids for _ in range(2)]
    checks["seeded_sample"] = {"ok": sampled[0] == sampled[1] and len(sampled[0]) == new_tokens,
                               "differs_from_greedy": sampled[0] != run(engine, [greedy(1, new_tokens)],
                                                                        timeout_s)[0][0].ids}
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--tokenizer", type=Path, default=ROOT / ".proctor" / "gpu-tokenizer")
    parser.add_argument("--streams", default="1,16,64", help="concurrent requests per run; the first must be 1")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per run of requests")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--batch-invariant", default="auto", choices=["auto", "on", "off"],
                        help="the engine's --batch-invariant (on: the invariant Triton kernels on CUDA)")
    parser.add_argument("--cuda-graphs", default="on", choices=["on", "off"],
                        help="the engine's --cuda-graphs (on: steps padded to row buckets, replayed as CUDA graphs)")
    parser.add_argument("--shape", default="default", choices=sorted(SHAPES),
                        help="the random model's shape: the default model's, or Llama-3.1-8B's")
    parser.add_argument("--schema", action="store_true",
                        help="also run every width with a JSON schema on every request (llguidance)")
    parser.add_argument("--prepare", action="store_true", help=f"copy the tokenizer files from {SOURCE} and exit")
    args = parser.parse_args()
    if args.prepare:
        prepare(SOURCE, args.tokenizer)
        return 0
    device = torch.device(args.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    streams = [int(s) for s in args.streams.split(",")]
    if streams[0] != 1:
        raise CheckError("--streams must start with 1 (request 0 alone is the determinism reference)")
    import transformers

    loaded = build(args.tokenizer, device, dtype, args.shape)
    settings = Settings.load({"device": device.type, "dtype": str(dtype).removeprefix("torch."), "warmup": False,
                              "max_batch_size": max(streams), "max_waiting": max(streams) + 8,
                              "batch_invariant": args.batch_invariant, "cuda_graphs": args.cuda_graphs == "on"},
                             environ={})
    engine = Engine(loaded, settings)
    if args.schema:
        constrained(engine, args.tokenizer)
    steps = Steps()
    engine.observer = steps
    engine.start()
    figures: dict[str, Any] = {
        "device": str(device), "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__,
        "transformers": transformers.__version__, "random_weights": True, "new_tokens": args.new_tokens,
        "shape": args.shape, "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
    try:
        run(engine, [greedy(i, 8) for i in range(2)], args.timeout)  # warm-up: kernels, allocator, tokenizer caches
        runner = engine._batch._executor
        step = getattr(runner, "step", None)  # the slot forward's row step (graph_step.GraphReplay under graphs)
        figures["engine_paths"] = {
            "runner": str(engine.plan.kind), "description": engine.plan.description, "weights": engine.plan.weights,
            "kv_cache_dtype": str(getattr(runner, "cache_dtype", "")).removeprefix("torch."),
            "drafts_and_jump_forward": engine._batch.capabilities.extend,  # False on CUDA (executor/protocol.py)
            "batch_invariant": {"asked": args.batch_invariant,
                                "rows_own_bits": engine._batch.capabilities.rows_own_bits},
            "cuda_graphs": {"asked": args.cuda_graphs, "captured": getattr(step, "captures", None),
                            "given_up": getattr(step, "graphs_failed", None)}}
        rows, solo, together = [], None, {}
        for n in streams:
            row, first = throughput(engine, steps, n, args.new_tokens, args.timeout)
            rows.append(row)
            print(f"streams={n}: {row['tokens_per_s']:.0f} tok/s, TTFT median {row['ttft_median_ms']:.1f} ms, "
                  f"step {row['step_ms_median_full_batch']:.2f} ms", file=sys.stderr, flush=True)
            if n == 1:
                solo = first
            else:
                together[n] = first
        figures["runs"] = rows
        if args.schema:
            json_rows = [throughput(engine, steps, n, args.new_tokens, args.timeout, schema=True)[0] for n in streams]
            for plain, row in zip(rows, json_rows, strict=True):
                row["json_over_plain_tokens_per_s"] = row["tokens_per_s"] / plain["tokens_per_s"]
                row["plain_over_json_step"] = plain["step_ms_median_full_batch"] / row["step_ms_median_full_batch"]
                print(f"streams={row['streams']} JSON: {row['tokens_per_s']:.0f} tok/s "
                      f"({row['json_over_plain_tokens_per_s']:.2f}x plain)", file=sys.stderr, flush=True)
            figures["json_runs"] = json_rows
        figures["engine_paths"]["cuda_graphs"]["captured"] = getattr(step, "captures", None)
        assert solo is not None
        figures["determinism"] = {f"request0_alone_eq_among_{n}": {
            "token_ids_equal": s.ids == solo.ids, "logprobs_equal": s.logprobs == solo.logprobs,
            "logprob_max_gap": max((abs(a - b) for a, b in zip(s.logprobs, solo.logprobs, strict=True)),
                                   default=0.0),
            "first_divergence": next((i for i, (a, b) in enumerate(zip(s.ids, solo.ids, strict=True)) if a != b), None)}
            for n, s in together.items()}
        figures["checks"] = stop_checks(engine, solo, args.new_tokens, args.timeout)
        if device.type == "cuda":
            figures["max_memory_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as exc:
        figures["error"] = f"{type(exc).__name__}: {exc}"  # the figures so far still go to --json
        raise
    finally:
        engine.shutdown(grace_s=1.0)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=1))
    report(figures)
    failed = [name for name, check in figures["checks"].items() if check["ok"] is False]
    if failed:
        print(f"CHECK FAILED: {', '.join(failed)}", file=sys.stderr)
        return 2
    return 0


def report(figures: dict[str, Any]) -> None:
    print(json.dumps(figures, indent=1))
    print(f"\nEngine loop, {figures['device']} {figures['dtype']} ({figures['gpu'] or 'cpu'}), "
          f"{figures['new_tokens']} new tokens per request, greedy\n")
    print("| streams | tok/s | TTFT median ms | TTFT max ms | step ms (full batch) | decode steps | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in figures["runs"]:
        print(f"| {r['streams']} | {r['tokens_per_s']:.0f} | {r['ttft_median_ms']:.1f} | {r['ttft_max_ms']:.1f} | "
              f"{r['step_ms_median_full_batch']:.2f} | {r['decode_steps']} | {r['wall_s']:.2f} |")
    for r in figures.get("json_runs", []):
        print(f"| {r['streams']} JSON ({r['json_over_plain_tokens_per_s']:.2f}x) | {r['tokens_per_s']:.0f} | "
              f"{r['ttft_median_ms']:.1f} | {r['ttft_max_ms']:.1f} | {r['step_ms_median_full_batch']:.2f} | "
              f"{r['decode_steps']} | {r['wall_s']:.2f} |")
    print()
    for name, d in figures["determinism"].items():
        print(f"determinism {name}: tokens {d['token_ids_equal']}, logprobs {d['logprobs_equal']}")
    for name, check in figures["checks"].items():
        print(f"check {name}: {check['ok']}")
    print(f"paths: {figures['engine_paths']}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        sys.exit(1)
