#!/usr/bin/env bash
# The main job: sets everything up (scripts/setup.sh), then compares, side by side in one run on 4 local ranks
# (threads, CPU), the compressed all-reduces against the 16-bit baseline (exact bfloat16 all-reduce) and the exact
# float32 all-reduce, over float32 gradients of 1 MiB .. 64 MiB (and one codec on bfloat16 gradients of the same
# element counts). Prints one markdown table: time, algbw, speedup vs the bf16 baseline, wire bits per element and
# error (vNMSE vs an fp64 reference).
#
#   scripts/main.sh                       # defaults
#   MIN_MIB=4 MAX_MIB=16 NRANKS=8 scripts/main.sh
#
# Between thread ranks the "network" is a memcpy, so this shows what the codecs cost; where compression pays is a
# bandwidth-limited network (perf/netbench).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/setup.sh
PERF="$BUILD_DIR/perf/allreduce_perf"
# One BLAS thread per rank (PowerSGD's products run in each rank's thread): OpenBLAS's default, a thread per core for
# every rank, oversubscribes the cores the ranks already share (PowerSGD at 64 MiB on 4 thread ranks and 2 cores:
# 111-139 ms against 73-80 ms with one thread, 2026-12-07).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
NRANKS=${NRANKS:-4}
MIN_MIB=${MIN_MIB:-1}   # float32 gradient sizes; the bf16 baseline runs the same element counts
MAX_MIB=${MAX_MIB:-64}
ITERS=${ITERS:-5}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# name | dtype | codec spec
CASES=(
  "bf16 exact (baseline)|bfloat16|none"
  "f32 exact|float|none"
  "cast16 (bf16 wire)|float|cast16"
  "quant 8-bit homomorphic|float|quant:bits=8,mode=homomorphic"
  "quant 4-bit requant|float|quant:bits=4,mode=requant,group=32"
  "quant 4-bit requant, bf16 gradients|bfloat16|quant:bits=4,mode=requant,group=32"
  "quant 4-bit homomorphic corr|float|quant:bits=4,mode=homomorphic,rounding=correlated"
  "topk 10%|float|topk:density=0.1"
  "randk 10%|float|randk:density=0.1"
  "powersgd rank 4|float|powersgd:rank=4"
)
i=0
for c in "${CASES[@]}"; do
  IFS='|' read -r name dtype spec <<<"$c"
  echo "== $name"
  if [ "$dtype" = bfloat16 ]; then lo="$((MIN_MIB * 512))K" hi="$((MAX_MIB * 512))K"; else lo="${MIN_MIB}M" hi="${MAX_MIB}M"; fi
  "$PERF" -t "$NRANKS" -b "$lo" -e "$hi" -f 4 -n "$ITERS" -w 1 -d "$dtype" -o avg -z "$spec" -D corr \
    -J "$OUT/$i.json" >"$OUT/$i.txt"
  echo "$name" >"$OUT/$i.name"
  i=$((i + 1))
done

python3 - "$OUT" "$i" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
runs = []
for k in range(n):
    name = open(f"{out}/{k}.name").read().strip()
    rows = {r["count"]: r for r in json.load(open(f"{out}/{k}.json"))}
    runs.append((name, rows))
base = runs[0][1]
print()
print("Logical size = float32 gradient bytes (the bf16 rows move the same element count).")
print()
print("| size | codec | time (us) | algbw (GB/s) | speedup vs bf16 | wirebits | vNMSE |")
print("|---:|---|---:|---:|---:|---:|---:|")
for count in sorted(base):
    size = count * 4
    for name, rows in runs:
        r = rows.get(count)
        if r is None:
            continue
        speed = base[count]["time_us"] / r["time_us"]
        print(f"| {size >> 20} MiB | {name} | {r['time_us']:.0f} | {size / r['time_us'] / 1e3:.2f} | {speed:.2f}x "
              f"| {r['wirebits']:.2f} | {r['error']:.2e} |")
PY
