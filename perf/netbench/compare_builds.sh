#!/usr/bin/env bash
# compare_builds.sh: two builds of libccoll side by side on the bandwidth-shaped cluster of cluster.sh, to tell a
# change in the code from the machine's noise where the network matters. NEW's perf binaries run every row, one rank
# per namespace (nb_ranks); OLD's library is swapped in at run time (LD_LIBRARY_PATH), so only the library differs.
# Rounds alternate which build runs first; the table gives each build's median time per call over the rounds, the
# fastest and slowest round, and the ratio. (The same over processes on shared memory: perf/compare_small_mpi.sh;
# the codecs on thread ranks: perf/compare_builds.sh.)
#
#   perf/netbench/compare_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR      (root)
#
# OLD_BUILD_DIR needs only its library, src/libccoll.so.0 (`git worktree add /tmp/old <commit>`, configure
# /tmp/old/build as NEW is, `cmake --build /tmp/old/build --target ccoll`).
#
# Environment (defaults): NP [4] RATE [1gbit] BINS ["broadcast_perf reduce_perf"] (any of NEW's perf/*_perf)
#   MINB [256K] MAXB [16M] FACTOR [4] ITERS [5] WARMUP [1] ROUNDS [4] ARGS (more arguments for every binary, e.g.
#   "-d bfloat16"; not "-c 0": every row's result check must pass, perf_rows.py); the cluster's NB_BURST and NB_GSO
#   as in cluster.sh.
set -euo pipefail

if [ $# -ne 2 ]; then
  awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0" >&2
  exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=SCRIPTDIR/../lib_swap.sh
source "$here/../lib_swap.sh"
old="$(cd "$1" && pwd)" || exit 2
new="$(cd "$2" && pwd)" || exit 2
old_lib="$old/src"
[ -e "$old_lib/libccoll.so.0" ] || { echo "compare_builds.sh: no $old_lib/libccoll.so.0" >&2; exit 2; }
NP="${NP:-4}" RATE="${RATE:-1gbit}" BINS="${BINS:-broadcast_perf reduce_perf}" MINB="${MINB:-256K}"
MAXB="${MAXB:-16M}" FACTOR="${FACTOR:-4}" ITERS="${ITERS:-5}" WARMUP="${WARMUP:-1}" ROUNDS="${ROUNDS:-4}"
ARGS="${ARGS:-}"
old_path="$old_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
new_path="${LD_LIBRARY_PATH:-}"
for bin in $BINS; do
  [ -x "$new/perf/$bin" ] || { echo "compare_builds.sh: no $new/perf/$bin" >&2; exit 2; }
  lib_swap_check compare_builds.sh "$new" "$old_path" "$new_path" "$bin" || exit 1
done
# shellcheck source=SCRIPTDIR/cluster.sh
source "$here/cluster.sh"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
nb_up "$NP" "$RATE" || exit 1
# In the cluster's scratch folder, which nb_down (nb_up's trap: exit, Ctrl-C, TERM) deletes with the cluster.
tmp=$(mktemp -d "$NB_TMP/compare.XXXXXX")
for ((i = 0; i < ROUNDS; i++)); do
  order=(old new)
  ((i % 2 == 1)) && order=(new old)
  for v in "${order[@]}"; do
    path="$new_path"
    [ "$v" = old ] && path="$old_path"
    for bin in $BINS; do
      out="$tmp/$bin.$v.$i.txt"
      # shellcheck disable=SC2086  # ARGS: split into arguments
      LD_LIBRARY_PATH="$path" nb_ranks -n "$NP" -- "$new/perf/$bin" -b "$MINB" -e "$MAXB" -f "$FACTOR" \
        -n "$ITERS" -w "$WARMUP" $ARGS > "$out" 2>&1 || { cat "$out" >&2; exit 1; }
    done
  done
done
echo "# compare_builds.sh: $NP ranks on the cluster ($(nb_shaper)), $ROUNDS rounds, -n $ITERS -w $WARMUP $ARGS"
echo "# load $load_start at start, $(cut -d' ' -f1-3 /proc/loadavg) at end; $(nb_cpu)"
echo "# OLD library: $old_lib ($(lib_swap_describe "$old")); NEW: $new ($(lib_swap_describe "$new"))"
for bin in $BINS; do
  python3 "$here/../perf_rows.py" old_new "$tmp/$bin.old.*.txt" "$tmp/$bin.new.*.txt" "$ROUNDS" "$bin" ms
done
