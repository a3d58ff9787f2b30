#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, build-fuzz/) and runs each for a fixed time, starting from
# the seed corpus in tests/fuzz/corpus/<target>/ (new inputs go to a scratch copy, not into the repository). Fails
# when a target crashes, leaks, times out on one input or breaks a property; the input that did it is kept in
# build-fuzz/artifacts/ and the command to replay it is printed.
#
#   tests/fuzz/run_fuzzers.sh                    # every target, FUZZ_SECONDS (25) each
#   FUZZ_SECONDS=300 tests/fuzz/run_fuzzers.sh fuzz_codec_quant_homomorphic
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-25}
TARGETS=${*:-"fuzz_bootstrap_root fuzz_codec_cast16 fuzz_codec_quant_requant fuzz_codec_quant_homomorphic fuzz_wire"}

# Debian's clang 14 and its runtime libraries (libFuzzer, ASan, UBSan), installed when missing.
if ! command -v clang++-14 >/dev/null 2>&1 || ! dpkg -s libclang-rt-14-dev >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "== installing clang-14 libclang-rt-14-dev"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends clang-14 libclang-rt-14-dev \
      >/dev/null
  fi
fi
CLANGXX=${CLANGXX:-$(command -v clang++-14 || command -v clang++ || true)}
CLANG=${CLANG:-$(command -v clang-14 || command -v clang || true)}
if [ -z "$CLANGXX" ] || [ -z "$CLANG" ]; then
  echo "run_fuzzers.sh: clang is needed (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 1
fi

t0=$(date +%s)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  LAUNCHER=""
  command -v ccache >/dev/null 2>&1 && LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
  GEN=""
  command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
  # Only the library and the fuzzers; no transport beyond the local one is reached from the targets.
  CC="$CLANG" CXX="$CLANGXX" cmake -S . -B "$BUILD_DIR" $GEN -DCMAKE_BUILD_TYPE=Release $LAUNCHER \
    -DCCOLL_BUILD_FUZZERS=ON -DCCOLL_BUILD_TESTS=OFF -DCCOLL_BUILD_PERF=OFF -DCCOLL_BUILD_EXAMPLES=OFF \
    -DCCOLL_ENABLE_CUDA=OFF -DCCOLL_ENABLE_UCX=OFF -DCCOLL_ENABLE_BLAS=OFF >/dev/null
fi
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$(nproc)" --target $TARGETS
t1=$(date +%s)

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
mkdir -p "$BUILD_DIR/artifacts"
summary=""
status=0
for t in $TARGETS; do
  work="$BUILD_DIR/corpus-run/$t"
  rm -rf "$work"
  mkdir -p "$work"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  echo "== $t: ${SECONDS_EACH} s"
  log="$BUILD_DIR/artifacts/$t.log"
  # -max_len: codec messages of up to 4096 elements and six bootstrap connections fit; -timeout: one input may not
  # take a second (a hang in a parser is a finding too); -rss_limit_mb: a parser must not allocate from a length
  # field it did not bound.
  if "$BUILD_DIR/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$BUILD_DIR/artifacts/$t-" "$work" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    summary+=$(printf '%-32s ok   %8s runs  %s  corpus %s files' "$t" "${runs:-?}" "${cov:-}" "$(ls "$work" | wc -l)")$'\n'
  else
    status=1
    grep -m1 -A30 -E "ERROR: |runtime error|property violated|deadly signal" "$log" || tail -40 "$log"
    crash=$(ls -t "$BUILD_DIR/artifacts/$t-"* 2>/dev/null | grep -v '\.log$' | head -1 || true)
    summary+=$(printf '%-32s FAIL replay: %s %s' "$t" "$BUILD_DIR/tests/fuzz/$t" "${crash:-?}")$'\n'
  fi
done
t2=$(date +%s)
echo "== fuzzing: build $((t1 - t0)) s, runs $((t2 - t1)) s"
printf '%s' "$summary"
exit $status
