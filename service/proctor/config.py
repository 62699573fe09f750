"""The one Settings object and the only home of defaults.

Precedence: command-line flags > environment (``PROCTOR_*``) > defaults. Every field can be set
from the environment by its upper-case name, e.g. ``PROCTOR_PORT=50051``.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# How the slot forward runs the linear layers (executor/weights.py); "auto" picks one (models/placement.py).
# Each with the revision of its arithmetic, recorded in the audit trail and bumped whenever what the mode
# computes changes, so a replay is refused rather than diverging (q8 2: the C++ kernel, float16 cache
# and embedding table; q4 1: GGUF Q4_1 layers and Q8_0 LM head in the C++ kernel, float16 cache;
# gguf 1: a .gguf file's own blocks of any supported type, activations rounded per block as llama.cpp does;
# gguf 2: the 32-input types and Q6_K scaled per block from one exact integer sum per row, eight rows at a time;
# then every mode's next — dense 2, fp16 2, q8 3, q4 2, gguf 3 — prompt positions computed as rows of the
# step's one forward, as decode rows are, instead of by a prefill of their own: issue 42; gguf 4: Q4_K and
# Q5_K scaled per block from exact integer totals, eight weight rows at a time, as Q6_K is).
WEIGHT_MODE_REVISIONS = {"dense": 2, "fp16": 2, "q8": 3, "q4": 2, "gguf": 4}
WEIGHT_MODES = tuple(WEIGHT_MODE_REVISIONS)
# The revision of the sampler's draw (decoding/sampler.py), recorded the same way: a record sampled under
# another revision replays differently, so its replay is refused. 1: torch.multinomial over the whole
# vocabulary (an exponential drawn per token); 2: sampler.draw(), the inverse cumulative distribution at one
# uniform, with warpers.py's filters finding their cut among a row's likeliest tokens.
SAMPLER_REVISION = 2
# The revision of the budget's closing rule (engine/closing.py), recorded the same way: a record the rule shaped
# (a JSON output closed at its budget, or any tool-call grammar) replays differently under another, so its replay
# is refused. 1: one margin per schema, tool calls never closed; 2 (issue 56): the margin of where the output
# stands, tool calls closed within the budget, a repeated call ends the answer.
CLOSING_REVISION = 2
# Whether rows must be batch-invariant: each row's logits the same bits whatever shares its forward (issue 43).
# auto: what the runner offers (every runner on the CPU; not CUDA's default one, where the libraries pick kernels by
# the batch's shape); on: required (on CUDA the Triton step, executor/triton_step.py; the server refuses
# to start where it cannot serve the model); off: not required. The audit record says what the rows were, and a
# replay is refused across a difference.
BATCH_INVARIANT_MODES = ("auto", "on", "off")
AUDIT_ENCRYPTION_MODES = ("off", "subject")  # subject: sealed under the subject's key (audit/sealing.py)


def default_audit_db() -> str:
    """``PROCTOR_AUDIT_DB`` or ``<repo>/.proctor/audit/audit.db``."""
    return os.environ.get("PROCTOR_AUDIT_DB") or str(Path(__file__).resolve().parents[2] / ".proctor" / "audit"
                                                     / "audit.db")


def default_model_store() -> Path:
    """Where converted models live: ``PROCTOR_MODEL_STORE`` or ``<repo>/.proctor/models``."""
    env = os.environ.get("PROCTOR_MODEL_STORE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".proctor" / "models"


KERNEL_CACHE_VARIABLE, TOKENIZER_CACHE_VARIABLE = "PROCTOR_KERNEL_CACHE", "PROCTOR_TOKENIZER_CACHE"
CACHE_VARIABLES = (KERNEL_CACHE_VARIABLE, TOKENIZER_CACHE_VARIABLE)  # read from the environment, not Settings


def default_kernel_cache() -> Path:
    """Where compiled kernels live (executor/fused_decode.py): ``PROCTOR_KERNEL_CACHE``,
    else ``<repo>/.proctor/kernels``."""
    env = os.environ.get(KERNEL_CACHE_VARIABLE)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".proctor" / "kernels"


def default_tokenizer_cache() -> Path:
    """Where GGUF files' converted tokenizers are kept (models/gguf_tokenizer.py): ``PROCTOR_TOKENIZER_CACHE`` or
    ``<repo>/.proctor/tokenizers``."""
    env = os.environ.get(TOKENIZER_CACHE_VARIABLE)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".proctor" / "tokenizers"


SPECULATION_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 50051
    # A Hugging Face model directory or a .gguf file; empty means the embedded default model.
    model: str = ""
    model_store: Path = field(default_factory=default_model_store)
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    weights: str = "auto"  # auto | dense | fp16 | q8: how the linear layers run (executor/weights.py)
    batch_invariant: str = "auto"  # auto | on | off: whether rows must be batch-invariant (BATCH_INVARIANT_MODES)
    model_signing_key: str = ""  # PEM public key of the model's signer (models/signature.py); "": not checked
    model_signing_ca: str = ""  # or the PEM CA certificate(s) its signing certificate chains to
    require_model_signature: bool = False  # refuse to start a model whose signature is missing or fails
    cuda_graphs: bool = True  # CUDA: steps padded to row buckets and replayed as graphs (executor/graph_step.py)
    threads: int = 0  # torch intra-op threads on CPU: N pinned; 0 = CPU budget, tuned (engine/thread_tuner.py)
    default_max_new_tokens: int = 256
    max_new_tokens_limit: int = 4096
    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    max_stop_token_ids: int = 64
    max_prompt_chars: int = 1_000_000
    # Continuous batching (engine/scheduler.py): requests decoded together, requests allowed to wait
    # (beyond: RESOURCE_EXHAUSTED), KV-cache memory budget, prompt tokens prefilled per step.
    max_batch_size: int = 32
    max_waiting: int = 64
    kv_cache_mb: int = 4096
    # Tokens one step's forward is fed, all rows together (engine/scheduler.py): every running row's next
    # token first, then prompt pieces, then drafts. Chosen by measurement (bench/README.md, "One forward a step").
    max_step_tokens: int = 256
    # The prefix cache keeps prompts in chunks of this many tokens (engine/prefix_cache.py); 0: no prefix cache.
    prefill_chunk_tokens: int = 128
    # Fewer steps for the same tokens (engine/drafting.py, engine/prefix_cache.py); none changes a bit of
    # the output. The prefix cache keeps prompts' full chunks (of prefill_chunk_tokens) within this budget
    # (0: off); jump_forward extends a run of grammar-forced tokens in one forward; speculation drafts by
    # prompt lookup: on, off, or auto (on while the batch holds at most speculation_max_rows rows).
    prefix_cache_mb: int = 256
    jump_forward: bool = True
    max_forced_tokens: int = 16  # grammar-forced tokens extended in one forward per row
    speculation: str = "auto"  # auto | on | off
    speculation_tokens: int = 4  # tokens drafted per row and step
    speculation_max_rows: int = 16  # measured: bench/README.md, "Fewer steps"
    # A thinking model's section (engine/thought_markers.py: the names, checked when the engine starts): auto finds
    # it in the chat template and vocabulary.
    reasoning_parser: str = "auto"
    max_message_bytes: int = 16 * 1024 * 1024
    reflection: bool | None = None  # None: on when bound to loopback
    # Shutdown on SIGTERM (app.py): health NOT_SERVING for drain_notice_s while calls are still served
    # (a load balancer sees it at its next probe), then the listener closes and in-flight calls get
    # grace_period_s to finish. Kubernetes' terminationGracePeriodSeconds covers both (deploy/k8s).
    grace_period_s: float = 10.0
    drain_notice_s: float = 5.0
    # A second, plaintext port that serves the gRPC health service only (0: off), for kubelet gRPC
    # probes, which cannot speak TLS; it reveals nothing but SERVING / NOT_SERVING.
    health_port: int = 0
    # The OpenAI-compatible HTTP API (openai_http/), in the same process and event loop, on the same host with
    # the same callers, limits and TLS files (0: off).
    http_port: int = 0
    # The watchdog (observability/watchdog.py): health NOT_SERVING and an ERROR line when the engine has
    # pending work, or the audit writer queued records, and neither moves for this many seconds (0: off).
    watchdog_s: float = 30.0
    warmup: bool = True
    log_level: str = "INFO"
    # Observability (observability/, README "Observability"): the log format, Prometheus metrics
    # over HTTP (port 0: off; empty host: the server's host), OpenTelemetry traces (also on when
    # OTEL_TRACES_EXPORTER names an exporter other than "none").
    log_format: str = "text"  # text | json
    metrics_port: int = 0
    metrics_host: str = ""
    tracing: bool = False
    # Constraints: compile time limit per engine attempt, spec size limit, compile worker processes
    # (isolation makes a runaway compile killable; off only for in-process tests), schema registry.
    constraint_timeout_s: float = 5.0
    max_constraint_bytes: int = 1024 * 1024
    max_schema_depth: int = 128  # JSON nesting of a schema (brackets), checked on the text before parsing;
    # MaskBench's deepest real schemas reach 63
    # Validated fallback for JSON schemas no engine enforces exactly: attempts per request (each one
    # generated under the relaxed schema and validated against the full one), and the temperature
    # of the retries of a greedy request (a retry with the same settings would repeat itself).
    fallback_attempts: int = 3
    fallback_temperature: float = 0.7
    compile_workers: int = 1
    constraint_isolation: bool = True
    schema_dir: str = ""  # empty: the registry shipped with the package (proctor/schemas)
    template_dir: str = ""  # empty: the contract templates shipped with the package (proctor/templates)
    # Forbidden phrases: a server-wide list (a UTF-8 file, one phrase per line, "#" comments) merged
    # into every request's list, and the per-request limits.
    forbidden_file: str = ""
    max_forbidden_phrases: int = 2000
    max_forbidden_phrase_chars: int = 200
    max_logit_bias: int = 1024
    max_allowed_token_ids: int = 65536  # more than any vocabulary we serve (49,152 for the default)
    max_choice_options: int = 1024
    max_plugin_calls: int = 16  # per list (logits_processors, stopping_criteria)
    max_plugin_params_bytes: int = 64 * 1024  # serialized params of one plugin call
    # Plugins: entry points (groups proctor.logits_processors / proctor.stopping_criteria) to load
    # at start, comma-separated names; "*" loads every installed one. The built-ins are always there.
    plugins: str = ""
    # Input screens and output moderators run on every Generation request before the request's own
    # (docs/plugins.md): comma-separated names ("prompt_injection"), or a JSON list whose items are
    # names or {"name": ..., "params": {...}}. Checked at start (unknown names or bad params stop it).
    input_screens: str = ""
    output_moderators: str = ""
    # Audit trail (docs/audit-format.md). On by default, in SQLite; audit_dsn (postgresql://…) selects
    # PostgreSQL. Compliance mode: a response completes only once its record is committed.
    audit: bool = True
    audit_db: str = field(default_factory=default_audit_db)
    audit_dsn: str = ""
    audit_compliance: bool = True
    audit_top_n: int = 5
    audit_prompt_policy: str = "full"  # full | hmac
    audit_output_policy: str = "full"  # full | hmac
    audit_hmac_key_file: str = ""
    audit_signing_key: str = ""  # Ed25519 PEM; empty: <audit db>.key (created on first start)
    audit_checkpoint_file: str = ""  # empty: <audit db>.checkpoints
    audit_origin: str = ""  # the checkpoints' origin line and note key name; empty: proctor.audit/<key hash>
    audit_witnesses: str = ""  # witnesses' vkeys (comma-separated) whose cosignatures are kept; empty: any valid one
    audit_witness_urls: str = ""  # c2sp.org/tlog-witness submission prefixes (comma-separated) posted each checkpoint
    audit_witness_quorum: int = 0  # cosignatures (of audit_witnesses) a checkpoint needs before proofs are given in it
    tlog_public: bool = False  # the HTTP port's /tlog/ (checkpoint, tiles: hashes only) open to all; else audit:read
    audit_checkpoint_every: int = 1000
    audit_checkpoint_interval_s: float = 60.0
    audit_receipts: bool = True  # every answer waits for its record's commit and carries a signed receipt
    # off | subject: each record's content sealed under its subject's key (erasure). Off by default: the keys must
    # live somewhere durable (and shared by replicas), and a lost key store erases every record it sealed.
    audit_encryption: str = "off"
    audit_key_dir: str = ""  # the subjects' keys (audit/keystore.py); empty: <audit db>.keys
    audit_retention_days: int = 0  # 0: off; else the keys of older records are destroyed (audit/retention.py)
    audit_retention_file: str = ""  # YAML: periods per subject and per caller, over audit_retention_days
    audit_queue_size: int = 1024
    # Security (api/gate.py, api/tls.py, api/callers.py). Off loopback the server refuses to start
    # without TLS and a callers file unless `insecure` is set; on loopback without a callers file it is open.
    tls_cert_file: str = ""  # PEM certificate chain; with tls_key_file, the port speaks TLS
    tls_key_file: str = ""
    tls_client_ca_file: str = ""  # PEM CA bundle: mutual TLS, a client certificate from it is required
    callers_file: str = ""  # YAML or TOML: names, sha256 of bearer tokens / mTLS identities, roles, limits
    insecure: bool = False  # allow a plaintext or open server on a non-loopback address
    http_plaintext: bool = False  # the HTTP port without TLS (a gateway or mesh terminates it); gRPC keeps its TLS
    reflection_needs_auth: bool = True  # with a callers file, reflection answers known callers only

    def __post_init__(self) -> None:
        if self.fallback_attempts < 1:
            raise ValueError(f"fallback_attempts must be at least 1, got {self.fallback_attempts}")
        if not self.fallback_temperature > 0:
            raise ValueError(f"fallback_temperature must be above 0, got {self.fallback_temperature}")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        if self.max_schema_depth < 1:
            raise ValueError(f"max_schema_depth must be at least 1, got {self.max_schema_depth}")
        if self.audit_witnesses:
            from proctor_client.tlog.note import NoteError, parse_vkey
            try:
                [parse_vkey(vkey) for vkey in self.witness_vkeys]
            except NoteError as exc:
                raise ValueError(f"audit_witnesses: {exc}") from None
        if (self.witness_urls or self.audit_witness_quorum) and not self.witness_vkeys:
            raise ValueError("audit_witness_urls and audit_witness_quorum need audit_witnesses: the vkeys the "
                             "witnesses' cosignatures are checked against")
        if not 0 <= self.audit_witness_quorum <= len(self.witness_vkeys):
            raise ValueError(f"audit_witness_quorum ({self.audit_witness_quorum}) must be between 0 and the number "
                             f"of audit_witnesses ({len(self.witness_vkeys)})")
        if any(c.isspace() or c == "+" for c in self.audit_origin):
            raise ValueError(f"audit_origin {self.audit_origin!r}: a note key name has no spaces and no '+'")
        if self.max_step_tokens <= self.max_batch_size:
            raise ValueError(f"max_step_tokens ({self.max_step_tokens}) must exceed max_batch_size "
                             f"({self.max_batch_size}): every running row takes one token of a step, and a prompt "
                             "needs at least one more")
        if self.prefill_chunk_tokens < 0:
            raise ValueError(f"prefill_chunk_tokens must be 0 (off) or more, got {self.prefill_chunk_tokens}")
        if self.speculation not in SPECULATION_MODES:
            raise ValueError(f"speculation must be one of {', '.join(SPECULATION_MODES)}, got {self.speculation!r}")
        for name in ("prefix_cache_mb", "max_forced_tokens", "speculation_tokens", "speculation_max_rows"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be 0 or more, got {getattr(self, name)}")
        if self.audit_retention_days < 0:
            raise ValueError(f"audit_retention_days must be >= 0 (0: off), got {self.audit_retention_days}")
        if (self.audit_retention_days or self.audit_retention_file) and self.audit_encryption != "subject":
            raise ValueError("audit_retention_days needs audit_encryption subject: retention destroys the keys that "
                             "seal the records' content, and unsealed records have none")
        if self.audit_encryption not in AUDIT_ENCRYPTION_MODES:
            raise ValueError(f"audit_encryption must be one of {', '.join(AUDIT_ENCRYPTION_MODES)}, "
                             f"got {self.audit_encryption!r}")
        if self.batch_invariant not in BATCH_INVARIANT_MODES:
            raise ValueError(f"batch_invariant must be one of {', '.join(BATCH_INVARIANT_MODES)}, "
                             f"got {self.batch_invariant!r}")
        if self.weights.strip().lower() not in ("auto", *WEIGHT_MODES):
            raise ValueError(f"weights must be auto or one of {', '.join(WEIGHT_MODES)}, got {self.weights!r}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be 'text' or 'json', got {self.log_format!r}")
        for name in ("grace_period_s", "drain_notice_s", "watchdog_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be 0 or more seconds, got {getattr(self, name)}")
        for name in ("input_screens", "output_moderators"):
            plugin_calls_setting(name, getattr(self, name))

    @property
    def loopback(self) -> bool:
        """Bound to this machine only (nothing else on the network can connect)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            return False

    @property
    def witness_vkeys(self) -> tuple[str, ...]:
        """``audit_witnesses`` as a tuple of vkeys (the witnesses whose cosignatures the log keeps)."""
        return tuple(v.strip() for v in self.audit_witnesses.split(",") if v.strip())

    @property
    def witness_urls(self) -> tuple[str, ...]:
        """``audit_witness_urls`` as a tuple (the witnesses each new checkpoint is posted to)."""
        return tuple(v.strip() for v in self.audit_witness_urls.split(",") if v.strip())

    @property
    def reflection_enabled(self) -> bool:
        if self.reflection is not None:
            return self.reflection
        return self.loopback

    @classmethod
    def load(cls, overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Settings:
        """Build settings from the environment, then apply non-None ``overrides`` (CLI flags)."""
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(f"PROCTOR_{f.name.upper()}")
            if raw is not None:
                values[f.name] = _parse(f, raw)
        for key, value in (overrides or {}).items():
            if value is not None:
                values[key] = value
        return cls(**values)

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


@functools.lru_cache(maxsize=16)
def plugin_calls_setting(name: str, raw: str) -> tuple[tuple[str, str], ...]:
    """A server-wide plugin list (``input_screens``, ``output_moderators``) as (name, params JSON) pairs."""
    text = raw.strip()
    if not text:
        return ()
    if not text.startswith("["):
        names = [part.strip() for part in text.split(",") if part.strip()]
        bad = [n for n in names if not n.replace("_", "").replace("-", "").replace(".", "").isalnum()]
        if bad:
            raise ValueError(f"{name}: {bad[0]!r} is not a plugin name (give parameters as a JSON list)")
        return tuple((n, "{}") for n in names)
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not a JSON list: {exc}") from exc
    calls: list[tuple[str, str]] = []
    for index, item in enumerate(items if isinstance(items, list) else [None]):
        if isinstance(item, str) and item:
            calls.append((item, "{}"))
        elif isinstance(item, dict) and isinstance(item.get("name"), str) and item["name"] \
                and isinstance(item.get("params", {}), dict) and set(item) <= {"name", "params"}:
            calls.append((item["name"], json.dumps(item.get("params", {}), sort_keys=True)))
        else:
            raise ValueError(f"{name}[{index}]: expected a plugin name or {{\"name\": ..., \"params\": {{...}}}}")
    return tuple(calls)


def _parse(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind.startswith("bool"):
            if raw.strip().lower() in {"", "none", "auto"} and "None" in kind:
                return None
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "Path":
            return Path(raw)
    except ValueError as exc:
        raise ValueError(f"PROCTOR_{f.name.upper()}={raw!r}: {exc}") from exc
    return raw
