#!/usr/bin/env bash
# compare_builds.sh: the same all-reduce rows on two builds of ccoll, side by side in one run, to tell a change in the
# code from the machine's noise (this machine is shared: one build's numbers from another day do not compare). Every
# row all-reduces float32 gradients on NP thread ranks of one process (local transport: the CPU-side schedule and
# codec, no network); the bf16 baseline row takes the same elements as bfloat16. Rounds alternate which build runs
# first; the table gives each build's median time and the ratio, with every round's time so the spread shows.
#
#   perf/compare_builds.sh OLD_BUILD_DIR NEW_BUILD_DIR
#
# Each directory is a configured and built build directory (its perf/allreduce_perf runs). To build an older commit
# next to the current one:
#   git worktree add /tmp/old <commit> && cmake -S /tmp/old -B /tmp/old/build -DCMAKE_BUILD_TYPE=Release \
#     -DCCOLL_BUILD_TESTS=OFF && cmake --build /tmp/old/build --target allreduce_perf
# (Configure both builds alike, CUDA on or off in both: a CUDA build checks where each buffer lives.) Each build runs
# its own allreduce_perf, so a ratio holds changes to the harness too. The rows run with -c 0: timing only, no check
# of the results (allreduce_perf's default check, or the tests, judge those).
#
# Then, with BITS=1 (the default), whether the two libraries compute the same bits: NEW's allreduce_perf runs each
# row once more with its check on (-c 1: a fresh state, fresh inputs, the output checked against the fp64 reference
# and across ranks), linked at run time (LD_LIBRARY_PATH) first to OLD's libccoll and then to NEW's, so only the
# library differs; the table gives rank 0's result hash from each. A codec's state over many calls (error feedback,
# warm start) is not covered: the check is one call from a fresh state. Exit status 3 when some codec's bits differ.
#
# Environment: NP [4] BYTES [64M: float32 gradient bytes per row] ROUNDS [5; 0: the bits only, and OLD then needs
#   only its library, src/libccoll.so.0 (`--target ccoll`)] ITERS [5] BITS [1]
#   CODECS ["bf16 q4r q2h topk randk powersgd"]: bf16 (the baseline), f32, cast16, q<bits>r / q<bits>h (quant
#   requant / homomorphic), topk, randk, powersgd (rank 4). OPENBLAS_NUM_THREADS defaults to 1 (one BLAS thread per
#   rank, as perf/netbench does).
set -euo pipefail

if [ $# -ne 2 ]; then
  awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0" >&2
  exit 2
fi
old="$1/perf/allreduce_perf" new="$2/perf/allreduce_perf"
NP="${NP:-4}" BYTES="${BYTES:-64M}" ROUNDS="${ROUNDS:-5}" ITERS="${ITERS:-5}" BITS="${BITS:-1}"
CODECS="${CODECS:-bf16 q4r q2h topk randk powersgd}"
((ROUNDS > 0)) || [ "$BITS" = 1 ] || { echo "compare_builds.sh: ROUNDS=0 and BITS=0: nothing to do" >&2; exit 2; }
bins=("$new")
((ROUNDS > 0)) && bins=("$old" "$new")  # the bits pass runs NEW's harness only
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "compare_builds.sh: $b not found (build the allreduce_perf target)" >&2; exit 2; }
done
[ "$BITS" != 1 ] || [ -e "$1/src/libccoll.so.0" ] || { echo "compare_builds.sh: no $1/src/libccoll.so.0" >&2; exit 2; }
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
PY="${PY:-python3}"

bytes=$(numfmt --from=iec "$BYTES")
row_args() {  # codec -> allreduce_perf arguments
  case "$1" in
    bf16) echo "-d bfloat16 -b $((bytes / 2)) -e $((bytes / 2))" ;;
    f32) echo "-d float -b $bytes -e $bytes" ;;
    cast16) echo "-d float -z cast16 -b $bytes -e $bytes" ;;
    q[0-9]r) echo "-d float -z quant:bits=${1:1:1},mode=requant -b $bytes -e $bytes" ;;
    q[0-9]h) echo "-d float -z quant:bits=${1:1:1},mode=homomorphic -b $bytes -e $bytes" ;;
    topk | randk) echo "-d float -z $1 -b $bytes -e $bytes" ;;
    powersgd) echo "-d float -z powersgd:rank=4 -b $bytes -e $bytes" ;;
    *) echo "compare_builds.sh: unknown codec '$1'" >&2; return 1 ;;
  esac
}
for c in $CODECS; do row_args "$c" >/dev/null; done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
times="$tmp/times.txt"
: >"$times"
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; ++round)); do
  order="old new"
  ((round % 2 == 0)) && order="new old"
  for c in $CODECS; do
    for which in $order; do
      bin="$old"
      [ "$which" = new ] && bin="$new"
      # shellcheck disable=SC2046
      if ! "$bin" -t "$NP" $(row_args "$c") -o sum -a auto -n "$ITERS" -w 1 -c 0 -D iid -J "$tmp/row.json" \
        >"$tmp/row.log" 2>&1; then
        echo "compare_builds.sh: $c on the $which build failed:" >&2
        tail -5 "$tmp/row.log" >&2
        exit 1
      fi
      if ! "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))[0]; print(sys.argv[2], sys.argv[3],
