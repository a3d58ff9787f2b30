#!/usr/bin/env bash
# The test command: sets up and builds (scripts/setup.sh), runs every test with ctest, then installs ccoll into
# a prefix and builds + runs a program outside the build tree against it, through find_package(ccoll) and through
# pkg-config, as a user's project would.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
scripts/setup.sh

echo "== ctest"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 600)

echo "== installed package"
PREFIX="$(cd "$BUILD_DIR" && pwd)/install-test"  # BUILD_DIR may be relative or absolute
rm -rf "$PREFIX" "$BUILD_DIR/consumer"
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
cmake -S examples/installed_consumer -B "$BUILD_DIR/consumer" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
cmake --build "$BUILD_DIR/consumer" >/dev/null
LD_LIBRARY_PATH="$PREFIX/lib" "$BUILD_DIR/consumer/consumer"
PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" cc examples/installed_consumer/main.c \
  $(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags --libs ccoll) -o "$BUILD_DIR/consumer/consumer_pc"
LD_LIBRARY_PATH="$PREFIX/lib" "$BUILD_DIR/consumer/consumer_pc"
echo "== all tests passed"
