#!/usr/bin/env bash
# What the wire header and CC_CHECKSUM cost: all-reduce time per size with CC_CHECKSUM=0 and =1 (and, given a second
# build, that build too, e.g. one from before the header), measured in alternating rounds in one run so that load
# on the machine hits every configuration alike. Median over rounds; the ratios are the result.
#
#   perf/wire_overhead.sh BUILD [BASE_BUILD]
#   MODE=processes|threads (default processes: NPROC ranks over UCX, UCX_TLS as set, default sysv,self)
#   NPROC=4 ROUNDS=5 MINB=8 MAXB=64M STEP=8 ITERS=20 CODEC=none
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: perf/wire_overhead.sh BUILD [BASE_BUILD]}
BASE=${2:-}
MODE=${MODE:-processes} NPROC=${NPROC:-4} ROUNDS=${ROUNDS:-5}
MINB=${MINB:-8} MAXB=${MAXB:-64M} STEP=${STEP:-8} ITERS=${ITERS:-20} CODEC=${CODEC:-none}
export UCX_TLS=${UCX_TLS:-sysv,self}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # run NAME BUILD CHECKSUM
  local args=(-b "$MINB" -e "$MAXB" -f "$STEP" -n "$ITERS" -w 3 -c 0 -z "$CODEC")
  if [ "$MODE" = threads ]; then
    CC_CHECKSUM=$3 "$2/perf/allreduce_perf" -t "$NPROC" "${args[@]}" >>"$out/$1"
  else
    CC_CHECKSUM=$3 perf/launch_local.sh -n "$NPROC" "$2/perf/allreduce_perf" "${args[@]}" >>"$out/$1"
  fi
}

echo "# wire_overhead: $MODE, $NPROC ranks, UCX_TLS=$UCX_TLS, codec $CODEC, $ROUNDS rounds, $(nproc) cores," \
     "load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
for ((i = 1; i <= ROUNDS; i++)); do
  [ -n "$BASE" ] && run base "$BASE" 0
  run plain "$BUILD" 0
  run crc "$BUILD" 1
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$out" <<'PY'
import os, statistics, sys
d = sys.argv[1]
times = {}
for name in ("base", "plain", "crc"):
    p = os.path.join(d, name)
    if not os.path.exists(p):
        continue
    for line in open(p):
        f = line.split()
        if not f or line.startswith("#") or not f[0].isdigit():
            continue
        times.setdefault(name, {}).setdefault(int(f[0]), []).append(float(f[6]))
med = {n: {s: statistics.median(v) for s, v in t.items()} for n, t in times.items()}
have_base = "base" in med
print("| bytes | " + ("before header (us) | " if have_base else "") + "header (us) | CC_CHECKSUM=1 (us) | "
      + ("header / before | " if have_base else "") + "checksum / header |")
print("|---:|" + ("---:|" if have_base else "") + "---:|---:|" + ("---:|" if have_base else "") + "---:|")
for s in sorted(med["plain"]):
    p, c = med["plain"][s], med["crc"][s]
    row = [str(s)]
    if have_base:
        row.append(f"{med['base'][s]:.1f}")
    row += [f"{p:.1f}", f"{c:.1f}"]
    if have_base:
        row.append(f"{p / med['base'][s]:.3f}")
    row.append(f"{c / p:.3f}")
    print("| " + " | ".join(row) + " |")
PY
