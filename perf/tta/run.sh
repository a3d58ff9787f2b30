#!/usr/bin/env bash
# perf/tta/run.sh: time-to-accuracy of data-parallel training through ccoll on a bandwidth-shaped cluster.
#
# Builds a cluster of 4 network namespaces joined by 1 Gbit/s tbf-shaped links (perf/netbench/cluster.sh, prefix
# cctta, addresses 10.78.0.x, so it never collides with perf/netbench's ccnb / 10.77.0), then trains
# examples/train_ddp.py with one rank per namespace once per codec, one run after the other, all with the same seed,
# steps and schedule. Every run's JSON-lines log goes to OUT/<name>.jsonl (rank 0) and the ranks' output to
# OUT/logs/<name>/rank<r>.log; at the end perf/tta/plot.py draws OUT/tta.png (test accuracy vs training wall time)
# and writes OUT/tta.md (time to target, speedup and accuracy delta vs the bf16 baseline).
#
#   perf/tta/run.sh [BUILD_DIR]          (root; BUILD_DIR holds src/libccoll.so, default build-tta)
#
# Environment:
#   CODECS   names of the runs, in order (default "bf16 q4r q2r psgd4 topk1"); a name is one of the table below or
#            NAME=SPEC for any codec argument of train_ddp.py (e.g. "q3r=quant:bits=3,mode=requant")
#   STEPS    training steps of every run (default 600); TARGET target accuracy (default 0.95); EVAL_EVERY (default 25)
#   RATE     tc rate of every link (default 1gbit); K hosts = ranks (default 4)
#   OUT      result folder (default perf/tta/results); TRAIN_ARGS extra arguments for train_ddp.py
#   MAX_TIME seconds of training after which a run stops early (default 600)
#   WAIT_IDLE=1 (default): before each run, wait until no process matching FOREIGN (default perf/netbench's
#            allreduce_bench.sh and perf/soak) has run for QUIET seconds (default 60): on 2 cores timed runs disturb
#            each other. A run during which one ran anyway is run again (at most RETRIES times, default 1) and
#            flagged in OUT/run_info.txt when it stays disturbed.
#
# The baseline is "bf16": the float32 gradient bucket rounded to bfloat16 and all-reduced exactly by ccoll (bf16 on
# the wire), the same baseline as perf/netbench's "ccoll bf16". "none" (DDP's own gloo all-reduce, float32) is
# available but slow at 1 Gbit/s (~4x the bf16 wire bytes plus gloo's own overhead) and is not run by default.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build-tta}" && pwd)" || exit 2
LIB="$BUILD/src/libccoll.so"
[[ -f "$LIB" ]] || { echo "run.sh: $LIB not found (cmake --build $BUILD --target ccoll)" >&2; exit 2; }
CODECS="${CODECS:-bf16 q4r q2r psgd4 topk1}"
STEPS="${STEPS:-600}"
TARGET="${TARGET:-0.95}"
EVAL_EVERY="${EVAL_EVERY:-25}"
RATE="${RATE:-1gbit}"
K="${K:-4}"
MAX_TIME="${MAX_TIME:-600}"
OUT="${OUT:-$ROOT/perf/tta/results}"
TRAIN_ARGS="${TRAIN_ARGS:-}"
PY=/usr/bin/python3  # Debian's python with torch; the python3 first on PATH may have none

declare -A SPEC=(
  [none]=none [bf16]=bf16 [cast16]=cast16
  [q8r]="quant:bits=8,mode=requant" [q4r]="quant:bits=4,mode=requant" [q2r]="quant:bits=2,mode=requant"
  [q4h]="quant:bits=4,mode=homomorphic" [q2h]="quant:bits=2,mode=homomorphic"
  [topk1]="topk:density=0.01" [randk1]="randk:density=0.01"
  [psgd4]="powersgd:rank=4" [psgd8]="powersgd:rank=8"
)

WAIT_IDLE="${WAIT_IDLE:-1}"
FOREIGN="${FOREIGN:-allreduce_bench[.]sh|perf/soak}"
RETRIES="${RETRIES:-1}"

foreign() { pgrep -f "$FOREIGN" >/dev/null; }
# Waits until no foreign benchmark has run for QUIET seconds in a row.
wait_idle() {
  ((WAIT_IDLE)) || return 0
  local quiet=0 said=0
  while ((quiet < ${QUIET:-60})); do
    if foreign; then
      ((said)) || echo "run.sh: another benchmark runs ($(pgrep -af "$FOREIGN" | head -1 | cut -c1-80)); waiting ($(date -u +%H:%M:%S))" >&2
      said=1 quiet=0
    else
      quiet=$((quiet + 5))
    fi
    sleep 5
  done
}

