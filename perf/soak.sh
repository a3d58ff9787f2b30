#!/usr/bin/env bash
# The soak of issue 8 (item 7): 10,000 mixed all-reduces on 4 thread ranks, or on PROCS processes over UCX (sizes
# log-uniform in 1..4M elements; exact in 6 datatypes x 5 ops, and cast16, quant 4-bit requant, quant 8-bit
# homomorphic, topk, randk, powersgd:rank=2; ring, tree and auto communicators), every exact result checked against
# its reference, every compressed one finite and byte-identical on all ranks; resident memory and open descriptors
# every 500 calls, flat after the warm-up (call 1000) in every process: no later sample above the one at call 1000 by
# more than 5% + 16 MiB (RSS), or at all (fds). Prints the table and the verdict; exits non-zero on any failure.
# PROCS: 2, 4 or 8.
#
#   perf/soak.sh [build dir] [soak options, e.g. -n 2000 -S 7]
#   PROCS=4 perf/soak.sh [build dir] [...]     # 4 processes (perf/launch_local.sh), UCX_TLS default tcp,self
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true
if [ ! -x "$BUILD_DIR/perf/soak" ]; then
  cmake --build "$BUILD_DIR" --target soak
fi
start=$(date +%s)
if [ "${PROCS:-0}" -gt 0 ]; then
  UCX_TLS="${UCX_TLS:-tcp,self}" perf/launch_local.sh -n "$PROCS" "$BUILD_DIR/perf/soak" -P -n 10000 -m 4194304 \
    -s 500 -w 1000 "$@"
else
  "$BUILD_DIR/perf/soak" -n 10000 -t 4 -m 4194304 -s 500 -w 1000 "$@"
fi
echo "# wall time $(( $(date +%s) - start )) s"
