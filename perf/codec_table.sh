#!/usr/bin/env bash
# codec_table.sh: the compression issue's error and wire table, measured. Every spec below all-reduces 2^20 float32
# (avg) on 4 thread ranks, for each input distribution (iid, corr, heavy) and 5 input seeds; the table shows the
# mean vNMSE against the fp64 reference and the measured wire bits per element, next to the issue's bounds (given
# for `corr`). Every run also checks that all ranks ended bitwise identical and the send buffers unchanged.
# Wire bits count the payload bytes each rank sent (not the 24-byte message headers: perf/wire_overhead.sh), less
# the call check's messages (ccCommStats_t.callCheckBytesSent: 528 bytes per rank and call at 4 ranks, two records,
# a fixed cost per call, 0.003 bits per element at 2^20).
# With MEMORY=1 it then measures peak RSS of one all-reduce of 256 MiB per codec (perf/peak_memory.sh).
#
#   perf/codec_table.sh [BUILD_DIR]        (default: build/ at the repository root)
#
# Environment: NP [4] COUNT [1048576] SEEDS [5] MEMORY [0]. Exit status 1 if a bound or a check failed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build}"
NP="${NP:-4}" COUNT="${COUNT:-1048576}" SEEDS="${SEEDS:-5}" MEMORY="${MEMORY:-0}"
bin="$build/perf/allreduce_perf"
[[ -x "$bin" ]] || { echo "codec_table.sh: $bin not found; build first" >&2; exit 2; }

# spec | vNMSE bound (corr) | wire-bits bound; "-" where the issue gives none.
specs=(
  "cast16|2e-5|16"
  "quant:bits=8,mode=homomorphic|1e-4|10.1"
  "quant:bits=4,mode=homomorphic,rounding=correlated|0.012|6.1"
  "quant:bits=4,mode=requant,group=32|0.05|4.6"
  "quant:bits=6,mode=requant,group=32|0.003|6.6"
  "quant:bits=2,mode=requant,group=32|-|-"
  "topk:density=0.1|-|-"
  "randk:density=0.1|-|-"
)
tmp="$(mktemp -d /tmp/ccoll_codec_table.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
bytes=$((COUNT * 4))
echo "# codec_table: $NP thread ranks, $COUNT float32 (avg), $SEEDS seeds per distribution, $(nproc) cores," \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
for entry in "${specs[@]}"; do
  spec="${entry%%|*}"
  for dist in iid corr heavy; do
    for ((seed = 1; seed <= SEEDS; ++seed)); do
      out="$tmp/$(echo "$spec" | tr ':,=' '___').$dist.$seed.json"
      # One timed call, then the checked call (-n 1 -w 0 -c 1), which runs with a fresh compressor: one call's
      # error, for topk and randk with error feedback too (their first call is ef=0's).
      "$bin" -t "$NP" -b "$bytes" -e "$bytes" -n 1 -w 0 -c 1 -o avg -D "$dist" -S "$seed" -z "$spec" -J "$out" \
        >"$out.log" 2>&1 || { cat "$out.log"; echo "codec_table.sh: $spec $dist seed $seed failed" >&2; exit 1; }
    done
  done
done

status=0
python3 - "$tmp" "$SEEDS" "${specs[@]}" <<'PY' || status=1
import glob, json, os, sys
tmp, seeds, entries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
failed = []
print("| spec | vNMSE iid | vNMSE corr | vNMSE heavy | bound (corr) | wire bits | bound | identical |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for entry in entries:
    spec, vbound, wbound = entry.split("|")
    key = spec.replace(":", "_").replace(",", "_").replace("=", "_")
    err, wire, same = {}, [], True
    for dist in ("iid", "corr", "heavy"):
        rows = []
        for path in sorted(glob.glob(os.path.join(tmp, "%s.%s.*.json" % (key, dist)))):
            rows += json.load(open(path))
        if len(rows) != seeds:
            sys.exit("codec_table.sh: %s %s: %d rows, expected %d" % (spec, dist, len(rows), seeds))
        err[dist] = sum(r["error"] for r in rows) / len(rows)
        wire += [r["wirebits"] for r in rows]
        same = same and all(r["identical"] and r["send_intact"] and r["wrong"] == 0 for r in rows)
    w = max(wire)
    ok_v = vbound == "-" or err["corr"] <= float(vbound)
    ok_w = wbound == "-" or w <= float(wbound)
    if not (ok_v and ok_w and same):
        failed.append(spec)
    mark = lambda ok: "" if ok else " (OVER)"
    print("| `%s` | %.3g | %.3g%s | %.3g | %s | %.4f%s | %s | %s |" % (
        spec, err["iid"], err["corr"], mark(ok_v), err["heavy"], vbound, w, mark(ok_w), wbound,
        "yes" if same else "NO"))
if failed:
    print("bounds or checks failed: " + ", ".join(failed))
    sys.exit(1)
print("all bounds met; every run bitwise identical across ranks, send buffers intact")
PY

if [[ "$MEMORY" == 1 ]]; then
  for entry in "|" "${specs[@]}"; do
    spec="${entry%%|*}"
    [[ -n "$spec" ]] || spec=none
    echo "== peak memory: $spec"
    CODEC="$spec" "$here/peak_memory.sh" "$build" | sed -n '/^user buffers/,$p' || status=1
  done
fi
exit $status
