#!/usr/bin/env bash
# Everything the shmem and EP issues check on a GPU machine, in one call: environment, install, the GPU
# tests, compute-sanitizer memcheck on the test kernels, and the shmem and EP benchmarks (with two or more
# GPUs also the multi-GPU EP benchmark against NCCL). Logs go to $OUT
# (or ./gpu-logs). Bundles must have been precompiled on a machine with the compiler:
#   python test/python/gpu/kernels.py .bundles && python bench/shmem_kernels.py .bundles \
#     && python bench/ep_bench.py --precompile .bundles && python bench/ep_ll_bench.py --precompile .bundles \
#     && python bench/ep_internode_bench.py --precompile .bundles
#     (and python bench/ep_multigpu_bench.py --precompile .bundles --world N for an N-GPU host)
set -uo pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MORI_COMPILER_CACHE_DIR=$PWD/.bundles MORI_TEST_BUNDLES=$PWD/.bundles
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, cuda.bindings; print(sys.version.split()[0], torch.__version__, cuda.bindings.__version__)"
} 2>&1 | tee "$OUT/env.log"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | grep -v WARNING | tail -3
status=0
# A per-test limit where pytest-timeout is installed (the H200 image has it; the project does not need it).
per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo --timeout=180)
timeout 420 python3 -m pytest ${PYTEST_PATHS:-test/python/gpu} -q -ra -p no:cacheprovider $per_test ${PYTEST_ARGS:-} \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -25 || status=1
if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
  timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest test/python/gpu/test_shmem_gpu.py -q -p no:cacheprovider -k "2pes and ${MEMCHECK_K:-not thread}" \
    2>&1 | tee "$OUT/memcheck.log" | tail -8 || status=1
  timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest test/python/gpu/test_ep_gpu.py -q -p no:cacheprovider -k "2pes and not graph" \
    2>&1 | tee "$OUT/ep_memcheck.log" | tail -4 || status=1
  timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest test/python/gpu/test_ep_ll_gpu.py -q -p no:cacheprovider \
    -k "2pes and oracle and (random-random-bf16 or 128-fp8 or zero or mixed)" \
    2>&1 | tee "$OUT/ll_memcheck.log" | tail -4 || status=1
  timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest test/python/gpu/test_ep_internode_gpu.py -q -p no:cacheprovider \
    -k "W4-G2 and (oracle and (random-random-bf16 or one or sentinel-mixed) or odd)" \
    2>&1 | tee "$OUT/internode_memcheck.log" | tail -4 || status=1
fi
for b in ${BENCH_BLOCKS:-132}; do timeout 120 python3 bench/shmem_bench.py --blocks $b --json "$OUT/shmem_bench_$b.json" 2>&1 | tee -a "$OUT/bench.log" || status=1; done
timeout 150 python3 bench/ep_bench.py --json "$OUT/ep_bench.json" --png "$OUT/ep_bench.png" 2>&1 \
  | tee "$OUT/ep_bench.log" | tail -11 || status=1
timeout 120 python3 bench/ep_ll_bench.py --ll-blocks 16,32 --json "$OUT/ep_ll_bench.json" 2>&1 \
  | tee "$OUT/ep_ll_bench.log" | tail -40 || status=1
timeout 200 python3 bench/ep_internode_bench.py --json "$OUT/ep_internode_bench.json" 2>&1 \
  | tee "$OUT/ep_internode_bench.log" | tail -65 || status=1
ngpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpus" -ge 2 ]; then  # EP across real GPUs (the GPU tests above ran test_ep_multigpu.py)
  timeout 400 python3 bench/ep_multigpu_bench.py --world "$ngpus" --stack-dump-s 350 --json "$OUT/ep_multigpu.json" \
    2>&1 | tee "$OUT/ep_multigpu.log" | tail -52 || status=1
fi
exit $status