# train_ddp.py's data and model: Debian's python3-sklearn (not installed by scripts/setup.sh) and python3-torch.
if ! "$PY" -c 'import sklearn, torch' 2>/dev/null; then
  echo "run.sh: $PY cannot import sklearn and torch: apt-get install python3-sklearn python3-torch" >&2
  exit 2
fi

wait_idle
export NB_PREFIX=cctta NB_NET=10.78.0
# shellcheck source=../netbench/cluster.sh
source "$ROOT/perf/netbench/cluster.sh"
nb_up "$K" "$RATE" || exit 1  # from here on an EXIT/INT/TERM trap deletes the namespaces

mkdir -p "$OUT/logs"
mbit="$(nb_selfcheck 3 2>/dev/null)"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
  echo "hosts: $K, link rate: $RATE ($(nb_shaper)), host 0 -> host 1 self-check: ${mbit:-?} Mbit/s"
  echo "cpus: $(nproc) ($(nb_cpu)), load before the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
  # The BLAS torch links (libblas.so.3): OpenBLAS picks its kernels by the CPU, and torch's products round as they do.
  echo "blas: $("$PY" -c 'import ctypes, ctypes.util
try:
    b = ctypes.CDLL("libblas.so.3")
    b.openblas_get_config.restype = ctypes.c_char_p
    print(b.openblas_get_config().decode())
except (OSError, AttributeError):
    print("not OpenBLAS, or none:", ctypes.util.find_library("blas"))' 2>/dev/null || echo unknown)"
  echo "steps: $STEPS, target: $TARGET, eval every: $EVAL_EVERY, extra args: ${TRAIN_ARGS:-none}"
  echo "codecs: $CODECS"
} | tee "$OUT/run_info.txt"

export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" CCOLL_LIBRARY="$LIB"
status=0
order=()
for entry in $CODECS; do
  name="${entry%%=*}"
  if [[ "$entry" == *=* && -z "${SPEC[$name]:-}" ]]; then spec="${entry#*=}"; else spec="${SPEC[$name]:-}"; fi
  [[ -n "$spec" ]] || { echo "run.sh: unknown codec name $name (give NAME=SPEC)" >&2; status=2; continue; }
  for ((try = 0; try <= RETRIES; ++try)); do
    rm -rf "${OUT:?}/logs/$name" "$OUT/$name.jsonl"
    wait_idle
    echo "== $name ($spec): $(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/run_info.txt" >&2
    # A sampler notes whether a foreign benchmark ran at any time during this run.
    rm -f "$OUT/.disturbed"
    (while kill -0 $$ 2>/dev/null; do foreign && touch "$OUT/.disturbed"; sleep 3; done) &
    sampler=$!
    # torch.distributed (gloo) meets at host 0 on CC_ROOT's port + 1 (train_ddp.py's default); GLOO_SOCKET_IFNAME
    # keeps gloo on the shaped eth0.
    # shellcheck disable=SC2086
    nb_ranks -l "$OUT/logs/$name" -- env MASTER_ADDR="$(nb_addr 0)" GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
      "$PY" "$ROOT/examples/train_ddp.py" --codec "$spec" --max-steps "$STEPS" --target "$TARGET" \
      --eval-every "$EVAL_EVERY" --max-time "$MAX_TIME" --log "$OUT/$name.jsonl" $TRAIN_ARGS
    rc=$?
    kill "$sampler" 2>/dev/null
    wait "$sampler" 2>/dev/null
    [[ -e "$OUT/.disturbed" ]] || break
    rm -f "$OUT/.disturbed"
    echo "   WARNING: another benchmark ran during $name: its timing is disturbed$( ((try < RETRIES)) &&
      echo "; running it again")" | tee -a "$OUT/run_info.txt" >&2
  done
  if ((rc != 0)); then
    echo "run.sh: $name failed (status $rc); last lines of rank 0:" >&2
    tail -n 5 "$OUT/logs/$name/rank0.log" >&2
    status=$rc
  else
    tail -n 1 "$OUT/logs/$name/rank0.log" >&2
    order+=("$name")
  fi
done
nb_down
trap - EXIT INT TERM

if ((${#order[@]} > 0)); then
  "$PY" "$ROOT/perf/tta/plot.py" --baseline bf16 --target "$TARGET" "$OUT" "${order[@]}" || status=1
fi
exit "$status"
