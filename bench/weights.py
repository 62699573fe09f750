"""Weight modes of the slot forward (``--weights dense|fp16|q8|q4``, executor/weights.py): speed and quality.

1. **Kernels** — ``x @ W.T`` for the default model's layer shapes (fused qkv, o, fused gate/up,
   down, LM head) at 1, 4, 16 and 32 rows, per mode; the weights of one layer are cycled through 30
   copies so they stream from memory as in a real step (a single reused matrix would sit in cache).
2. **Decode step** — ``SlotForward.forward`` of the real model, one token a row, at 1 and 16 rows, per mode;
   ratio to dense.
3. **Quality against dense** (the fp32 dequantization of the GGUF, the reference): top-1 agreement
   and KL divergence per position, teacher-forced over fixed texts; perplexity on a fixed text;
   greedy agreement (share of identical 48-token outputs, tokens until the first divergence) over
   fixed chat prompts; and whether a row's logits are the same bits alone and in a batch of 16.

    python bench/weights.py [--modes dense,fp16,q8,q4] [--rows 1,4,16,32] [--skip-kernels] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "tests")]

import torch  # noqa: E402
from helpers.slots import feed_prompt, feed_prompts, feed_step  # noqa: E402
from helpers.weight_quality import AGREEMENT_PROMPTS, PERPLEXITY_TEXT, agreement, chat_ids, perplexity  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.executor.slot_forward import SlotForward  # noqa: E402
from proctor.executor.smoothing import calibration_ids  # noqa: E402
from proctor.executor.weights import make_linear  # noqa: E402
from proctor.models import load_model  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
LAYERS = 30


def median_time(fn, repeats: int = 7) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernels(modes: list[str], rows: list[int]) -> dict[str, dict[str, dict[int, float]]]:
    torch.manual_seed(0)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, (n, k) in SHAPES.items():
        copies = 1 if name == "lm_head" else LAYERS
        weights = [torch.randn(n, k) * 0.02 for _ in range(copies)]
        for mode in modes:
            linears = [make_linear(w, mode, head=name == "lm_head") for w in weights]
            for r in rows:
                x = torch.randn(r, k)
                seconds = median_time(lambda: [f(x) for f in linears]) / copies  # noqa: B023
                out.setdefault(name, {}).setdefault(mode, {})[r] = seconds * 1e6
                print(f"kernel {name:8s} {mode:5s} rows {r:2d}: {seconds * 1e6:8.1f} µs", file=sys.stderr, flush=True)
    return out


def step_times(model, tokenizer, modes: list[str], rows: list[int]) -> dict[str, dict[int, float]]:  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(100, 40000, (61 + 7 * i,), generator=generator).tolist() for i in range(max(rows))]
    out: dict[str, dict[int, float]] = {}
    with torch.inference_mode():
        for mode in modes:
            slots = SlotForward(model, max(rows), torch.device("cpu"), mode, calibration_ids(tokenizer))
            for r in rows:
                for i in range(r):
                    slots.free(i)
                    feed_prompt(slots, i, prompts[i])
                tokens = [5] * r
                seconds = median_time(lambda: [feed_step(slots, tokens) for _ in range(10)], 5) / 10  # noqa: B023
                out.setdefault(mode, {})[r] = seconds * 1e3
                print(f"step {mode:5s} rows {r:2d}: {seconds * 1e3:.2f} ms", file=sys.stderr, flush=True)
    return out


def teacher_forced(model, tokenizer, mode: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    texts = [tokenizer(PERPLEXITY_TEXT)["input_ids"]] + [chat_ids(tokenizer, p) for p in AGREEMENT_PROMPTS]
    agree, divergence, positions = 0.0, 0.0, 0
    with torch.inference_mode():
        for ids in texts:
            reference = feed_prompt(SlotForward(model, 1, torch.device("cpu"), "dense"), 0, ids, every_position=True)
            candidate = feed_prompt(SlotForward(model, 1, torch.device("cpu"), mode, calibration_ids(tokenizer)), 0,
                                    ids, every_position=True)
            ref_lp, cand_lp = torch.log_softmax(reference, -1), torch.log_softmax(candidate, -1)
            agree += float((reference.argmax(-1) == candidate.argmax(-1)).sum())
            divergence += float((ref_lp.exp() * (ref_lp - cand_lp)).sum())
            positions += len(ids)
    return {"top1_agreement": agree / positions, "kl_to_dense": divergence / positions}


def bit_identical_in_batch(model, tokenizer, mode: str) -> bool:  # type: ignore[no-untyped-def]
    prompts = [chat_ids(tokenizer, p) for p in AGREEMENT_PROMPTS] * 2
    calibration = calibration_ids(tokenizer)
    with torch.inference_mode():
        solo = SlotForward(model, 1, torch.device("cpu"), mode, calibration)
        alone = [feed_prompt(solo, 0, prompts[0]), feed_step(solo, [11]), feed_step(solo, [12])]
        wide = SlotForward(model, len(prompts), torch.device("cpu"), mode, calibration)
        firsts = feed_prompts(wide, prompts)
        together = [firsts, feed_step(wide, [11] * len(prompts)), feed_step(wide, [12] * len(prompts))]
    return all(torch.equal(a[0], t[0]) for a, t in zip(alone, together, strict=True))


def print_kernels(table: dict[str, dict[str, dict[int, float]]], rows: list[int]) -> None:
    print("\n| kernel | mode | " + " | ".join(f"{r} rows µs" for r in rows) + " |")
    print("|---|---|" + "---|" * len(rows))
    for name, by_mode in table.items():
        for mode, by_rows in by_mode.items():
            print(f"| {name} | {mode} | " + " | ".join(f"{by_rows[r]:.0f}" for r in rows) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="dense,fp16,q8,q4")
    parser.add_argument("--rows", default="1,4,16,32")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--kernels-only", action="store_true", help="only the kernel table (no model needed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    modes, rows = args.modes.split(","), [int(r) for r in args.rows.split(",")]
    figures: dict[str, object] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if not args.skip_kernels:
        figures["kernels_us"] = kernels(modes, rows)
    if args.kernels_only:
        print_kernels(figures["kernels_us"], rows)  # type: ignore[arg-type]
        return
    loaded = load_model(Settings.load({"device": "cpu", "dtype": "float32", "weights": "dense", "warmup": False}))
    model, tokenizer = loaded.model, loaded.tokenizer
    steps = step_times(model, tokenizer, modes, [1, 16])
    figures["step_ms"] = steps
    quality = {}
    for mode in modes:
        quality[mode] = {**teacher_forced(model, tokenizer, mode), "perplexity": perplexity(model, tokenizer, mode),
                         "greedy": vars(agreement(model, tokenizer, mode)),
                         "bit_identical_in_batch": bit_identical_in_batch(model, tokenizer, mode)}
        print(f"quality {mode}: {quality[mode]}", file=sys.stderr, flush=True)
    figures["quality"] = quality
    print(json.dumps(figures, indent=1))
    if "kernels_us" in figures:
        print_kernels(figures["kernels_us"], rows)  # type: ignore[arg-type]
    print("\n| mode | step 1 row ms | step 16 rows ms | × dense (1 / 16) | top-1 = dense | KL to dense | perplexity |"
          " greedy identical | tokens to 1st divergence (mean / min) | bits same in batch |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = steps.get("dense", next(iter(steps.values())))
    for mode in modes:
        q, s = quality[mode], steps[mode]
        g = q["greedy"]
        print(f"| {mode} | {s[1]:.1f} | {s[16]:.1f} | {base[1] / s[1]:.2f} / {base[16] / s[16]:.2f} | "
              f"{q['top1_agreement']:.1%} | {q['kl_to_dense']:.4f} | {q['perplexity']:.2f} | "
              f"{g['identical_share']:.0%} | "
              f"{g['mean_tokens_until_divergence']:.1f} / {g['min_tokens_until_divergence']} | "
              f"{q['bit_identical_in_batch']} |")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
