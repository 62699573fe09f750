#!/usr/bin/env bash
# The CUDA check, prepared for one short call on a GPU machine (device tool: `run`, about 3 minutes).
#
# The model files cannot travel to that machine (its working-tree limit is 64 MiB) and it has no
# network, so this runs the slot forward on a random-weight model of the default model's exact
# shape (speed does not depend on the weights), in bf16 and fp32, with model.generate() as the
# baseline in the same run, plus the bit-identical-in-a-batch check on CUDA. It needs only torch and
# transformers, which that machine's image has. Figures land in $OUT (or bench/gpu-out locally).
#
#   bash bench/gpu.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/gpu-out}"
mkdir -p "$out"
python3 - <<'PY' | tee "$out/env.txt"
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
PY
export PYTHONUNBUFFERED=1
for dtype in bfloat16 float32; do
  timeout 240 python3 bench/step.py --device cuda --dtype "$dtype" --random --batches 1,4,16,32,64 \
    --new-tokens 128 --json "$out/step-$dtype.json" 2>&1 | tee "$out/step-$dtype.txt"
done
