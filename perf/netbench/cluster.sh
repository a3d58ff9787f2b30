#!/usr/bin/env bash
# cluster.sh: a bandwidth-shaped "cluster" of K hosts on this machine, made of network namespaces. Every host is a
# namespace <prefix>0..<prefix>K-1 with one interface eth0 (address 10.77.0.<k+1>/24) that a veth pair joins to a
# bridge in a namespace <prefix>br; both ends of every veth are shaped with
#   tc qdisc add dev X root tbf rate RATE burst BURST latency 50ms
# so each host has RATE in and RATE out, as behind a switch. Both ends also cap their GSO packets (NB_GSO bytes).
# Addresses exist only inside these namespaces; nothing is created in the machine's own namespace. Everything created
# is deleted again on exit, Ctrl-C, TERM or failure.
#
# Why a 64 KiB burst and 32 KiB GSO packets (perf/netbench/results/2026-12-07_burst.md): tbf's bucket fills while a
# link is idle, up to BURST, and then lets that much through at once, so every idle gap of a link costs up to
# BURST/RATE less than on a real wire (256kb: 2.1 ms at 1 Gbit/s, 64kb: 0.52 ms; a link fed without gaps is not
# affected). The bucket must also hold a whole GSO packet plus the timer's lateness, or the link loses rate: burst
# 64kb with the kernel's 64 KiB packets halved a loaded link, 32kb with 8 KiB packets lost a third, and 64kb with
# 32 KiB packets kept the rate (an exact bf16 all-reduce at 98-99% of its wire-bound time in that sweep, a stream
# beside two busy loops 949 Mbit/s).
#
# As a wrapper (root):
#   perf/netbench/cluster.sh [-k K] [-r RATE] [-b BURST] [-s] [--] [COMMAND [ARGS...]]
#     -k K       hosts (default 4)
#     -r RATE    tc rate of every link, e.g. 1gbit, 500mbit (default 1gbit)
#     -b BURST   tbf burst, at least the MTU and two GSO packets (NB_GSO below; default 64kb)
#     -s         self-check: measure host 0 -> host 1 with iperf3 (or a python3 sender when iperf3 is missing)
#     -c         only delete leftovers of an earlier run that was killed with SIGKILL, then exit
#   COMMAND runs after the cluster is up, with NB_K, NB_PREFIX, NB_NET, NB_RATE exported and the helpers below
#   exported as bash functions, for example
#     perf/netbench/cluster.sh -k 4 -- bash -c 'nb_ranks build/perf/allreduce_perf -b 64M -e 64M'
#   The exit status is COMMAND's (or the self-check's).
#
# As a library: `source perf/netbench/cluster.sh`, then `nb_up K RATE` (installs an EXIT/INT/TERM trap that calls
# nb_down; it replaces the caller's traps on those signals) and the helpers:
#   nb_ns K                 name of host K's namespace
#   nb_addr K               host K's address
#   nb_exec K CMD...        run CMD on host K (ip netns exec)
#   nb_ranks [-n N] [-l LOG_DIR] [--] CMD...
#                           start N (default NB_K) ranks of one ccoll group, rank r on host r % K, with
#                           CC_RANK, CC_NRANKS, CC_ROOT=<host 0>:<port>, CC_SECRET, CC_SOCKET_IFNAME=eth0,
#                           UCX_TLS=tcp,self, UCX_NET_DEVICES=eth0 (shared memory would bypass the shaping); waits
#                           for all; when one fails the others get SIGTERM (then SIGKILL); returns the first failure
#   nb_mpirun NP [MPIRUN_ARGS...] -- CMD...
#                           OpenMPI with one rank per host (rank r on host r % K), TCP over eth0 only (btl self,tcp)
#   nb_selfcheck [SECONDS]  host 0 -> host 1 throughput, printed in Mbit/s
#   nb_down                 kill what still runs in the namespaces and delete them (idempotent)
# Environment: NB_PREFIX (default ccnb), NB_NET (first three octets, default 10.77.0), NB_BURST (default 64kb),
# NB_GSO (default 32768; 0: the kernel's 64 KiB), NB_UCX_TLS (default tcp,self), NB_SELFCHECK_TOOL (auto or python),
# NB_MSG_FD (fd for the interrupt message).
#
# Pitfalls (ENVIRONMENT.md): no netem in this kernel (no delay emulation); tbf burst below the MTU drops everything.

