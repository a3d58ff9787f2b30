#!/usr/bin/env bash
# compare_mpi.sh: ccoll's all-reduce against OpenMPI's MPI_Allreduce on this machine, in one run, over matching
# transports; prints markdown tables. Builds nothing: point it at a configured and built build directory.
#
#   perf/compare_mpi.sh [BUILD_DIR]        (default: build/ at the repository root)
#
# Configurations (NP ranks each, the same sizes):
#   ccoll threads     allreduce_perf -t NP: ranks are threads of one process (local transport), f32 and bf16
#   ccoll shm         allreduce_perf_mpi under mpirun, ranks are processes, ccoll's data over UCX with
#                     UCX_TLS=sysv,self (shared memory), f32 and bf16
#   ccoll ucx-default the same with UCX_TLS unset (UCX picks among self, sysv, posix, cma, tcp), f32 and bf16
#   ccoll tcp         the same with UCX_TLS=tcp,self UCX_NET_DEVICES=lo, f32 and bf16
#   MPI vader         mpi_allreduce_perf, --mca pml ob1 --mca btl self,vader (shared memory), f32
#   MPI tcp           mpi_allreduce_perf, --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo, f32
# (MPI is only the launcher and side channel of the ccoll process runs: --mca pml ob1 --mca btl self,vader there.)
# Then small-message latency (LAT_MINB..LAT_MAXB) of ccoll processes (shm, ucx-default, tcp), ccoll threads and both
# MPI transports, f32, with the library's default algorithm choice.
#
# Noise: the machine may be small and shared, so every configuration runs REPEATS times, in rounds: each round runs
# every configuration once, starting at a rotated position, so each configuration meets the same background over the
# run. Tables show the median over rounds of the time per all-reduce (algbw = size / median time), the ratio of
# medians, the ratio of the best rounds, and the spread. The check (-c) runs in round 1 only (it is not timed).
#
# Environment (defaults in brackets):
#   MINB [1M] MAXB [256M] FACTOR [4]          bandwidth sizes in bytes, as allreduce_perf -b -e -f
#   ITERS [10] WARMUP [2] CHECK [1]           -n -w -c of the bandwidth runs
#   LAT [1] LAT_MINB [8] LAT_MAXB [64K] LAT_FACTOR [2] LAT_ITERS [100] LAT_WARMUP [10] LAT_ALGO [auto]
#                                             the latency runs (LAT=0 skips them)
#   NP [4]                                    ranks
#   ALGO [ring]                               ccoll's -a in the bandwidth runs
#   REPEATS [3]                               rounds
#   THREADS [1] DEFAULT_TLS [1] TCP [1] BF16 [1]   0 leaves out those configurations
#   ENV_LAUNCH [0]                            1: also ccoll shm with ranks started by perf/launch_local.sh (no MPI;
#                                             ccCommInitFromEnv, ccoll as the harness's side channel)
#   SAME_COUNT [0]                            1: also bf16 at half of every size, and a table at the same element count
#   CCOLL_ENV []                              extra VAR=value words for every ccoll run (e.g. CC_SLICE_BYTES=4M)
#   MPIRUN_ARGS []                            extra mpirun arguments for every run under mpirun
#   MPI_SHM_ARGS [--mca pml ob1 --mca btl self,vader]
#   MPI_TCP_ARGS [--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo]
#   OUT_DIR [a new mktemp -d]                 logs and JSON files, one per run
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build}"
MINB="${MINB:-1M}" MAXB="${MAXB:-256M}" FACTOR="${FACTOR:-4}"
ITERS="${ITERS:-10}" WARMUP="${WARMUP:-2}" CHECK="${CHECK:-1}" NP="${NP:-4}" ALGO="${ALGO:-ring}"
LAT="${LAT:-1}" LAT_MINB="${LAT_MINB:-8}" LAT_MAXB="${LAT_MAXB:-64K}" LAT_FACTOR="${LAT_FACTOR:-2}"
LAT_ITERS="${LAT_ITERS:-100}" LAT_WARMUP="${LAT_WARMUP:-10}" LAT_ALGO="${LAT_ALGO:-auto}"
REPEATS="${REPEATS:-3}" THREADS="${THREADS:-1}" DEFAULT_TLS="${DEFAULT_TLS:-1}" TCP="${TCP:-1}" BF16="${BF16:-1}"
ENV_LAUNCH="${ENV_LAUNCH:-0}" SAME_COUNT="${SAME_COUNT:-0}" CCOLL_ENV="${CCOLL_ENV:-}" MPIRUN_ARGS="${MPIRUN_ARGS:-}"
# shellcheck source=SCRIPTDIR/sizes.sh
source "$here/sizes.sh"
min_bytes="$(size_bytes "$MINB")" || { echo "compare_mpi.sh: MINB must be a size like 1M, not '$MINB'" >&2; exit 2; }
max_bytes="$(size_bytes "$MAXB")" || { echo "compare_mpi.sh: MAXB must be a size like 256M, not '$MAXB'" >&2; exit 2; }
MPI_SHM_ARGS="${MPI_SHM_ARGS:---mca pml ob1 --mca btl self,vader}"
MPI_TCP_ARGS="${MPI_TCP_ARGS:---mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/ccoll_compare_mpi.XXXXXX)}"
mkdir -p "$OUT_DIR"

