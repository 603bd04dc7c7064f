#!/usr/bin/env bash
# The GPU path, checked on a CUDA machine in one go (about 8 minutes at most):
#   a) the CUDA tests (graph replay, memory profiling, host syncs, FlexAttention vs the torch backend and HF)
#   b) greedy fidelity vs HF on the GPU: float32 token-exact, bfloat16 agreement share
#   c) the nano-vllm workload on a random Qwen3-0.6B-shaped model: output tokens/s, share of roofline
# Each part has its own timeout and a failed part does not stop the next; the summary at the end
# lists each part's exit status (124 = timed out). Logs go to $OUT (or /tmp/aqueduct-gpu-check).
#
#     bash benchmarks/gpu_check.sh              # from the repository root, on the GPU machine
#     bash benchmarks/gpu_check.sh --cpu-smoke  # dry run of the same steps on CPU, tiny sizes
#
# Needs a Python (default python3, or $PYTHON) with a CUDA torch, transformers, numpy, safetensors,
# pytest and pyyaml. structlog, redis and pytest-asyncio are installed from .whl/ when missing
# (make it with benchmarks/gpu_wheels.sh where there is internet); without them it stops and says so.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${OUT:-/tmp/aqueduct-gpu-check}
mkdir -p "$LOGS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export AQUEDUCT_CACHE_DIR=${AQUEDUCT_CACHE_DIR:-/tmp/aqueduct-gpu-check-cache}
SMOKE=0
[ "${1:-}" = "--cpu-smoke" ] && SMOKE=1

missing=$("$PY" - <<'EOF'
import importlib.util
needed = ["torch", "transformers", "numpy", "safetensors", "pytest", "yaml", "structlog", "redis", "pytest_asyncio"]
print(" ".join(name for name in needed if importlib.util.find_spec(name) is None))
EOF
)
if [ -n "$missing" ]; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        echo "installing from .whl/: $(ls .whl)"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/aqueduct-site .whl/*.whl || exit 2
        export PYTHONPATH="$PYTHONPATH:/tmp/aqueduct-site"
        missing=$("$PY" -c "import importlib.util as u; print(' '.join(n for n in '$missing'.split() if u.find_spec(n) is None))")
    fi
    if [ -n "$missing" ]; then
        echo "gpu_check: missing Python packages: $missing (make .whl/ with benchmarks/gpu_wheels.sh and bring it along)"
        exit 2
    fi
fi
if [ $SMOKE = 0 ]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
        echo "gpu_check: torch sees no CUDA device ($("$PY" -c 'import torch; print(torch.__version__)')); use --cpu-smoke to dry-run"
        exit 2
    }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"

declare -A status
run_part() {  # name, seconds, command...
    local name=$1 seconds=$2
    shift 2
    echo "=== $name (timeout ${seconds}s) ==="
    local started=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$LOGS/$name.log" | grep -v '^{' | tail -40
    status[$name]=${PIPESTATUS[0]}
    echo "=== $name: exit ${status[$name]} after $((SECONDS - started)) s ==="
}

if [ $SMOKE = 1 ]; then
    run_part tests 300 "$PY" -m pytest -q -p no:cacheprovider -W ignore tests/pipeline/model/test_cuda_path.py
    run_part fidelity 300 "$PY" benchmarks/gpu_fidelity.py --device cpu --archs llama --dtypes float32 \
        --num-requests 4 --attention-backend torch
    run_part benchmark 300 "$PY" benchmarks/nano_vllm_shape.py --cpu-smoke --model-dir /tmp/aqueduct-nano
else
    # Budget: 170 + 110 + 180 s. Triton builds each FlexAttention variant once per machine (cached in
    # /tmp/torchinductor_*), so the later parts reuse what the tests compiled for the same shapes.
    run_part tests 170 "$PY" -m pytest -q -p no:cacheprovider -W ignore -rs tests/pipeline/model/test_cuda_path.py \
        tests/pipeline/model/attention/test_flex.py
    run_part fidelity 110 "$PY" benchmarks/gpu_fidelity.py --device cuda --archs llama qwen3 mistral gemma2 \
        --num-requests 8
    run_part benchmark 180 "$PY" benchmarks/nano_vllm_shape.py --model-dir /tmp/aqueduct-qwen3-0.6b-shape
fi

echo "=== summary (exit status per part; 124 = timed out) ==="
for name in tests fidelity benchmark; do
    echo "$name: ${status[$name]:-not run}"
done
grep -h "share of roofline\|output tokens/s\|tokens agree" "$LOGS"/*.log 2>/dev/null
for name in tests fidelity benchmark; do
    [ "${status[$name]:-1}" = 0 ] || exit 1
done
