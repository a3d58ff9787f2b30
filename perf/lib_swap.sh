# shellcheck shell=bash
# lib_swap.sh (sourced): for the scripts that run NEW's perf binaries with OLD's libccoll swapped in through
# LD_LIBRARY_PATH (compare_small_mpi.sh, netbench/compare_builds.sh).
#
#   lib_swap_check SCRIPT NEW_BUILD OLD_PATH NEW_PATH BIN
#     returns 1, saying why on stderr, unless NEW_BUILD/perf/BIN loads OLD's library with LD_LIBRARY_PATH=OLD_PATH
#     (whose first folder holds that library) and NEW_BUILD/src's with NEW_PATH: a binary with an RPATH, or a
#     libccoll installed on the path, would run one library on both sides.
#   lib_swap_describe BUILD_DIR
#     the commit of the checkout above BUILD_DIR (git describe), or ?, for the table's header
lib_swap_check() {
  local script="$1" new="$2" old_path="$3" new_path="$4" bin="$5" which want path loaded
  for which in old new; do
    want="$new/src/libccoll.so.0" path="$new_path"
    [ "$which" = old ] && want="${old_path%%:*}/libccoll.so.0" path="$old_path"
    loaded=$(LD_LIBRARY_PATH="$path" ldd "$new/perf/$bin" 2>&1 | awk '/libccoll[.]so/ {print $3}' || true)
    if [ -z "$loaded" ] || [ "$(realpath "$loaded" 2>/dev/null)" != "$(realpath "$want")" ]; then
      echo "$script: $bin would load '$loaded' for $which, not $want" >&2
      return 1
    fi
  done
}

lib_swap_describe() { git -C "$1/.." describe --always --dirty 2>/dev/null || echo '?'; }
