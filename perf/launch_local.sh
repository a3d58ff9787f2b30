#!/usr/bin/env bash
# launch_local.sh: start N processes of one command on this machine as the ranks of one ccoll group, without MPI
# (a small torchrun for benchmarks and tests). Every process gets
#   CC_RANK=<0..N-1>  CC_NRANKS=N  CC_ROOT=127.0.0.1:<a free port>  CC_SECRET=<random, unless already set>
# and ccCommInitFromEnv does the rest (allreduce_perf runs one rank per process when it sees them).
#
#   perf/launch_local.sh [-n N] [-p PORT] [-l LOG_DIR] [--] COMMAND [ARGS...]
#
#   -n N        number of processes (default 4, or $NPROC)
#   -p PORT     bootstrap port on 127.0.0.1 (default: a free one, chosen by the kernel)
#   -l LOG_DIR  write rank r's stdout and stderr to LOG_DIR/rank<r>.log instead of this terminal
#
# Waits for all processes. When one fails, the others (each rank's process group) are sent SIGTERM, since they would
# otherwise wait for it until CC_TIMEOUT_MS, then SIGKILL after $KILL_GRACE seconds (default 5). Exit status: 0 when
# every rank exited 0, else the status of the first failure seen (128+signal for a signal); stderr says which rank.
# Only loopback is used: the ranks all run here.
set -uo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; }

n="${NPROC:-4}" port="" log_dir=""
while getopts ":n:p:l:h" opt; do
  case "$opt" in
    n) n="$OPTARG" ;;
    p) port="$OPTARG" ;;
    l) log_dir="$OPTARG" ;;
    h) usage; exit 0 ;;
    :) echo "launch_local.sh: -$OPTARG needs a value" >&2; exit 2 ;;
    *) echo "launch_local.sh: unknown option -$OPTARG (-h for help)" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ "${1:-}" == "--" ]] && shift
if [[ $# -eq 0 ]]; then
  echo "launch_local.sh: no command given (-h for help)" >&2
  exit 2
fi
if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1)); then
  echo "launch_local.sh: -n must be a positive integer, not \"$n\"" >&2
  exit 2
fi

free_port() {
  # The kernel's choice of an unused port; a tiny race with other programs is possible, and then rank 0's bind fails
  # loudly. Falls back to trying ports while python3 is missing.
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    return
  fi
  local p
  for ((p = 29500 + RANDOM % 20000; ; p = 29500 + RANDOM % 20000)); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}
if [[ -z "$port" ]]; then
  port="$(free_port)" || { echo "launch_local.sh: cannot find a free port" >&2; exit 2; }
fi
if [[ -z "${CC_SECRET:-}" ]]; then
  CC_SECRET="$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
fi
export CC_SECRET
[[ -n "$log_dir" ]] && mkdir -p "$log_dir"

pids=()
rank_of=()
declare -A live=()
signal_rank() {  # signal_rank SIG PID: the rank's process group, or the process alone if it has none of its own
  kill "-$1" -- "-$2" 2>/dev/null || kill "-$1" "$2" 2>/dev/null
}
cleanup() {
  local p
  for p in "${!live[@]}"; do signal_rank TERM "$p"; done
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

# Each rank in its own process group, so that stopping a rank also stops what it started. Not its own session
# (setsid): with the scheduler's autogroups every session is scheduled as one unit, and ranks in different sessions
# that poll and yield (UCX, MPI) then wait whole timeslices for each other on a machine with fewer cores than ranks.
if command -v perl >/dev/null 2>&1; then
  own_group=(perl -e 'setpgrp(0, 0); exec { $ARGV[0] } @ARGV or die "launch_local.sh: cannot run $ARGV[0]: $!\n"')
else
  own_group=()  # the ranks stay in this script's group: SIGTERM reaches them, but not what they started
fi
for ((r = 0; r < n; ++r)); do
  if [[ -n "$log_dir" ]]; then
    CC_RANK=$r CC_NRANKS=$n CC_ROOT="127.0.0.1:$port" "${own_group[@]}" "$@" >"$log_dir/rank$r.log" 2>&1 &
  else
    CC_RANK=$r CC_NRANKS=$n CC_ROOT="127.0.0.1:$port" "${own_group[@]}" "$@" &
  fi
  pids+=($!)
  rank_of[$!]=$r
  live[$!]=1
done

# Poll: bash reaps its children as they end, and `wait PID` then returns the saved status. (`wait -n` loses jobs that
# bash has already reported as killed by a signal.)
status=0
kill_at=0  # after the first failure: when whatever still runs gets SIGKILL
while ((${#live[@]} > 0)); do
  for p in "${!live[@]}"; do
    kill -0 "$p" 2>/dev/null && continue
    wait "$p"
    rc=$?
    unset "live[$p]"
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "launch_local.sh: rank ${rank_of[$p]} (pid $p) exited with status $rc; stopping the others" >&2
      for q in "${!live[@]}"; do signal_rank TERM "$q"; done
      kill_at=$((SECONDS + ${KILL_GRACE:-5}))
    fi
  done
  if ((kill_at > 0 && SECONDS >= kill_at)); then
    for p in "${!live[@]}"; do
      echo "launch_local.sh: rank ${rank_of[$p]} (pid $p) ignored SIGTERM for ${KILL_GRACE:-5} s; sending SIGKILL" >&2
      signal_rank KILL "$p"
    done
    kill_at=0
  fi
  ((${#live[@]} > 0)) && sleep 0.05
done
exit "$status"
