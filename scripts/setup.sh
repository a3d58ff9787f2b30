#!/usr/bin/env bash
# Installs ccoll's dependencies (Debian packages; needs root or sudo) when they are missing, then configures and
# builds ccoll in ${BUILD_DIR:-build}. Safe to run again: it only does what is left to do.
#
#   scripts/setup.sh            # Release build with tests, perf binaries and examples
#   BUILD_TYPE=Debug scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}

# catch2: tests; libopenmpi-dev/openmpi-bin: MPI launch and the MPI_Allreduce comparison; libucx-dev/ucx-utils:
# the UCX transport; libopenblas-dev: CPU GEMMs (low-rank compression); libisal-dev: CRC32C (CC_CHECKSUM);
# ninja-build: fast builds; python3-numpy and python3-torch (Debian's torch 1.13, CPU; about 90 s and 830 MB): the
# Python binding's tests and the DDP hook.
# Never libcub-dev: it shadows the CUDA toolkit's CUB (see shared/ENVIRONMENT.md).
PACKAGES="cmake g++ pkg-config ninja-build catch2 libopenmpi-dev openmpi-bin libucx-dev ucx-utils libopenblas-dev
          libisal-dev time python3-numpy python3-torch"
missing=""
for p in $PACKAGES; do
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== installing:$missing"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

LAUNCHER=""
command -v ccache >/dev/null 2>&1 && LAUNCHER="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE" $LAUNCHER ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
