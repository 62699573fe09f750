"""The compile worker: a child process that compiles constraints so a runaway compile can be killed.

Engine libraries compile in native code that Python cannot interrupt; a pathological schema
could otherwise pin a core forever. The server sends (backend, spec) over a pipe; the worker
answers with the serialized compiled constraint or the error. On a timeout the parent kills the
process and starts a fresh one. The worker builds each backend's tokenizer info once, lazily.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from proctor.constraints.spec import ConstraintSpec


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    model_path: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]


def load_tokenizer(model_path: str) -> Any:
    """The model's tokenizer, from its directory (a GGUF model's: its converted cache entry) or, when that cache
    could not be written, from the .gguf file itself (parsed again here: the rare, slow path)."""
    from transformers import AutoTokenizer

    from proctor.offline import offline

    path = Path(model_path)
    with offline():
        if path.suffix == ".gguf":
            return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, clean_up_tokenization_spaces=False)
        return AutoTokenizer.from_pretrained(path, local_files_only=True, clean_up_tokenization_spaces=False)


def worker_main(conn: Connection, config: WorkerConfig) -> None:
    """Serve compile requests until the pipe closes."""
    from proctor.constraints.backends import create_backend
    from proctor.constraints.engines import BACKEND_NAMES
    from proctor.constraints.errors import ConstraintError

    tokenizer = load_tokenizer(config.model_path)
    backends: dict[str, Any] = {}
    for name in BACKEND_NAMES:  # build tokenizer tables before the first request, not during it
        try:
            backends[name] = create_backend(name, tokenizer, config.vocab_size, config.eos_token_ids)
        except Exception:
            traceback.print_exc()
    try:
        conn.send(("ready",))
    except (BrokenPipeError, ConnectionResetError):  # the server stopped while this worker started: nothing to do
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        name, spec = message
        assert isinstance(spec, ConstraintSpec)
        start = time.perf_counter()
        try:
            if name not in backends:
                backends[name] = create_backend(name, tokenizer, config.vocab_size, config.eos_token_ids)
            compiled = backends[name].compile(spec)
            conn.send(("ok", compiled.to_bytes(), (time.perf_counter() - start) * 1000))
        except ConstraintError as exc:
            conn.send(("error", exc.reason, (time.perf_counter() - start) * 1000))
        except Exception as exc:  # a library crash on odd input is a compile failure, not a server fault
            detail = f"{type(exc).__name__}: {exc}"
            conn.send(("error", f"the engine failed on this constraint ({detail})", 0.0))
            traceback.print_exc()


def main() -> None:
    """Entry point of the worker process: ``python -m proctor.constraints.worker FD CONFIG_JSON``.

    A fresh interpreter (not multiprocessing's spawn) so the parent's ``__main__`` is never re-run.
    """
    import json
    import sys

    fd, raw = int(sys.argv[1]), json.loads(sys.argv[2])
    config = WorkerConfig(raw["model_path"], raw["vocab_size"], tuple(raw["eos_token_ids"]))
    worker_main(Connection(fd), config)


if __name__ == "__main__":
    main()
