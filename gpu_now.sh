#!/usr/bin/env bash
# one-shot device run (not committed)
set -uo pipefail
export PYTHONUNBUFFERED=1
L=/tmp/logs; mkdir -p $L
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $L/whl.log 2>&1 || tail -5 $L/whl.log
export PYTHONPATH=/tmp/site:$PWD/.whl/py
python3 -m pip install -q --no-deps --no-build-isolation -e . > $L/install.log 2>&1 || { tail -30 $L/install.log; }
{ nvidia-smi -L; python3 -c "import torch,platform,triton;print(platform.python_version(),torch.__version__,torch.version.cuda,triton.__version__)"; python3 -c "import hexlayout.ops,cuda.bindings as c;print('hexlayout ok', c.__version__)"; } 2>&1 | tee $L/env.log
echo "install+env $((SECONDS-T0)) s"
timeout 290 python3 -m pytest -q -rs -m gpu -n 14 --timeout 200 -p no:cacheprovider tests > $L/gpu_tests.log 2>&1; echo "gpu tests rc=$? at $((SECONDS-T0)) s"
tail -40 $L/gpu_tests.log
timeout 75 python3 benchmarks/bench_gemm.py --quick --warmup 3 --iters 10 > $L/bench_gemm.log 2>&1; echo "gemm rc=$? at $((SECONDS-T0)) s"; tail -15 $L/bench_gemm.log
timeout 80 python3 benchmarks/bench_moe.py --quick --warmup 3 --iters 10 --models deepseek-v3-tp8 --variants hexlayout-bf16 hexlayout-w4a16 hexlayout-fp8 --out benchmarks/results > $L/bench_moe.log 2>&1; echo "moe rc=$? at $((SECONDS-T0)) s"; tail -12 $L/bench_moe.log
timeout 60 python3 benchmarks/bench_attention.py --quick --warmup 3 --iters 10 --what decode > $L/bench_attn.log 2>&1; echo "attn rc=$? at $((SECONDS-T0)) s"; tail -10 $L/bench_attn.log
tar czf $OUT/gpu_run.tgz -C /tmp logs -C "$PWD" benchmarks/results 2>/dev/null
echo done $((SECONDS-T0)) s
