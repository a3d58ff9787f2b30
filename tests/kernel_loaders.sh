#!/usr/bin/env bash
# Every __global__ kernel of src/**/*.cu is loaded by its file's loader (a LoadKernel call naming it), so that
# collectives/device_prepare.h loads them all before a device's first stream wait. The fake CUDA runtime only sees
# that each loader ran, not what it loads: this check covers what it cannot.
#
#   tests/kernel_loaders.sh [SOURCE_DIR]        (exit 0: every kernel has a loader call; 1: the missing ones listed)
set -euo pipefail
src=${1:-$(dirname "$0")/..}/src
missing=0
count=0
while IFS= read -r file; do
  # (A kernel may carry __launch_bounds__(...) between void and its name.)
  kernels=$(grep -oE '__global__[[:space:]]+void[[:space:]]+(__launch_bounds__\([^)]*\)[[:space:]]+)?[A-Za-z_][A-Za-z0-9_]*' \
    "$file" | awk '{print $NF}')
  for kernel in $kernels; do
    count=$((count + 1))
    if ! grep -qE "LoadKernel\\(${kernel}[<,]" "$file"; then
      echo "$file: kernel $kernel has no LoadKernel call in its file's loader"
      missing=1
    fi
  done
done < <(find "$src" -name '*.cu' | sort)
if [ "$count" -eq 0 ]; then
  echo "no kernels found under $src"
  exit 1
fi
[ "$missing" -eq 0 ] && echo "$count kernels, each loaded by its file's loader"
exit "$missing"