thr_bin="$build/perf/allreduce_perf"
proc_bin="$build/perf/allreduce_perf_mpi"
mpi_bin="$build/perf/mpi_allreduce_perf"
for b in "$thr_bin" "$proc_bin" "$mpi_bin"; do
  if [[ ! -x "$b" ]]; then
    echo "compare_mpi.sh: $b not found; build first (the MPI binaries need MPI at configure time)" >&2
    exit 2
  fi
done
command -v mpirun >/dev/null || { echo "compare_mpi.sh: mpirun not on PATH" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare_mpi.sh: python3 not on PATH" >&2; exit 2; }
if ! [[ "$REPEATS" =~ ^[1-9][0-9]*$ ]]; then echo "compare_mpi.sh: REPEATS must be >= 1" >&2; exit 2; fi


# shellcheck disable=SC2206
ccoll_env=($CCOLL_ENV)
# shellcheck disable=SC2206
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe -np "$NP" $MPIRUN_ARGS)
# shellcheck disable=SC2206
mpi_shm=($MPI_SHM_ARGS)
# shellcheck disable=SC2206
mpi_tcp=($MPI_TCP_ARGS)
# The ccoll process runs use MPI only to start and to synchronize: always over shared memory.
mpi_side=(--mca pml ob1 --mca btl "self,vader")
# Every run starts from a clean UCX environment; a configuration sets what it needs.
clean_env=(env -u UCX_TLS -u UCX_NET_DEVICES)

# Configurations: NAME -> "kind dtype" (kind: thr, shm, dflt, tcp, env, mpishm, mpitcp; dtype f32, bf16, bf16h).
declare -A cfg_kind cfg_dtype
bw_cfgs=()
add_bw() { bw_cfgs+=("$1"); cfg_kind[$1]="$2"; cfg_dtype[$1]="$3"; }
for kind in thr shm dflt tcp env; do
  case "$kind" in
    thr) [[ "$THREADS" == 1 ]] || continue ;;
    dflt) [[ "$DEFAULT_TLS" == 1 ]] || continue ;;
    tcp) [[ "$TCP" == 1 ]] || continue ;;
    env) [[ "$ENV_LAUNCH" == 1 ]] || continue ;;
  esac
  add_bw "${kind}_f32" "$kind" f32
  if [[ "$BF16" == 1 ]]; then
    add_bw "${kind}_bf16" "$kind" bf16
    [[ "$SAME_COUNT" == 1 ]] && add_bw "${kind}_bf16h" "$kind" bf16h
  fi
