#!/usr/bin/env bash
# The GPU checks of issues 36 and 24, for a session that is lent a GPU (the `device` tool), in the order to run them:
# the CUDA decode kernels' tests and benchmark (issue 36), the smoke sweep on cuda (solves there too:
# --solve-device auto follows the model), one Llama-3-8B-shaped group (d = 14,336) solved on cuda in float64 and float32 against the host, and the default Gemma-3-270m run on cuda,
# each timed; results under $OUT (or ./gpu-check). Needs `make setup` done with a CUDA build of torch
# (TORCH_SPEC="torch==2.13.0" from the CUDA index) and the model cache carried over. Sized to finish in under 10
# minutes on one H100/H200-class GPU with 16 host cores; each step has its own time limit so one slow step cannot
# take the others' time (KTEST_S, KBENCH_S, SMOKE_S, GROUP_S, DEFAULT_S seconds; 600 in all).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-check}"
mkdir -p "$OUT"
BENCH=.venv/bin/bench
PY=.venv/bin/python
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA build of torch'; print(torch.__version__)" || exit 1

step() {  # step NAME LIMIT_S COMMAND...: run it under its limit, log it, record its time and exit status
    local name=$1 limit=$2
    shift 2
    local start
    start=$(date +%s)
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: $(( $(date +%s) - start )) s, exit $rc$([ $rc = 124 ] && echo " (over its ${limit} s limit)")" \
        | tee -a "$OUT/times.txt"
    tail -n 5 "$OUT/$name.log"
}

# issue 36's CUDA paths first: the compiled Triton decode kernel and wanda's 2:4 weights as semi-structured sparse
# tensors against their references (the tests the CPU runs skip), then their speed against dense at batch 1
step cuda-kernel-tests "${KTEST_S:-90}" $PY -m pytest tests/test_speed.py tests/test_weight_kernels.py -q \
    -k "cuda or sparse_tensor_cores" -rs
step cuda-kernel-bench "${KBENCH_S:-120}" $PY -m pytest benchmarks/test_cuda_kernels.py -q --benchmark-enable \
    --benchmark-only --benchmark-json "$OUT/cuda_kernels.json"
TINY=$($PY -c 'from acbench.cli.smoke import tiny_checkpoint; print(tiny_checkpoint())')
step smoke-cuda "${SMOKE_S:-90}" $BENCH run --model "$TINY" --methods all --rank 0.5 --sparsity 2:4 \
    --tasks ppl-token lama rho --lama-limit 1 --lama-candidates 8 --ppl-windows 2 --ppl-seq-len 64 \
    --calib-samples 4 --calib-seq-len 64 --device cuda --dtype bfloat16 --quiet --output "$OUT/smoke"
# float64 and float32 solves of pca, fasc-kfac and whitened-svd on cuda; pca's also on the host (one eigh there)
step group-8b "${GROUP_S:-150}" $PY -m acbench.studies.solve_8b_group --device cuda --out "$OUT/solve_8b_group.json"
step default-cuda "${DEFAULT_S:-150}" $BENCH run --methods all --rank 0.5 --device cuda --output "$OUT/default" \
    --quiet
[ -f "$OUT/default/LEADERBOARD.md" ] && cp "$OUT/default/LEADERBOARD.md" "$OUT/LEADERBOARD-cuda.md"
cat "$OUT/times.txt"
