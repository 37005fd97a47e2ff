#!/usr/bin/env bash
# Run on a lent GPU machine (no network) from the repository root: installs the wheels carried in
# .whl/ (what the GPU image lacks: z3-solver, python-constraint), hexlayout itself, then runs the
# gpu-marked tests and the GEMM benchmark. Results and logs go to $OUT (default benchmarks/results).
set -uo pipefail
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
export PYTHONUNBUFFERED=1
python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT/gpu_tests.log"
python3 benchmarks/bench_gemm.py ${BENCH_ARGS:---quick} 2>&1 | tee "$OUT/bench_gemm.log"
cp benchmarks/results/gemm_* "$OUT/" 2>/dev/null || true