done
add_bw mpishm_f32 mpishm f32
[[ "$TCP" == 1 ]] && add_bw mpitcp_f32 mpitcp f32
lat_cfgs=()
if [[ "$LAT" == 1 ]]; then
  for kind in thr shm dflt tcp env mpishm mpitcp; do
    case "$kind" in
      thr) [[ "$THREADS" == 1 ]] || continue ;;
      dflt) [[ "$DEFAULT_TLS" == 1 ]] || continue ;;
      tcp | mpitcp) [[ "$TCP" == 1 ]] || continue ;;
      env) [[ "$ENV_LAUNCH" == 1 ]] || continue ;;
    esac
    lat_cfgs+=("lat_$kind")
    cfg_kind[lat_$kind]="$kind"
    cfg_dtype[lat_$kind]=f32
  done
fi

# The command of configuration NAME in round ROUND, into the array `cmd`.
build_cmd() {
  local name="$1" round="$2" kind="${cfg_kind[$1]}" dtype="${cfg_dtype[$1]}" d=float minb maxb
  local check="$CHECK"
  ((round > 1)) && check=0
  local sizes
  if [[ "$name" == lat_* ]]; then
    sizes=(-b "$LAT_MINB" -e "$LAT_MAXB" -f "$LAT_FACTOR" -n "$LAT_ITERS" -w "$LAT_WARMUP" -c "$check")
  else
    minb="$MINB" maxb="$MAXB"
    if [[ "$dtype" == bf16h ]]; then
      minb=$((min_bytes / 2))
      maxb=$((max_bytes / 2))
    fi
    sizes=(-b "$minb" -e "$maxb" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c "$check")
  fi
  [[ "$dtype" == bf16* ]] && d=bfloat16
  local algo=(-a "$ALGO")
  [[ "$name" == lat_* ]] && algo=(-a "$LAT_ALGO")
  local json=(-J "$OUT_DIR/${name}_r$round.json")
  case "$kind" in
    thr) cmd=("${clean_env[@]}" "${ccoll_env[@]}" "$thr_bin" -t "$NP" -d "$d" -o sum "${algo[@]}" "${sizes[@]}" "${json[@]}") ;;
    shm) cmd=("${clean_env[@]}" "UCX_TLS=sysv,self" "${ccoll_env[@]}" "${mpirun_cmd[@]}" "${mpi_side[@]}" "$proc_bin"
              -d "$d" -o sum "${algo[@]}" "${sizes[@]}" "${json[@]}") ;;
    dflt) cmd=("${clean_env[@]}" "${ccoll_env[@]}" "${mpirun_cmd[@]}" "${mpi_side[@]}" "$proc_bin"
               -d "$d" -o sum "${algo[@]}" "${sizes[@]}" "${json[@]}") ;;
    tcp) cmd=("${clean_env[@]}" "UCX_TLS=tcp,self" UCX_NET_DEVICES=lo "${ccoll_env[@]}" "${mpirun_cmd[@]}"
              "${mpi_side[@]}" "$proc_bin" -d "$d" -o sum "${algo[@]}" "${sizes[@]}" "${json[@]}") ;;
    env) cmd=("${clean_env[@]}" "UCX_TLS=sysv,self" "${ccoll_env[@]}" "$here/launch_local.sh" -n "$NP" "$thr_bin"
              -d "$d" -o sum "${algo[@]}" "${sizes[@]}" "${json[@]}") ;;
    mpishm) cmd=("${clean_env[@]}" "${mpirun_cmd[@]}" "${mpi_shm[@]}" "$mpi_bin" -d float -o sum "${sizes[@]}" "${json[@]}") ;;
    mpitcp) cmd=("${clean_env[@]}" "${mpirun_cmd[@]}" "${mpi_tcp[@]}" "$mpi_bin" -d float -o sum "${sizes[@]}" "${json[@]}") ;;
  esac
}

