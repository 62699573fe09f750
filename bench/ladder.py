"""The size ladder (issue 25): random-weight models of real shapes as the GGUFs people download, served by
Proctor from their own blocks (``--weights gguf``) beside llama.cpp on the same file, in the same run.

Each rung is a transformers config with a real model's shapes (vocabulary included) and random weights,
written as F16 with the ``convert_hf_to_gguf.py`` of the llama.cpp tree bench/llama_server.py builds, then
quantized with that tree's ``llama-quantize``. The tokenizer is the default model's (49,152 tokens; the
converter pads the vocabulary to the rung's size, so the LM head and logits have the real width). Files
are cached by config hash under the temp dir and never rebuilt.

Per rung and type, from bench/peer.py run on the rung's file (llama-server and ``proctor serve`` one at a
time, the same prompts, closed-loop streams): tokens/s at 1 and 16 streams, plain and with a JSON schema,
TTFT p50, each server's peak RSS against the file size plus a KV cache for 16 × 512 tokens, and the time
until each was ready. Beside them the slot forward's own decode step at one stream (LM head included,
median of steady steps) against the bytes of weights it reads: the memory roofline (~24 GB/s here); and its
step at 16 streams in GFLOP/s (two per weight a token multiplies) against the float32 GEMM peak measured in the
same process (``torch.matmul`` of 2048² matrices), so a reader sees which limit binds and how far off it is.

    python bench/ladder.py [--rungs qwen2.5-0.5b,llama-3.2-1b] [--types Q4_K_M,Q8_0] [--steps 24]

"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
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
from prompt import instruction_sets, llama_bench, proctor_prompt  # noqa: E402

LADDER = Path(tempfile.gettempdir()) / "proctor-ladder"
SHARD_BYTES = 2 << 30  # a random checkpoint's shards (_random_model)
RUNGS: dict[str, dict[str, Any]] = {  # the real models' shapes (their config.json), random weights
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    "smollm2-1.7b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                     "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152,
                     "tie_word_embeddings": True, "rope_theta": 130000.0, "max_position_embeddings": 8192},
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
    # The 7-8B rungs (issue 42): Q4_K_M ~4.7 GB, in this machine's memory; building the random fp16 model first
    # takes ~16 GB of memory and disk once.
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": False, "max_position_embeddings": 131072, "rope_parameters": {
                         "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False, "rope_theta": 1000000.0, "max_position_embeddings": 32768},
    # Gemma 3 1B: 5 sliding-window layers to 1 global. llama.cpp's converter trims a Gemma 3 embedding to the
    # tokenizer's own tokens (and llama-server then refuses a file whose header says 262,144), so with the
    # stand-in tokenizer this rung's vocabulary is its 49,152 tokens, not Gemma's 262,144
    "gemma-3-1b": {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912,
                   "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                   "query_pre_attn_scalar": 256, "vocab_size": 49152, "sliding_window": 512,
                   "rope_local_base_freq": 10000.0, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
                   "tie_word_embeddings": True,
                   "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(26)]},
}
PROMPT, STREAMS = 32, (1, 16)
PP = 512  # the prompt-processing columns: one prompt of this many tokens alone (llama-bench's pp512)
# convert_hf_to_gguf.py as is, but for the stand-in tokenizer: the converter names a BPE pre-tokenizer by
# the hash of its encoding of a test text, and the default model's tokenizer as transformers re-saves it
# hashes differently from HuggingFaceTB's original files; it is SmolLM's BPE, so it is named "smollm".
CONVERT = """
import runpy, sys
tree = sys.argv.pop(1)
sys.path.insert(0, tree)
sys.path.insert(1, tree + "/gguf-py")
from conversion import base
known = base.TextModel.get_vocab_base_pre
def stand_in(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "smollm"
base.TextModel.get_vocab_base_pre = stand_in
sys.argv[0] = tree + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


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
        _run([sys.executable, "-c", CONVERT, str(CACHE / SOURCE_DIR), str(hf), "--outtype", "f16",
              "--outfile", str(f16)])
        shutil.rmtree(hf)
    if kind != "F16":
        say(f"{name}: quantizing to {kind} with llama-quantize")
        _run([str(_binary("llama-quantize")), str(f16), str(target), kind, "2"])
    return target


def _random_model(config: dict[str, Any], out: Path) -> None:
    """The rung as a transformers checkpoint of random float16 weights, initialised as transformers does
    (norms 1, biases 0, the rest N(0, 0.02)) but written tensor by tensor in shards: an 8B model is never whole
    in memory (transformers would build it in float32 first, 32 GB)."""
    import torch
    import transformers
    from safetensors.torch import save_file

    from proctor.config import DEFAULT_MODEL_NAME, default_model_store

    kind = config["model_type"]
    classes = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
               "llama": ("LlamaConfig", "LlamaForCausalLM"), "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
    config_class, model_class = classes[kind]
    settings = {key: value for key, value in config.items() if key != "model_type"}
    cfg = getattr(transformers, config_class)(**settings, torch_dtype="float16")
    say(f"building a random {kind} with {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}")
    with torch.device("meta"):
        skeleton = getattr(transformers, model_class)(cfg)
    shapes = {name: tuple(tensor.shape) for name, tensor in skeleton.state_dict().items()
              if not (cfg.tie_word_embeddings and name == "lm_head.weight")}
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        if size > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += 2 * int(torch.Size(shape).numel())
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    weight_map: dict[str, str] = {}
    for index, names in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _initial(name, shapes[name], generator) for name in names}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        say(f"  shard {index + 1}/{len(shards)} written")
    total = sum(2 * int(torch.Size(shape).numel()) for shape in shapes.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    cfg.architectures = [model_class]  # what save_pretrained of the model would write; the converter reads it
    cfg.save_pretrained(out)
    source = default_model_store() / DEFAULT_MODEL_NAME
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
        if (source / name).is_file():
            shutil.copy(source / name, out / name)


def _initial(name: str, shape: tuple[int, ...], generator: Any) -> Any:
    import torch

    if "norm" in name:
        return torch.ones(shape, dtype=torch.float16)
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.float16)
    return torch.empty(shape, dtype=torch.float16).normal_(0.0, 0.02, generator=generator)


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
    from proctor.executor.protocol import Feed
    from proctor.executor.slot_forward import SlotForward
    from proctor.models.loader import load_model

    started = time.perf_counter()
    loaded = load_model(Settings(model=str(path), weights="gguf"))
    slots = SlotForward(loaded.model, max(STREAMS), torch.device("cpu"), "gguf")
    load_s = time.perf_counter() - started
    figures: dict[str, float] = {"load_s": load_s, "weights_mb": slots.weights.nbytes / 1e6}
    with torch.inference_mode():
        for streams in STREAMS:
            for slot in range(streams):
                slots.free(slot)
                slots.forward([Feed(slot, [(slot * 7 + i) % 1000 + 10 for i in range(PROMPT)], 1)])
            times = []
            for step in range(steps):
                began = time.perf_counter()
                slots.forward([Feed(slot, [(step + slot) % 1000 + 10], 1) for slot in range(streams)])
                times.append(time.perf_counter() - began)
            median = statistics.median(times[2:])
            figures[f"step_ms_{streams}"] = median * 1e3
            figures[f"tokens_s_{streams}"] = streams / median
            for slot in range(streams):
                slots.free(slot)
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    del slots
    for loops, cell in proctor_prompt(path, PP, 3, torch.get_num_threads()).items():  # (bench/prompt.py)
        figures[f"pp_{loops}"] = cell["tokens_s"]
    figures["flops_per_token"] = 2 * matrix_parameters(path)
    figures["gemm_peak_gflops"] = gemm_peak_gflops()
    print(json.dumps(figures))