# shellcheck source=SCRIPTDIR/../sizes.sh
source "$(dirname "${BASH_SOURCE[0]}")/../sizes.sh"
NB_PREFIX="${NB_PREFIX:-ccnb}"
NB_NET="${NB_NET:-10.77.0}"
NB_BURST="${NB_BURST:-64kb}"
NB_GSO="${NB_GSO:-32768}"
NB_K="${NB_K:-0}"
NB_RATE="${NB_RATE:-}"
NB_CREATED=()   # namespaces this shell created, deleted by nb_down
NB_TMP=""       # scratch folder (mpirun's agent script), deleted by nb_down

nb_ns() { echo "${NB_PREFIX}$1"; }
# _nb_gso NS DEV: caps DEV's GSO packets at NB_GSO bytes (unless NB_GSO is 0: the kernel's 64 KiB).
_nb_gso() { ((NB_GSO == 0)) || ip -n "$1" link set "$2" gso_max_size "$NB_GSO"; }
# nb_shaper: the shaping of every link in words, for logs and result headers.
nb_shaper() {
  local gso="$NB_GSO bytes"
  ((NB_GSO == 0)) && gso="the kernel's 64 KiB"
  echo "tbf rate ${NB_RATE:-?} burst $NB_BURST, GSO packets at most $gso"
}
nb_addr() { echo "${NB_NET}.$(($1 + 1))"; }
nb_exec() { local k="$1"; shift; ip netns exec "$(nb_ns "$k")" "$@"; }

_nb_log() { echo "cluster.sh: $*" >&2; }

# Kills every process left in namespace $1 (they can only be ours: the namespace is ours), TERM then KILL.
_nb_kill_in() {
  local ns="$1" pids i
  pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
  [[ -z "${pids// /}" ]] && return 0
  # shellcheck disable=SC2086  # (|| true: a process may be gone by now, and a caller's set -e must not end a trap)
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 30; ++i)); do
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    [[ -z "${pids// /}" ]] && return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
  sleep 0.1
}

nb_down() {
  local ns rc=0
  for ns in "${NB_CREATED[@]}"; do _nb_kill_in "$ns"; done
  for ns in "${NB_CREATED[@]}"; do
    if ip netns list | awk '{print $1}' | grep -qx "$ns"; then
      ip netns del "$ns" || { _nb_log "could not delete namespace $ns"; rc=1; }
    fi
  done
  NB_CREATED=()
  [[ -n "$NB_TMP" && -d "$NB_TMP" ]] && rm -rf "$NB_TMP"
  NB_TMP=""
  return "$rc"
}

# Namespaces of this prefix that exist now (leftovers of a run killed with SIGKILL, which no trap can catch).
_nb_existing() { ip netns list | awk '{print $1}' | grep -E "^${NB_PREFIX}([0-9]+|br)\$"; }

nb_clean_stale() {
  local ns
  for ns in $(_nb_existing); do
    _nb_kill_in "$ns"
    ip netns del "$ns" && _nb_log "deleted leftover namespace $ns"
  done
}

NB_CMD_PID=""   # the wrapper's COMMAND, stopped on a signal

_nb_on_signal() {
  trap '' INT TERM
  # (to NB_MSG_FD when set: a caller may have sent stderr to a log while the signal came)
  _nb_log "interrupted: deleting the cluster" 2>&"${NB_MSG_FD:-2}"
  [[ -n "$NB_CMD_PID" ]] && _nb_signal TERM "$NB_CMD_PID"
  nb_down
  trap - EXIT
  exit "$1"
}

