#!/usr/bin/env bash
# The first hour on a lent GPU machine (no network), from the repository root:
#   1. installs the wheels carried in .whl/ (what the GPU image lacks), then hexlayout itself.
#      The H200 image (Python 3.12, torch 2.11+cu130, cuda-bindings, triton, matplotlib,
#      ml_dtypes) lacks z3-solver and python-constraint: prepare them here with
#        pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#          --platform manylinux_2_17_x86_64 -d .whl z3-solver
#        mkdir -p .whl/py && cp -r "$(python -c 'import constraint, os; print(os.path.dirname(constraint.__file__))')" .whl/py/
#      (python-constraint 1.4 is a pure-Python sdist: its package folder travels as is) and carry .whl;
#   2. the gpu-marked tests: every serving op on the GPU against the emulator on the same inputs
#      and replayed from a CUDA-graph capture (tests/ops/test_gpu_matches_emulator.py), and the
#      other gpu tests;
#   3. every benchmark with its peers (bench_gemm, bench_attention, bench_moe, bench_host);
#   4. one report, $OUT/gpu_session.md: device, versions, what is missing (vLLM, Triton, ...),
#      each step's status and the tail of its log.
# Results and logs go to $OUT (default benchmarks/results). BENCH_ARGS (default --quick) goes to
# every benchmark. A step that fails is reported, and the session goes on.
set -uo pipefail
OUT=${OUT:-benchmarks/results}
BENCH_ARGS=${BENCH_ARGS:---quick}
mkdir -p "$OUT"
REPORT="$OUT/gpu_session.md"
export PYTHONUNBUFFERED=1

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -d .whl/py ]; then
  export PYTHONPATH=$PWD/.whl/py${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || { echo "hexlayout did not install" >&2; exit 1; }

{
  echo "# GPU session $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi -L 2>&1
  python3 - <<'EOF'
import importlib.util
import platform

import torch

print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
for mod in ("triton", "vllm", "cuda.bindings", "hexlayout"):
    spec = importlib.util.find_spec(mod)
    if spec is None:
        print(f"missing: {mod}")
        continue
    m = __import__(mod, fromlist=["__version__"])
    print(mod, getattr(m, "__version__", "?"))
EOF
  echo '```'
  echo
} > "$REPORT" 2>&1

step() {  # step NAME LOG COMMAND...: run, log, and add the status and the log's tail to the report
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  "$@" > "$OUT/$log" 2>&1
  local rc=$?
  {
    echo "## $name: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)"), $((SECONDS - t0)) s"
    echo
    echo '```'
    tail -n 25 "$OUT/$log"
    echo '```'
    echo
  } >> "$REPORT"
}

step "gpu tests: every op against the emulator, CUDA-graph replay" gpu_ops.log \
  python3 -m pytest -q -rs -p no:cacheprovider tests/ops/test_gpu_matches_emulator.py
step "gpu tests: the others" gpu_tests.log \
  python3 -m pytest -q -rs -m gpu -p no:cacheprovider tests --deselect tests/ops/test_gpu_matches_emulator.py
for bench in gemm attention moe host; do
  args=$BENCH_ARGS
  [ "$bench" = host ] && args=""
  # shellcheck disable=SC2086
  step "bench_$bench" "bench_$bench.log" python3 "benchmarks/bench_$bench.py" $args
done
echo "report: $REPORT"
cat "$REPORT"
