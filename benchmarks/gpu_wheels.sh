#!/usr/bin/env bash
# Download, on a machine with internet, the wheels that benchmarks/gpu_check.sh needs beyond what
# a CUDA PyTorch image usually holds (torch, transformers, numpy, safetensors, pytest, pyyaml):
# pure-Python packages, so one set serves any Linux x86-64 Python >= 3.11. They land in .whl/
# (git-ignored); copy or carry that folder to the GPU machine with the checkout.
#
#     bash benchmarks/gpu_wheels.sh && ls .whl
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> "$(git rev-parse --git-path info/exclude)"
PY=${PYTHON:-python3}
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none \
    --platform any -d .whl "structlog==26.1.0" "redis==8.1.0" "pytest-asyncio==1.5.0"
ls -l .whl
