"""``proctor-client generate`` and ``info``; the server's CLI mounts the same commands via add_client_commands.

Exit codes: 0 success, 1 the call failed (or the server is not ready), 2 bad local input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import grpc

from proctor_client.errors import ProctorError
from proctor_client.formatting import info_lines, summary_line, to_json
from proctor_client.request import build_request
from proctor_client.sync_client import ProctorClient
from proctor_client.v1 import generation_pb2

DEFAULT_ADDR = "127.0.0.1:50051"
ADDR_ENV = "PROCTOR_ADDR"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def add_client_commands(subparsers: argparse._SubParsersAction) -> dict[str, argparse.ArgumentParser]:
    """Register ``generate`` and ``info``; each sets ``func`` (Namespace -> exit code) as its default."""
    generate = subparsers.add_parser(
        "generate", help="generate a completion", description="Generate a completion on a running Proctor server."
    )
    _add_common(generate, timeout_s=60.0)
    source = generate.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="raw prompt text (no chat template)")
    source.add_argument(
        "--messages",
        metavar="FILE",
        help='JSON chat turns: [{"role", "content"}, ...] or {"messages": [...]}; - reads stdin',
    )
    generate.add_argument("--request-id", default="", help="client-chosen request id")
    for flag, kind in (
        ("--max-new-tokens", int),
        ("--min-new-tokens", int),
        ("--temperature", float),
        ("--top-k", int),
        ("--top-p", float),
        ("--min-p", float),
        ("--repetition-penalty", float),
        ("--presence-penalty", float),
        ("--frequency-penalty", float),
        ("--no-repeat-ngram-size", int),
        ("--seed", int),
        ("--top-logprobs", int),
    ):
        generate.add_argument(flag, type=kind, metavar=kind.__name__.upper(), help="unset: server default")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    generate.add_argument(
        "--stop-token-id", action="append", type=int, default=[], metavar="N", help="stop token id (repeatable)"
    )
    generate.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    generate.add_argument("--token-details", action="store_true", help="return per-token details")
    generate.add_argument("--stream", action="store_true", help="print text as it is generated (JSONL with json)")
    generate.set_defaults(func=run_generate)

    info = subparsers.add_parser("info", help="describe the served model", description="Describe the served model.")
    _add_common(info, timeout_s=10.0)
    info.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for readiness")
    info.set_defaults(func=run_info)
    return {"generate": generate, "info": info}


def _add_common(parser: argparse.ArgumentParser, *, timeout_s: float) -> None:
    parser.add_argument(
        "--addr", default=None, metavar="HOST:PORT", help=f"server address (default: ${ADDR_ENV} or {DEFAULT_ADDR})"
    )
    parser.add_argument(
        "--timeout", type=float, default=timeout_s, metavar="S", help=f"deadline in seconds, 0 for none ({timeout_s:g})"
    )
    parser.add_argument("--output", choices=("text", "json"), default="text", help="output format (text)")


def resolve_addr(addr: str | None) -> str:
    """--addr, else $PROCTOR_ADDR, else the local default."""
    return addr or os.environ.get(ADDR_ENV) or DEFAULT_ADDR


def run_generate(args: argparse.Namespace) -> int:
    """Run ``generate``: print the text (or JSON) to stdout and a summary line to stderr."""
    try:
        request = request_from_args(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with ProctorClient(resolve_addr(args.addr), timeout_s=args.timeout or None) as client:
            if args.stream:
                _print_stream(client.stream_generate(request), args.output, sys.stdout)
            else:
                _print_response(client.generate(request), args.output, sys.stdout)
    except ProctorError as error:
        print_error(error)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return EXIT_OK


def run_info(args: argparse.Namespace) -> int:
    """Run ``info``: print model info; exit 1 when the server is not reachable or not ready."""
    addr = resolve_addr(args.addr)
    try:
        with ProctorClient(addr, timeout_s=args.timeout or None) as client:
            info = client.wait_ready(args.wait) if args.wait > 0 else client.model_info()
    except ProctorError as error:
        print_error(error)
        if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(f"error: no ready server at {addr}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if args.output == "json":
        print(to_json(info))
    else:
        print("\n".join(info_lines(info)))
    return EXIT_OK


def request_from_args(args: argparse.Namespace) -> generation_pb2.GenerateRequest:
    """Build the request from parsed ``generate`` arguments (ValueError / OSError on bad input)."""
    messages = load_messages(args.messages) if args.messages is not None else None
    return build_request(
        args.prompt,
        messages,
        request_id=args.request_id,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        stop=args.stop,
        stop_token_ids=args.stop_token_id,
        ignore_eos=args.ignore_eos,
        top_logprobs=args.top_logprobs,
        token_details=args.token_details,
    )


def load_messages(path: str) -> list[dict[str, Any]]:
    """Read chat turns from a JSON file (``-``: stdin): a list of objects, or ``{"messages": [...]}``."""
    if path == "-":
        text = sys.stdin.read()
    else:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    data = json.loads(text)
    if isinstance(data, dict) and "messages" in data:
        data = data["messages"]
    if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
        raise ValueError(f'{path}: expected a JSON list of {{"role", "content"}} objects')
    return data


def print_error(error: ProctorError, stream: TextIO | None = None) -> None:
    """``error: CODE: message`` and one indented line per field violation."""
    out = stream or sys.stderr
    print(f"error: {error.code.name}: {error.message}", file=out)
    for field, description in error.field_violations:
        print(f"  {field}: {description}", file=out)


def _print_response(response: generation_pb2.GenerateResponse, output: str, out: TextIO) -> None:
    if output == "json":
        print(to_json(response), file=out)
        return
    print(response.text, file=out)
    out.flush()
    print(summary_line(response), file=sys.stderr)


def _print_stream(chunks: Iterable[generation_pb2.GenerateChunk], output: str, out: TextIO) -> None:
    last: generation_pb2.GenerateChunk | None = None
    wrote_text = False
    try:
        for chunk in chunks:
            if output == "json":
                out.write(to_json(chunk, compact=True) + "\n")
            else:
                out.write(chunk.text)
                wrote_text = wrote_text or bool(chunk.text)
            out.flush()
            last = chunk
    except BaseException:
        if wrote_text:  # end the partial line so the error starts on its own
            out.write("\n")
            out.flush()
        raise
    if output == "text":
        out.write("\n")
        out.flush()
        if last is not None:
            print(summary_line(last), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """The ``proctor-client`` parser."""
    parser = argparse.ArgumentParser(prog="proctor-client", description="Client for the Proctor generation service.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_client_commands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``proctor-client`` script; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
