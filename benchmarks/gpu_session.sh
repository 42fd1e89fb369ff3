#!/usr/bin/env bash
# One call on a lent GPU machine, which has PyTorch and Triton but no network: install the
# carried wheels (.whl/, the dependencies that machine lacks) and this checkout, then run the
# stages named (default: all but paper), each logging to $OUT:
#   tests  the CUDA tests of the fused scan and of Tensor Memory
#   bench  benchmarks/bench_gpu_step.py --device cuda --save (the JSON lands in $OUT too)
#   first  the README's first command with --device cuda, timed
#   paper  the paper profile's coordinate-binding cells at W=50 (PAPER_ARGS adds to the command)
# Wheels for Python 3.12: pip download --no-deps --only-binary=:all: --python-version 3.12
#   -d .whl gymnasium farama-notifications jsonschema jsonschema-specifications referencing rpds-py 'setuptools>=80'
set -uo pipefail
OUT=${OUT:-/tmp/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stages=${*:-tests bench first}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { tail -20 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
for stage in $stages; do
    echo "== $stage $(date +%T)"
    start=$(date +%s)
    case $stage in
        tests) python3 -m pytest -q -p no:cacheprovider -x tests/tensor_memory/test_triton.py 2>&1 | tee "$OUT/tests.log" | tail -15 ;;
        bench) python3 benchmarks/bench_gpu_step.py --device cuda --save ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
               cp benchmarks/results/gpu_step_*.json "$OUT/" ;;
        first) tmem-bench run coordinate_binding --seeds 1 --device cuda --out /tmp/first 2>&1 | tee "$OUT/first.log" | tail -15 ;;
        paper) tmem-bench run coordinate_binding --profile paper --device cuda --level n_writes=50 --out /tmp/paper \
                   ${PAPER_ARGS:-} 2>&1 | tee "$OUT/paper.log" | tail -25
               tar czf "$OUT/paper-run.tgz" -C /tmp paper ;;
        *) echo "unknown stage $stage (allowed: tests bench first paper)"; exit 2 ;;
    esac
    echo "== $stage took $(( $(date +%s) - start )) s"
done
