#!/usr/bin/env bash
# The GPU checks (scripts/gpu_check.py says what each measures), in the order of what they teach,
# each a process of its own under its own time cap, so a short window still returns rows: memory
# at conf/engine/h200.yaml's settings, kill-and-resume, MFU; where there are two GPUs, two NCCL
# ranks with uneven micro-batches; where vLLM imports, the engine's log-probs after a weight push.
# Designed for one GPU of a bare machine (the image's torch, no vLLM) within 8 minutes (the caps
# below sum to 7 on one GPU without vLLM), 15 with the machine's start. One table at the end, a
# row per figure; a check stopped at its cap says so; exit 1 if any row failed.
# Needs a Python with CUDA torch and this project importable: pip install -e '.[dev]' (and '.[vllm]'
# where the wheel can be had); on an image without a registry, the tree on PYTHONPATH with hydra,
# omegaconf and antlr4 copied beside it (how it ran on its first H200).
#   PYTHON=.venv/bin/python scripts/gpu_check.sh [--steps 4 --n 8 --B-p 16]
#   scripts/gpu_check.sh --cpu-dry-run     # each check's tiny CPU variant: the code paths, no figures
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d /tmp/isoflop-gpu-check.XXXX)}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 ISOFLOP_CACHE=${ISOFLOP_CACHE:-$OUT/cache}
CHECKS=${GPU_CHECKS:-"memory:150 resume:150 mfu:60 ranks:120 vllm-logprobs:150"}
for entry in $CHECKS; do
  check=${entry%%:*} cap=${entry##*:}
  echo "== $check (cap ${cap} s)"
  timeout --kill-after=10 "$cap" "$PYTHON" scripts/gpu_check.py --out "$OUT" --check "$check" "$@"
  status=$?
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    "$PYTHON" scripts/gpu_check.py --out "$OUT" --stopped "$check" "$cap" "$@"
  fi
done
"$PYTHON" scripts/gpu_check.py --out "$OUT" --table "$@"
