#!/usr/bin/env bash
# bench/kernels/run_liger_gpu.sh — everything the liger kernels need from a GPU, in one call on the
# device machine: the cuda tests (direct and through the hub), the C++ benchmark and the PyTorch
# peers, results under $OUT (default /tmp/liger-out).
#
#   BUILD=build bash bench/kernels/run_liger_gpu.sh          (binaries built here, carried over)
#   LIGER_STANDALONE=1 bash bench/kernels/run_liger_gpu.sh   (compile the benchmark there with nvcc
#                                                             only, when carried binaries do not run)
# The test and benchmark binaries need only the CUDA runtime, cuBLAS(Lt) and libstdc++; the hub
# test also needs libhk.so and <build>/hub. Steps are independent: one failing does not stop the rest.
set -u
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/liger-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.csv" 2>&1
cat "$OUT/gpu.csv"

if [ -n "${LIGER_STANDALONE:-}" ] || [ ! -x "$BUILD/bin/liger_bench" ]; then
  mkdir -p "$OUT/bin"
  S=kernels/liger-kernels/src
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I "$S" \
    bench/kernels/liger_bench.cu $S/cuda/*.cu $S/cuda/*.cc $S/liger/chunking.cc \
    -lcublasLt -lcublas -o "$OUT/bin/liger_bench" && BENCH="$OUT/bin/liger_bench"
else
  BENCH="$BUILD/bin/liger_bench"
fi

echo "== liger_kernels_cuda_test"
"$BUILD/tests/kernels/liger_kernels_cuda_test" --gtest_output=json:"$OUT/liger_kernels_cuda_test.json" \
  > "$OUT/liger_kernels_cuda_test.log" 2>&1; echo "rc=$?"
grep -E "FAILED|PASSED|Failure" "$OUT/liger_kernels_cuda_test.log" | head -20

echo "== liger_hub_cuda_test"
HK_BINARY_DIR="$(cd "$BUILD" && pwd)" "$BUILD/tests/kernels/liger_hub_cuda_test" \
  > "$OUT/liger_hub_cuda_test.log" 2>&1; echo "rc=$?"
grep -E "FAILED|PASSED|Failure" "$OUT/liger_hub_cuda_test.log" | head -20

echo "== liger_bench"
"${BENCH:-false}" --out "$OUT/liger_bench.json" 2> "$OUT/liger_bench.txt"; echo "rc=$?"
cat "$OUT/liger_bench.txt"

echo "== liger_torch.py"
python3 bench/peers/liger_torch.py --out "$OUT/liger_torch.json" 2> "$OUT/liger_torch.txt"; echo "rc=$?"
cat "$OUT/liger_torch.txt"
