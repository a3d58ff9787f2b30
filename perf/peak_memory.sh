#!/usr/bin/env bash
# peak_memory.sh: peak resident memory of a float32 all-reduce of SIZE on NP thread ranks, against the user buffers
# (send + recv of every rank). Target: what the library adds per rank, beyond the user buffers and (for codecs with
# error feedback) the error-feedback memory of one buffer, is at most EXTRA x SIZE: with the default 0.5, peak RSS
# <= 1.25 x user buffers for the exact path. Exits 1 when the target is missed.
#
#   perf/peak_memory.sh [BUILD_DIR]        (default: build/ at the repository root)
#
# Environment: SIZE [256M] NP [4] EXTRA [0.5] CODEC [none: exact; else a compressor spec, as allreduce_perf -z]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../build}"
SIZE="${SIZE:-256M}" NP="${NP:-4}" EXTRA="${EXTRA:-0.5}" CODEC="${CODEC:-none}"
bin="$build/perf/allreduce_perf"
[[ -x "$bin" ]] || { echo "peak_memory.sh: $bin not found; build first" >&2; exit 2; }

cmd=("$bin" -t "$NP" -d float -b "$SIZE" -e "$SIZE" -n 3 -w 1 -c 0 -o avg -z "$CODEC")
log="$(mktemp /tmp/ccoll_peak_memory.XXXXXX)"
trap 'rm -f "$log"' EXIT

if [[ -x /usr/bin/time ]]; then
  /usr/bin/time -v "${cmd[@]}" >"$log" 2>&1 || { cat "$log"; echo "peak_memory.sh: the run failed" >&2; exit 1; }
  rss_kib="$(sed -n 's/^[[:space:]]*Maximum resident set size (kbytes): //p' "$log")"
  source="/usr/bin/time -v (Maximum resident set size)"
else
  "${cmd[@]}" >"$log" 2>&1 || { cat "$log"; echo "peak_memory.sh: the run failed" >&2; exit 1; }
  rss_kib=""
  source=""
fi
if [[ -z "$rss_kib" ]]; then
  # allreduce_perf's own footer: "# peak RSS: X MiB (VmHWM)".
  rss_mib="$(sed -n 's/^# peak RSS: \([0-9.]*\) MiB.*/\1/p' "$log")"
  rss_kib="$(python3 -c "print(int(float('$rss_mib') * 1024))")"
  source="VmHWM printed by allreduce_perf"
fi
vmhwm="$(sed -n 's/^# peak RSS: \(.*\)$/\1/p' "$log")"
grep -v '^# [a-z]' "$log" | grep -E '^ +[0-9]' || true

python3 - "$rss_kib" "$SIZE" "$NP" "$EXTRA" "$source" "$vmhwm" "$CODEC" "${cmd[*]}" <<'PY'
import sys
rss_kib, size, np_, extra_target, source, vmhwm, codec, cmd = sys.argv[1:9]
units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
s = size.rstrip("bB")
size_bytes = int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)
ranks = int(np_)
user = 2 * ranks * size_bytes
# Error feedback keeps one buffer per rank by definition (topk, randk, powersgd unless ef=0).
ef = ranks * size_bytes if codec.split(":")[0] in ("topk", "randk", "powersgd") and "ef=0" not in codec else 0
rss = int(rss_kib) * 1024
extra = (rss - user - ef) / ranks / size_bytes
ok = extra <= float(extra_target)
print("command:        %s" % cmd)
print("user buffers:   %.1f MiB (send + recv of %s ranks x %s)" % (user / 2**20, np_, size))
print("error feedback: %.1f MiB" % (ef / 2**20))
print("peak RSS:       %.1f MiB (%s; allreduce_perf's VmHWM line: %s), %.3f x user buffers" % (
    rss / 2**20, source, vmhwm or "n/a", rss / user))
print("extra per rank: %.3f x the buffer size (target <= %s): %s" % (extra, extra_target,
                                                                      "OK" if ok else "OVER TARGET"))
sys.exit(0 if ok else 1)
PY
