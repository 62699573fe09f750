"""The ``proctor`` command: serve, generate, info, model install."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from proctor import __version__
from proctor.config import AUDIT_ENCRYPTION_MODES, BATCH_INVARIANT_MODES, WEIGHT_MODES, Settings
from proctor.engine.thought_markers import PARSER_NAMES


def _add_serve(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("serve", help="start the gRPC server with a model")
    p.add_argument("--host", help="address to bind (default 127.0.0.1; PROCTOR_HOST)")
    p.add_argument("--port", type=int, help="port (default 50051, 0 picks a free one; PROCTOR_PORT)")
    p.add_argument("--model", help="HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--model-store", type=Path, help="where converted models live (PROCTOR_MODEL_STORE)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="compute device (default auto)")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights/activations dtype (auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--weights", choices=["auto", *WEIGHT_MODES],
                   help="linear layers: dense (the dtype itself, the exact reference), fp16, q8 (int8) or q4 (the "
                   "GGUF's own Q4_1 blocks, Q8_0 LM head) weights on CPU; auto: q4 on CPU, dense on CUDA "
                   "(PROCTOR_WEIGHTS)")
    p.add_argument("--batch-invariant", choices=list(BATCH_INVARIANT_MODES),
                   help="rows whose logits are their own bits whatever shares the forward: auto (default) takes what "
                   "the runner offers (every runner on the CPU, not CUDA's default one), on requires it (on CUDA: "
                   "batch-invariant Triton kernels, Llama's arithmetic, --weights dense; no start where they cannot "
                   "serve), off does not; the audit record says which, and replay is refused across a difference "
                   "(PROCTOR_BATCH_INVARIANT)")
    p.add_argument("--model-signing-key", help="PEM public key of the model's signer: its OpenSSF model signature "
                   "(model.sig in the directory, FILE.gguf.sig beside a GGUF) is checked before loading and recorded "
                   "(PROCTOR_MODEL_SIGNING_KEY)")
    p.add_argument("--model-signing-ca", help="or the PEM CA certificate(s) the signing certificate chains to "
                   "(certificate mode; PROCTOR_MODEL_SIGNING_CA)")
    p.add_argument("--require-model-signature", action=argparse.BooleanOptionalAction, default=None,
                   help="refuse to start unless the model's signature verifies with --model-signing-key or -ca")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="on CUDA, steps padded to row counts 1, 2, 4, … up to --max-step-tokens, each captured once "
                   "as a CUDA graph and replayed (Llama's arithmetic, --weights dense; default on; "
                   "PROCTOR_CUDA_GRAPHS)")
    p.add_argument("--threads", type=int, help="torch CPU threads: N pins exactly N; 0 (default) = the CPUs "
                   "this process may use (affinity, cgroup quota), tuned under load by measurement")
    p.add_argument("--max-batch-size", type=int, help="requests decoded together (default 32)")
    p.add_argument("--max-waiting", type=int, help="requests allowed to wait; beyond, RESOURCE_EXHAUSTED (default 64)")
    p.add_argument("--kv-cache-mb", type=int,
                   help="KV-cache memory budget in MiB: rows join while what they reserve fits (default 4096)")
    p.add_argument("--max-step-tokens", type=int, help="tokens one step's forward is fed, every row together: "
                   "the running rows' next tokens, prompt pieces, drafts (default 256)")
    p.add_argument("--prefill-chunk-tokens", type=int, help="the prefix cache keeps prompts in chunks of this many "
                   "tokens (default 128; 0: no prefix cache)")
    steps = p.add_argument_group("fewer steps for the same tokens (none changes the output; docs/architecture.md)")
    steps.add_argument("--prefix-cache-mb", type=int, help="memory for prompts' cached chunks (default 256; 0: off)")
    steps.add_argument("--no-jump-forward", dest="jump_forward", action="store_false", default=None,
                       help="decode grammar-forced tokens one step each instead of in one forward")
    steps.add_argument("--max-forced-tokens", type=int, help="forced tokens extended per row and step (default 16)")
    steps.add_argument("--speculation", choices=("auto", "on", "off"),
                       help="prompt-lookup drafts (default auto: on while the batch is small)")
    steps.add_argument("--speculation-tokens", type=int, help="tokens drafted per row and step (default 4)")
    steps.add_argument("--speculation-max-rows", type=int,
                       help="auto speculation stays on while the batch holds at most this many rows (default 16)")
    p.add_argument("--reasoning-parser", choices=PARSER_NAMES,
                   help="a thinking model's section (<think>...</think>): the constraint starts after it; auto "
                   "(default) finds it in the chat template and vocabulary, none turns it off (README: reasoning)")
    p.add_argument("--max-new-tokens-limit", type=int, help="server cap on max_new_tokens (default 4096)")
    p.add_argument("--grace-period", dest="grace_period_s", type=float,
                   help="seconds in-flight calls may take to finish on shutdown (default 10)")
    p.add_argument("--drain-notice", dest="drain_notice_s", type=float,
                   help="on SIGTERM, seconds the health check reports NOT_SERVING while calls are still "
                   "accepted, before the listener closes: at least one probe period of the load balancer "
                   "(default 5; SIGINT skips it)")
    p.add_argument("--health-port", type=int, help="also serve the gRPC health service alone on this plaintext "
                   "port, for probes that cannot speak TLS (kubelet gRPC probes; default 0: off)")
    p.add_argument("--reflection", action=argparse.BooleanOptionalAction, default=None,
                   help="gRPC server reflection (default: on when bound to loopback)")
    p.add_argument("--constraint-timeout", dest="constraint_timeout_s", type=float,
                   help="compile time limit per constraint engine attempt, seconds (default 5)")
    p.add_argument("--compile-workers", type=int, help="constraint compile processes (default 1)")
    p.add_argument("--max-schema-depth", type=int, help="deepest JSON nesting of a schema (default 128)")
    p.add_argument("--fallback-attempts", type=int,
                   help="attempts per request on the validated fallback (default 3; 1: validate, never retry)")
    p.add_argument("--fallback-temperature", type=float,
                   help="temperature of the fallback's retries of a greedy request (default 0.7)")
    p.add_argument("--schema-dir", help="schema registry directory (default: the schemas shipped with proctor)")
    p.add_argument("--template-dir", help="contract template directory (default: the templates shipped with proctor)")
    p.add_argument("--forbidden-file", help="server-wide forbidden phrases, one per line, merged into every request")
    p.add_argument("--plugins", help="plugin entry points to load, comma-separated, or '*' (PROCTOR_PLUGINS)")
    p.add_argument("--input-screens", help="input screens run on every request before its own: comma-separated "
                   "names, or a JSON list of names / {\"name\": ..., \"params\": {...}} (PROCTOR_INPUT_SCREENS)")
    p.add_argument("--output-moderators", help="output moderators run on every request before its own, same format "
                   "(PROCTOR_OUTPUT_MODERATORS)")
    audit = p.add_argument_group("audit trail (docs/audit-format.md)")
    audit.add_argument("--audit-db", help="SQLite audit file (default .proctor/audit/audit.db; PROCTOR_AUDIT_DB)")
    audit.add_argument("--audit-dsn", help="PostgreSQL audit store instead, postgresql://… (PROCTOR_AUDIT_DSN)")
    audit.add_argument("--no-audit", dest="audit", action="store_false", default=None,
                       help="do not record calls (not for production)")
    audit.add_argument("--no-audit-compliance", dest="audit_compliance", action="store_false", default=None,
                       help="return responses without waiting for their record to be committed")
    audit.add_argument("--audit-top-n", type=int, help="alternatives recorded per token (default 5)")
    audit.add_argument("--audit-prompt-policy", choices=("full", "hmac"), help="store the prompt, or only its HMAC")
    audit.add_argument("--audit-output-policy", choices=("full", "hmac"), help="store the output, or only its HMAC")
    audit.add_argument("--audit-hmac-key-file", help="HMAC key (>= 16 bytes), kept outside the store")
    audit.add_argument("--audit-signing-key", help="Ed25519 PEM key for checkpoints (default <audit db>.key)")
    audit.add_argument("--audit-origin", help="the log's name in its signed checkpoints (default "
                                              "proctor.audit/<key hash>; PROCTOR_AUDIT_ORIGIN)")
    audit.add_argument("--audit-checkpoint-every", type=int,
                       help="records between signed checkpoints (default 1000): an inclusion proof needs one")
    audit.add_argument("--audit-checkpoint-interval", dest="audit_checkpoint_interval_s", type=float,
                       help="seconds between signed checkpoints while records arrive (default 60)")
    audit.add_argument("--audit-receipts", action=argparse.BooleanOptionalAction, default=None,
                       help="every answer waits for its record's commit and carries the log's signed receipt "
                       "(default on; docs/audit-format.md \"Receipts\")")
    audit.add_argument("--audit-encryption", choices=AUDIT_ENCRYPTION_MODES,
                       help="subject: each record's prompt, output and tokens sealed (AES-256-GCM) under its subject's "
                       "key, so `proctor audit erase --subject` erases them with every proof intact (default off; "
                       "docs/compliance.md)")
    audit.add_argument("--audit-key-dir", help="the subjects' keys, outside the log (default <audit db>.keys)")
    audit.add_argument("--audit-retention-days", type=int,
                       help="destroy the keys of records older than this many days, hourly, except what a legal hold "
                       "covers (default 0: off; the EU AI Act asks for at least 183; needs --audit-encryption subject)")
    audit.add_argument("--audit-retention-file", help="periods per subject and per caller, over --audit-retention-days "
                       "(YAML: subjects: {NAME: DAYS}, callers: {NAME: DAYS}; 0 keeps for ever)")
    audit.add_argument("--audit-witnesses", help="witness vkeys (comma-separated) whose cosignatures are kept "
                                                 "(default: any that verifies; PROCTOR_AUDIT_WITNESSES)")
    audit.add_argument("--audit-witness-url", dest="audit_witness_urls", action="append",
                       help="a witness's c2sp.org/tlog-witness submission prefix: each new checkpoint is posted to it "
                       "and its cosignature kept (repeat per witness; needs --audit-witnesses)")
    audit.add_argument("--audit-witness-quorum", type=int,
                       help="cosignatures of --audit-witnesses a checkpoint needs before proofs are given in it "
                       "(default 0: none)")
    audit.add_argument("--tlog-public", action=argparse.BooleanOptionalAction, default=None,
                       help="serve the log as a C2SP tiled log (/tlog/checkpoint, /tlog/tile/...; hashes only) on "
                       "--http-port to anyone (default off: callers with the audit:read role)")
    sec = p.add_argument_group("security (README: Security)")
    sec.add_argument("--tls-cert", dest="tls_cert_file", help="PEM certificate chain: serve TLS (with --tls-key)")
    sec.add_argument("--tls-key", dest="tls_key_file", help="PEM private key of --tls-cert")
    sec.add_argument("--tls-client-ca", dest="tls_client_ca_file",
                     help="PEM CA bundle: mutual TLS, every client must present a certificate from it")
    sec.add_argument("--callers-file", help="YAML/TOML: callers, sha256 of their tokens or mTLS names, roles, limits")
    sec.add_argument("--http-plaintext", action="store_true", default=None,
                     help="serve --http-port without TLS even with --tls-cert (behind a gateway or mesh that "
                     "terminates TLS, e.g. Kubernetes' inference gateway); the gRPC port keeps TLS, and callers "
                     "still authenticate")
    sec.add_argument("--insecure", action="store_true", default=None,
                     help="allow serving a non-loopback address without TLS or without a callers file")
    sec.add_argument("--reflection-auth", dest="reflection_needs_auth", action=argparse.BooleanOptionalAction,
                     default=None, help="with a callers file, reflection answers known callers only (default on)")
    p.add_argument("--watchdog-s", type=float, help="health NOT_SERVING when the engine or the audit writer makes "
                   "no progress for this long (default 30; 0: off)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false", default=None, help="skip the warm-up request")
    p.add_argument("--log-level", help="logging level (default INFO)")
    p.add_argument("--http-port", type=int,
                   help="also serve the OpenAI-compatible HTTP API on this port, same host, callers and TLS "
                        "(default 0: off; README: OpenAI-compatible HTTP API)")
    obs = p.add_argument_group("observability (README: Observability)")
    obs.add_argument("--log-format", choices=("text", "json"), help="log lines as text (default) or JSON")
    obs.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default 0: off)")
    obs.add_argument("--metrics-host", help="address of the metrics endpoint (default: --host)")
    obs.add_argument("--tracing", action="store_true", default=None,
                     help="OpenTelemetry traces (exporter from OTEL_TRACES_EXPORTER, default otlp)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    keys = ("host", "port", "model", "model_store", "device", "dtype", "weights", "batch_invariant",
            "model_signing_key", "model_signing_ca", "require_model_signature", "cuda_graphs",
            "threads", "max_batch_size",
            "max_waiting", "kv_cache_mb", "max_step_tokens", "prefill_chunk_tokens",
            "prefix_cache_mb", "jump_forward", "max_forced_tokens", "speculation", "speculation_tokens",
            "speculation_max_rows", "reasoning_parser",
            "max_new_tokens_limit", "grace_period_s", "drain_notice_s", "health_port", "http_port", "watchdog_s",
            "reflection",
            "warmup", "log_level",
            "constraint_timeout_s", "compile_workers", "max_schema_depth", "fallback_attempts",
            "fallback_temperature", "schema_dir", "template_dir", "forbidden_file", "plugins", "input_screens",
            "output_moderators", "audit",
            "audit_db", "audit_dsn", "audit_compliance", "audit_top_n", "audit_prompt_policy", "audit_output_policy",
            "audit_hmac_key_file", "audit_signing_key", "audit_origin", "audit_witnesses", "audit_witness_urls",
            "audit_witness_quorum", "tlog_public",
            "audit_checkpoint_every",
            "audit_checkpoint_interval_s", "audit_receipts", "audit_encryption", "audit_key_dir",
            "audit_retention_days", "audit_retention_file", "tls_cert_file",
            "tls_key_file",
            "tls_client_ca_file",
            "callers_file", "http_plaintext", "insecure", "reflection_needs_auth",
            "log_format", "metrics_port", "metrics_host", "tracing")
    if args.audit_witness_urls:
        args.audit_witness_urls = ",".join(args.audit_witness_urls)
    try:
        settings = Settings.load({k: getattr(args, k) for k in keys})
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from proctor.observability.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    from proctor.app import serve

    try:
        asyncio.run(serve(settings))
    except (FileNotFoundError, ValueError, OSError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _add_model(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("model", help="manage the local model store")
    sub = p.add_subparsers(dest="model_command", required=True)
    install = sub.add_parser("install-default", help="fetch and convert the embedded default model (idempotent)")
    install.add_argument("--store", type=Path, help="model store directory (PROCTOR_MODEL_STORE)")
    install.set_defaults(func=_install_default)
    sign = sub.add_parser("sign", help="sign a local model (directory or GGUF) with an OpenSSF model signature")
    sign.add_argument("model", type=Path, help="the model directory or .gguf file")
    sign.add_argument("--key", type=Path, required=True,
                      help="elliptic-curve PEM private key (a P-256 one is made there when missing); its public half "
                      "is written beside it as KEY.pub, for --model-signing-key")
    sign.add_argument("--cert", type=Path, help="certificate mode: the signing certificate of --key (PEM)")
    sign.add_argument("--chain", type=Path, nargs="*", default=[], help="the certificates up to its CA (PEM)")
    sign.set_defaults(func=_sign_model)
    verify = sub.add_parser("verify", help="check a local model's signature with its signer's public key")
    verify.add_argument("model", type=Path, help="the model directory or .gguf file")
    trust = verify.add_mutually_exclusive_group(required=True)
    trust.add_argument("--public-key", help="the signer's PEM public key (key mode)")
    trust.add_argument("--ca", help="the CA certificate(s) its signing certificate chains to (certificate mode)")
    verify.set_defaults(func=_verify_model)


def _sign_model(args: argparse.Namespace) -> int:
    from proctor.models.signature import sign_model

    try:
        signature, public = sign_model(args.model, args.key, args.cert, tuple(args.chain))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    trust = "--model-signing-ca with the CA of --cert" if args.cert else f"--model-signing-key {public}"
    print(f"signed {args.model}: {signature}; verifiers use {trust}", file=sys.stderr)
    return 0


def _verify_model(args: argparse.Namespace) -> int:
    from proctor.models.signature import VERIFIED, check_signature

    found = check_signature(args.model, args.public_key or "", args.ca or "")
    print(f"{found.status}: {found.detail}", file=sys.stderr)
    return 0 if found.status == VERIFIED else 1


def _install_default(args: argparse.Namespace) -> int:
    from proctor.models.default_model import main as install_main

    return install_main(["--store", str(args.store)] if args.store else [])


def build_parser() -> argparse.ArgumentParser:
    from proctor.audit.cli import add_audit_commands
    from proctor.health_probe import add_health_command
    from proctor_client.cli import add_client_commands
    from proctor_client.contract_cli import add_contract_commands

    parser = argparse.ArgumentParser(prog="proctor", description="Constrained, audited text generation over gRPC.")
    parser.add_argument("--version", action="version", version=f"proctor {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_serve(subparsers)
    add_client_commands(subparsers)
    add_contract_commands(subparsers)
    add_health_command(subparsers)
    _add_model(subparsers)
    add_audit_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
