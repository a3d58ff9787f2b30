#!/usr/bin/env bash
# alltoall_vs_mpi.sh: ccoll's all-to-all (alltoall_perf_mpi: one process per rank, ccoll's data over UCX) against
# OpenMPI's MPI_Alltoall (mpi_alltoall_perf), side by side in one run on this machine; prints a markdown table.
# Builds nothing: point it at a configured and built build directory.
#
#   perf/alltoall_vs_mpi.sh [BUILD_DIR]        (default: build/ at the repository root)
#
# Both programs share the harness (the same sizes, inputs, timing and byte-for-byte check). The runs alternate, in
# ROUNDS rounds whose order rotates, and the table shows the median time per call over the rounds, busbw from it,
# and the ratio MPI time / ccoll time (above 1: ccoll is faster).
#
# Warm-up: UCX's shared memory takes tens of calls to reach its steady speed for a new size of eager messages (its
# pools grow), OpenMPI's about 20; so every size gets WARMUP untimed calls first (the programs' -w, default 100).
#
# Environment (defaults in brackets):
#   NP [4] MINB [128K] MAXB [32M] FACTOR [4] ITERS [50] WARMUP [100] ROUNDS [3]
#   UCX_TLS [unset: UCX's own choice, on one host shared memory and cma]   ccoll's transports (MPI is its launcher
#                                              and side channel only); sysv,self leaves out cma, UCX's single copy
#   MPI_ARGS [--mca pml ob1 --mca btl self,vader]   both programs' mpirun arguments (MPI's data: vader)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${1:-$here/../build}  # (a relative BUILD_DIR is the caller's)
NP=${NP:-4} MINB=${MINB:-128K} MAXB=${MAXB:-32M} FACTOR=${FACTOR:-4} ITERS=${ITERS:-50} WARMUP=${WARMUP:-100}
ROUNDS=${ROUNDS:-3}
TLS_ARGS=()
if [ -n "${UCX_TLS:-}" ]; then
  export UCX_TLS
  TLS_ARGS=(-x UCX_TLS)
fi
read -r -a MPI_ARGS <<< "${MPI_ARGS:---mca pml ob1 --mca btl self,vader}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for p in alltoall_perf_mpi mpi_alltoall_perf; do
  if [ ! -x "$BUILD/perf/$p" ]; then
    echo "alltoall_vs_mpi.sh: $BUILD/perf/$p is missing (a build with MPI and UCX)" >&2
    exit 2
  fi
done
OUT=$(mktemp -d)
ARGS=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP")
echo "# $NP processes, UCX_TLS=${UCX_TLS:-unset (UCX picks)} for ccoll, MPI: ${MPI_ARGS[*]};" \
  "-n $ITERS -w $WARMUP; $ROUNDS rounds; logs in $OUT"
for r in $(seq 1 "$ROUNDS"); do
  for k in 0 1; do
    which=$(( (r + k) % 2 ))
    echo "# round $r $([ $which = 0 ] && echo ccoll || echo mpi), load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [ "$which" = 0 ]; then
      mpirun "${MPI_ARGS[@]}" "${TLS_ARGS[@]}" -np "$NP" "$BUILD/perf/alltoall_perf_mpi" "${ARGS[@]}" \
        > "$OUT/ccoll_$r.txt" 2>&1 || { cat "$OUT/ccoll_$r.txt" >&2; exit 1; }
    else
      mpirun "${MPI_ARGS[@]}" -np "$NP" "$BUILD/perf/mpi_alltoall_perf" "${ARGS[@]}" \
        > "$OUT/mpi_$r.txt" 2>&1 || { cat "$OUT/mpi_$r.txt" >&2; exit 1; }
    fi
  done
done
python3 - "$OUT" "$ROUNDS" "$NP" <<'EOF'
import glob, statistics, sys
out, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rows(kind):
    times = {}
    for path in sorted(glob.glob(f"{out}/{kind}_*.txt")):
        for line in open(path):
            f = line.split()
            if len(f) >= 12 and f[0].isdigit() and not line.startswith("#"):
                if f[-1] != "0":
                    sys.exit(f"{path}: {f[0]} bytes: {f[-1]} wrong elements")
                times.setdefault(int(f[0]), []).append(float(f[6]))
    return times
cc, mp = rows("ccoll"), rows("mpi")
for kind, table in (("ccoll", cc), ("MPI", mp)):
    for size, times in table.items():
        if len(times) != rounds:
            sys.exit(f"{kind}: {len(times)} rows of {size} bytes in {rounds} rounds")
print("| size | ccoll time (us) | MPI_Alltoall time (us) | ccoll busbw (GB/s) | MPI busbw (GB/s) | MPI / ccoll time |")
print("|---:|---:|---:|---:|---:|---:|")
for size in sorted(cc):
    if size not in mp:
        sys.exit(f"no MPI row of {size} bytes")
    c, m = statistics.median(cc[size]), statistics.median(mp[size])
    bus = lambda t: size / t / 1e3 * (n - 1) / n
    spread = lambda v: f"{min(v):.1f}-{max(v):.1f}"
    print(f"| {size} | {c:.1f} ({spread(cc[size])}) | {m:.1f} ({spread(mp[size])}) | {bus(c):.2f} | {bus(m):.2f} "
          f"| {m / c:.2f} |")
EOF