def matrix_parameters(path: Path) -> int:
    """The weights one token's step multiplies: every layer's matrices and the LM head (the embedding is a
    lookup), from the file's tensor table."""
    from proctor.models.gguf_header import read_header

    shapes = {tensor.name: tensor.dims for tensor in read_header(path).tensors}
    head = shapes.get("output.weight") or shapes["token_embd.weight"]
    layers = sum(math.prod(dims) for name, dims in shapes.items() if name.startswith("blk.") and len(dims) == 2)
    return layers + math.prod(head)


def gemm_peak_gflops(size: int = 2048, repeats: int = 5) -> float:
    """The machine's float32 matrix-multiply rate in this process (PyTorch's BLAS, its threads): the best of
    ``repeats`` square products, the ceiling a compute-bound step is held against."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(a, b)
    best = math.inf
    for _ in range(repeats):
        began = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - began)
    return 2 * size ** 3 / best / 1e9


def measure_servers(path: Path, new_tokens: int, modes: str) -> dict[str, Any]:
    """bench/peer.py on this file: llama-server and ``proctor serve`` one at a time, plain and JSON."""
    out = path.with_name(f"{path.stem}-peer.json")  # kept: a later step's failure loses no measurement
    _run([sys.executable, str(ROOT / "bench" / "peer.py"), "--gguf", str(path), "--streams",
          ",".join(map(str, STREAMS)), "--modes", modes, "--rounds", "1", "--new-tokens",
          str(new_tokens), "--llama-bench-args", "none", "--json", str(out)])
    say(f"bench/peer.py's report: {out}")
    report = json.loads(out.read_text())
    figures: dict[str, Any] = {}
    for cell in report["cells"]:
        key = f"{cell['server']}_{cell['mode']}_{cell['streams']}"
        figures[key] = cell["tokens_per_s"]
        figures[key + "_ttft_ms"] = statistics.median(cell["ttft_s"]) * 1e3 if cell["ttft_s"] else float("nan")
        figures[key + "_valid"] = f"{cell['valid']}/{cell['checked']}" if cell["checked"] else ""
    figures["threads"] = report.get("threads", 2)
    for life in report["lives"]:
        figures[f"{life['server']}_ready_s"] = life["ready_s"]
        figures[f"{life['server']}_rss_mb"] = life["hwm_mb"]
    return figures


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, NaN where a level served nothing (an 8B rung's arrivals within the limit)."""
    return numerator / denominator if denominator else float("nan")