run() {  # run NAME ROUND: the log goes to $OUT_DIR/NAME_rROUND.log; the command is printed
  local name="$1" round="$2" log="$OUT_DIR/${1}_r$2.log" t0 t1
  build_cmd "$name" "$round"
  printf '## round %s: %s:' "$round" "$name"
  printf ' %q' "${cmd[@]}"
  t0=$EPOCHREALTIME
  if ! "${cmd[@]}" >"$log" 2>&1; then
    echo
    cat "$log"
    echo "compare_mpi.sh: $name (round $round) failed (log: $log)" >&2
    exit 1
  fi
  t1=$EPOCHREALTIME
  local us=$((${t1/./} - ${t0/./}))
  printf '  [%d.%d s]\n' $((us / 1000000)) $((us / 100000 % 10))
}

load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
start_time="$(date -u +%FT%TZ)"
run_rounds() {  # run_rounds CFG...: REPEATS rounds, round k starting at configuration k-1 (mod the count)
  local cfgs=("$@") n=$# round i
  for ((round = 1; round <= REPEATS; ++round)); do
    for ((i = 0; i < n; ++i)); do
      run "${cfgs[$(((i + round - 1) % n))]}" "$round"
    done
  done
}
run_rounds "${bw_cfgs[@]}"
((${#lat_cfgs[@]} > 0)) && run_rounds "${lat_cfgs[@]}"
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

mpi_version="$(grep -h '^# library:' "$OUT_DIR/mpishm_f32_r1.log" | head -1 | sed 's/^# library: //')"
ccoll_version="$(grep -h '^# library:' "$OUT_DIR/shm_f32_r1.log" | head -1 | sed 's/^# library: //')"

python3 - "$OUT_DIR" <<PY
import json, os, statistics, sys

out_dir = sys.argv[1]
P = dict(np="$NP", algo="$ALGO", lat_algo="$LAT_ALGO", iters="$ITERS", warmup="$WARMUP", check="$CHECK",
         lat_iters="$LAT_ITERS", lat_warmup="$LAT_WARMUP", repeats=int("$REPEATS"), cores="$(nproc)",
         ccoll_v="""$ccoll_version""", mpi_v="""$mpi_version""", mpirun="""${mpirun_cmd[*]}""",
         mpi_shm="""$MPI_SHM_ARGS""", mpi_tcp="""$MPI_TCP_ARGS""", ccoll_env="""$CCOLL_ENV""",
         load_start="$load_start", load_end="$load_end", start="$start_time", same_count="$SAME_COUNT")
bw_cfgs = "${bw_cfgs[*]}".split()
lat_cfgs = "${lat_cfgs[*]}".split()

LABEL = {
    "thr": "ccoll threads", "shm": "ccoll shm", "dflt": "ccoll ucx-default", "tcp": "ccoll tcp",
    "env": "ccoll shm (launch_local)", "mpishm": "MPI vader", "mpitcp": "MPI tcp",
}

def kind_dtype(name):
    base = name[4:] if name.startswith("lat_") else name
    if base.startswith("mpishm") or base.startswith("mpitcp"):
        kind = base[:6]
        dtype = "f32"
    else:
        kind, _, dtype = base.partition("_")
        dtype = dtype or "f32"
    return kind, dtype

def label(name):
    kind, dtype = kind_dtype(name)
    d = {"f32": "f32", "bf16": "bf16", "bf16h": "bf16 (half size)"}[dtype]
    return "%s %s" % (LABEL[kind], d)

# rows[name][size] = list of rows, one per round
rows, bad = {}, set()
for name in bw_cfgs + lat_cfgs:
    rows[name] = {}
    for r in range(1, P["repeats"] + 1):
        with open(os.path.join(out_dir, "%s_r%d.json" % (name, r))) as f:
            for row in json.load(f):
                rows[name].setdefault(row["size"], []).append(row)
                if row.get("wrong") not in (0, None) or row.get("identical") is False or row.get("send_intact") is False:
                    bad.add(label(name))

def times(name, size):
    return [r["time_us"] for r in rows.get(name, {}).get(size, [])]

def med_t(name, size):
    t = times(name, size)
    return statistics.median(t) if t else None

def best_t(name, size):
    t = times(name, size)
    return min(t) if t else None

def bw(name, size, which=med_t):
    t = which(name, size)
    return size / t / 1e3 if t else None  # bytes/us -> GB/s (1e9)

def fmt(v, f="%.3f"):
    return f % v if v is not None else "-"

def ratio(a, b):
    return "%.2f" % (a / b) if a and b else "-"

def human(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return "%d%s" % (n // scale, unit)
    return str(n)

def spread(name, size):
    t = times(name, size)
    if len(t) < 2:
        return "-"
    return "%.0f%%" % (100.0 * (max(t) - min(t)) / statistics.median(t))

def sizes_of(names):
    return sorted({s for n in names for s in rows.get(n, {})})

print()
print("# ccoll vs OpenMPI all-reduce: %s ranks on one machine (%s cores)" % (P["np"], P["cores"]))
print()
print("- ccoll: %s. MPI: %s." % (P["ccoll_v"], P["mpi_v"]))
print("- ccoll threads: \`allreduce_perf -t %s\` (local transport). ccoll shm / ucx-default / tcp: \`%s %s allreduce_perf_mpi\` "
      "(ranks are processes, data over UCX) with UCX_TLS=sysv,self / UCX_TLS unset / UCX_TLS=tcp,self "
      "UCX_NET_DEVICES=lo." % (P["np"], P["mpirun"], "--mca pml ob1 --mca btl self,vader"))
print("- MPI vader: \`%s %s mpi_allreduce_perf\`; MPI tcp: \`%s %s mpi_allreduce_perf\`." % (P["mpirun"], P["mpi_shm"], P["mpirun"], P["mpi_tcp"]))
print("- bandwidth runs: -n %s -w %s, ccoll -a %s; latency runs: -n %s -w %s, ccoll -a %s%s." % (
    P["iters"], P["warmup"], P["algo"], P["lat_iters"], P["lat_warmup"], P["lat_algo"],
    ("; extra ccoll environment: " + P["ccoll_env"]) if P["ccoll_env"] else ""))
print("- noise handling: %d rounds; each round runs every configuration once, starting at a rotated position. "
      "Numbers are the median over rounds of the time per all-reduce (algbw = size / that time); 'best' is the "
      "fastest round. The result check (-c %s) ran in round 1 only." % (P["repeats"], P["check"]))
print("- load average (1, 5, 15 min) at start %s, at end %s; started %s." % (P["load_start"], P["load_end"], P["start"]))
print("- algbw in GB/s (1e9) of logical bytes; at the same size bf16 moves twice the elements of f32.")

bw_main = [n for n in bw_cfgs if kind_dtype(n)[1] != "bf16h"]
print()
print("## Bandwidth: algbw (GB/s), median of %d rounds" % P["repeats"])
print()
print("| size | " + " | ".join(label(n) for n in bw_main) + " |")
print("|---:|" + "---:|" * len(bw_main))
for s in sizes_of(bw_main):
    print("| %s | " % human(s) + " | ".join(fmt(bw(n, s)) for n in bw_main) + " |")

pairs = []  # (label, ccoll cfg, mpi cfg)
for k, m in (("shm", "mpishm"), ("dflt", "mpishm"), ("env", "mpishm"), ("tcp", "mpitcp"), ("thr", "mpishm")):
    for d in ("f32", "bf16"):
        a, b = "%s_%s" % (k, d), "%s_f32" % m
        if a in bw_cfgs and b in bw_cfgs:
            pairs.append(("%s / %s" % (label(a), label(b)), a, b))
print()
print("## Ratio ccoll algbw / MPI algbw, matching transport (> 1: ccoll faster)")
print()
print("Median: ratio of the medians; best: ratio of the fastest rounds.")
print()
print("| size | " + " | ".join("%s (median) | (best)" % p[0] for p in pairs) + " |")
print("|---:|" + "---:|---:|" * len(pairs))
for s in sizes_of(bw_main):
    cells = []
    for _, a, b in pairs:
        cells.append(ratio(bw(a, s), bw(b, s)))
        cells.append(ratio(bw(a, s, best_t), bw(b, s, best_t)))
    print("| %s | " % human(s) + " | ".join(cells) + " |")

target = [s for s in sizes_of(["shm_f32"]) if s >= 16 << 20]
if target and "shm_f32" in bw_cfgs:
    got = [(s, bw("shm_f32", s) / bw("mpishm_f32", s)) for s in target if bw("shm_f32", s) and bw("mpishm_f32", s)]
    miss = [human(s) for s, r in got if r < 0.9]
    print()
    print("Target (ccoll shm f32 >= 0.9x MPI vader algbw at >= 16M, medians): %s" % (
        "met at every size" if not miss else "NOT met at " + ", ".join(miss)))

print()
print("## Spread over rounds: (slowest - fastest) / median time")
print()
print("| size | " + " | ".join(label(n) for n in bw_main) + " |")
print("|---:|" + "---:|" * len(bw_main))
for s in sizes_of(bw_main):
    print("| %s | " % human(s) + " | ".join(spread(n, s) for n in bw_main) + " |")

if P["same_count"] == "1":
    half = [n for n in bw_cfgs if kind_dtype(n)[1] == "bf16h"]
    print()
    print("## Same element count: time per all-reduce (ms, median) of float32-sized messages; bf16 at half the bytes")
    print()
    cols = []
    for h in half:
        k = kind_dtype(h)[0]
        cols.append(("%s f32" % LABEL[k], "%s_f32" % k, 1))
        cols.append(("%s bf16" % LABEL[k], h, 2))
    print("| elements | " + " | ".join(c[0] for c in cols) + " | MPI vader f32 |")
    print("|---:|" + "---:|" * (len(cols) + 1))
    for s in sizes_of(["shm_f32", "thr_f32", "tcp_f32"]):
        cells = [fmt(med_t(n, s // div) / 1e3 if med_t(n, s // div) else None) for _, n, div in cols]
        m = med_t("mpishm_f32", s)
        print("| %s | " % human(s // 4) + " | ".join(cells) + " | %s |" % fmt(m / 1e3 if m else None))

if lat_cfgs:
    print()
    print("## Small-message latency: time per all-reduce (us), median of %d rounds (f32, ccoll -a %s)" % (
        P["repeats"], P["lat_algo"]))
    print()
    lpairs = [(a, b) for a, b in (("lat_shm", "lat_mpishm"), ("lat_dflt", "lat_mpishm"), ("lat_tcp", "lat_mpitcp"))
              if a in lat_cfgs and b in lat_cfgs]
    print("| size | " + " | ".join(LABEL[kind_dtype(n)[0]] for n in lat_cfgs) + " | " +
          " | ".join("%s / %s" % (LABEL[kind_dtype(a)[0]], LABEL[kind_dtype(b)[0]]) for a, b in lpairs) + " |")
    print("|---:|" + "---:|" * (len(lat_cfgs) + len(lpairs)))
    for s in sizes_of(lat_cfgs):
        cells = [fmt(med_t(n, s), "%.1f") for n in lat_cfgs]
        cells += [ratio(med_t(a, s), med_t(b, s)) for a, b in lpairs]
        print("| %s | " % human(s) + " | ".join(cells) + " |")
    print()
    print("Ratios here are of times: > 1 means ccoll is slower.")

print()
if P["check"] == "1":
    print("checks (round 1): %s" % ("FAILED in " + ", ".join(sorted(bad)) if bad else "all passed"))
else:
    print("checks: disabled (CHECK=%s)" % P["check"])
print("logs and JSON: %s" % out_dir)
sys.exit(1 if bad else 0)
PY
