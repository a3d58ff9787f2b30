#!/usr/bin/env bash
# Everything the GPU side can show, in one call on a one-GPU machine (the `device` tool's H200: CUDA and CMake, no
# apt, no network, no UCX/MPI/Catch2): configure for sm_90, build, probe, run the [gpu] tests (CUDA kernels against
# the CPU drivers, byte for byte) and the kernel benchmark, and print a short summary last. Budget: a few minutes.
#
#   perf/gpu_check.sh                 (from the repository root; BUILD_DIR=build-gpu by default)
#
# On the device tool: run it with carry [".deps"] (below). The logs come back as $OUT/gpu_check_logs.tgz (the tool
# returns at most 8 files); the summary at the end of the output says what passed, and the start of each failure.
#
# Catch2 is not on that machine: before the call, on the development machine, `apt-get download catch2` into .deps/
# (ignored by git) and pass carry [".deps"]; this script unpacks it next to the build. Without it the tests are
# not built and only the benchmark runs. UCX, MPI and a BLAS are optional: CMake leaves out what is missing.
# First perf/gpu_probe: device work step by step (context, copies, kernels against the CPU, the device's preparation, a
# stream held on a mapped host word, pools, 1- and 2-rank device all-reduces), each step "ok" or what failed; when it
# fails before the all-reduces, the parts that need the whole device path are left out. Then the tests, each case in a
# process of its own. Then allreduce_perf -t 4 -G 1 (4 thread ranks sharing the GPU) for the exact float and bf16
# all-reduce and every codec, on the device buffers (CC_DEVICE_KERNELS=1, the default: device copies between the ranks'
# buffers, reduction and codec kernels) and staged through host memory with the CPU reductions and codecs
# (CC_DEVICE_KERNELS=0), side by side at 64 MiB, and the exact collectives' programs (reduce_perf, broadcast_perf,
# reducescatter_perf, allgather_perf, sendrecv_perf, alltoall_perf) the same way. Then the NCCL transport
# (CC_TRANSPORT=nccl): test_nccl (exact and compressed calls against fp64 and the host ring's bytes, stream order, CUDA
# graph capture and replay, a dead peer) and allreduce_perf, both with ranks as processes that share the GPU under
# NCCL_HOSTIDs of their own (NCCL refuses two ranks on one GPU of one host). NCCL there is the nvidia-nccl-cu13 wheel's
# libnccl.so.2; its header may be missing, so carry one: on the development machine `mkdir -p .deps/nccl/include && cp
# /usr/local/cuda/include/nccl.h .deps/nccl/include/`. Not covered: UCX on CUDA memory (no CUDA-enabled UCX on either
# machine).
#
# A hang costs one step, not the call: every step has a time limit and none runs past GPU_CHECK_BUDGET_S (default
# 540 s) from the start. Short device calls run first (45 s each at most); one that hangs runs again with
# CUDA_DEVICE_MAX_CONNECTIONS=32, then CUDA_MODULE_LOADING=EAGER, then both, and the first that passes says the cause
# (the summary says it, and the rest of the script runs so): ccoll's streams sharing a hardware queue with a stream
# that waits for them (README, "Device buffers"), or a lazy kernel load deadlocked against a waiting stream
# (collectives/device_prepare.h; cuBLAS's kernels are not preloaded). A test case that times out runs again with
# both.
#
# GPU_CHECK_PARTS (default "smoke tests python bench perf nccl sanitize") picks what runs after the build, in that
# order, so that a second call can run what the budget cut from the first; GPU_CHECK_PREBUILT=1 skips configure and
# build and takes BUILD_DIR's binaries as they are (a second call on a machine still warm keeps them).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
PARTS=" ${GPU_CHECK_PARTS:-smoke tests python bench perf nccl sanitize} "
part() { [[ "$PARTS" == *" $1 "* ]]; }
LOGS=${GPU_CHECK_LOGS:-${BUILD_DIR}/gpu_check}
mkdir -p "$LOGS"
LOGS=$(cd "$LOGS" && pwd)
rm -f "$LOGS"/*.log "$LOGS"/*.txt "$LOGS/gpu_check_logs.tgz"
# The device tool brings back at most 8 files from $OUT: the logs travel as one archive, written also when the script
# stops early.
pack_logs() {
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "$(cd "$OUT" && pwd)" != "$LOGS" ]; then
    local f
    for f in "$LOGS"/*.log; do
      [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $((4 << 20)) ] || continue
      { head -c $((2 << 20)) "$f"; printf '\n[... cut by gpu_check.sh ...]\n'; tail -c $((1 << 20)) "$f"; } \
        >"$f.cut" && mv "$f.cut" "$f" || rm -f "$f.cut"
    done
    tar czf "$OUT/gpu_check_logs.tgz" -C "$LOGS" . 2>/dev/null
  fi
}
trap pack_logs EXIT
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET_S:-540} ))
# step LIMIT CMD...: runs CMD (stdin /dev/null) for at most LIMIT seconds, cut short to end 20 s before the deadline;
# 124 on a timeout, 125 when the budget is spent and CMD did not run. Its output (stdout and stderr) stops at 64 MiB:
# the first GPU run's logs filled the disk, and nothing came back. (Not ulimit -f: that also limits the files and
# shared memory a program makes.) The reader of the output has a time limit too: a process that outlives the timeout
# (a rank of perf/launch_local.sh in its own process group, a child that ignores SIGTERM) would hold the pipe open;
# it gets SIGPIPE once the reader is gone.
step() {
  local limit left
  limit=$1
  shift
  left=$(( deadline - $(date +%s) - 20 ))
  if [ "$left" -lt 10 ]; then
    echo "not run (the budget is spent): $*"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout -k 10 "$limit" "$@" </dev/null 2>&1 | timeout -k 5 $((limit + 15)) head -c $((64 << 20))
  return "${PIPESTATUS[0]}"
}
# mark NAME: the seconds since the last mark, into times.txt (the summary prints it).
last_mark=$(date +%s)
mark() {
  local now
  now=$(date +%s)
  echo "$1: $(( now - last_mark )) s" >>"$LOGS/times.txt"
  last_mark=$now
  df -h . >"$LOGS/disk.txt" 2>&1
  pack_logs  # what is done so far comes back even if the call is killed
}
echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset, so lazy loading (the default)}," \
  "CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-unset (8)}" >"$LOGS/loading.txt"
ulimit -c 0  # no core files on the disk
# A device call that waits for ever (a stream held behind a shared hardware queue, a lazy load) ends in ccoll's own
# timeout error, which names what it waited for, well inside a step's limit (the default is 300 s). Tests that set
# their communicator's timeout in its config keep theirs.
export CC_TIMEOUT_MS=${CC_TIMEOUT_MS:-20000}
timeout 30 nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,compute_mode --format=csv,noheader 2>&1 \
  | tee "$LOGS/gpu.txt"
timeout 30 nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1

status=0
tests=OFF
prefix=""
deb=$(ls .deps/catch2_*.deb 2>/dev/null | head -1)
if [ -n "$deb" ]; then
  root=$(mkdir -p "$BUILD_DIR/catch2-root" && cd "$BUILD_DIR/catch2-root" && pwd)
  dpkg -x "$deb" "$root" 2>/dev/null || (cd "$root" && ar p "$OLDPWD/$deb" data.tar.xz | tar xJ)
  prefix="-DCMAKE_PREFIX_PATH=$root/usr"
  tests=ON
fi
# NCCL: the toolkit's, else the Python wheel's library (found wherever the wheel put it: nvidia/nccl/lib or
# nvidia/cu13/lib) with its header or, when the wheel has none, the carried one (see the top).
nccl=""
{
  echo "nvcc: $(command -v nvcc) ($(nvcc --version 2>&1 | tail -1))"
  echo "toolkit libraries: $(ls /usr/local/cuda/lib64/ 2>/dev/null | grep -E 'cublas|nccl|cudart' | tr '\n' ' ')"
  echo "python3: $(command -v python3)"
} >"$LOGS/toolkit.txt"
if [ ! -f /usr/local/cuda/include/nccl.h ] || ! ls /usr/local/cuda/lib*/libnccl.so* >/dev/null 2>&1; then
  find_in_wheels() {  # find_in_wheels NAME: the first file NAME under a site-packages/nvidia folder
    python3 -c 'import glob, os, site, sys
for d in site.getsitepackages():
    for p in sorted(glob.glob(os.path.join(d, "nvidia", "**", sys.argv[1]), recursive=True)):
        print(p)
        sys.exit(0)' "$1" 2>/dev/null
  }
  nccl_lib=$(find_in_wheels 'libnccl.so*')
  inc=$(dirname "$(find_in_wheels nccl.h)" 2>/dev/null)
  [ -n "$inc" ] && [ -f "$inc/nccl.h" ] || inc="$(pwd)/.deps/nccl/include"
  if [ -n "$nccl_lib" ] && [ -f "$inc/nccl.h" ]; then
    nccl="-DNCCL_LIBRARY=$nccl_lib -DNCCL_INCLUDE_DIR=$inc"
    export LD_LIBRARY_PATH="$(dirname "$nccl_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "NCCL: $nccl_lib, header $inc/nccl.h" >"$LOGS/nccl.txt"
  else
    echo "NCCL: not found (library '$nccl_lib', header dir '$inc')" >"$LOGS/nccl.txt"
  fi
  cat "$LOGS/nccl.txt" >>"$LOGS/toolkit.txt"
