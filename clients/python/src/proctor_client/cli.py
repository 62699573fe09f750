"""``proctor-client generate``, ``info`` and ``schemas``; the server's CLI mounts them via add_client_commands.

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

from proctor_client.auth import TOKEN_ENV, resolve_token, tls_credentials
from proctor_client.errors import ProctorError
from proctor_client.formatting import info_lines, schema_lines, summary_line, to_json, validation_lines
from proctor_client.request import (
    CONSTRAINT_BACKENDS,
    CONTEXT_OVERFLOWS,
    EARLY_STOPPINGS,
    GRAMMAR_SYNTAXES,
    JSON_WHITESPACES,
    SPECULATIONS,
    build_request,
)
from proctor_client.sync_client import ProctorClient
from proctor_client.v1 import generation_pb2

DEFAULT_ADDR = "127.0.0.1:50051"
ADDR_ENV = "PROCTOR_ADDR"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# Grammar file suffixes that name their syntax; any other file is read as lark (the default).
GRAMMAR_SUFFIXES = {".lark": "lark", ".gbnf": "ebnf", ".ebnf": "ebnf"}


def add_client_commands(subparsers: argparse._SubParsersAction) -> dict[str, argparse.ArgumentParser]:
    """Register ``generate``, ``info`` and ``schemas``; each sets ``func`` (Namespace -> exit code) as its default."""
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
    generate.add_argument("--subject", default="", metavar="ID",
                          help="whose data the call holds (audit erasure: `proctor audit erase --subject ID`); "
                          "default: the caller")
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
        ("--typical-p", float),
        ("--greedy-first-tokens", int),
        ("--first-tokens-temperature", float),
        ("--top-logprobs", int),
    ):
        generate.add_argument(flag, type=kind, metavar=kind.__name__.upper(), help="unset: server default")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    generate.add_argument(
        "--stop-token-id", action="append", type=int, default=[], metavar="N", help="stop token id (repeatable)"
    )
    generate.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    generate.add_argument("--token-details", action="store_true", help="return per-token details")
    generate.add_argument("--force", action="append", default=[], metavar="POS=ID",
                          help="force token ID at generated position POS, 0-based (repeatable)")
    generate.add_argument("--must-include", action="append", default=[], metavar="PHRASE",
                          help="the output may not end before it contains PHRASE (repeatable)")
    generate.add_argument("--close-at-budget", action=argparse.BooleanOptionalAction, default=None,
                          help="end a JSON output that runs short of tokens with its shortest valid ending "
                               "(default: on); --no-close-at-budget cuts it off at max_new_tokens instead")
    generate.add_argument("--num-beams", type=int, help="beam search with this many beams (generate()'s semantics)")
    generate.add_argument("--length-penalty", type=float, help="beam search: score / generated_tokens ** this")
    generate.add_argument("--early-stopping", choices=EARLY_STOPPINGS, help="beam search: when to stop searching")
    generate.add_argument("--num-return-sequences", type=int, help="beam search: return the best N beams")
    generate.add_argument("--speculation", choices=SPECULATIONS,
                          help="prompt-lookup drafts (default: the server's; never changes the output)")
    generate.add_argument("--no-cache-prompt", dest="cache_prompt", action="store_false", default=None,
                          help="keep nothing of this prompt in the server's prefix cache")
    generate.add_argument("--context-overflow", choices=CONTEXT_OVERFLOWS,
                          help="when the input and --max-new-tokens do not fit the context: refuse (default), drop "
                          "the oldest chat turns after the system message, or keep the start and the end")
    generate.add_argument("--confidence", action="store_true",
                          help="return a confidence summary (a heuristic, not a probability of correctness)")
    generate.add_argument("--stream", action="store_true", help="print text as it is generated (JSONL with json)")
    _add_constraint_flags(generate)
    _add_mask_flags(generate)
    generate.set_defaults(func=run_generate)

    info = subparsers.add_parser("info", help="describe the served model", description="Describe the served model.")
    _add_common(info, timeout_s=10.0)
    info.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for readiness")
    info.set_defaults(func=run_info)

    schemas = subparsers.add_parser(
        "schemas",
        help="list the server's registered JSON schemas",
        description="List the JSON schemas registered on the server (use one with generate --schema-ref NAME).",
    )
    _add_common(schemas, timeout_s=10.0)
    schemas.set_defaults(func=run_schemas)
    from proctor_client.tlog.cli import add_verify_proof_command, add_verify_receipt_command

    verify = add_verify_proof_command(subparsers)
    receipt = add_verify_receipt_command(subparsers)
    return {"generate": generate, "info": info, "schemas": schemas, "verify-proof": verify, "verify-receipt": receipt}


def _add_constraint_flags(parser: argparse.ArgumentParser) -> None:
    """The output constraint (at most one) and its options."""
    group = parser.add_argument_group("output constraint (at most one)")
    constraint = group.add_mutually_exclusive_group()
    constraint.add_argument(
        "--json-schema", metavar="FILE", help="the output is JSON valid under this JSON Schema file; - reads stdin"
    )
    constraint.add_argument("--regex", metavar="R", help="the whole output matches this regular expression")
    constraint.add_argument(
        "--choice", action="append", metavar="TEXT", help="the output is exactly one of these (repeatable)"
    )
    constraint.add_argument("--grammar", metavar="FILE", help="the output follows this grammar file; - reads stdin")
    constraint.add_argument(
        "--schema-ref", metavar="NAME", help='a schema registered on the server, "name@version" or "name" (latest)'
    )
    group.add_argument(
        "--grammar-syntax",
        choices=GRAMMAR_SYNTAXES,
        help="syntax of --grammar (default: by suffix, .gbnf/.ebnf: ebnf, otherwise lark)",
    )
    group.add_argument("--constraint-backend", choices=CONSTRAINT_BACKENDS, help="constraint engine (server: auto)")
    group.add_argument(
        "--exact-only", action="store_true",
        help="refuse a JSON schema no engine enforces exactly (no validated fallback)",
    )
    group.add_argument(
        "--json-whitespace",
        choices=JSON_WHITESPACES,
        help="whitespace between JSON tokens for --json-schema/--schema-ref (server: compact)",
    )


def _add_mask_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("forbidden phrases, biases and plugins")
    group.add_argument("--forbid", action="append", default=[], metavar="PHRASE",
                       help="the output never contains PHRASE, in any case or tokenization (repeatable)")
    group.add_argument("--whole-word", action="store_true", default=None,
                       help="forbid whole words only (not inside other words; leave off for Chinese/Japanese)")
    group.add_argument("--case-sensitive", action="store_true", help="forbid the exact letter case only")
    group.add_argument("--logit-bias", action="append", default=[], metavar="ID=BIAS",
                       help="add BIAS (-100..100) to token ID's logit (repeatable)")
    group.add_argument("--allow-token", action="append", type=int, default=[], metavar="ID",
                       help="only these token ids may be produced (repeatable)")
    group.add_argument("--processor", action="append", default=[], metavar="NAME[=JSON]",
                       help="a logits-processor plugin with JSON object parameters (repeatable)")
    group.add_argument("--criterion", action="append", default=[], metavar="NAME[=JSON]",
                       help="a stopping-criterion plugin with JSON object parameters (repeatable)")
    group.add_argument("--input-screen", action="append", default=[], metavar="NAME[=JSON]",
                       help="an input screen run before generation, e.g. prompt_injection (repeatable)")
    group.add_argument("--output-moderator", action="append", default=[], metavar="NAME[=JSON]",
                       help="an output moderator run on the finished output, e.g. "
                       "'keyword_score={\"terms\": [\"secret\"]}' (repeatable; streams are held back)")
    group.add_argument("--stop-repetition", metavar="N,K",
                       help="stop when a unit of up to N tokens repeats K times in a row")


def parse_plugin(text: str) -> tuple[str, dict[str, Any] | None]:
    """``name`` or ``name={"json": "object"}``."""
    name, sep, raw = text.partition("=")
    if not sep:
        return name, None
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"plugin {name}: parameters are not JSON ({exc})") from exc
    if not isinstance(params, dict):
        raise ValueError(f"plugin {name}: parameters must be a JSON object")
    return name, params


def parse_logit_bias(items: Sequence[str]) -> dict[int, float]:
    out: dict[int, float] = {}
    for item in items:
        token, sep, bias = item.partition("=")
        try:
            out[int(token)] = float(bias)
        except ValueError:
            raise ValueError(f"--logit-bias {item!r}: expected ID=BIAS, e.g. 1234=-100") from None
        if not sep:
            raise ValueError(f"--logit-bias {item!r}: expected ID=BIAS, e.g. 1234=-100")
    return out


def parse_forced_tokens(items: Sequence[str]) -> dict[int, int]:
    """``POS=ID`` pairs (``--force``) as {position: token id}; ValueError on a malformed or repeated position."""
    forced: dict[int, int] = {}
    for item in items:
        position, sep, token_id = item.partition("=")
        try:
            if not sep:
                raise ValueError
            key, value = int(position), int(token_id)
        except ValueError:
            raise ValueError(f"--force expects POS=ID (integers), got {item!r}") from None
        if key in forced:
            raise ValueError(f"--force: position {key} is given twice")
        forced[key] = value
    return forced


def parse_repetition(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        size, repeats = (int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--stop-repetition {text!r}: expected N,K, e.g. 8,3") from None
    return size, repeats


def _add_common(parser: argparse.ArgumentParser, *, timeout_s: float) -> None:
    parser.add_argument(
        "--addr", default=None, metavar="HOST:PORT", help=f"server address (default: ${ADDR_ENV} or {DEFAULT_ADDR})"
    )
    parser.add_argument(
        "--timeout", type=float, default=timeout_s, metavar="S", help=f"deadline in seconds, 0 for none ({timeout_s:g})"
    )
    parser.add_argument("--output", choices=("text", "json"), default="text", help="output format (text)")
    add_credential_flags(parser)


def add_credential_flags(parser: argparse.ArgumentParser) -> None:
    """Token and TLS flags of every command that calls a server."""
    sec = parser.add_argument_group("credentials")
    sec.add_argument("--token-file", metavar="FILE", help=f"bearer token file (default: ${TOKEN_ENV})")
    sec.add_argument("--tls-ca", metavar="PEM", help="TLS: trust this CA (implies TLS; default: plaintext)")
    sec.add_argument("--tls-cert", metavar="PEM", help="mutual TLS: client certificate (with --tls-key)")
    sec.add_argument("--tls-key", metavar="PEM", help="mutual TLS: client key")
    sec.add_argument("--tls", action="store_true", help="TLS with the system's trusted CAs")


def client_from_args(args: argparse.Namespace, timeout_s: float | None) -> ProctorClient:
    """A client for --addr with the credentials the flags (or $PROCTOR_TOKEN) give."""
    credentials = None
    if args.tls or args.tls_ca or args.tls_cert:
        credentials = tls_credentials(args.tls_ca, args.tls_cert, args.tls_key)
    return ProctorClient(resolve_addr(args.addr), timeout_s=timeout_s, credentials=credentials,
                         token=resolve_token(token_file=args.token_file))


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
        with client_from_args(args, args.timeout or None) as client:
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
        with client_from_args(args, args.timeout or None) as client:
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


def run_schemas(args: argparse.Namespace) -> int:
    """Run ``schemas``: ``name@version  description`` per registered schema (json: ListSchemasResponse)."""
    try:
        with client_from_args(args, args.timeout or None) as client:
            schemas = client.list_schemas()
    except ProctorError as error:
        print_error(error)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    if args.output == "json":
        print(to_json(generation_pb2.ListSchemasResponse(schemas=schemas), include_defaults=True))
    elif schemas:
        print("\n".join(schema_lines(schemas)))
    else:
        print("no schemas registered", file=sys.stderr)
    return EXIT_OK


def request_from_args(args: argparse.Namespace) -> generation_pb2.GenerateRequest:
    """Build the request from parsed ``generate`` arguments (ValueError / OSError on bad input)."""
    from_stdin = [flag for flag, path in (("--messages", args.messages), ("--json-schema", args.json_schema),
                                          ("--grammar", args.grammar)) if path == "-"]
    if len(from_stdin) > 1:
        raise ValueError(f"only one of {' and '.join(from_stdin)} can read stdin (-)")
    messages = load_messages(args.messages) if args.messages is not None else None
    json_schema = load_json_schema(args.json_schema) if args.json_schema is not None else None
    grammar = read_input(args.grammar) if args.grammar is not None else None
    grammar_syntax = args.grammar_syntax
    if grammar is not None and grammar_syntax is None:
        grammar_syntax = grammar_syntax_for(args.grammar)
    return build_request(
        args.prompt,
        messages,
        request_id=args.request_id,
        subject_id=args.subject,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        seed=args.seed,
        typical_p=args.typical_p,
        greedy_first_tokens=args.greedy_first_tokens,
        first_tokens_temperature=args.first_tokens_temperature,
        forced_tokens=parse_forced_tokens(args.force),
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        stop=args.stop,
        stop_token_ids=args.stop_token_id,
        ignore_eos=args.ignore_eos,
        top_logprobs=args.top_logprobs,
        token_details=args.token_details,
        json_schema=json_schema,
        regex=args.regex,
        choice=args.choice,
        grammar=grammar,
        grammar_syntax=grammar_syntax,
        schema_ref=args.schema_ref,
        constraint_backend=args.constraint_backend,
        json_whitespace=args.json_whitespace,
        exact_only=args.exact_only,
        forbidden=args.forbid,
        forbidden_case_insensitive=False if args.case_sensitive else None,
        forbidden_whole_word=args.whole_word,
        logit_bias=parse_logit_bias(args.logit_bias),
        allowed_token_ids=args.allow_token,
        logits_processors=[parse_plugin(p) for p in args.processor],
        stopping_criteria=[parse_plugin(c) for c in args.criterion],
        input_screens=[parse_plugin(c) for c in args.input_screen],
        output_moderators=[parse_plugin(c) for c in args.output_moderator],
        repetition=parse_repetition(args.stop_repetition),
        must_include=args.must_include,
        close_at_budget=args.close_at_budget,
        confidence=args.confidence,
        context_overflow=args.context_overflow,
        speculation=args.speculation,
        cache_prompt=args.cache_prompt,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        early_stopping=args.early_stopping,
        num_return_sequences=args.num_return_sequences,
    )


def read_input(path: str) -> str:
    """The text of a file, or of stdin for ``-``."""
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def load_json_schema(path: str) -> str:
    """A JSON Schema file's text (``-``: stdin), checked to be JSON here so a typo is a local error (exit 2).

    The text is sent as is: the server canonicalizes it and checks that it is a usable schema.
    """
    text = read_input(path)
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        pass  # nested deeper than Python parses: the server judges it (its depth limit answers at once)
    return text


def grammar_syntax_for(path: str) -> str:
    """The syntax a grammar file's suffix names (``.gbnf``/``.ebnf``: ebnf); lark otherwise, and for stdin."""
    return GRAMMAR_SUFFIXES.get(os.path.splitext(path)[1].lower(), "lark")


def load_messages(path: str) -> list[dict[str, Any]]:
    """Read chat turns from a JSON file (``-``: stdin): a list of objects, or ``{"messages": [...]}``."""
    data = json.loads(read_input(path))
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
    for rank, sequence in enumerate(response.sequences[1:], 2):  # beam search: the other returned beams
        print(f"--- beam {rank} (score {sequence.score:.4f}) ---\n{sequence.text}", file=out)
    out.flush()
    _print_summary(response)


def _print_summary(message: generation_pb2.GenerateResponse | generation_pb2.GenerateChunk) -> None:
    """The summary line and, under it, any schema validation errors (stderr, so stdout stays the text)."""
    for line in [summary_line(message), *validation_lines(message)]:
        print(line, file=sys.stderr)


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
            _print_summary(last)


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
