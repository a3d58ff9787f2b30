#!/usr/bin/env bash
# allreduce_bench.sh: side-by-side all-reduce on a bandwidth-shaped cluster (cluster.sh), one run: ccoll exact
# float32, ccoll exact bfloat16 (the baseline), every compressor, and OpenMPI's MPI_Allreduce float32, 4 ranks on 4
# namespaces, float32 gradients of 1 MiB..256 MiB. Writes results/<date>.md (table), .json (rows) and .png (speedup
# vs size per codec; perf/netbench/plot.py) and prints the table last.
#
#   perf/netbench/allreduce_bench.sh [BUILD_DIR]          (root; BUILD_DIR default build, a Release build)
#
# Environment (defaults):
#   RATE=1gbit  NP=4  MINB=1M  MAXB=256M  FACTOR=4  ITERS=5  WARMUP=1  CHECK=1  DIST=iid  ALGO=auto
#   ROUNDS=1: run every row this many times, in a rotated order each round; the report takes the median time (the
#             machine is shared: its load changes during a run)
#   CODECS="f32 bf16 cast16 q2r q4r q8r q2h q4h q8h topk randk powersgd mpi mpiring"  (a subset: only those rows;
#            also q4r_b16 q8r_b16 randk_b16 topk_b16 powersgd_b16: those codecs on bfloat16 gradients)
#   OUT=perf/netbench/results  TAG=<UTC date and time>  CCOLL_ENV="" (extra VAR=value for the ccoll ranks;
#            OPENBLAS_NUM_THREADS=1 is added unless it names it)
#   CPU_ONLY=1 (the default; 0 leaves it out): afterwards run every ccoll row again as NP threads of one process (local transport, no network,
#               -c 0): the CPU-only time column, which says whether a row is bound by the wire or by the cores
#
# Rows and what "size" means: size is the float32 gradient (size/4 elements). Every ccoll row but bf16 and *_b16
# all-reduces those float32 elements (-d float, with -z SPEC for a codec). The bf16 baseline all-reduces the same
# number of elements as bfloat16 (-d bfloat16 at size/2 bytes): what a framework that keeps bf16 gradients sends; the
# *_b16 rows do the same through their codec. algbw is size / time for every row, so "speedup vs bf16" = bf16 time /
# row time at the same element count.
# powersgd runs only when the binary accepts -z powersgd:rank=4 (checked first on 2 thread ranks).
# MPI: mpi_allreduce_perf under mpirun, one rank per namespace, --mca pml ob1 --mca btl self,tcp on eth0; mpi as
# OpenMPI comes, mpiring tuned (ring all-reduce, yield when idle; see below).
# A row that fails is reported as failed; the others still run. Exit status 1 if any row failed or a check failed.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="$(cd "${1:-$repo/build}" 2>/dev/null && pwd)" || { echo "allreduce_bench.sh: no build dir ${1:-$repo/build}" >&2; exit 2; }
RATE="${RATE:-1gbit}" NP="${NP:-4}" MINB="${MINB:-1M}" MAXB="${MAXB:-256M}" FACTOR="${FACTOR:-4}"
ITERS="${ITERS:-5}" ROUNDS="${ROUNDS:-1}" WARMUP="${WARMUP:-1}" CHECK="${CHECK:-1}" DIST="${DIST:-iid}" ALGO="${ALGO:-auto}"
CODECS="${CODECS:-f32 bf16 cast16 q2r q4r q8r q2h q4h q8h topk randk powersgd mpi mpiring}"
CPU_ONLY="${CPU_ONLY:-1}" OUT="${OUT:-$here/results}" TAG="${TAG:-$(date -u +%Y-%m-%d_%H%M)}" CCOLL_ENV="${CCOLL_ENV:-}"
PY=/usr/bin/python3

