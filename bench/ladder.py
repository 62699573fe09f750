"""The size ladder (issue 25): random-weight models of real shapes as the GGUFs people download, served by
Proctor from their own blocks (``--weights gguf``) beside llama.cpp on the same file, in the same run.

Each rung is a transformers config with a real model's shapes (vocabulary included) and random weights,
written as F16 with the ``convert_hf_to_gguf.py`` of the llama.cpp tree bench/llama_server.py builds, then
quantized with that tree's ``llama-quantize``. The tokenizer is the default model's (49,152 tokens; the
converter pads the vocabulary to the rung's size, so the LM head and logits have the real width). Files
are cached by config hash under the temp dir and never rebuilt.

Per rung and type: the decode tokens/s at 1 and 16 streams (Proctor: the slot forward's decode step, LM
head included, median of steady steps after a 32-token prompt; llama.cpp: ``llama-batched-bench`` with
32-token prompts and 32 generated), the load time and peak RSS against the file size, and the 1-stream
step time against the bytes a step reads (the memory roofline).

    python bench/ladder.py [--rungs qwen2.5-0.5b,llama-3.2-1b] [--types Q4_K_M,Q8_0] [--steps 24]

Status (2026-12-03): not yet producing figures. The random rungs build, but this tree's converter refuses
the stand-in tokenizer: its BPE pre-tokenizer hash (chkhsh a70b913f…) is not in get_vocab_base_pre, since
the default tokenizer as transformers re-saves it is not byte-identical to HuggingFaceTB's. Next: ship
the original SmolLM tokenizer files, or a registry tokenizer the converter knows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from llama_server import BUILD_DIR, CACHE, SOURCE_DIR, ensure_build  # noqa: E402

LADDER = Path(tempfile.gettempdir()) / "proctor-ladder"
RUNGS: dict[str, dict[str, Any]] = {  # the real models' shapes (their config.json), random weights
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    "qwen3-0.6b": {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 40960},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072, "rope_parameters": {
                         "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    "llama-3.2-3b": {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072, "rope_parameters": {
                         "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
}
PROMPT, STREAMS = 32, (1, 16)


def say(message: str) -> None:
    print(f"[ladder] {message}", file=sys.stderr, flush=True)


def rung_file(name: str, kind: str) -> Path:
    """The rung's GGUF of block type ``kind`` (F16, Q4_K_M, Q8_0), built once and cached by config hash."""
    config = RUNGS[name]
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    folder = LADDER / f"{name}-{digest}"
    target = folder / f"{name}-{kind}.gguf"
    if target.is_file():
        return target
    f16 = folder / f"{name}-F16.gguf"
    if not f16.is_file():
        hf = folder / "hf"
        if not (hf / "config.json").is_file():
            _random_model(config, hf)
        say(f"{name}: converting to F16 with convert_hf_to_gguf.py")
        _run([sys.executable, str(CACHE / SOURCE_DIR / "convert_hf_to_gguf.py"), str(hf), "--outtype", "f16",
              "--outfile", str(f16)])
        shutil.rmtree(hf)
    if kind != "F16":
        say(f"{name}: quantizing to {kind} with llama-quantize")
        _run([str(_binary("llama-quantize")), str(f16), str(target), kind, "2"])
    return target


def _random_model(config: dict[str, Any], out: Path) -> None:
    import torch
    import transformers

    from proctor.config import DEFAULT_MODEL_NAME, default_model_store

    kind = config["model_type"]
    classes = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama", "gemma3_text": "Gemma3"}
    settings = {key: value for key, value in config.items() if key != "model_type"}
    cfg = getattr(transformers, f"{classes[kind]}Config")(**settings, torch_dtype="float16")
    say(f"building a random {kind} with {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}")
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = getattr(transformers, f"{classes[kind]}ForCausalLM")(cfg).half()
    model.save_pretrained(out)
    source = default_model_store() / DEFAULT_MODEL_NAME
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)


