#!/usr/bin/env bash
# The test suite under sanitizers, in build trees of their own (g++, see shared/ENVIRONMENT.md):
#   build-asan: ASan + UBSan (float-cast-overflow included: NaN or huge floats converted to integers), the whole
#               ctest suite (unit, thread-rank, process and perf smoke tests; the Python tests too, with libasan
#               preloaded into the interpreter).
#   build-tsan: TSan, the thread-rank tests (ranks as threads of one process over the local transport).
# Only what ctest runs is built (no examples, no CUDA: there is no GPU to run device code on here; the device proxy
# runs against tests/fake_cuda).
#
#   scripts/sanitize.sh            # both
#   scripts/sanitize.sh asan       # or: tsan
# Environment: ASAN_DIR, TSAN_DIR (build trees), JOBS (ctest -j, default nproc), SANITIZE_PYTHON=0 skips the Python
# tests under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
ASAN_DIR=${ASAN_DIR:-build-asan}
TSAN_DIR=${TSAN_DIR:-build-tsan}
JOBS=${JOBS:-$(nproc)}
WHAT=${1:-all}
# Time limits inside tests that are written for the normal build (test_peer_death's detection slack, the Python
# tests' rank limit, test_api's timeout case) scale by this, under both sanitizers; the ctest TIMEOUTs scale in CMake
# (CCOLL_TIMEOUT_SCALE).
export CCTEST_TIME_SCALE=4

LAUNCHER=""
command -v ccache >/dev/null 2>&1 && LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"

configure() {  # dir sanitizers [options for the test programs' sources]
  if [ ! -f "$1/CMakeCache.txt" ]; then
    # RelWithDebInfo: -O2 keeps the runs short (-O1 everywhere compiles the tests a fifth faster but runs them a tenth
    # slower), -g1 gives the reports file:line; full debug information (-g) would make the build a third longer.
    cmake -S . -B "$1" $GEN -DCMAKE_BUILD_TYPE=RelWithDebInfo $LAUNCHER -DCCOLL_SANITIZE="$2" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
      -DCCOLL_TEST_COMPILE_OPTIONS="${3:-}" -DCCOLL_ENABLE_CUDA=OFF -DCCOLL_BUILD_EXAMPLES=OFF >/dev/null
  fi
}

stamp() { date +%s; }
# The pipelining case with 64-byte slices hands every chunk over in thousands of slices, each a wake-up of another
# thread: slowed by a sanitizer (and by a loaded machine) it can outlast its ctest TIMEOUT (900 s here), so it runs
# outside ctest, with a limit of its own.
slow_tests='with CC_SLICE_BYTES=64$'
run_slow() {  # build dir, extra env
  echo "== test_collectives [slice] with CC_SLICE_BYTES=64 (outside ctest)"
  (cd "$1" && env CC_SLICE_BYTES=64 "${@:2}" timeout 1200 tests/test_collectives "[slice]")
}
report=""