# nb_up K RATE: builds the cluster; on any failure deletes what it made and returns 1.
nb_up() {
  local k="${1:-4}" rate="${2:-1gbit}" br i ns
  if ! [[ "$k" =~ ^[0-9]+$ ]] || ((k < 2 || k > 200)); then _nb_log "K must be 2..200, not '$k'"; return 2; fi
  if ((EUID != 0)); then _nb_log "needs root (ip netns, tc)"; return 2; fi
  if ! [[ "$NB_GSO" =~ ^[0-9]+$ ]]; then
    _nb_log "NB_GSO must be a byte count (0: the kernel's), not '$NB_GSO'"
    return 2
  fi
  local burst_bytes packet=$((NB_GSO == 0 ? 65536 : NB_GSO))
  # (A burst in units size_bytes does not read, such as 64kbit, is left to tc unchecked.)
  if burst_bytes="$(size_bytes "$NB_BURST")" && ((burst_bytes < 2 * packet)); then
    _nb_log "warning: burst $NB_BURST holds fewer than two GSO packets of $packet bytes: a loaded link loses rate" \
      "(perf/netbench/results/2026-12-07_burst.md); lower NB_GSO"
  fi
  if [[ -n "$(_nb_existing)" ]]; then
    _nb_log "namespaces with prefix $NB_PREFIX already exist ($(_nb_existing | tr '\n' ' '));" \
      "another run is active, or a killed run left them: delete them with cluster.sh -c, or set NB_PREFIX"
    return 2
  fi
  trap 'nb_down' EXIT
  trap '_nb_on_signal 130' INT
  trap '_nb_on_signal 143' TERM
  NB_K="$k" NB_RATE="$rate"
  NB_TMP="$(mktemp -d /tmp/ccoll_netbench.XXXXXX)" || return 1
  br="${NB_PREFIX}br"
  {
    ip netns add "$br" && NB_CREATED+=("$br") &&
      ip -n "$br" link set lo up &&
      ip -n "$br" link add br0 type bridge &&
      ip -n "$br" link set br0 up
  } || { _nb_log "cannot create the bridge namespace $br"; nb_down; return 1; }
  for ((i = 0; i < k; ++i)); do
    ns="$(nb_ns "$i")"
    {
      ip netns add "$ns" && NB_CREATED+=("$ns") &&
        ip -n "$ns" link set lo up &&
        ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$br" &&
        ip -n "$ns" addr add "$(nb_addr "$i")/24" dev eth0 &&
        _nb_gso "$ns" eth0 && _nb_gso "$br" "p$i" &&
        ip -n "$ns" link set eth0 up &&
        ip -n "$br" link set "p$i" master br0 &&
        ip -n "$br" link set "p$i" up &&
        tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst "$NB_BURST" latency 50ms &&
        tc -n "$br" qdisc add dev "p$i" root tbf rate "$rate" burst "$NB_BURST" latency 50ms
    } || { _nb_log "cannot set up host $i ($ns)"; nb_down; return 1; }
  done
  # Every host reaches every other before anyone is told the cluster is up.
  # (No ping here: a TCP connect to a closed port answered by "connection refused" proves the path both ways. The
  # first tries can fail while the new links come up.)
  local try ok out
  for ((i = 1; i < k; ++i)); do
    ok=0
    for ((try = 0; try < 50 && !ok; ++try)); do
      # (The connect fails by design: `|| true` keeps a caller's `set -e` from ending the shell here.)
      out="$(nb_exec 0 timeout 2 bash -c "exec 3<>/dev/tcp/$(nb_addr "$i")/9" 2>&1)" || true
      if [[ "$out" == *refused* ]]; then ok=1; else sleep 0.1; fi
    done
    if ((!ok)); then
      _nb_log "host 0 cannot reach host $i at $(nb_addr "$i")"
      nb_down
      return 1
    fi
  done
  _nb_log "up: $k hosts ${NB_PREFIX}0..${NB_PREFIX}$((k - 1)) at ${NB_NET}.1..$k/24, every link $(nb_shaper)"
  export NB_K NB_PREFIX NB_NET NB_RATE NB_BURST NB_GSO
}

# nb_cpu: this machine's CPU in one line, for a run's header: results from two CPUs do not compare, in time nor in
# bits (torch picks its kernels by the CPU's vector extensions, and they round differently).
nb_cpu() {
  local model family mdl avx512=no
  model=$(sed -n 's/^model name[[:space:]]*: //p;T;q' /proc/cpuinfo)
  family=$(sed -n 's/^cpu family[[:space:]]*: //p;T;q' /proc/cpuinfo)
  mdl=$(sed -n 's/^model[[:space:]]*: //p;T;q' /proc/cpuinfo)
  grep -q -m1 -w avx512f /proc/cpuinfo && avx512=yes
  echo "${model:-unknown}, family ${family:-?} model ${mdl:-?}, AVX-512 $avx512"
}