fi
gen=""
command -v ninja >/dev/null && gen="-G Ninja"
have_nccl=0
if [ "${GPU_CHECK_PREBUILT:-0}" = 1 ]; then
  # A second call on a machine still warm from the first, whose build outputs are kept: no configure, no build.
  [ -x "$BUILD_DIR/tests/test_gpu" ] && tests=ON || tests=OFF
  [ -x "$BUILD_DIR/tests/test_nccl" ] || "$BUILD_DIR/src/ccoll_info" 2>/dev/null | grep -q "nccl yes" && have_nccl=1
  echo "GPU_CHECK_PREBUILT=1: the binaries of $BUILD_DIR as they are" >"$LOGS/configure.log"
else
  step 120 cmake -S . -B "$BUILD_DIR" $gen -DCMAKE_BUILD_TYPE=Release -DCCOLL_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCCOLL_BUILD_TESTS=$tests -DCCOLL_BUILD_EXAMPLES=OFF $prefix $nccl \
    >"$LOGS/configure.log" 2>&1 \
    || { tail -30 "$LOGS/configure.log"; exit 1; }
  targets="ccoll_info gpu_probe gpu_codec_bench allreduce_perf"
  targets="$targets reduce_perf broadcast_perf reducescatter_perf allgather_perf sendrecv_perf alltoall_perf"
  grep -q "NCCL=ON" "$LOGS/configure.log" && have_nccl=1
  [ "$tests" = ON ] && targets="$targets test_gpu test_gpu_collectives"
  [ "$tests" = ON ] && [ $have_nccl = 1 ] && targets="$targets test_nccl"
  step 360 cmake --build "$BUILD_DIR" --target $targets -j "$(nproc)" >"$LOGS/build.log" 2>&1 \
    || { tail -40 "$LOGS/build.log"; exit 1; }