def _binary(name: str) -> Path:
    ensure_build()  # llama-server and llama-bench; the ladder's two tools are built beside them
    binary = CACHE / BUILD_DIR / "bin" / name
    if not binary.is_file():
        say(f"building {name}")
        _run(["cmake", "--build", str(CACHE / BUILD_DIR), "--target", name, "-j", "2"])
    return binary


def _run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{command[0]} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


def measure_proctor(path: Path, steps: int) -> dict[str, float]:
    """In a fresh process (its own peak RSS): load, then steady decode steps at each stream count."""
    out = _run([sys.executable, __file__, "--measure", str(path), "--steps", str(steps)])
    return json.loads(out.strip().splitlines()[-1])


def _measure_here(path: Path, steps: int) -> None:
    import torch

    from proctor.config import Settings
    from proctor.engine.llama_step import LlamaSlots
    from proctor.models.loader import load_model

    started = time.perf_counter()
    loaded = load_model(Settings(model=str(path), weights="gguf"))
    slots = LlamaSlots(loaded.model, max(STREAMS), torch.device("cpu"), "gguf")
    load_s = time.perf_counter() - started
    figures: dict[str, float] = {"load_s": load_s, "weights_mb": slots.weights.nbytes / 1e6}
    with torch.inference_mode():
        for streams in STREAMS:
            for slot in range(streams):
                slots.free(slot)
                slots.prefill(slot, [(slot * 7 + i) % 1000 + 10 for i in range(PROMPT)])
            times = []
            for step in range(steps):
                began = time.perf_counter()
                slots.decode([(step + slot) % 1000 + 10 for slot in range(streams)])
                times.append(time.perf_counter() - began)
            median = statistics.median(times[2:])
            figures[f"step_ms_{streams}"] = median * 1e3
            figures[f"tokens_s_{streams}"] = streams / median
            for slot in range(streams):
                slots.free(slot)
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))


def measure_llama(path: Path) -> dict[str, float]:
    """llama-batched-bench on the same file: decode tokens/s at 1 and 16 parallel sequences."""
    out = _run([str(_binary("llama-batched-bench")), "-m", str(path), "-c", "4096", "-b", "2048", "-ub", "512",
                "-npp", str(PROMPT), "-ntg", "32", "-npl", ",".join(map(str, STREAMS)), "-t", str(os.cpu_count() or 2),
                "--output-format", "jsonl"])
    figures: dict[str, float] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            figures[f"tokens_s_{row['pl']}"] = float(row["speed_tg"])
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rungs", default="qwen2.5-0.5b")
    parser.add_argument("--types", default="Q4_K_M,Q8_0")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure_here(Path(args.measure), args.steps)
        return 0
    rows = ["| rung | type | file MB | Proctor load s | peak RSS MB | Proctor tok/s 1 / 16 | llama.cpp tok/s 1 / 16 "
            "| ratio 1 / 16 | 1-stream GB/s read |", "|" + "---|" * 9]
    for name in args.rungs.split(","):
        for kind in args.types.split(","):
            path = rung_file(name, kind)
            ours, theirs = measure_proctor(path, args.steps), measure_llama(path)
            size = path.stat().st_size / 1e6
            ratio = [ours[f"tokens_s_{s}"] / theirs[f"tokens_s_{s}"] for s in STREAMS]
            rows.append(f"| {name} | {kind} | {size:.0f} | {ours['load_s']:.1f} | {ours['peak_rss_mb']:.0f} | "
                        f"{ours['tokens_s_1']:.1f} / {ours['tokens_s_16']:.1f} | "
                        f"{theirs['tokens_s_1']:.1f} / {theirs['tokens_s_16']:.1f} | "
                        f"{ratio[0]:.2f}× / {ratio[1]:.2f}× | {ours['weights_mb'] / ours['step_ms_1']:.1f} |")
            say(rows[-1])
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

