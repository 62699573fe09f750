"""Decode-step benchmark of the slot forward (executor/slot_forward.py) at several batch sizes.

Measures, on one device and dtype: the time of a prompt fed alone, the time of one decode step with B
running rows (each at its own length), aggregate tokens/s, and ``model.generate()`` (batch 1) on
the same model in the same run as the baseline. Also checks that a row's logits are bit-identical
alone and in the widest batch (the determinism the engine relies on).

Runs on the real default model when it is installed, or — ``--random`` — on a random-weight model
of the same shape (speed does not depend on the weights; this is what ``bench/gpu.sh`` uses on a
GPU machine, where the model files cannot travel).

    python bench/step.py [--device cpu|cuda] [--dtype float32|bfloat16] [--batches 1,4,16,32] [--random]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service")]

import torch  # noqa: E402

from proctor.executor.protocol import Feed  # noqa: E402
from proctor.executor.slot_forward import SlotForward  # noqa: E402

SMOLLM2_135M = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
                "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}


def prompt(slots: SlotForward, slot: int, ids: list[int]) -> torch.Tensor:
    """``ids`` into ``slot``, emptied first, in one forward; the last position's logits."""
    slots.free(slot)
    return slots.forward([Feed(slot, ids, 1)])


def step(slots: SlotForward, tokens: list[int]) -> torch.Tensor:
    """One token to each of slots 0 … len(tokens) - 1, in one forward."""
    return slots.forward([Feed(slot, [token], 1) for slot, token in enumerate(tokens)])


def load(random: bool, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    if random:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M))
    else:
        from proctor.config import Settings
        from proctor.models import load_model

        model = load_model(Settings.load({"dtype": "float32", "device": "cpu", "warmup": False})).model
    return model.to(device=device, dtype=dtype).eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device: torch.device, fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--batches", default="1,4,16,32")
    parser.add_argument("--prompt-tokens", type=int, default=61)
    parser.add_argument("--new-tokens", type=int, default=64, help="for the generate() baseline")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--random", action="store_true", help="random weights of the default model's shape")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32, "float32": torch.float32,
             "bfloat16": torch.bfloat16}[args.dtype]
    batches = [int(b) for b in args.batches.split(",")]
    model = load(args.random, device, dtype)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(100, 40000, (args.prompt_tokens + 7 * i,), generator=generator).tolist()
               for i in range(max(batches))]
    figures: dict[str, object] = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
                                  "torch": torch.__version__, "random_weights": args.random,
                                  "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
    with torch.inference_mode():
        slots = SlotForward(model, max(batches), device)
        figures["prefill_ms"] = timed(device, lambda: prompt(slots, 0, prompts[0]), 3) * 1000
        rows = {}
        for b in batches:
            for i in range(b):
                prompt(slots, i, prompts[i])
            tokens = [5] * b
            for _ in range(2):
                step(slots, tokens)
            seconds = timed(device, lambda: [step(slots, tokens) for _ in range(args.steps)], 3) / args.steps  # noqa: B023
            rows[b] = {"step_ms": seconds * 1000, "tokens_per_s": b / seconds}
            print(f"B={b}: step {seconds * 1000:.2f} ms, {b / seconds:.0f} tok/s", file=sys.stderr, flush=True)
        figures["decode"] = rows
        # Determinism: row 0 alone vs row 0 in the widest batch.
        solo = SlotForward(model, 1, device)
        alone = [prompt(solo, 0, prompts[0]), step(solo, [11]), step(solo, [12])]
        wide = SlotForward(model, max(batches), device)
        firsts = torch.cat([prompt(wide, i, p) for i, p in enumerate(prompts)])
        together = [firsts, step(wide, [11] * len(prompts)), step(wide, [12] * len(prompts))]
        figures["bit_identical_in_batch"] = all(torch.equal(a[0], t[0]) for a, t in zip(alone, together, strict=True))
        figures["max_logit_gap_in_batch"] = max(float((a[0] - t[0]).abs().max()) for a, t in zip(alone, together,
                                                                                                 strict=True))
        ids = torch.tensor([prompts[0]], device=device)
        gen = timed(device, lambda: model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                   max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                                   pad_token_id=0), 2)
        figures["generate_tokens_per_s"] = args.new_tokens / gen
    single = rows[batches[0]]["tokens_per_s"]
    print(json.dumps(figures, indent=1))
    print(f"\n| batch | step ms | tok/s | × generate() ({figures['generate_tokens_per_s']:.1f} tok/s) |")
    print("|---|---|---|---|")
    for b, row in rows.items():
        print(f"| {b} | {row['step_ms']:.2f} | {row['tokens_per_s']:.0f} | "
              f"{row['tokens_per_s'] / figures['generate_tokens_per_s']:.2f} |")
    print(f"\nsingle row {single:.1f} tok/s; bit-identical in a batch: {figures['bit_identical_in_batch']}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