# nb_selfcheck [SECONDS]: host 0 sends to host 1; prints "<Mbit/s>" on stdout (the tool's own output on stderr).
nb_selfcheck() {
  local secs="${1:-3}" mbit
  if [[ "${NB_SELFCHECK_TOOL:-auto}" != python ]] && command -v iperf3 >/dev/null 2>&1; then
    nb_exec 1 iperf3 -s -1 -B "$(nb_addr 1)" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    mbit="$(nb_exec 0 iperf3 -c "$(nb_addr 1)" -t "$secs" -J 2>/dev/null |
      /usr/bin/python3 -c 'import json,sys; print("%.0f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6))')"
    wait "$srv" 2>/dev/null
    _nb_log "self-check (iperf3, ${secs} s): host 0 -> host 1 ${mbit:-?} Mbit/s"
  else
    # Fallback: a python3 sender and receiver; the receiver times the bytes it got.
    nb_exec 1 /usr/bin/python3 - "$(nb_addr 1)" >"$NB_TMP/selfcheck" <<'PY' &
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 5201)); s.listen(1)
c, _ = s.accept(); n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.time()
    n += len(b)
print("%.0f" % (n * 8 / (time.time() - t0) / 1e6))
PY
    local srv=$!
    sleep 0.5
    nb_exec 0 /usr/bin/python3 - "$(nb_addr 1)" "$secs" <<'PY'
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5201)); buf = b"\0" * (1 << 20); end = time.time() + float(sys.argv[2])
while time.time() < end: c.sendall(buf)
c.close()
PY
    wait "$srv"
    mbit="$(cat "$NB_TMP/selfcheck")"
    _nb_log "self-check (python3 sockets, ${secs} s): host 0 -> host 1 ${mbit:-?} Mbit/s"
  fi
  [[ -n "$mbit" ]] || return 1
  echo "$mbit"
}

# Sends signal $1 to rank process $2 and its process group.
_nb_signal() { kill "-$1" -- "-$2" 2>/dev/null || kill "-$1" "$2" 2>/dev/null; }

