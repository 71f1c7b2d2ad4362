#!/usr/bin/env bash
# The device check of the GPU backend: one prepared run for a machine with a CUDA GPU and
# CuPy, PyTorch (with CUDA), pytest and hypothesis installed. From anywhere:
#
#     bash benchmarks/gpu_check.sh
#
# 1. the gpu tests (tests/contracts/test_gpu.py: agreement with the reference on CuPy, finite
#    differences, float16, bad input, purity, device vs host emulation; and
#    tests/contracts/test_gpu_grad_jvp_*.py, the second order; the adapters' CUDA tests: PyTorch's
#    functions and modules, dask with CuPy blocks), Hypothesis "dev" profile, at most
#    170 s;
# 2. benchmarks/gpu.py (cell step and sequence forward+backward against PyTorch CUDA and
#    cuDNN, elementwise-kernel bandwidth against a device-to-device copy), at most 110 s.
# Everything printed goes to $OUT/gpu_check.txt when $OUT is set, else to
# benchmarks/results/gpu_check-<time>.txt; the benchmark tables also to gpu_bench*.txt
# beside it. Exit status: 0 when the tests passed and the benchmark ran, else 1.
set -u
cd "$(dirname "$0")/.." || exit 1

if [ -n "${OUT:-}" ]; then
    dest="$OUT"; suffix=""
else
    dest="benchmarks/results"; suffix="-$(date +%Y%m%d-%H%M%S)"
fi
mkdir -p "$dest"
log="$dest/gpu_check$suffix.txt"
bench="$dest/gpu_bench$suffix.txt"
python=${PYTHON:-python}

run() {
    echo "== environment"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -3
    "$python" - <<'PY'
import platform
import cupy
print("python", platform.python_version(), "| cupy", cupy.__version__,
      "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "| devices", cupy.cuda.runtime.getDeviceCount())
try:
    import torch
    print("torch", torch.__version__, "| CUDA", torch.cuda.is_available(),
          "| cuDNN", torch.backends.cudnn.version())
except ImportError:
    print("torch absent")
PY
    if ! "$python" -c "import gradcells" 2>/dev/null; then
        echo "== installing gradcells (editable, no dependencies)"
        "$python" -m pip install -q -e . --no-deps || return 1
    fi

    echo "== gpu tests"
    local start=$SECONDS
    HYPOTHESIS_PROFILE=dev timeout 170 "$python" -m pytest tests/contracts/test_gpu.py tests/contracts/test_gpu_grad_jvp_*.py \
        "tests/frameworks/test_torch_functions.py::test_cuda_matches_cpu" \
        "tests/frameworks/test_torch_modules.py::test_cuda_module_matches_nn" \
        "tests/frameworks/test_dask.py::test_cupy_chunks_run_on_the_gpu" -q -rs \
        -p no:cacheprovider --durations=8
    local tests=$?
    echo "gpu tests: exit status $tests in $((SECONDS - start)) s"

    echo "== benchmark"
    start=$SECONDS
    timeout 110 "$python" benchmarks/gpu.py --out "$bench"
    local benchmark=$?
    echo "benchmark: exit status $benchmark in $((SECONDS - start)) s"
    [ "$tests" -eq 0 ] && [ "$benchmark" -eq 0 ]
}

run 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
echo "results: $log" >&2
exit "$status"
