#!/usr/bin/env bash
# The CUDA check, prepared for one short call on a GPU machine (device tool: `run`, at most 6 minutes).
#
# The model files cannot travel to that machine (its working-tree limit is 64 MiB) and it has no network, so the
# models are random-weight ones of the default model's exact shape and of Llama-3.1-8B's (its vocabulary the carried
# tokenizer's), built on the GPU itself (speed does not depend on the weights). It measures:
#   env.txt           torch, the card, and the card's copy bandwidth (the HBM read roofline of the run)
#   step.json         the eager slot forward against model.generate() at one row (bench/step.py), bf16
#   engine-graphs     the engine's loop (bench/gpu_engine.py) on the default shape, steps replayed as CUDA graphs,
#                     then again with a JSON schema on every request (llguidance): JSON ÷ plain
#   engine-eager      the same with --no-cuda-graphs (the figure before graphs)
#   engine-invariant  graphs with --batch-invariant on: the Triton kernels' products; request 0 alone against among
#                     16, 64 and 128, bit for bit
#   engine-8b         graphs on Llama-3.1-8B's shape (the 1-stream target: 70% of the copy bandwidth)
# each engine run at 1, 16, 64 (and 128) streams: tok/s, TTFT, step time, determinism. Files in $OUT (or
# bench/gpu-out locally): env.txt, log.txt (everything printed), step.json and the four engine-*.json (7 files).
# It needs torch, transformers, tokenizers, numpy and triton (CUDA builds of torch bring it), which that machine's
# image has; llguidance and jsonschema come as wheels in the carried directory (--prepare downloads them).
#
# The tokenizer files (3.4 MiB, no weights) are git-ignored, so make them here first and carry them:
#
#   .venv/bin/python bench/gpu_engine.py --prepare   # 5 files and 10 wheels (8 MiB) in .proctor/gpu-tokenizer
#   run: command "bash bench/gpu.sh", carry [".proctor/gpu-tokenizer"], timeout_s 420
#
#   bash bench/gpu.sh            # from the repository root (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/gpu-out}"
py="${PYTHON:-python3}"
mkdir -p "$out"
{
  "$py" - <<'PY'
import time, torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
if torch.cuda.is_available():  # the read roofline: a 4 GiB device-to-device copy reads 4 GiB and writes 4 GiB
    a = torch.empty(2**31, dtype=torch.bfloat16, device="cuda"); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize(); times = []
    for _ in range(10):
        start = time.perf_counter(); b.copy_(a); torch.cuda.synchronize(); times.append(time.perf_counter() - start)
    times.sort()
    print(f"copy bandwidth: {2 * a.numel() * 2 / times[5] / 1e9:.0f} GB/s read+write, median of 10 copies of 4 GiB")
PY
  nvidia-smi || echo "nvidia-smi: not available"
  "$py" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|numpy|triton|pytorch-triton) ' || echo "pip list: not available"
} 2>&1 | tee "$out/env.txt"
export PYTHONUNBUFFERED=1
failed=()
check() {  # check NAME COMMAND...: output appended to $out/log.txt; a failure is noted and the next check runs
  local name=$1 rc
  shift
  echo "=== $name: $*" | tee -a "$out/log.txt"
  "$@" 2>&1 | tee -a "$out/log.txt" && rc=0 || rc=$?
  if ((rc == 124)); then failed+=("$name (timed out)"); elif ((rc)); then failed+=("$name (exit $rc)"); fi
}
tokenizer=.proctor/gpu-tokenizer
[[ -f $tokenizer/tokenizer.json ]] || echo "WARNING: no $tokenizer (not carried?): the engine checks will fail" \
  | tee -a "$out/env.txt"
# --schema needs llguidance and jsonschema, which that machine lacks: install what is missing from the carried wheels
site="${TMPDIR:-/tmp}/proctor-gpu-site"
missing=$("$py" - <<'PY'
import importlib.util
wanted = {"llguidance": "llguidance", "jsonschema": "jsonschema", "referencing": "referencing",
          "jsonschema_specifications": "jsonschema-specifications", "attrs": "attrs", "rpds": "rpds-py",
          "typing_extensions": "typing-extensions"}
print(" ".join(dist for module, dist in wanted.items() if importlib.util.find_spec(module) is None))
PY
)
if [[ -n $missing ]]; then
  # shellcheck disable=SC2086  # one word a distribution
  "$py" -m pip install --quiet --no-index --no-deps --target "$site" --find-links "$tokenizer/wheels" $missing 2>&1 \
    | tail -3 | tee -a "$out/env.txt" && echo "installed from the carried wheels: $missing" | tee -a "$out/env.txt"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
engine=("$py" bench/gpu_engine.py --device cuda --dtype bfloat16 --tokenizer "$tokenizer")
check step timeout 45 "$py" bench/step.py --device cuda --dtype bfloat16 --random --batches 1,16,64 \
  --new-tokens 64 --json "$out/step.json"
check engine-graphs timeout 110 "${engine[@]}" --schema --streams 1,16,64,128 --new-tokens 128 \
  --json "$out/engine-graphs.json"
check engine-eager timeout 50 "${engine[@]}" --cuda-graphs off --streams 1,16,64 --new-tokens 64 \
  --json "$out/engine-eager.json"
check engine-invariant timeout 75 "${engine[@]}" --batch-invariant on --streams 1,16,64,128 --new-tokens 128 \
  --json "$out/engine-invariant.json"
check engine-8b timeout 80 "${engine[@]}" --shape llama-8b --streams 1,16,64 --new-tokens 64 \
  --json "$out/engine-8b.json"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" | tee -a "$out/env.txt"
  exit 1
fi
