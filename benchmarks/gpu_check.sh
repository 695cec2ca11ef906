#!/usr/bin/env bash
# The GPU check of the large-model issue, for a session that is lent a GPU (the `device` tool): the smoke sweep and
# the default Gemma-3-270m run on cuda, each timed, results under $OUT (or ./gpu-check). Needs `make setup` done
# with a CUDA build of torch (TORCH_SPEC="torch==2.13.0" from the CUDA index) and the model cache carried over.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check}"
mkdir -p "$OUT"
BENCH=.venv/bin/bench
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA build of torch'; print(torch.__version__)"
start=$(date +%s)
$BENCH run --model "$(.venv/bin/python -c 'from bench.smoke import tiny_checkpoint; print(tiny_checkpoint())')" \
    --methods all --rank 0.5 --tasks ppl-token lama rho --lama-limit 1 --lama-candidates 8 --ppl-windows 2 \
    --ppl-seq-len 64 --calib-samples 4 --calib-seq-len 64 --device cuda --dtype bfloat16 --quiet \
    --output "$OUT/smoke" 2>&1 | tee "$OUT/smoke.log"
echo "smoke on cuda: $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
start=$(date +%s)
$BENCH run --methods all --rank 0.5 --device cuda --output "$OUT/default" --quiet 2>&1 | tee "$OUT/default.log"
echo "default run on cuda (float32): $(( $(date +%s) - start )) s" | tee -a "$OUT/times.txt"
cp "$OUT/default/LEADERBOARD.md" "$OUT/LEADERBOARD-cuda.md"