perf_bin="$build/perf/allreduce_perf"
mpi_bin="$build/perf/mpi_allreduce_perf"
[[ -x "$perf_bin" ]] || { echo "allreduce_bench.sh: $perf_bin not found; build first" >&2; exit 2; }
[[ -x "$PY" ]] || { echo "allreduce_bench.sh: $PY not found" >&2; exit 2; }

# Row name -> label and allreduce_perf arguments.
declare -A label spec
label[f32]="ccoll f32";              spec[f32]="-d float"
label[bf16]="ccoll bf16 (baseline)"; spec[bf16]="-d bfloat16"
label[cast16]="cast16";              spec[cast16]="-d float -z cast16"
for b in 2 4 8; do
  label[q${b}r]="quant ${b}b requant";     spec[q${b}r]="-d float -z quant:bits=$b,mode=requant"
  label[q${b}h]="quant ${b}b homomorphic"; spec[q${b}h]="-d float -z quant:bits=$b,mode=homomorphic"
done
label[topk]="topk";                  spec[topk]="-d float -z topk"
label[randk]="randk";                spec[randk]="-d float -z randk"
label[powersgd]="powersgd rank 4";   spec[powersgd]="-d float -z powersgd:rank=4"
# The same codecs on bfloat16 gradients (the float32 codecs' bytes on widened values, rounded back): what a framework
# that keeps bf16 gradients sends instead of the bf16 baseline.
label[q4r_b16]="quant 4b requant, bf16 data"; spec[q4r_b16]="-d bfloat16 -z quant:bits=4,mode=requant"
label[q8r_b16]="quant 8b requant, bf16 data"; spec[q8r_b16]="-d bfloat16 -z quant:bits=8,mode=requant"
label[randk_b16]="randk, bf16 data";          spec[randk_b16]="-d bfloat16 -z randk"
label[topk_b16]="topk, bf16 data";            spec[topk_b16]="-d bfloat16 -z topk"
label[powersgd_b16]="powersgd rank 4, bf16 data"; spec[powersgd_b16]="-d bfloat16 -z powersgd:rank=4"
# OpenMPI rows: spec holds mpirun arguments. mpi = OpenMPI as it comes (the issue's reference: 64 MiB in ~2.3 s).
# mpiring = tuned for this machine: its ring all-reduce (algorithm 4), and yield_when_idle, because each namespace
# looks like its own node to OpenMPI, so it busy-polls with 4 ranks on 2 cores (1 MiB: ~150 ms -> ~14 ms).
label[mpi]="OpenMPI f32";            spec[mpi]=""
label[mpiring]="OpenMPI f32 tuned";  spec[mpiring]="--mca mpi_yield_when_idle 1 --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4"

mkdir -p "$OUT"
raw="$(mktemp -d /tmp/ccoll_netbench_raw.XXXXXX)"
echo "allreduce_bench.sh: logs and raw JSON in $raw" >&2

rows=()
for r in $CODECS; do
  [[ -n "${label[$r]+x}" ]] || { echo "allreduce_bench.sh: unknown row '$r'" >&2; exit 2; }
  rows+=("$r")
done
skipped=()
if [[ " ${rows[*]} " == *" powersgd"* ]]; then  # powersgd or powersgd_b16
  if ! "$perf_bin" -t 2 -b 64K -e 64K -n 1 -w 0 -c 0 -d float -z powersgd:rank=4 >"$raw/powersgd_probe.log" 2>&1; then
    echo "allreduce_bench.sh: -z powersgd:rank=4 not accepted by this build: row skipped ($(grep -m1 -iE 'error|invalid|fail' "$raw/powersgd_probe.log"))" >&2
    skipped+=("powersgd: not accepted by this build ($(grep -m1 -iE 'error|invalid|fail' "$raw/powersgd_probe.log" | cut -c1-150))")
    kept=()
    for r in "${rows[@]}"; do [[ "$r" == powersgd* ]] || kept+=("$r"); done  # each powersgd row, whole names only
    rows=("${kept[@]}")
  fi