fi
mark "configure + build"
# Which CUDA runtime, cuBLAS and NCCL each binary loads (LD_LIBRARY_PATH above can put a wheel's first), and the
# environment the device steps run in: the first run failed every device call for a reason never seen.
{
  for b in perf/gpu_probe src/libccoll.so tests/test_gpu; do
    [ -e "$BUILD_DIR/$b" ] || continue
    echo "== $b"
    ldd "$BUILD_DIR/$b" 2>&1 | grep -E 'cuda|cublas|nccl|not found'
  done
  echo "== environment"
  env | grep -E '^(LD_LIBRARY_PATH|LD_PRELOAD|CUDA_|NVIDIA_|NCCL_|CC_)' | sort
} >"$LOGS/loader.txt" 2>&1

# First the probe: which step of device work fails, if one does (perf/gpu_probe.cc). After a failure, again under
# compute-sanitizer's memcheck, which names a kernel's bad access. When it fails before the all-reduces, the steps
# that need the whole device path (the collectives' tests, Python, allreduce_perf, NCCL) are left out; the kernels'
# tests, the benchmark and memcheck still run.
device_path=1
step 60 "$BUILD_DIR/perf/gpu_probe" -t 20 >"$LOGS/probe.log" 2>&1
probe=$?
head -c 4000 "$LOGS/probe.log"  # now, while the output is short (and again at the very end of the summary)
echo
if [ $probe -ne 0 ]; then
  status=1
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  [ -n "$cs" ] && step 90 "$cs" --tool memcheck "$BUILD_DIR/perf/gpu_probe" -t 60 >"$LOGS/probe_memcheck.log" 2>&1
  # Whether ccoll's memory pools are the cause: the probe again with scratch from cudaMalloc and cudaHostAlloc.
  step 60 env CC_MEMORY_POOLS=0 "$BUILD_DIR/perf/gpu_probe" -t 20 >"$LOGS/probe_nopools.log" 2>&1
  echo "gpu_probe with CC_MEMORY_POOLS=0: exit $?, $(grep -c '^ok' "$LOGS/probe_nopools.log") steps ok" |
    tee -a "$LOGS/loading.txt"
  # Judged by the last step that must pass, not by failure lines: a probe that crashed or ran out of time prints none.
  # Past the pools, a failure or a hang is in the all-reduces, and smoke (which tells the hangs apart) still runs.
  if ! grep -q '^ok .*scratch from the pools' "$LOGS/probe.log"; then
    for p in smoke python perf nccl; do
      PARTS=${PARTS// $p / }
    done
    device_path=0
    echo "the probe did not pass its steps up to the pools (exit $probe): parts left: $PARTS (of the tests," \
      "test_gpu's)" | tee -a "$LOGS/loading.txt"
  fi
fi
mark probe

# gpu_cases NAME LIMIT [VAR=VALUE...] BINARY [SPEC]: every test case of BINARY (matching SPEC) in a process of its
# own, at most LIMIT seconds each (twice that for a case that hangs and runs again), and the cases after it still
# run. A spec or name that matches no case fails (-w NoTests), as does a binary that lists none. The output
# goes to $LOGS/NAME.log; the count to results.txt; each failing case, with the start of its first failure, to
# failures.txt. A case that hangs runs once more with CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32, and
# whether that passes is noted (the two known causes of a hang: see the top).
gpu_cases() {
  local name=$1 limit=$2
  shift 2
  local envs=()
  while [[ "$1" == *=* ]]; do
    envs+=("$1")
    shift
  done
  local bin=$1 spec=${2:-} passed=0 failed=0 listed=0 c esc rc cut=""
  : >"$LOGS/$name.log"
  while IFS= read -r c; do
    [ -n "$c" ] || continue
    # Catch2 v2's test spec: '[', ']' and ',' of a name are escaped with a backslash.
    esc=$(printf '%s' "$c" | sed -e 's/\\/\\\\/g' -e 's/\[/\\[/g' -e 's/\]/\\]/g' -e 's/,/\\,/g')
    listed=$((listed + 1))
    step "$limit" env "${envs[@]}" "$bin" -w NoTests "$esc" >"$LOGS/case.log" 2>&1
    rc=$?
    cat "$LOGS/case.log" >>"$LOGS/$name.log"
    if [ $rc -eq 0 ]; then
      passed=$((passed + 1))
      continue
    fi
    if [ $rc -eq 125 ]; then
      cut=" (the budget ran out: not run from '$c' on)"
      break
    fi
    failed=$((failed + 1))
    status=1
    {
      echo "== $name: $c: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')"
      if grep -q "FAILED:" "$LOGS/case.log"; then
        grep -m1 -A14 "FAILED:" "$LOGS/case.log" | head -c 1200
      else
        tail -12 "$LOGS/case.log" | head -c 1200
      fi
      echo
    } >>"$LOGS/failures.txt"
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      step "$limit" env "${envs[@]}" CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32 "$bin" -w NoTests "$esc" \
        >>"$LOGS/${name}_eager.log" 2>&1
      echo "   again with CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32: exit $?" >>"$LOGS/failures.txt"
    fi
  done < <(timeout 30 "$bin" --list-test-names-only ${spec:+"$spec"} 2>"$LOGS/list.log" </dev/null)
  if [ $listed -eq 0 ]; then
    failed=1
    status=1
    { echo "== $name: no test case listed"; head -c 1200 "$LOGS/list.log"; echo; } >>"$LOGS/failures.txt"
  fi
  echo "$name: $passed passed, $failed failed (a process per case, $limit s at most each)$cut" \
    | tee -a "$LOGS/results.txt"
}
# First a short device call of every kind on 4 thread ranks (exact, a codec, PowerSGD): if one hangs, it costs 45 s,
# not a test binary's limit, and when it then passes with eager module loading, everything after runs so (the summary
# says it), so that the rest is still measured.
smoke_ok=1
part smoke || smoke_ok=2
for z in none quant:bits=4,mode=requant powersgd:rank=2; do
  part smoke || break
  step 45 "$BUILD_DIR/perf/allreduce_perf" -t 4 -G 1 -b 1M -e 1M -n 2 -w 1 -o avg -z "$z" >"$LOGS/smoke_run.log" 2>&1
  rc=$?
  cat "$LOGS/smoke_run.log" >>"$LOGS/smoke.log"
  [ $rc -eq 0 ] && continue
  smoke_ok=0
  status=1
  { echo "== smoke $z: exit $rc"; tail -8 "$LOGS/smoke_run.log" | head -c 1200; echo; } >>"$LOGS/failures.txt"
  echo "smoke $z: exit $rc" | tee -a "$LOGS/loading.txt"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    # Two known ways to hang, told apart by what makes the call pass: a lazy kernel load that synchronizes the
    # context while a stream waits, or ccoll's own streams sharing a hardware queue (CUDA_DEVICE_MAX_CONNECTIONS,
    # default 8) with a waiting stream, behind the commands that follow its wait.
    fixed=""
    for fix in CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER \
               "CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32"; do
      step 45 env $fix "$BUILD_DIR/perf/allreduce_perf" -t 4 -G 1 -b 1M -e 1M -n 2 -w 1 -o avg -z "$z" \
        >>"$LOGS/smoke_rerun.log" 2>&1
      rc=$?
      if [ $rc -eq 0 ]; then
        fixed=$fix
        break
      fi
      echo "smoke $z with $fix: exit $rc" | tee -a "$LOGS/loading.txt"
    done
    if [ -n "$fixed" ]; then
      echo "smoke $z passes with $fixed: the rest runs with it" | tee -a "$LOGS/loading.txt"
      export $fixed
    else
      echo "smoke $z hangs with either fix: the other device smoke calls are skipped" | tee -a "$LOGS/loading.txt"
      break
    fi
  fi
done
[ $smoke_ok -eq 1 ] && echo "smoke: exact, quant, powersgd device calls on 4 thread ranks passed" >>"$LOGS/loading.txt"
mark smoke
if [ "$tests" = ON ] && part tests; then
  gpu_cases test_gpu 60 "$BUILD_DIR/tests/test_gpu"
  if [ $device_path = 1 ]; then
    gpu_cases test_gpu_collectives 60 "$BUILD_DIR/tests/test_gpu_collectives"
    gpu_cases test_gpu_collectives_staged 60 CC_DEVICE_KERNELS=0 "$BUILD_DIR/tests/test_gpu_collectives" \
      "[codec],[exact]"
  fi
  # ccoll's scratch without memory pools (from cudaMalloc and cudaHostAlloc, kept for reuse, the first call of each
  # shape waiting on the host), as on a device that has none.
  gpu_cases test_gpu_nopools 60 CC_MEMORY_POOLS=0 "$BUILD_DIR/tests/test_gpu" "[scratch],*a device is prepared*"
  [ $device_path = 1 ] && gpu_cases test_gpu_collectives_nopools 60 CC_MEMORY_POOLS=0 \
    "$BUILD_DIR/tests/test_gpu_collectives" \
    "*device codecs run on the device buffers*,*returns once queued*,*a shape's first device call returns once*,\
*allocate nothing after the first call*"
  mark tests
fi
# CUDA tensors through the Python binding (that machine's PyTorch has CUDA); 77 means skipped.
lib=$(cd "$BUILD_DIR" && pwd)/src/libccoll.so
py="not run"
if part python; then
  (cd tests/python && step 120 env CCOLL_LIBRARY="$lib" PYTHONPATH="$OLDPWD/python" python3 test_cuda.py -v) \
    >"$LOGS/test_cuda_py.log" 2>&1
  py=$?
  if [ $py -ne 0 ] && [ $py -ne 77 ]; then
    status=1
    { echo "== python test_cuda.py: exit $py"; tail -15 "$LOGS/test_cuda_py.log" | head -c 1500; echo; } \
      >>"$LOGS/failures.txt"
  fi
  tail -3 "$LOGS/test_cuda_py.log"
  mark python
fi
"$BUILD_DIR/src/ccoll_info" >"$LOGS/features.txt" 2>&1
cat "$LOGS/features.txt"
: >"$LOGS/bench.md"
if part bench; then
  step 180 "$BUILD_DIR/perf/gpu_codec_bench" -n $((64 << 20)) -r 20 >"$LOGS/bench.md" 2>&1 || status=1
  mark bench
fi
# Device buffers through the whole perf path (checked against fp64, ranks identical), one line per codec at 64 MiB.
: >"$LOGS/device_allreduce.txt"
for z in none cast16 quant:bits=4,mode=requant quant:bits=2,mode=requant quant:bits=8,mode=homomorphic \
         quant:bits=4,mode=homomorphic topk:density=0.1 randk:density=0.1 powersgd:rank=4; do
  part perf || break
  name=$(echo "$z" | tr ':,=' '___')
  if [ "${z%%:*}" = powersgd ] && ! grep -q "cublas yes" "$LOGS/features.txt"; then
    echo "$z: skipped (this build has no cuBLAS)" >>"$LOGS/device_allreduce.txt"
    continue
  fi
  d=float
  [ "$z" = none ] && d="float bfloat16"
  for t in $d; do
    log="$LOGS/allreduce_G_${name}_$t.log"
    step 90 "$BUILD_DIR/perf/allreduce_perf" -t 4 -G 1 -b 1M -e 64M -f 8 -n 5 -w 2 -d "$t" -o avg -z "$z" \
      >"$log" 2>&1 || status=1
    echo "$z $t: $(grep -E '^ +67108864 ' "$log" || tail -1 "$log")" >>"$LOGS/device_allreduce.txt"
  done
  if [ "${z%%:*}" = powersgd ] && ! grep -q "cpu blas yes" "$LOGS/features.txt"; then
    echo "$z float, staged: skipped (no CPU BLAS on this machine)" >>"$LOGS/device_allreduce.txt"
  else
    t=float
    [ "$z" = none ] && t=bfloat16  # the baseline the codecs are judged against
    log="$LOGS/allreduce_G_${name}_staged.log"
    step 90 env CC_DEVICE_KERNELS=0 "$BUILD_DIR/perf/allreduce_perf" -t 4 -G 1 -b 64M -e 64M -n 5 -w 2 -d $t -o avg \
      -z "$z" >"$log" 2>&1 || status=1
    echo "$z $t, staged (CC_DEVICE_KERNELS=0): $(grep -E '^ +67108864 ' "$log" || tail -1 "$log")" \
      >>"$LOGS/device_allreduce.txt"
  fi
done
# The exact collectives on device buffers (4 thread ranks on the GPU: device copies between the ranks' buffers and the
# reduction kernels), each checked as its program checks it, one line each at 64 MiB.
: >"$LOGS/device_collectives.txt"
for c in reduce broadcast reducescatter allgather sendrecv alltoall; do
  part perf || break
  log="$LOGS/${c}_G.log"
  step 60 "$BUILD_DIR/perf/${c}_perf" -t 4 -G 1 -b 1M -e 64M -f 8 -n 5 -w 2 -d float >"$log" 2>&1 || status=1
  echo "$c: $(grep -E '^ +67108864 ' "$log" || tail -1 "$log")" >>"$LOGS/device_collectives.txt"
done
part perf && mark perf

# The NCCL transport: 4 processes on the one GPU, each its own NCCL "host" (NCCL_HOSTID), connected by NCCL's socket
# transport over loopback.
: >"$LOGS/nccl_allreduce.txt"
if [ $have_nccl = 1 ] && part nccl; then
  [ "$tests" = ON ] && gpu_cases test_nccl 60 NCCL_SOCKET_IFNAME=lo "$BUILD_DIR/tests/test_nccl"
  for z in none quant:bits=4,mode=requant topk:density=0.1 powersgd:rank=4; do
    d=float
    [ "$z" = none ] && d="float bfloat16"
    for t in $d; do
      log="$LOGS/nccl_allreduce_$(echo "$z" | tr ':,=' '___')_$t.log"
      step 45 env CC_TRANSPORT=nccl NCCL_SOCKET_IFNAME=lo perf/launch_local.sh -n 4 sh -c \
        'NCCL_HOSTID=ccoll-rank-$CC_RANK exec "$0" "$@"' "$BUILD_DIR/perf/allreduce_perf" -G 1 -b 1M -e 16M -f 4 \
        -n 5 -w 2 -d "$t" -o avg -z "$z" >"$log" 2>&1 || status=1
      pkill -9 -f -- "$BUILD_DIR/perf/allreduce_perf" 2>/dev/null  # ranks a timeout left behind
      echo "$z $t: $(grep -E '^ +16777216 ' "$log" || tail -1 "$log")" >>"$LOGS/nccl_allreduce.txt"
    done
  done
  mark nccl
fi
# Out-of-bounds and misaligned accesses in the kernels: compute-sanitizer's memcheck over test_gpu's kernel cases
# (each kernel against the CPU driver; the collectives' cases are left out, memcheck makes them too slow), the two
# largest sweeps (requant, homomorphic lanes) at every 29th of their configurations, starting at an offset drawn per
# run (printed in the summary; GPU_CHECK_SWEEP_OFFSET repeats one), so that runs sample different configurations.
san="not run"
sweep_offset=${GPU_CHECK_SWEEP_OFFSET:-$((RANDOM % 29))}
if [ "$tests" = ON ] && part sanitize; then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -n "$cs" ]; then
    step 120 env CCTEST_SWEEP_STRIDE=29 CCTEST_SWEEP_OFFSET="$sweep_offset" "$cs" --tool memcheck --error-exitcode 3 "$BUILD_DIR/tests/test_gpu" \
      "*rotation*,*requant*,*exact reductions*,*16-bit cast*,*homomorphic*,*sparsifier*,*the chunk choice*,*PowerSGD*" \
      >"$LOGS/memcheck.log" 2>&1
    san=$?
    [ "$san" -ne 0 ] && status=1
    mark sanitize
  else
    san="compute-sanitizer not found"
  fi
