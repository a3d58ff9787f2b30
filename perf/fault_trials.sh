#!/usr/bin/env bash
# Fault trials: a rank of 4 processes SIGKILLed at a random moment (during init or mid-collective, exact and
# compressed all-reduces of random sizes), TRIALS times per transport. Every survivor must return ccRemoteError or
# ccTimeout within the timeout, name a peer, and exit cleanly; a rank still running 15 s past the timeout counts as
# a hang. Prints, per transport, the trials passed and how long after the kill the survivors' calls failed.
#
#   perf/fault_trials.sh [build_dir]          TRIALS=50 NRANKS=4 SEED=1 by default
set -euo pipefail
BUILD_DIR=${1:-build}
BIN="$BUILD_DIR/tests/test_peer_death"
TRIALS=${TRIALS:-50}
NRANKS=${NRANKS:-4}
SEED=${SEED:-1}
[ -x "$BIN" ] || { echo "fault_trials.sh: $BIN not found (build with UCX first)" >&2; exit 1; }
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT

status=0
# name | UCX_TLS | extra env | timeout (ms)
for row in "tcp|tcp,self|CC_UCX_ERR_MODE=peer|5000" "shared memory|sysv,self||3000"; do
  IFS='|' read -r name tls extra timeout <<<"$row"
  start=$(date +%s)
  if ! env UCX_TLS="$tls" $extra "$BIN" "$NRANKS" "$timeout" "$TRIALS" "$SEED" >"$LOG/out" 2>"$LOG/err"; then
    status=1
  fi
  secs=$(( $(date +%s) - start ))
  /usr/bin/env python3 - "$LOG/out" "$name" "$timeout" "$secs" <<'PY'
import statistics, sys
path, name, timeout, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
lines = open(path).read().splitlines()
passed = [l for l in lines if l.endswith(": ok")]
failed = [l for l in lines if l.endswith(": FAILED")]
codes = {}
lat = []
for l in lines:
    if l.startswith("detect "):
        _, what, code, t = l.split()
        key = (what, {"6": "ccRemoteError", "8": "ccTimeout"}.get(code, "code " + code))
        codes[key] = codes.get(key, 0) + 1
        lat.append(float(t))
print(f"## {name} (CC_TIMEOUT_MS={timeout}), {len(passed) + len(failed)} trials in {secs} s")
print(f"trials passed: {len(passed)} of {len(passed) + len(failed)}")
for (what, code), k in sorted(codes.items()):
    print(f"survivor errors: {k} x {code} from {what}")
if lat:
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print(f"seconds from the kill to a survivor's error: median {statistics.median(lat):.3f}, p90 {p(0.9):.3f}, "
          f"max {lat[-1]:.3f} (n = {len(lat)})")
PY
  grep -E "HANG|FAILED|exit code|signal" "$LOG/err" "$LOG/out" | head -20 || true
  echo
done
exit $status
