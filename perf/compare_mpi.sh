#!/usr/bin/env bash
# compare_mpi.sh: ccoll's all-reduce (float32 and bfloat16, ranks as threads) against OpenMPI's MPI_Allreduce
# (float32, ranks as processes) over the same sizes on this machine, in one run; prints a markdown table.
# Builds nothing: point it at a configured and built build directory.
#
#   perf/compare_mpi.sh [BUILD_DIR]        (default: build/ at the repository root)
#
# Environment (defaults in brackets):
#   MINB [1M] MAXB [256M] FACTOR [4]       sizes in bytes, as allreduce_perf -b -e -f
#   ITERS [10] WARMUP [2] CHECK [1]        -n -w -c of every run
#   NP [4]                                 ranks: allreduce_perf -t NP, mpirun -np NP
#   ALGO [ring]                            ccoll's -a
#   SAME_COUNT [1]                         1: also run bf16 at half of every size and print a second table that
#                                          compares the same element count (what a gradient all-reduce cares about)
#   MPI_ARGS [--mca btl self,vader]        extra mpirun arguments (OpenMPI's pml here is ob1, so this is shared memory)
#   OUT_DIR [a new mktemp -d]              where the logs and JSON files are kept
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build}"
MINB="${MINB:-1M}" MAXB="${MAXB:-256M}" FACTOR="${FACTOR:-4}"
ITERS="${ITERS:-10}" WARMUP="${WARMUP:-2}" CHECK="${CHECK:-1}" NP="${NP:-4}" ALGO="${ALGO:-ring}"
SAME_COUNT="${SAME_COUNT:-1}"
MPI_ARGS="${MPI_ARGS:---mca btl self,vader}"
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/ccoll_compare_mpi.XXXXXX)}"
mkdir -p "$OUT_DIR"

ccoll_bin="$build/perf/allreduce_perf"
mpi_bin="$build/perf/mpi_allreduce_perf"
for b in "$ccoll_bin" "$mpi_bin"; do
  if [[ ! -x "$b" ]]; then
    echo "compare_mpi.sh: $b not found; build first (mpi_allreduce_perf needs MPI at configure time)" >&2
    exit 2
  fi
done
command -v mpirun >/dev/null || { echo "compare_mpi.sh: mpirun not on PATH" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare_mpi.sh: python3 not on PATH" >&2; exit 2; }

to_bytes() {  # 64M -> 67108864 (1024-based, like the perf binaries)
  local v="${1%[bB]}" m=1
  case "$v" in
    *[kK]) m=1024; v="${v%?}" ;;
    *[mM]) m=$((1024 * 1024)); v="${v%?}" ;;
    *[gG]) m=$((1024 * 1024 * 1024)); v="${v%?}" ;;
  esac
  echo $((v * m))
}

common=(-b "$MINB" -e "$MAXB" -f "$FACTOR" -n "$ITERS" -w "$WARMUP" -c "$CHECK")
# MPI as root on a small machine: allow root and more ranks than cores.
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe -np "$NP")
# shellcheck disable=SC2206
mpirun_cmd+=($MPI_ARGS)

run() {  # run NAME CMD...: the rows go to the terminal and to $OUT_DIR/NAME.log
  local name="$1"
  shift
  echo "## $name: $*"
  if ! "$@" >"$OUT_DIR/$name.log" 2>&1; then
    cat "$OUT_DIR/$name.log"
    echo "compare_mpi.sh: $name failed (log: $OUT_DIR/$name.log)" >&2
    exit 1
  fi
  grep -v '^# [a-z]' "$OUT_DIR/$name.log" | grep -v '^#$' || true
}

run ccoll_f32 "$ccoll_bin" -t "$NP" -d float -o sum -a "$ALGO" "${common[@]}" -J "$OUT_DIR/ccoll_f32.json"
run ccoll_bf16 "$ccoll_bin" -t "$NP" -d bfloat16 -o sum -a "$ALGO" "${common[@]}" -J "$OUT_DIR/ccoll_bf16.json"
if [[ "$SAME_COUNT" == 1 ]]; then
  half_common=(-b "$(($(to_bytes "$MINB") / 2))" -e "$(($(to_bytes "$MAXB") / 2))" -f "$FACTOR" -n "$ITERS"
               -w "$WARMUP" -c "$CHECK")
  run ccoll_bf16_half "$ccoll_bin" -t "$NP" -d bfloat16 -o sum -a "$ALGO" "${half_common[@]}" \
    -J "$OUT_DIR/ccoll_bf16_half.json"
