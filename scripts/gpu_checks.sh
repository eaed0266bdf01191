#!/usr/bin/env bash
# The checks this project runs when a GPU is lent (BENCHMARKS.md "On a GPU"): the Kimi-K2.5-geometry
# draft's train step (Llama-style and MLA: tok/s, peak memory by sample length), the teacher's screened
# head product against float32 (same teacher? time), and the demo_kimi chain
# on CUDA in bf16. Usage, from the repository root on the GPU machine:
#   OUT=/tmp/gpu-checks bash scripts/gpu_checks.sh      # tables and logs land in $OUT
# The GPU image lacks hydra-core, omegaconf and datasets: put them on PYTHONPATH first (the device
# README's carried wheels). Each part has its own time limit so one slow part cannot starve the rest.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu-checks}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$REPO"
cd "$REPO" || exit 1
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  nproc
} 2>&1 | tee "$OUT/machine.txt"

timeout "${STEP_LIMIT_S:-200}" $PY scripts/bench_train.py --device cuda --part step --targets kimi_llama kimi_mla \
  --precisions bf16-mixed --batch-tokens ${STEP_TOKENS:-2048} --reps 3 2>&1 | tee "$OUT/step.md"
timeout "${TEACHER_LIMIT_S:-90}" $PY scripts/bench_train.py --device cuda --part teacher --reps 3 \
  --teacher-shapes kimi_k25 gemma3_270m 2>&1 | tee "$OUT/teacher.md"   # the bf16 screen's bound under cuBLAS
timeout "${MEMORY_LIMIT_S:-150}" $PY scripts/bench_train.py --device cuda --part memory --targets kimi_llama kimi_mla \
  --lengths ${MEMORY_LENGTHS:-512 1024 2048 4096} 2>&1 | tee "$OUT/memory.md"

[ "${SKIP_CHAIN:-0}" = 1 ] && exit 0
CHAIN_ROOT=${CHAIN_ROOT:-/tmp/gpu-checks-chain}
started=$(date +%s)
timeout "${CHAIN_LIMIT_S:-300}" $PY scripts/run.py stage=all model=demo_kimi model.dtype=bfloat16 \
  paths.root="$CHAIN_ROOT" > "$OUT/chain.log" 2>&1
echo "chain exit $? after $(( $(date +%s) - started )) s" | tee -a "$OUT/chain.log"
tail -n 25 "$OUT/chain.log"
