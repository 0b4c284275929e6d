#!/usr/bin/env bash
# Builds and runs the whole test suite on a Debian 12 machine:
#   1. release build (warnings as errors) and its tests,
#   2. pmap used from other projects: find_package and pkg-config on the installed package,
#      add_subdirectory, FetchContent, the Debian package from CPack (scripts/consumers.sh),
#   3. an aarch64 cross build of the device-layer tests, run under qemu (scripts/aarch64.sh),
#   4. an ASan + UBSan build of the tests and its tests,
#   5. a ThreadSanitizer build of the tests and its tests.
# Installs missing Debian packages first. Exits non-zero on the first failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
source scripts/install-deps.sh

jobs="$(nproc)"
start=${SECONDS}
current_step="start"
step() {
  current_step="$1"
  printf '\n=== pmap: %s (%ds)\n' "$1" $((SECONDS - start))
}
work="$(mktemp -d)"
finish() {
  local rc=$?
  rm -rf "${work}"
  if ((rc != 0)); then
    echo "pmap: FAILED during '${current_step}' (exit ${rc}) after $((SECONDS - start))s" >&2
  fi
}
trap finish EXIT

# cmake, failing when a -D variable was not used (a misspelled option silently does
# nothing otherwise). CMake warns about such variables by default; this makes it fatal.
configure() {
  local log="${work}/configure.log"
  cmake "$@" 2>&1 | tee "${log}"
  if grep -q "Manually-specified variables were not used" "${log}"; then
    echo "pmap: configure was given a variable it does not use (see above)" >&2
    return 1
  fi
}

step "installing missing packages"
pmap_install_deps

step "release: configure and build"
configure --preset ci-release
cmake --build --preset ci-release --parallel "${jobs}"

step "release: tests"
ctest --preset ci-release --parallel "${jobs}"

step "consumers: find_package, pkg-config, add_subdirectory, FetchContent, the .deb"
bash scripts/consumers.sh build/release "${work}/consumers"

step "aarch64: cross-build the device-layer tests, run them under qemu"
bash scripts/aarch64.sh

step "asan: configure and build (tests only)"
configure --preset ci-asan
cmake --build --preset ci-asan --parallel "${jobs}"

step "asan: tests"
# ASAN_OPTIONS / UBSAN_OPTIONS (halt on error, leak detection) are set on every test by
# tests/CMakeLists.txt. Devices run on their fibers here, every switch annotated.
ctest --preset ci-asan --parallel "${jobs}"

step "tsan: configure and build (tests only)"
configure --preset ci-tsan
cmake --build --preset ci-tsan --parallel "${jobs}"

step "tsan: tests"
# Devices run on their fibers here too: TSan knows each fiber (src/fibers.cpp).
ctest --preset ci-tsan --parallel "${jobs}"

step "done"
echo "pmap: all tests passed (release, package consumers, aarch64 under qemu, asan+ubsan, tsan) in $((SECONDS - start))s"