fi
if [[ ! -x "$mpi_bin" ]] || ! command -v mpirun >/dev/null; then
  for i in "${!rows[@]}"; do
    if [[ "${rows[$i]}" == mpi* ]]; then skipped+=("${rows[$i]}: $mpi_bin or mpirun missing"); unset "rows[$i]"; fi
  done
fi

# shellcheck source=SCRIPTDIR/cluster.sh
source "$here/cluster.sh"
exec 3>&2
export NB_MSG_FD=3  # cluster.sh's interrupt message reaches this terminal even while a row's output goes to its log
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2009
busy() { ps -eo comm= | grep -cxE 'cc1plus|cicc|ptxas|nvcc|ld|ninja|ctest|make' || true; }  # other people's builds
busy_start="$(busy)"
start_time="$(date -u +%FT%TZ)"
t_start=$SECONDS
nb_up "$NP" "$RATE" || exit 1
selfcheck="$(nb_selfcheck 3)" || selfcheck="?"

minb="$(size_bytes "$MINB")" || { echo "allreduce_bench.sh: MINB must be a size like 1M, not '$MINB'" >&2; exit 2; }
maxb="$(size_bytes "$MAXB")" || { echo "allreduce_bench.sh: MAXB must be a size like 256M, not '$MAXB'" >&2; exit 2; }
failed=()
# The ranks share this machine's cores: PowerSGD's GEMMs get one OpenBLAS thread per rank (as perf/tta sets
# OMP_NUM_THREADS=1), unless CCOLL_ENV says otherwise; OpenBLAS's default of one thread per core made 4 ranks run 8
# spinning BLAS threads on 2 cores (powersgd at 64 MiB: 185 ms instead of 149-157 ms).
[[ " $CCOLL_ENV" == *" OPENBLAS_NUM_THREADS="* ]] || CCOLL_ENV="OPENBLAS_NUM_THREADS=1${CCOLL_ENV:+ $CCOLL_ENV}"
# shellcheck disable=SC2206
ccoll_env=($CCOLL_ENV)
live_rows=()
for r in "${rows[@]}"; do [[ -n "$r" ]] && live_rows+=("$r"); done
is_failed() { local f; for f in "${failed[@]}"; do [[ "$f" == "$1" ]] && return 0; done; return 1; }
# Round k runs every row once, starting at row k-1 (mod the count), so that a change of the machine's load over the
# run does not always hit the same rows. The result check runs in round 1 only.
for ((round = 1; round <= ROUNDS; ++round)); do
  nrows=${#live_rows[@]}
  for ((i = 0; i < nrows; ++i)); do
    r="${live_rows[$(((i + round - 1) % nrows))]}"
    is_failed "$r" && continue
    json="$raw/$r.r$round.json" log="$raw/$r.r$round.log"
    b="$minb" e="$maxb"
    if [[ "${spec[$r]}" == "-d bfloat16"* ]]; then b=$((minb / 2)) e=$((maxb / 2)); fi
    check="$CHECK"
    ((round > 1)) && check=0
    sizes=(-b "$b" -e "$e" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c "$check" -D "$DIST" -J "$json")
    t0=$SECONDS
    if [[ "$r" == mpi* ]]; then
      # shellcheck disable=SC2086
      nb_mpirun "$NP" ${spec[$r]} -- "$mpi_bin" -d float -o sum "${sizes[@]}" >"$log" 2>&1
    else
      # shellcheck disable=SC2086
      nb_ranks -- env "${ccoll_env[@]}" "$perf_bin" ${spec[$r]} -o sum -a "$ALGO" "${sizes[@]}" >"$log" 2>&1
    fi
    rc=$?
    printf 'allreduce_bench.sh: round %d/%d %-24s %4d s  %s\n' "$round" "$ROUNDS" "${label[$r]}" $((SECONDS - t0)) \
      "$([[ $rc == 0 ]] && echo ok || echo "FAILED (rc $rc, log $log)")" >&2
    if ((rc != 0)); then
      failed+=("$r")
      tail -5 "$log" >&2
    fi
  done
done
nb_down
trap - EXIT INT TERM

# Where the time goes: the same ccoll rows as threads of one process (local transport: no network, no TCP), i.e. the
# CPU-only time of the schedule and codec on this machine's cores.
if [[ "$CPU_ONLY" == 1 ]]; then
  for r in "${rows[@]}"; do
    [[ -z "$r" || "$r" == mpi* ]] && continue
    is_failed "$r" && continue
    b="$minb" e="$maxb"
    if [[ "${spec[$r]}" == "-d bfloat16"* ]]; then b=$((minb / 2)) e=$((maxb / 2)); fi
    t0=$SECONDS
    # shellcheck disable=SC2086
    if env "${ccoll_env[@]}" "$perf_bin" -t "$NP" ${spec[$r]} -o sum -a "$ALGO" -b "$b" -e "$e" -f "$FACTOR" \
      -n "$ITERS" -w "$WARMUP" -c 0 -D "$DIST" -J "$raw/$r.cpu.json" >"$raw/$r.cpu.log" 2>&1; then
      printf 'allreduce_bench.sh: %-24s %4d s  ok (CPU only, %d threads)\n' "${label[$r]}" $((SECONDS - t0)) "$NP" >&2
    else
      printf 'allreduce_bench.sh: %-24s CPU-only run failed (log %s)\n' "${label[$r]}" "$raw/$r.cpu.log" >&2
    fi
  done
fi
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"
busy_end="$(busy)"
elapsed=$((SECONDS - t_start))

meta="$raw/meta.json"
"$PY" - "$meta" <<PY
import json, sys
json.dump({
    "tag": "$TAG", "start": "$start_time", "elapsed_s": $elapsed, "rate": "$RATE", "np": $NP,
    "burst": "$NB_BURST", "gso": "$NB_GSO",
    "iters": $ITERS, "rounds": $ROUNDS, "cpu_only": $CPU_ONLY, "warmup": $WARMUP, "check": $CHECK, "dist": "$DIST", "algo": "$ALGO",
    "selfcheck_mbit": "$selfcheck", "cores": $(nproc), "load_start": "$load_start", "load_end": "$load_end",
    "cpu": "$(nb_cpu)",
    "busy_start": "$busy_start", "busy_end": "$busy_end",
    "commit": "$(git -C "$repo" rev-parse --short HEAD 2>/dev/null)",
    "dirty": "$(git -C "$repo" status --porcelain --untracked-files=no -- src include perf 2>/dev/null | wc -l)",
    "build": "$build", "build_time": "$(date -u -r "$perf_bin" +%FT%TZ)", "ccoll_env": "$CCOLL_ENV", "raw": "$raw",
    "ccoll_library": """$(grep -h -m1 '^# library:' "$raw"/*.log 2>/dev/null | grep -m1 ccoll | sed 's/^# library: //')""",
    "mpi_library": """$(grep -h -m1 '^# library:' "$raw"/mpi*.log 2>/dev/null | head -1 | sed 's/^# library: //')""",
    "rows": "${rows[*]}".split(),
    "labels": {$(for r in "${rows[@]}"; do [[ -n "$r" ]] && printf '"%s": "%s", ' "$r" "${label[$r]}"; done)},
    "specs": {$(for r in "${rows[@]}"; do [[ -n "$r" ]] && printf '"%s": "%s", ' "$r" "${spec[$r]}"; done)},
    "skipped": $("$PY" -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "${skipped[@]}"),
    "failed": "${failed[*]}".split(),
}, open(sys.argv[1], "w"), indent=1)
PY
"$PY" "$here/report.py" "$meta" "$raw" "$OUT/$TAG" || exit 1
"$PY" "$here/plot.py" "$OUT/$TAG.json" "$OUT/$TAG.png" >&2 || echo "allreduce_bench.sh: plot failed" >&2
cat "$OUT/$TAG.md"
((${#failed[@]} == 0)) || exit 1
