#!/usr/bin/env bash
# Everything the GPU side can show, in one call on a one-GPU machine (the `device` tool's H200: CUDA and CMake, no
# apt, no network, no UCX/MPI/Catch2): configure for sm_90, build, run the [gpu] tests (CUDA kernels against the
# CPU drivers, byte for byte) and the kernel benchmark, and print a short summary last. Budget: a few minutes.
#
#   perf/gpu_check.sh                 (from the repository root; BUILD_DIR=build-gpu by default)
#
# Catch2 is not on that machine: before the call, on the development machine, `apt-get download catch2` into .deps/
# (ignored by git) and pass carry [".deps"]; this script unpacks it next to the build. Without it the tests are
# not built and only the benchmark runs. UCX, MPI and a BLAS are optional: CMake leaves out what is missing.
# Not covered yet (the CUDA backend's later parts): collectives on device buffers (allreduce_perf -t 4 on device
# memory), the NCCL and UCX-CUDA transports.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-${BUILD_DIR}/gpu_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"

tests=OFF
prefix=""
deb=$(ls .deps/catch2_*.deb 2>/dev/null | head -1)
if [ -n "$deb" ]; then
  mkdir -p "$BUILD_DIR/catch2-root"
  dpkg -x "$deb" "$BUILD_DIR/catch2-root" 2>/dev/null || (cd "$BUILD_DIR/catch2-root" && ar p "$OLDPWD/$deb" data.tar.xz | tar xJ)
  prefix="-DCMAKE_PREFIX_PATH=$PWD/$BUILD_DIR/catch2-root/usr"
  tests=ON
fi
gen=""
command -v ninja >/dev/null && gen="-G Ninja"
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" $gen -DCMAKE_BUILD_TYPE=Release -DCCOLL_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCCOLL_BUILD_TESTS=$tests -DCCOLL_BUILD_EXAMPLES=OFF $prefix >"$OUT/configure.log" 2>&1 \
  || { tail -30 "$OUT/configure.log"; exit 1; }
targets="gpu_codec_bench"
[ "$tests" = ON ] && targets="$targets test_gpu"
cmake --build "$BUILD_DIR" --target $targets -j "$(nproc)" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "configure + build: $(( $(date +%s) - start )) s"

status=0
if [ "$tests" = ON ]; then
  timeout 300 "$BUILD_DIR/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1 || status=1
  tail -3 "$OUT/test_gpu.log"
fi
timeout 180 "$BUILD_DIR/perf/gpu_codec_bench" -n $((64 << 20)) -r 20 >"$OUT/bench.md" 2>&1 || status=1

echo
echo "== summary"
cat "$OUT/gpu.txt"
if [ "$tests" = ON ]; then
  grep -E "passed|failed|skipped" "$OUT/test_gpu.log" | tail -2
else
  echo "tests: not built (no Catch2 in .deps/)"
fi
cat "$OUT/bench.md"
exit $status
