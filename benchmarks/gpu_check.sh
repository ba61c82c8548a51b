#!/usr/bin/env bash
# The one prepared GPU run (under 8 minutes on one H100-class GPU): the GPU tests of the
# Triton kernels and native routes, then the GEMM GPU bars. Run from the repository root
# with the project's environment built (make venv):  bash benchmarks/gpu_check.sh
# Results: benchmarks/results/gemm-gpu.json, and the pytest summary on stdout.
set -u
PY=${PYTHON:-.venv/bin/python}
status=0
timeout 300 "$PY" -m pytest -q -m gpu tests/gemm tests/linalg/test_triton_jacobi.py \
    tests/control_flow -p no:cacheprovider --timeout 240 || status=1
timeout 240 "$PY" -m torchnext bench gemm-gpu --reps 10 || status=1
exit $status
