"""Single-stream decode benchmark: our engine loop vs ``model.generate()`` in the same run.

Same model, prompt, dtype and number of new tokens (EOS suppressed by min_new_tokens in both, so
every run is full length and greedy outputs are comparable);
runs alternate between the two so machine noise hits both alike. Prints medians and the ratio,
and a Markdown table for bench/README.md. Also checks greedy equality of each dtype against the
fp32 reference, which is how the CPU default dtype is chosen.

    python bench/decode.py [--dtypes float32,bfloat16] [--new-tokens 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "service"), str(ROOT / "clients" / "python" / "src")]

import torch  # noqa: E402

from proctor.config import Settings  # noqa: E402
from proctor.domain import GenerationRequest, StoppingParams  # noqa: E402
from proctor.engine.engine import Engine  # noqa: E402
from proctor.models import load_model  # noqa: E402

PROMPT = (
    "You are a contracts assistant. Summarise the following clause in plain English for a small "
    "business owner, in three short bullet points. Clause: The Receiving Party shall hold the "
    "Confidential Information in strict confidence and shall not disclose it to any third party "
    "without the prior written consent of the Disclosing Party."
)


_REFERENCE: dict[str, object] = {}


def _load_reference(dtype: str) -> None:
    """Child process: load the model for ``model.generate()``."""
    loaded = load_model(Settings.load({"dtype": dtype, "warmup": False}))
    _REFERENCE.update(model=loaded.model, enc=loaded.tokenizer(PROMPT, return_tensors="pt").to(loaded.device))


def _reference(new_tokens: int) -> tuple[float, float, list[int]]:
    """Child process: one timed ``model.generate()`` run; (total s, time to first token s, token ids)."""
    model, enc = _REFERENCE["model"], _REFERENCE["enc"]
    first: list[float] = []
    start = time.perf_counter()

    class FirstToken:  # a streamer that records when the first new token arrives
        calls = 0

        def put(self, value: torch.Tensor) -> None:
            FirstToken.calls += 1
            if FirstToken.calls == 2:
                first.append(time.perf_counter() - start)

        def end(self) -> None:
            pass

    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens,  # type: ignore[attr-defined]
                             do_sample=False, streamer=FirstToken())
    total = time.perf_counter() - start
    return total, first[0] if first else float("nan"), out[0, enc.input_ids.shape[1]:].tolist()  # type: ignore[attr-defined]


def bench_dtype(dtype: str, new_tokens: int, repeats: int) -> dict[str, object]:
    settings = Settings.load({"dtype": dtype, "warmup": False})
    loaded = load_model(settings)
    enc = loaded.tokenizer(PROMPT, return_tensors="pt")
    engine = Engine(loaded, settings)
    engine.start()
    # generate() runs in a child process: run in this process, its OpenMP threads were measured to
    # slow our engine thread by a quarter for the rest of the run (two thread teams on two cores).
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_load_reference,
                               initargs=(dtype,))

    def ours(i: int) -> tuple[float, float, list[int]]:
        request = GenerationRequest(request_id=f"bench-{dtype}-{i}", prompt=PROMPT,
                                    stopping=StoppingParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens))
        start = time.perf_counter()
        events = engine.generate_blocking(request)
        total = time.perf_counter() - start
        assert events[-1].timings is not None
        return total, events[-1].timings.time_to_first_token_ms / 1000, [t for e in events for t in e.token_ids]

    def reference() -> tuple[float, float, list[int]]:
        return pool.submit(_reference, new_tokens).result()

    ours(-1)
    reference()  # warm-up both
    ours_runs, ref_runs = [], []
    for i in range(repeats):
        ours_runs.append(ours(i))
        ref_runs.append(reference())
        print(f"  {dtype} run {i + 1}/{repeats}: ours {new_tokens / ours_runs[-1][0]:.1f} tok/s, "
              f"generate() {new_tokens / ref_runs[-1][0]:.1f} tok/s", file=sys.stderr, flush=True)
    engine.shutdown(1)
    pool.shutdown()
    ours_tps = statistics.median(new_tokens / r[0] for r in ours_runs)
    ref_tps = statistics.median(new_tokens / r[0] for r in ref_runs)
    return {
        "dtype": dtype, "prompt_tokens": int(enc.input_ids.shape[1]), "ours_tps": ours_tps, "ref_tps": ref_tps,
        "ours_ttft_ms": statistics.median(r[1] for r in ours_runs) * 1000,
        "ref_ttft_ms": statistics.median(r[1] for r in ref_runs) * 1000,
        "ratio": ours_tps / ref_tps, "tokens": ours_runs[0][2], "equal_to_generate": ours_runs[0][2] == ref_runs[0][2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", file=sys.stderr)
    results = [bench_dtype(d, args.new_tokens, args.repeats) for d in args.dtypes.split(",")]
    reference_tokens = next((r["tokens"] for r in results if r["dtype"] == "float32"), None)
    print(f"\nSingle stream, greedy, {results[0]['prompt_tokens']}-token prompt, {args.new_tokens} new tokens, "
          f"median of {args.repeats} (`python bench/decode.py`):\n")
    print("| dtype | ours tok/s | generate() tok/s | ratio | ours TTFT ms | generate() TTFT ms "
          "| greedy = generate() | greedy = fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        same_fp32 = "n/a" if reference_tokens is None else ("yes" if r["tokens"] == reference_tokens else "no")
        print(f"| {r['dtype']} | {r['ours_tps']:.1f} | {r['ref_tps']:.1f} | {r['ratio']:.2f}× | "
              f"{r['ours_ttft_ms']:.0f} | {r['ref_ttft_ms']:.0f} | {'yes' if r['equal_to_generate'] else 'no'} "
              f"| {same_fp32} |")


if __name__ == "__main__":
    main()