nb_ranks() {
  local n="$NB_K" log_dir="" OPTIND=1 opt
  while getopts ":n:l:" opt; do
    case "$opt" in
      n) n="$OPTARG" ;;
      l) log_dir="$OPTARG" ;;
      *) _nb_log "nb_ranks: unknown option -$OPTARG"; return 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  [[ "${1:-}" == "--" ]] && shift
  if (($# == 0)); then _nb_log "nb_ranks: no command"; return 2; fi
  if ((NB_K < 2)); then _nb_log "nb_ranks: the cluster is not up (nb_up)"; return 2; fi
  [[ -n "$log_dir" ]] && mkdir -p "$log_dir"
  local port=$((20000 + RANDOM % 30000)) secret r p rc status=0 kill_at=0
  secret="${CC_SECRET:-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')}"
  local -a pids=() own_group=()
  local -A live=() rank_of=()
  # Each rank in its own process group (not its own session: see perf/launch_local.sh on autogroups).
  if command -v perl >/dev/null 2>&1; then
    # shellcheck disable=SC2016
    own_group=(perl -e 'setpgrp(0, 0); exec { $ARGV[0] } @ARGV or die "nb_ranks: cannot run $ARGV[0]: $!\n"')
  fi
  for ((r = 0; r < n; ++r)); do
    local env_r=(env CC_RANK="$r" CC_NRANKS="$n" CC_ROOT="$(nb_addr 0):$port" CC_SECRET="$secret"
      CC_SOCKET_IFNAME=eth0 UCX_TLS="${NB_UCX_TLS:-tcp,self}" UCX_NET_DEVICES=eth0)
    if [[ -n "$log_dir" ]]; then
      ip netns exec "$(nb_ns $((r % NB_K)))" "${own_group[@]}" "${env_r[@]}" "$@" >"$log_dir/rank$r.log" 2>&1 &
    else
      ip netns exec "$(nb_ns $((r % NB_K)))" "${own_group[@]}" "${env_r[@]}" "$@" &
    fi
    p=$!
    pids+=("$p")
    rank_of[$p]=$r
    live[$p]=1
  done
  while ((${#live[@]} > 0)); do
    for p in "${!live[@]}"; do
      kill -0 "$p" 2>/dev/null && continue
      wait "$p"
      rc=$?
      unset "live[$p]"
      if ((rc != 0 && status == 0)); then
        status=$rc
        _nb_log "rank ${rank_of[$p]} (pid $p) exited with status $rc; stopping the others"
        local q
        for q in "${!live[@]}"; do _nb_signal TERM "$q"; done
        kill_at=$((SECONDS + 5))
      fi
    done
    if ((kill_at > 0 && SECONDS >= kill_at)); then
      for p in "${!live[@]}"; do _nb_signal KILL "$p"; done
      kill_at=0
    fi
    ((${#live[@]} > 0)) && sleep 0.05
  done
  return "$status"
}

# nb_mpirun NP [MPIRUN_ARGS...] -- CMD...: mpirun itself runs on host 0; every rank's orted is started in its host's
# namespace by an rsh agent, with its own hostname (so that OpenMPI sees K nodes and never uses shared memory).
nb_mpirun() {
  local np="$1" i hosts=""
  shift
  local -a margs=()
  while (($# > 0)) && [[ "$1" != "--" ]]; do margs+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] && shift
  if (($# == 0)); then _nb_log "nb_mpirun: no command"; return 2; fi
  local agent="$NB_TMP/rsh_agent.sh"
  cat >"$agent" <<'SH'
#!/bin/sh
# mpirun's plm_rsh_agent: "agent HOST CMD..." starts CMD in namespace HOST, under the hostname HOST.
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
SH
  chmod +x "$agent"
  for ((i = 0; i < np; ++i)); do hosts+="${hosts:+,}$(nb_ns $((i % NB_K)))"; done
  # In the background and waited for, so that a signal trap of the caller runs at once; that trap (nb_down) stops
  # mpirun with everything else that runs in the namespaces.
  # shellcheck disable=SC2016
  ip netns exec "$(nb_ns 0)" unshare --uts sh -c 'hostname "$0" && exec "$@"' "${NB_PREFIX}mpirun" \
    env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np "$np" --host "$hosts" --mca plm_rsh_agent "$agent" \
    --mca oob_tcp_if_include "${NB_NET}.0/24" --mca pml ob1 --mca btl self,tcp \
    --mca btl_tcp_if_include "${NB_NET}.0/24" "${margs[@]}" "$@" &
  local mp=$!
  wait "$mp"
}

_nb_main() {
  local k=4 rate=1gbit selfcheck=0 clean=0 opt
  while getopts ":k:r:b:sch" opt; do
    case "$opt" in
      k) k="$OPTARG" ;;
      r) rate="$OPTARG" ;;
      b) NB_BURST="$OPTARG" ;;
      s) selfcheck=1 ;;
      c) clean=1 ;;
      h) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"; return 0 ;;
      *) _nb_log "unknown option -$OPTARG (-h for help)"; return 2 ;;
    esac
  done
  shift $((OPTIND - 1))
  [[ "${1:-}" == "--" ]] && shift
  if ((clean)); then nb_clean_stale; return 0; fi
  nb_up "$k" "$rate" || return $?
  local status=0
  if ((selfcheck)); then nb_selfcheck 3 >/dev/null || status=1; fi
  if (($# > 0)); then
    export -f nb_ns nb_addr nb_exec nb_ranks nb_mpirun nb_selfcheck _nb_log _nb_signal
    export NB_TMP
    # In the background so that the signal traps run at once (bash defers them while a foreground child runs).
    "$@" <&0 &
    NB_CMD_PID=$!
    wait "$NB_CMD_PID"
    status=$?
    NB_CMD_PID=""
  fi
  nb_down || status=1
  trap - EXIT INT TERM
  return "$status"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  _nb_main "$@"
  exit $?
fi
