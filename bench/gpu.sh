#!/usr/bin/env bash
# The CUDA check, prepared for one short call on a GPU machine (device tool: `run`, about 4 minutes).
#
# The model files cannot travel to that machine (its working-tree limit is 64 MiB) and it has no
# network, so this runs the slot forward on a random-weight model of the default model's exact
# shape (speed does not depend on the weights), in bf16 and fp32, with model.generate() as the
# baseline in the same run, plus the bit-identical-in-a-batch check on CUDA; then the engine's own
# decode loop (bench/gpu_engine.py: scheduler thread, sampling, stop rules; 1/16/64 streams, bf16)
# on the same shape with the real tokenizer, with the default kernels and with --batch-invariant on (Triton).
# It needs torch, transformers, tokenizers, numpy and triton (CUDA builds of torch bring it), which that
# machine's image has. Figures land in $OUT (or bench/gpu-out locally): env.txt, step-bfloat16.{txt,json},
# engine-bfloat16.{txt,json}, engine-invariant.{txt,json} (7 files).
#
# The tokenizer files (3.4 MiB, no weights) are git-ignored, so make them here first and carry them:
#
#   .venv/bin/python bench/gpu_engine.py --prepare   # copies 5 files to .proctor/gpu-tokenizer
#   run: command "bash bench/gpu.sh", carry [".proctor/gpu-tokenizer"], timeout_s 600
#
#   bash bench/gpu.sh            # from the repository root (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/gpu-out}"
py="${PYTHON:-python3}"
mkdir -p "$out"
{
  "$py" - <<'PY'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
PY
  nvidia-smi || echo "nvidia-smi: not available"
  "$py" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|tokenizers|numpy|triton|pytorch-triton) ' || echo "pip list: not available"
} 2>&1 | tee "$out/env.txt"
export PYTHONUNBUFFERED=1
failed=()
check() {  # check NAME COMMAND...: output teed to $out/NAME.txt; a failure is noted and the next check runs
  local name=$1 rc
  shift
  "$@" 2>&1 | tee "$out/$name.txt" && rc=0 || rc=$?
  if ((rc == 124)); then failed+=("$name (timed out)"); elif ((rc)); then failed+=("$name (exit $rc)"); fi
}
tokenizer=.proctor/gpu-tokenizer
[[ -f $tokenizer/tokenizer.json ]] || echo "WARNING: no $tokenizer (not carried?): the engine check will fail" \
  | tee -a "$out/env.txt"
check step-bfloat16 timeout 120 "$py" bench/step.py --device cuda --dtype bfloat16 --random \
  --batches 1,4,16,32,64 --new-tokens 128 --json "$out/step-bfloat16.json"
check engine-bfloat16 timeout 120 "$py" bench/gpu_engine.py --device cuda --dtype bfloat16 --tokenizer "$tokenizer" \
  --streams 1,16,64 --new-tokens 128 --json "$out/engine-bfloat16.json"
# The same engine with --batch-invariant on (executor/invariant_step.py: Triton kernels whose reduction order does not
# depend on the batch): its tok/s against the run above, and request 0 alone against among 16 and 64, bit for bit.
check engine-invariant timeout 150 "$py" bench/gpu_engine.py --device cuda --dtype bfloat16 --tokenizer "$tokenizer" \
  --streams 1,16,64 --new-tokens 64 --batch-invariant on --json "$out/engine-invariant.json"
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" | tee -a "$out/env.txt"
  exit 1
fi
