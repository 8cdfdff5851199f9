#!/usr/bin/env bash
# The GPU checks, where a GPU is lent (scripts/gpu_check.py says what each measures): one table,
# a row per check, a failing row naming its step; exit 1 if any failed. Sized for one H200 in
# 8-9 minutes; on two or more GPUs it adds tensor parallel 2.
# Needs a Python with CUDA torch and this project installed: pip install -e '.[dev,vllm]'. On an
# image that has torch, transformers, peft, pandas, typer and rich but no registry, the tree on
# PYTHONPATH with hydra, omegaconf and antlr4 copied beside it is enough for every check but vLLM's
# (how it ran on its first H200); Ray, datasets and math-verify are not needed here.
#   PYTHON=.venv/bin/python scripts/gpu_check.sh [--steps 4 --n 8 --B-p 16]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d /tmp/isoflop-gpu-check.XXXX)}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 ISOFLOP_CACHE=${ISOFLOP_CACHE:-$OUT/cache}
exec timeout "${GPU_CHECK_TIMEOUT_S:-540}" "$PYTHON" scripts/gpu_check.py --out "$OUT" --peak-tflops "${PEAK_TFLOPS:-989}" "$@"