def kv_cache_mb(config: dict[str, Any], tokens: int) -> float:
    """float16 keys and values for ``tokens`` positions (what the servers hold for the bench's streams)."""
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2 * tokens / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rungs", default="qwen2.5-0.5b")
    parser.add_argument("--types", default="Q4_K_M,Q8_0")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--modes", default="plain,json,arrivals",
                        help="bench/peer.py's modes (arrivals at 7-8B on 2 cores: no request ends within its limit)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure_here(Path(args.measure), args.steps)
        return 0
    rows = ["| rung | type | file MB | tok/s 1 stream: Proctor / llama (×) | 16 streams (×) "
            "| 16 streams, arrivals (×) | JSON ÷ plain 1 / 16 | TTFT p50 ms P / L | arrivals TTFT p50 ms P / L (×) "
            "| peak RSS MB P / L (file + KV) | ready s P / L | step ms at 1 (GB/s) "
            f"| step at 16: GFLOP/s (% of fp32 GEMM peak) | pp{PP} tok/s P / llama-bench (×) "
            f"| pp{PP} AVX2 loops / AVX2-only llama-bench (×) |",
            "|" + "---|" * 15]
    for name in args.rungs.split(","):
        for kind in args.types.split(","):
            path = rung_file(name, kind)
            step, served = measure_proctor(path, args.steps), measure_servers(path, args.new_tokens, args.modes)
            threads = int(served.get("threads", 2))
            pp_native, pp_avx2 = (llama_bench(path, PP, threads, isa) for isa in ("native", "avx2"))
            pp_ours = step.get("pp_avx512-vnni", step.get("pp_avx2", float("nan")))
            size = path.stat().st_size / 1e6

            def rate(server: str, mode: str, streams: int, served: dict[str, Any] = served) -> float:
                return float(served.get(f"{server}_{mode}_{streams}", float("nan")))

            one, many = (ratio(rate("proctor", "plain", n), rate("llama", "plain", n)) for n in STREAMS)
            arrivals = ratio(rate("proctor", "arrivals", 16), rate("llama", "arrivals", 16))
            ttft_p = float(served.get("proctor_arrivals_16_ttft_ms", float("nan")))
            ttft_l = float(served.get("llama_arrivals_16_ttft_ms", float("nan")))
            json_ratio = [ratio(rate("proctor", "json", n), rate("proctor", "plain", n)) for n in STREAMS]
            budget = size + kv_cache_mb(RUNGS[name], 16 * 512)
            flops_16 = step["flops_per_token"] * step["tokens_s_16"] / 1e9
            rows.append(
                f"| {name} | {kind} | {size:.0f} | {rate('proctor', 'plain', 1):.1f} / {rate('llama', 'plain', 1):.1f} "
                f"({one:.2f}×) | {rate('proctor', 'plain', 16):.1f} / {rate('llama', 'plain', 16):.1f} ({many:.2f}×) | "
                f"{rate('proctor', 'arrivals', 16):.1f} / {rate('llama', 'arrivals', 16):.1f} ({arrivals:.2f}×) | "
                f"{json_ratio[0]:.2f} / {json_ratio[1]:.2f} | {served.get('proctor_plain_1_ttft_ms', 0):.0f} / "
                f"{served.get('llama_plain_1_ttft_ms', 0):.0f} | "
                f"{ttft_p:.0f} / {ttft_l:.0f} ({ratio(ttft_p, ttft_l):.2f}×) | "
                f"{served.get('proctor_rss_mb', 0):.0f} / "
                f"{served.get('llama_rss_mb', 0):.0f} ({budget:.0f}) | {served.get('proctor_ready_s', 0):.1f} / "
                f"{served.get('llama_ready_s', 0):.1f} | {step['step_ms_1']:.1f} "
                f"({step['weights_mb'] / step['step_ms_1']:.1f}) | {flops_16:.0f} "
                f"({100 * flops_16 / step['gemm_peak_gflops']:.0f}% of {step['gemm_peak_gflops']:.0f}) | "
                f"{pp_ours:.0f} / {pp_native:.0f} ({ratio(pp_ours, pp_native):.2f}×) | "
                f"{step['pp_avx2']:.0f} / {pp_avx2:.0f} ({ratio(step['pp_avx2'], pp_avx2):.2f}×) |")
            say(rows[-1])
    print(f"CPU: {instruction_sets()}\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

