# shellcheck shell=bash
# sizes.sh (sourced): sizes as the perf programs and tc read them, for the scripts (compare_mpi.sh,
# netbench/allreduce_bench.sh, netbench/cluster.sh's burst check).
#
#   size_bytes SIZE
#     prints SIZE in bytes: digits, then k, m or g (1024-based, either case), then an optional b (64M, 64mb, 65536);
#     returns 1, printing nothing, for anything else (1.5M, 64kbit)
size_bytes() {
  [[ "$1" =~ ^([0-9]+)([kKmMgG]?)[bB]?$ ]] || return 1
  local m=1
  case "${BASH_REMATCH[2]}" in
    k | K) m=1024 ;;
    m | M) m=$((1024 * 1024)) ;;
    g | G) m=$((1024 * 1024 * 1024)) ;;
  esac
  echo $((10#${BASH_REMATCH[1]} * m))
}