r["time_us"] / 1e3)' "$tmp/row.json" "$c" "$which" >>"$times"; then
        echo "compare_builds.sh: no time in the $which build's report for $c ($tmp/row.json)" >&2
        exit 1
      fi
    done
  done
  echo "compare_builds.sh: round $round/$ROUNDS done" >&2
done
load_end="$(cut -d' ' -f1-3 /proc/loadavg)"

# The same bits? NEW's harness on each library in turn.
bits="$tmp/bits.txt"
: >"$bits"
if [ "$BITS" = 1 ]; then
  for which in old new; do
    libdir="$1/src"
    [ "$which" = new ] && libdir="$2/src"
    # Ahead of the caller's path, not instead of it: CUDA or UCX may be found through it.
    libpath="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    loaded=$(LD_LIBRARY_PATH="$libpath" ldd "$new" 2>&1 | awk '/libccoll[.]so/ {print $3}' || true)
    want=$(realpath "$libdir/libccoll.so.0" 2>/dev/null)
    if [ -z "$loaded" ] || [ "$(realpath "$loaded" 2>/dev/null)" != "$want" ]; then
      echo "compare_builds.sh: $new would load '$loaded', not $libdir/libccoll.so.0" >&2
      exit 1
    fi
    for c in $CODECS; do
      # shellcheck disable=SC2046
      if ! LD_LIBRARY_PATH="$libpath" "$new" -t "$NP" $(row_args "$c") -o sum -a auto -n 1 -w 0 -c 1 -D iid \
        -J "$tmp/bits.json" >"$tmp/bits.log" 2>&1; then
        echo "compare_builds.sh: the check of $c on the $which library failed:" >&2
        tail -5 "$tmp/bits.log" >&2
        exit 1
      fi
      if ! "$PY" -c 'import json, re, sys; h = json.load(open(sys.argv[1]))[0]["result_hash"]
assert isinstance(h, str) and re.fullmatch("[0-9a-f]{16}", h), h
print(sys.argv[2], sys.argv[3], h)' "$tmp/bits.json" "$c" "$which" >>"$bits"; then
        echo "compare_builds.sh: no result hash in the $which library's report for $c ($tmp/bits.json)" >&2
        exit 1
      fi
    done
  done
  echo "compare_builds.sh: result bits done" >&2
fi

commit_of() {  # the commit a build directory was configured from, where its source is a git checkout
  local src
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt" 2>/dev/null)
  git -C "${src:-$1}" rev-parse --short HEAD 2>/dev/null || echo "unknown commit"
}
CB_OLD="$1 ($(commit_of "$1"))" CB_NEW="$2 ($(commit_of "$2"))"
export CB_OLD CB_NEW CB_LOAD_START="$load_start" CB_LOAD_END="$load_end" CB_NP="$NP" CB_BYTES="$BYTES" \
  CB_ROUNDS="$ROUNDS"
status=0
"$PY" - "$times" "$CODECS" "$bits" <<'PY' || status=$?
import collections, os, statistics, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    codec, which, ms = line.split()
    t[(codec, which)].append(float(ms))
h = {}
for line in open(sys.argv[3]):
    codec, which, digest = line.split()
    h[(codec, which)] = digest
e = os.environ
if t:
    print("# Side by side: %s thread ranks, %s of float32 gradients per row (bf16: the same elements), %s rounds"
          % (e["CB_NP"], e["CB_BYTES"], e["CB_ROUNDS"]))
else:
    print("# Result bits: %s thread ranks, %s of float32 gradients per row (bf16: the same elements)"
          % (e["CB_NP"], e["CB_BYTES"]))
print()
print("- old: " + e["CB_OLD"])
print("- new: " + e["CB_NEW"])
print("- load average (1, 5, 15 min): %s at start, %s at end; OPENBLAS_NUM_THREADS=%s"
      % (e["CB_LOAD_START"], e["CB_LOAD_END"], e["OPENBLAS_NUM_THREADS"]))
print()
if t:
    print("| codec | old median (ms) | new median (ms) | new / old | old, each round | new, each round |")
    print("|---|---:|---:|---:|---|---|")
    for c in sys.argv[2].split():
        o, n = t[(c, "old")], t[(c, "new")]
        mo, mn = statistics.median(o), statistics.median(n)
        each = lambda v: " ".join("%.1f" % x for x in v)
        print(f"| {c} | {mo:.1f} | {mn:.1f} | {mn / mo:.3f} | {each(o)} | {each(n)} |")
if h:
    if t:
        print()
    print("Result bits (NEW's allreduce_perf -c 1 on each library; rank 0's output hash, one call from a fresh state):")
    print()
    print("| codec | same bits | old library | new library |")
    print("|---|---|---|---|")
    for c in sys.argv[2].split():
        o, n = h[(c, "old")], h[(c, "new")]
        print(f"| {c} | {'yes' if o == n else '**no**'} | {o} | {n} |")
    if any(h[(c, "old")] != h[(c, "new")] for c in sys.argv[2].split()):
        sys.exit(3)
PY
exit "$status"
