"""The one Settings object and the only home of defaults.

Precedence: command-line flags > environment (``PROCTOR_*``) > defaults. Every field can be set
from the environment by its upper-case name, e.g. ``PROCTOR_PORT=50051``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_store() -> Path:
    """Where converted models live: ``PROCTOR_MODEL_STORE`` or ``<repo>/.proctor/models``."""
    env = os.environ.get("PROCTOR_MODEL_STORE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".proctor" / "models"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 50051
    # A Hugging Face model directory or a .gguf file; empty means the embedded default model.
    model: str = ""
    model_store: Path = field(default_factory=default_model_store)
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    threads: int = 0  # torch intra-op threads on CPU; 0 = torch's default
    default_max_new_tokens: int = 256
    max_new_tokens_limit: int = 4096
    max_stop_strings: int = 16
    max_stop_string_chars: int = 256
    max_stop_token_ids: int = 64
    max_prompt_chars: int = 1_000_000
    max_batch_size: int = 1
    max_waiting: int = 64
    max_message_bytes: int = 16 * 1024 * 1024
    reflection: bool | None = None  # None: on when bound to loopback
    grace_period_s: float = 10.0
    warmup: bool = True
    log_level: str = "INFO"
    # Constraints: compile time limit per engine attempt, spec size limit, compile worker processes
    # (isolation makes a runaway compile killable; off only for in-process tests), schema registry.
    constraint_timeout_s: float = 5.0
    max_constraint_bytes: int = 1024 * 1024
    compile_workers: int = 1
    constraint_isolation: bool = True
    schema_dir: str = ""  # empty: the registry shipped with the package (proctor/schemas)

    @property
    def reflection_enabled(self) -> bool:
        if self.reflection is not None:
            return self.reflection
        return self.host in {"127.0.0.1", "localhost", "::1"}

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