if [ "$WHAT" = all ] || [ "$WHAT" = asan ]; then
  t0=$(stamp)
  echo "== ASan+UBSan: build ($ASAN_DIR)"
  # The test programs' own sources at -O1: under ASan+UBSan they take most of the build (test_api.cc alone 66 s at
  # -O2, 44 s at -O1), while their run time is mostly the library's, whose sources stay at -O2 (side by side, the
  # heaviest cases ran about as long with the tests at -O1). A build tree configured before keeps its setting.
  configure "$ASAN_DIR" "address,undefined,float-cast-overflow" -O1
  cmake --build "$ASAN_DIR" -j "$(nproc)"
  t1=$(stamp)
  echo "== ASan+UBSan: ctest"
  # detect_leaks=0: LeakSanitizer reports allocations that OpenMPI and UCX keep until exit, inside processes started
  # by mpirun (test_processes.*, perf_mpi_*, perf_compare_mpi_script), and they cannot be suppressed there (see
  # ENVIRONMENT.md). Every other test runs with leak detection on. UBSan: every finding is fatal (halt_on_error also
  # covers float-cast-overflow, which -fno-sanitize-recover=undefined does not include).
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  # Leaks inside dependencies that are not ccoll's (tests/lsan.supp says which and why).
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp"
  asan_common="abort_on_error=0:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1"
  mpi_tests='^(test_processes\.|perf_mpi_[a-z_]+$|perf_compare_mpi_script$)'
  py_env=()
  if [ "${SANITIZE_PYTHON:-1}" = 1 ]; then
    # The interpreter is not instrumented: the runtime must be the first library loaded. libstdc++ comes right
    # after it, so that ASan finds the real __cxa_throw at start-up: the interpreter does not link libstdc++, and a
    # C++ exception thrown later (torch raising a Future's exception) would abort in ASan's interceptor otherwise.
    # Python and numpy keep objects alive until exit, so leak detection is off for these too.
    py_env=(LD_PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)")
  fi
  # The exact sweeps (test_collectives) on one signed integer type per element size and every float type: the unsigned
  # types run the same memory accesses as the signed ones of their size, and their wrapping arithmetic has no
  # undefined behaviour for UBSan to find; the normal build runs them. Nor the statistics over many trials of the
  # stochastic rounding (the codecs' code paths run in every other codec case; this one only repeats them).
  export CCTEST_DTYPES=int8,int32,int64,float16,bfloat16,float32,float64
  # Nor three reruns of whole binaries that change what the fakes check, not the memory accesses: the fake CUDA
  # runtime's strict mode (allocations and loads that synchronize the device abort where a GPU would hang), the fake
  # NCCL's cases without the call check, and the device cases without memory pools or without those of host memory
  # (the scratch then comes from a cache that never frees a block, so ASan sees less there than with pools, where each
  # free is the fake's; the cache's own cases, [scratch], run under ASan with and without pools). The normal build runs
  # them all.
  asan_only='rounding are unbiased|with allocations and loads synchronizing the device|every case with CC_CHECK_CALLS=0'
  asan_only+='|device calls without (host )?memory pools$|allocate by shape only, without memory pools$'
  (cd "$ASAN_DIR" &&
    ASAN_OPTIONS="$asan_common:detect_leaks=1" ctest --output-on-failure -j "$JOBS" --timeout 900 \
      -E "$mpi_tests|^python\\.|$slow_tests|$asan_only" &&
    ASAN_OPTIONS="$asan_common:detect_leaks=0" ctest --output-on-failure -j "$JOBS" --timeout 900 -R "$mpi_tests")
  run_slow "$ASAN_DIR" ASAN_OPTIONS="$asan_common:detect_leaks=1"
  if [ ${#py_env[@]} -gt 0 ]; then
    (cd "$ASAN_DIR" && env "${py_env[@]}" ASAN_OPTIONS="$asan_common:detect_leaks=0" \
      ctest --output-on-failure -j "$JOBS" --timeout 900 -R '^python\.')
  fi
  t2=$(stamp)
  report+="asan+ubsan: build $((t1 - t0)) s, tests $((t2 - t1)) s"$'\n'
fi

if [ "$WHAT" = all ] || [ "$WHAT" = tsan ]; then
  t0=$(stamp)
  echo "== TSan: build ($TSAN_DIR)"
  configure "$TSAN_DIR" "thread"
  thread_tests="test_collectives test_api test_split test_p2p test_compression test_internals"
  grep -q "CCOLL_ENABLE_BLAS:BOOL=ON" "$TSAN_DIR/CMakeCache.txt" && thread_tests+=" test_lowrank"
  # The device proxy against the fake CUDA runtime (built when the CUDA headers are there): caller, proxy and
  # stream threads.
  cmake --build "$TSAN_DIR" --target help | grep -q test_gpu_collectives_fakecuda &&
    thread_tests+=" test_gpu_collectives_fakecuda"
  # The NCCL transport against the fake NCCL (built when nccl.h is there): callers, the watchdog, the fake's stream
  # and connection threads.
  cmake --build "$TSAN_DIR" --target help | grep -q test_nccl_fakecuda &&
    thread_tests+=" test_nccl_fakecuda test_fake_nccl"
  cmake --build "$TSAN_DIR" -j "$(nproc)" --target $thread_tests
  t1=$(stamp)
  echo "== TSan: thread-rank tests"
  # UCX intercepts malloc and mmap through its own hooks, which TSan cannot follow (ENVIRONMENT.md): the thread-rank
  # tests use the local transport, but a test that touches UCX must not install the hooks.
  export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:history_size=4"
  # The exact sweeps on one datatype per element size: threads interleave by message sizes and slice counts, not by
  # the arithmetic (the normal build and ASan+UBSan run the other datatypes).
  export CCTEST_DTYPES=int8,bfloat16,float32,int64
  regex="^($(echo "$thread_tests" | sed 's/ /|/g'))\\."
  # Not under TSan: the cases that repeat the smaller cases' code paths on 2^18 or 2^20 elements (codec and reduction
  # arithmetic, statistics over many trials). Instrumented, every memory access is 5-15 times slower: they are CPU-bound
  # for many minutes and time out, while adding no interleaving the smaller cases lack. ASan+UBSan runs them (but the
  # statistics of stochastic rounding: see above). Nor the cases that check values, not threads: all-zero and
  # non-finite inputs, the error-feedback arithmetic over many calls, and the rerun on the codecs' scalar code
  # (CC_CPU_BASELINE=1); each makes the same exchanges as the other codec cases (160 s of test time under TSan in
  # the last CI). Nor the 16-bit data sweep (every codec twice over, on the same threads as the float32 cases), the
  # fake runtime's staged rerun (CC_DEVICE_KERNELS=0: the host drivers, which the thread-rank tests cover) and its
  # rerun of the exact device cases with CC_CHECKSUM=1, the device cases with allocations and loads synchronizing the
  # device (the same threads as without) or without memory pools of both kinds (eight of those cases run below) or of
  # host memory, and the fake NCCL's rerun of every case without the call check (the same threads, less the check's).
  # Nor the device case that counts allocations after the first call of each shape (every codec and exact collective
  # again on 4 ranks, the device codec cases' threads; 22 s under TSan).
  heavy='2\^18|2\^20|every codec and mode|rounding are unbiased|bfloat16 and float16 data|with CC_DEVICE_KERNELS=0'
  heavy+='|allocate nothing after the first call'
  heavy+='|exact calls with CC_CHECKSUM=1|and loads synchronizing the device|without memory pools'
  heavy+='|device calls without host memory pools'
  heavy+='|every case with CC_CHECK_CALLS=0'
  heavy+='|all-zero input gives|a NaN or an Inf on one rank|test_compression\.error feedback|with CC_CPU_BASELINE=1'
  (cd "$TSAN_DIR" && ctest --output-on-failure -j "$JOBS" --timeout 900 -R "$regex" -E "$slow_tests|$heavy")
  run_slow "$TSAN_DIR"
  if [[ " $thread_tests " == *" test_gpu_collectives_fakecuda "* ]]; then
    # A device without memory pools keeps the device and pinned blocks it frees for reuse once their streams pass the
    # free (core/device_memory.cc), touched by callers, proxies and stream threads, and the first call of each shape
    # waits on the host for its proxy (core/device_proxy.cc): the device cases that stage the most through pinned
    # memory, and the host waits' own case, 25 s here (the whole rerun above is left out).
    echo "== TSan: device calls without memory pools (eight cases)"
    nopool='*16-bit gradients through the device codecs*,*returns once queued*,*destroyed right after its device call*'
    nopool+=',*serves two of its communicators*,*a peer that aborts releases*,*staging that cannot be allocated*'
    nopool+=",*device codecs run on the device buffers*,*a shape's first device call returns once it has run*"
    # Catch2 skips a pattern that matches nothing: a renamed case must not drop out unnoticed. (Its listing exits with
    # the number of cases listed, hence the `|| true`.)
    matched=$(cd "$TSAN_DIR" && { tests/test_gpu_collectives_fakecuda --list-test-names-only "$nopool" || true; } |
              grep -c '^\[gpu\]' || true)
    if [ "$matched" != 8 ]; then
      echo "sanitize.sh: the eight device cases without memory pools match $matched cases" >&2
      exit 1
    fi
    (cd "$TSAN_DIR" && FAKE_CUDA_NO_POOLS=1 timeout 900 tests/test_gpu_collectives_fakecuda "$nopool")
  fi
  t2=$(stamp)
  report+="tsan: build $((t1 - t0)) s, tests $((t2 - t1)) s"$'\n'
fi

echo "== sanitizers passed"
printf '%s' "$report"
