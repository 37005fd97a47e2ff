set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /tmp/whl.log 2>&1
export PYTHONPATH=/tmp/site:$PWD/.whl/py
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || tail /tmp/install.log
timeout 150 python3 gpu_diag.py 2>&1 | tee $OUT/diag.log
timeout 150 python3 -m pytest -q -rs -n 4 -p no:cacheprovider tests/runtime/test_launch.py tests/e2e/test_alignment_specialization.py -m gpu 2>&1 | tail -25
