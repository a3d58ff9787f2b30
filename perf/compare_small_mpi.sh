#!/usr/bin/env bash
# compare_small_mpi.sh: small collectives on two builds of libccoll, side by side in one run, over MPI processes on
# this machine's shared memory (UCX), to tell a change in the code from the machine's noise. NEW's perf binaries run
# every row; OLD's library is swapped in at run time (LD_LIBRARY_PATH), so only the library differs. Rounds alternate
# which build runs first; the table gives each build's median time per call over the rounds, the fastest and slowest
# round, and the ratio.
#
#   perf/compare_small_mpi.sh OLD_BUILD_DIR NEW_BUILD_DIR
#
# OLD_BUILD_DIR needs only its library, src/libccoll.so.0 (`cmake --build <dir> --target ccoll`; to build an older
# commit: `git worktree add /tmp/old <commit>` and configure /tmp/old/build as NEW is). With more processes than cores
# each launch is pinned (--bind-to core:overload-allowed --map-by core): unpinned, the kernel's placement of the
# processes differs from launch to launch, and with it the time of a small call, by up to 2x between two launches of
# one binary (perf/results/call_check_room_2026-12-07.md).
#
# Environment: NP [4] BINS ["allreduce_perf_mpi"] (any of NEW's perf/*_perf_mpi) MINB [8] MAXB [64K] FACTOR [4]
#   ITERS [200] WARMUP [50] ROUNDS [8] MPIRUN_ARGS (more mpirun arguments, e.g. "-x CC_CHECK_INLINE_BYTES=0")
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=SCRIPTDIR/lib_swap.sh
source "$here/lib_swap.sh"

if [ $# -ne 2 ]; then
  awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0" >&2
  exit 2
fi
old_lib="$(cd "$1" && pwd)/src" new="$(cd "$2" && pwd)"
[ -e "$old_lib/libccoll.so.0" ] || { echo "compare_small_mpi.sh: no $old_lib/libccoll.so.0" >&2; exit 2; }
NP="${NP:-4}" BINS="${BINS:-allreduce_perf_mpi}" MINB="${MINB:-8}" MAXB="${MAXB:-64K}" FACTOR="${FACTOR:-4}"
ITERS="${ITERS:-200}" WARMUP="${WARMUP:-50}" ROUNDS="${ROUNDS:-8}" MPIRUN_ARGS="${MPIRUN_ARGS:-}"
cores=$(nproc)
pin=()
pinned=""
if ((NP > cores)); then
  pin=(--bind-to core:overload-allowed --map-by core)
  pinned=" (pinned)"
fi
# OLD's library ahead of the caller's path, not instead of it (UCX, MPI or CUDA may be found through it).
old_path="$old_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# compare_small_mpi.sh: $NP processes on $cores cores$pinned, $ROUNDS rounds, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# OLD library: $old_lib ($(lib_swap_describe "$old_lib/..")); NEW: $new ($(lib_swap_describe "$new"))"
for bin in $BINS; do
  [ -x "$new/perf/$bin" ] || { echo "compare_small_mpi.sh: no $new/perf/$bin" >&2; exit 2; }
  lib_swap_check compare_small_mpi.sh "$new" "$old_path" "${LD_LIBRARY_PATH:-}" "$bin" || exit 1
  for ((i = 0; i < ROUNDS; i++)); do
    order=(old new)
    ((i % 2 == 1)) && order=(new old)
    for v in "${order[@]}"; do
      env_args=()
      [ "$v" = old ] && env_args=(-x "LD_LIBRARY_PATH=$old_path")
      # shellcheck disable=SC2086
      mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader ${pin[@]+"${pin[@]}"} \
        ${env_args[@]+"${env_args[@]}"} \
        $MPIRUN_ARGS -np "$NP" "$new/perf/$bin" -b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" \
        > "$tmp/$bin.$v.$i.txt" 2>&1 || { cat "$tmp/$bin.$v.$i.txt" >&2; exit 1; }
    done
  done
  python3 "$here/perf_rows.py" old_new "$tmp/$bin.old.*.txt" "$tmp/$bin.new.*.txt" "$ROUNDS" "$bin"
done
