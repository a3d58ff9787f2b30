#!/usr/bin/env bash
# collectives_bench.sh: ccoll's exact broadcast, reduce, reduce-scatter and all-gather against OpenMPI's (MPI_Bcast,
# MPI_Reduce, MPI_Reduce_scatter_block, MPI_Allgather) on the bandwidth-shaped cluster of cluster.sh, side by side in
# one run:
# NP ranks, one per namespace, float32 sum. ccoll's ranks use its own bootstrap and UCX's tcp (nb_ranks), OpenMPI's
# its tcp btl on the same links (nb_mpirun). Both programs of a pair share the harness (perf/bench.h: sizes, inputs,
# timing, checks), and a row whose check fails stops the run. Prints a markdown table: the median time per call over
# ROUNDS rounds (the order of ccoll and MPI alternates), the wire-bound time, and MPI time / ccoll time.
#
#   perf/netbench/collectives_bench.sh [BUILD_DIR]      (root; BUILD_DIR default build)
#
# Environment (defaults): RATE=1gbit NP=4 MINB=1M MAXB=64M FACTOR=8 ITERS=3 WARMUP=1 ROUNDS=2
#   COLLS="broadcast reducescatter allgather" (and reduce)
#   MPI_ARGS=""  extra mpirun arguments for OpenMPI's ranks (e.g. "--mca mpi_yield_when_idle 1": every namespace
#                looks like a node of its own to OpenMPI, which then busy-polls with NP ranks on this machine's cores)
# Wire-bound: the bytes that must enter the busiest rank at the link rate (RATE, in bits per second): the whole
# buffer for a broadcast (a non-root receives all of it) and a reduce (the root receives a whole buffer of partial
# sums; ccoll's chain and a tree alike), (n-1)/n of it for a reduce-scatter (the input) and an all-gather (the
# output).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
BUILD="$(cd "${1:-$here/../../build}" && pwd)"
RATE="${RATE:-1gbit}" NP="${NP:-4}" MINB="${MINB:-1M}" MAXB="${MAXB:-64M}" FACTOR="${FACTOR:-8}"
ITERS="${ITERS:-3}" WARMUP="${WARMUP:-1}" ROUNDS="${ROUNDS:-2}" COLLS="${COLLS:-broadcast reducescatter allgather}"
for c in $COLLS; do
  case "$c" in
    broadcast | reduce | reducescatter | allgather) ;;
    *) echo "collectives_bench.sh: COLLS: unknown collective '$c' (broadcast reduce reducescatter allgather)" >&2
       exit 2 ;;
  esac
  for p in "${c}_perf" "mpi_${c}_perf"; do
    [[ -x "$BUILD/perf/$p" ]] || { echo "collectives_bench.sh: $BUILD/perf/$p is missing" >&2; exit 2; }
  done
done
command -v mpirun >/dev/null || { echo "collectives_bench.sh: mpirun is missing" >&2; exit 2; }
case "$RATE" in
  *[gG]bit) rate_bps=$(( ${RATE%?bit} * 1000000000 )) ;;
  *[mM]bit) rate_bps=$(( ${RATE%?bit} * 1000000 )) ;;
  *) echo "collectives_bench.sh: RATE must be <n>gbit or <n>mbit (got $RATE)" >&2; exit 2 ;;
esac

raw="$(mktemp -d /tmp/ccoll_collectives_bench.XXXXXX)"
echo "collectives_bench.sh: logs in $raw" >&2
# shellcheck source=SCRIPTDIR/cluster.sh
source "$here/cluster.sh"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
nb_up "$NP" "$RATE" || exit 1
selfcheck="$(nb_selfcheck 3)" || selfcheck="?"
args=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -d float -o sum)
for ((round = 1; round <= ROUNDS; ++round)); do
  for c in $COLLS; do
    order="ccoll mpi"
    ((round % 2 == 0)) && order="mpi ccoll"
    for who in $order; do
      log="$raw/${c}_${who}_$round.txt"
      echo "collectives_bench.sh: round $round $c $who (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
      if [[ $who == ccoll ]]; then
        nb_ranks -n "$NP" -- "$BUILD/perf/${c}_perf" "${args[@]}" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
      else
        # shellcheck disable=SC2086  # MPI_ARGS: split into arguments
        nb_mpirun "$NP" ${MPI_ARGS:-} -- "$BUILD/perf/mpi_${c}_perf" "${args[@]}" >"$log" 2>&1 \
          || { cat "$log" >&2; exit 1; }
      fi
    done
  done
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
echo "# Exact collectives on the shaped cluster: $NP ranks, one per namespace, every link $(nb_shaper)" \
  "(self-check: host 0 -> host 1 $selfcheck Mbit/s), float32 sum, -n $ITERS -w $WARMUP, $ROUNDS rounds, median;" \
  "OpenMPI's mpirun arguments: ${MPI_ARGS:-none added}; $(nb_cpu); load $load_start at start, $load_end at end"
# shellcheck disable=SC2086  # COLLS: one argument per collective
PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" python3 - "$raw" "$ROUNDS" "$NP" "$rate_bps" $COLLS <<'EOF'
import statistics, sys
from perf_rows import times_us
raw, rounds, n, rate, colls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
def human(b):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift} {unit}"
    return f"{b} B"
CALLS = {"broadcast": "MPI_Bcast", "reduce": "MPI_Reduce", "reducescatter": "MPI_Reduce_scatter_block",
         "allgather": "MPI_Allgather"}
def times_ms(coll, who):
    us = times_us(f"{raw}/{coll}_{who}_*.txt", rounds, f"{coll} {who}")
    return {size: [t / 1e3 for t in ts] for size, ts in us.items()}
print()
print("| collective | size | ccoll (ms) | OpenMPI (ms) | wire-bound (ms) | wire-bound / ccoll | MPI / ccoll time |")
print("|---|---:|---:|---:|---:|---:|---:|")
for coll in colls:
    cc, mp = times_ms(coll, "ccoll"), times_ms(coll, "mpi")
    if set(cc) != set(mp):
        sys.exit(f"{coll}: the two programs ran different sizes ({sorted(cc)} and {sorted(mp)})")
    share = 1.0 if coll in ("broadcast", "reduce") else (n - 1) / n
    for size in sorted(cc):
        c, m = statistics.median(cc[size]), statistics.median(mp[size])
        wire = size * share * 8 / rate * 1e3
        spread = lambda v: f"{min(v):.1f}-{max(v):.1f}"
        print(f"| {coll} ({CALLS[coll]}) | {human(size)} | {c:.1f} ({spread(cc[size])}) | {m:.1f} "
              f"({spread(mp[size])}) | {wire:.1f} | {wire / c * 100:.0f}% | {m / c:.2f} |")
EOF
