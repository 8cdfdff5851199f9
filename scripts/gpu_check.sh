#!/usr/bin/env bash
# The GPU checks, where a GPU is lent: the FLOP ledger against FlopCounterMode on GPU kernels, then
# GRPO at Qwen2.5-0.5B's shape (FSDP2 on one GPU, bf16): tokens/s and learner MFU with the HF
# sampler; where vLLM imports (its GPU wheel), the vLLM tests (tests/test_vllm.py) and the same run
# with sampler=vllm (sleep mode between generation and learning), tensor parallel 1 and, on two or
# more GPUs, 2, each against the engine's own offline throughput.
# Needs a Python with CUDA torch and this project installed (pip install -e '.[dev]', + '.[vllm]').
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d /tmp/isoflop-gpu-check.XXXX)}
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 ISOFLOP_CACHE=${ISOFLOP_CACHE:-$OUT/cache}
"$PYTHON" scripts/gpu_ledger_check.py
"$PYTHON" scripts/gpu_check.py --out "$OUT" --peak-tflops "${PEAK_TFLOPS:-989}" "$@"
if "$PYTHON" -c "import vllm" 2>/dev/null; then
  "$PYTHON" -m pytest -q -m vllm tests/test_vllm.py
  GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
  for TP in 1 2; do
    if [ "$TP" -le "$GPUS" ]; then
      "$PYTHON" scripts/gpu_check.py --out "$OUT" --peak-tflops "${PEAK_TFLOPS:-989}" --sampler vllm --tensor-parallel "$TP" "$@"
    fi
  done
else
  echo "vLLM does not import here: the sampler=vllm checks are skipped (pip install -e '.[vllm]')"
fi