fi

echo
echo "== summary"
cat "$LOGS/gpu.txt"
cat "$LOGS/loading.txt"
echo "parts run: $PARTS"
cat "$LOGS/times.txt" 2>/dev/null | tr '\n' ';'
echo
cat "$LOGS/toolkit.txt" 2>/dev/null
if [ "$tests" = ON ]; then
  cat "$LOGS/results.txt" 2>/dev/null
  echo "python test_cuda.py: exit $py ($(tail -1 "$LOGS/test_cuda_py.log" 2>/dev/null))"
  echo "compute-sanitizer memcheck, test_gpu's kernel cases (two sweeps at every 29th configuration from" \
    "$sweep_offset): exit $san" \
    "($(grep -E 'ERROR SUMMARY' "$LOGS/memcheck.log" 2>/dev/null | tail -1))"
else
  echo "tests: not built (no Catch2 in .deps/)"
fi
if [ -s "$LOGS/failures.txt" ]; then
  echo "== failures (the first 3000 characters; all of them in failures.txt)"
  head -c 3000 "$LOGS/failures.txt"
  echo
fi
head -c 4000 "$LOGS/bench.md"
echo "== allreduce_perf -t 4 -G 1 at 64 MiB (size count type redop algo codec time_us algbw busbw wirebits error wrong)"
cut -c1-240 "$LOGS/device_allreduce.txt"
echo "== the exact collectives, -t 4 -G 1 float sum at 64 MiB (the same columns)"
cut -c1-240 "$LOGS/device_collectives.txt"
echo "== CC_TRANSPORT=nccl, 4 processes on one GPU (NCCL sockets over loopback, time-sliced): 16 MiB"
cut -c1-240 "$LOGS/nccl_allreduce.txt"
# The probe last: the reply keeps the end of the output. After a failure, what the loader chose first.
[ $probe -ne 0 ] && head -c 1500 "$LOGS/loader.txt"
echo "== gpu_probe (exit $probe)"
head -c 3000 "$LOGS/probe.log"
if [ $probe -ne 0 ]; then
  grep -m4 -A4 -E "Invalid|ERROR|Program hit" "$LOGS/probe_memcheck.log" 2>/dev/null | head -c 1000
fi
exit $status
