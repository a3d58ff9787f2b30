#!/usr/bin/env bash
# collectives_vs_mpi.sh: ccoll's collectives (X_perf_mpi: one process per rank, ccoll's data over UCX) against
# OpenMPI's (mpi_X_perf: MPI_Alltoall, MPI_Bcast, MPI_Reduce_scatter_block, MPI_Allgather, MPI_Allreduce,
# MPI_Reduce into rank 0), side by side in one run on this machine; prints a markdown table per collective. Builds
# nothing: point it at a configured and built build directory.
#
#   perf/collectives_vs_mpi.sh [BUILD_DIR]        (default: build/ at the repository root)
#   COLLS=alltoall perf/collectives_vs_mpi.sh      (one collective)
#
# Both programs of a pair share the harness (the same sizes, inputs, timing and check: byte for byte, or against the
# fp64 reference for the reductions). The runs alternate, in ROUNDS rounds whose order rotates, and the table
# shows the median time per call over the rounds, busbw from it, and the ratio MPI time / ccoll time (above 1: ccoll
# is faster). Sizes are nccl-tests': the whole buffer (a reduce-scatter's input, an all-gather's output).
#
# Warm-up: UCX's shared memory takes tens of calls to reach its steady speed for a new size of eager messages (its
# pools grow), OpenMPI's about 20; so every size gets WARMUP untimed calls first (the programs' -w, default 100).
#
# Placement: with more processes than cores, both programs' processes are pinned (--bind-to core:overload-allowed
# --map-by core: rank r on core r mod cores). Unpinned, the kernel places them afresh at each launch, and a small
# call's time then differs by up to 2x from one launch to the next (perf/results/call_check_room_2026-12-07.md).
#
# Environment (defaults in brackets):
#   COLLS [alltoall broadcast reducescatter allgather]   which collectives, in this order (also: allreduce, reduce)
#   NP [4] MINB [128K] MAXB [32M] FACTOR [4] ITERS [50] WARMUP [100] ROUNDS [3] DTYPE [float] OP [sum]
#   UCX_TLS [unset: UCX's own choice, on one host shared memory and cma]   ccoll's transports (MPI is its launcher
#                                              and side channel only); sysv,self leaves out cma, UCX's single copy
#   MPI_ARGS [--mca pml ob1 --mca btl self,vader]   both programs' mpirun arguments (MPI's data: vader)
#   PIN [1]   0: no pinning (see Placement)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$here/../build}  # (a relative BUILD_DIR is the caller's)
NP=${NP:-4} MINB=${MINB:-128K} MAXB=${MAXB:-32M} FACTOR=${FACTOR:-4} ITERS=${ITERS:-50} WARMUP=${WARMUP:-100}
ROUNDS=${ROUNDS:-3} COLLS=${COLLS:-alltoall broadcast reducescatter allgather} DTYPE=${DTYPE:-float} OP=${OP:-sum}
TLS_ARGS=()
if [ -n "${UCX_TLS:-}" ]; then
  export UCX_TLS
  TLS_ARGS=(-x UCX_TLS)
fi
read -r -a MPI_ARGS <<< "${MPI_ARGS:---mca pml ob1 --mca btl self,vader}"
if [ "${PIN:-1}" = 1 ] && ((NP > $(nproc))); then
  MPI_ARGS+=(--bind-to core:overload-allowed --map-by core)
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for c in $COLLS; do
  case "$c" in
    alltoall | broadcast | reducescatter | allgather | allreduce | reduce) ;;
    *) echo "collectives_vs_mpi.sh: COLLS: unknown collective '$c' (alltoall broadcast reducescatter allgather" \
         "allreduce reduce)" >&2
       exit 2 ;;
  esac
  for p in "${c}_perf_mpi" "mpi_${c}_perf"; do
    if [ ! -x "$BUILD/perf/$p" ]; then
      echo "collectives_vs_mpi.sh: $BUILD/perf/$p is missing (a build with MPI and UCX)" >&2
      exit 2
    fi
  done
done
OUT=$(mktemp -d)
ARGS=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -d "$DTYPE" -o "$OP")
echo "# $NP processes, UCX_TLS=${UCX_TLS:-unset (UCX picks)} for ccoll, MPI: ${MPI_ARGS[*]};" \
  "-n $ITERS -w $WARMUP -d $DTYPE; $ROUNDS rounds; $(nproc) cores; logs in $OUT"
for c in $COLLS; do
  for r in $(seq 1 "$ROUNDS"); do
    for k in 0 1; do
      which=$(( (r + k) % 2 ))
      echo "# $c round $r $([ $which = 0 ] && echo ccoll || echo mpi), load $(cut -d' ' -f1-3 /proc/loadavg)"
      if [ "$which" = 0 ]; then
        mpirun "${MPI_ARGS[@]}" "${TLS_ARGS[@]}" -np "$NP" "$BUILD/perf/${c}_perf_mpi" "${ARGS[@]}" \
          > "$OUT/${c}_ccoll_$r.txt" 2>&1 || { cat "$OUT/${c}_ccoll_$r.txt" >&2; exit 1; }
      else
        mpirun "${MPI_ARGS[@]}" -np "$NP" "$BUILD/perf/mpi_${c}_perf" "${ARGS[@]}" \
          > "$OUT/${c}_mpi_$r.txt" 2>&1 || { cat "$OUT/${c}_mpi_$r.txt" >&2; exit 1; }
      fi
    done
  done
done
# shellcheck disable=SC2086  # COLLS: one argument per collective
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python3 - "$OUT" "$ROUNDS" "$NP" $COLLS <<'EOF'
import statistics, sys
from perf_rows import times_us
out, rounds, n, colls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
CALLS = {"alltoall": "MPI_Alltoall", "broadcast": "MPI_Bcast", "reducescatter": "MPI_Reduce_scatter_block",
         "allgather": "MPI_Allgather", "allreduce": "MPI_Allreduce", "reduce": "MPI_Reduce"}
for coll in colls:
    cc = times_us(f"{out}/{coll}_ccoll_*.txt", rounds, f"{coll} ccoll")
    mp = times_us(f"{out}/{coll}_mpi_*.txt", rounds, f"{coll} MPI")
    factor, text = {"broadcast": (1.0, ""), "reduce": (1.0, ""), "allreduce": (2 * (n - 1) / n, " * 2(n-1)/n")}.get(
        coll, ((n - 1) / n, " * (n-1)/n"))
    print(f"\n{coll} (busbw = algbw{text})\n")
    print(f"| size | ccoll time (us) | {CALLS[coll]} time (us) | ccoll busbw (GB/s) | MPI busbw (GB/s) "
          "| MPI / ccoll time |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sorted(cc):
        if size not in mp:
            sys.exit(f"{coll}: no MPI row of {size} bytes")
        c, m = statistics.median(cc[size]), statistics.median(mp[size])
        bus = lambda t: size / t / 1e3 * factor
        spread = lambda v: f"{min(v):.1f}-{max(v):.1f}"
        print(f"| {size} | {c:.1f} ({spread(cc[size])}) | {m:.1f} ({spread(mp[size])}) | {bus(c):.2f} "
              f"| {bus(m):.2f} | {m / c:.2f} |")
EOF
