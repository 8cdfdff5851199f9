#!/usr/bin/env bash
# The GPU checks, where a GPU is lent: the FLOP ledger against FlopCounterMode on GPU kernels, then
# GRPO at Qwen2.5-0.5B's shape (HF sampler, FSDP2 on one GPU, bf16): tokens/s and learner MFU.
# Needs a Python with CUDA torch and this project installed (pip install -e .).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d /tmp/isoflop-gpu-check.XXXX)}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 ISOFLOP_CACHE=${ISOFLOP_CACHE:-$OUT/cache}
"$PYTHON" scripts/gpu_ledger_check.py
"$PYTHON" scripts/gpu_check.py --out "$OUT" --peak-tflops "${PEAK_TFLOPS:-989}" "$@"