fi
run mpi_f32 "${mpirun_cmd[@]}" "$mpi_bin" -d float -o sum "${common[@]}" -J "$OUT_DIR/mpi_f32.json"

mpi_version="$(grep '^# library:' "$OUT_DIR/mpi_f32.log" | head -1 | sed 's/^# library: //')"
ccoll_version="$(grep '^# library:' "$OUT_DIR/ccoll_f32.log" | head -1 | sed 's/^# library: //')"

python3 - "$OUT_DIR" "$NP" "$ALGO" "$ITERS" "$WARMUP" "$CHECK" "${mpirun_cmd[*]}" "$ccoll_version" \
  "$mpi_version" "$(nproc)" <<'PY'
import json, os, sys

out_dir, np_, algo, iters, warmup, check, mpirun, ccoll_v, mpi_v, cores = sys.argv[1:11]

def load(name):
    with open(os.path.join(out_dir, name + ".json")) as f:
        return {row["size"]: row for row in json.load(f)}

f32, bf16, mpi = load("ccoll_f32"), load("ccoll_bf16"), load("mpi_f32")

def human(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return "%d%s" % (n // scale, unit)
    return str(n)

def bw(row):
    return "%.3f" % row["algbw_GBps"] if row else "-"

def ratio(a, b):
    if not a or not b or not b["algbw_GBps"]:
        return "-"
    return "%.2f" % (a["algbw_GBps"] / b["algbw_GBps"])

print()
print("ccoll vs OpenMPI all-reduce, %s ranks on one machine (%s cores); algbw in GB/s (1e9) of logical bytes" % (np_, cores))
print()
print("- ccoll: %s; ranks are %s threads of one process (local transport), algo %s" % (ccoll_v, np_, algo))
print("- MPI: %s; `%s mpi_allreduce_perf`" % (mpi_v, mpirun))
print("- every run: -n %s -w %s -c %s; rows joined on size in bytes (bf16 moves twice the elements of f32 at the same size)" % (iters, warmup, check))
print()
print("| size | ccoll f32 algbw | ccoll bf16 algbw | MPI f32 algbw | ratio ccoll f32/MPI | ratio ccoll bf16/MPI |")
print("|---:|---:|---:|---:|---:|---:|")
for size in sorted(set(f32) | set(bf16) | set(mpi)):
    a, b, m = f32.get(size), bf16.get(size), mpi.get(size)
    print("| %s | %s | %s | %s | %s | %s |" % (human(size), bw(a), bw(b), bw(m), ratio(a, m), ratio(b, m)))
half_path = os.path.join(out_dir, "ccoll_bf16_half.json")
if os.path.exists(half_path):
    half = {row["count"]: row for row in load("ccoll_bf16_half").values()}
    for row in bf16.values():
        half.setdefault(row["count"], row)
    def ms(row):
        return "%.3f" % (row["time_us"] / 1000) if row else "-"
    print()
    print("Same element count (float32 elements of the size above; bf16 moves half the bytes): time per all-reduce in ms")
    print()
    print("| elements | ccoll f32 | ccoll bf16 | MPI f32 | bf16 speedup over ccoll f32 | ccoll bf16 speedup over MPI f32 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sorted(f32):
        a = f32[size]
        n = a["count"]
        b, m = half.get(n), mpi.get(size)
        sp = lambda x, y: "%.2f" % (x["time_us"] / y["time_us"]) if x and y and y["time_us"] else "-"
        print("| %s | %s | %s | %s | %s | %s |" % (human(n), ms(a), ms(b), ms(m), sp(a, b), sp(m, b)))
    bf16_all = dict(bf16)
    bf16_all.update({r["size"]: r for r in load("ccoll_bf16_half").values()})
else:
    bf16_all = bf16
bad = [name for name, rows in (("ccoll f32", f32), ("ccoll bf16", bf16_all), ("MPI f32", mpi))
       for r in rows.values() if r["wrong"] not in (0, None) or r["identical"] is False]
print()
print("checks: %s" % ("FAILED in " + ", ".join(sorted(set(bad))) if bad else ("all passed" if check == "1" else "disabled (-c 0)")))
print("logs and JSON: %s" % out_dir)
PY
