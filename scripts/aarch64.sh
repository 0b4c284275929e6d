#!/usr/bin/env bash
# Cross-builds the device-layer tests for aarch64 (Debian's g++-aarch64-linux-gnu and the
# :arm64 multiarch packages) and runs them under qemu user mode, more devices than threads:
# the collectives, the runtime (fibers, oversubscription, concurrent callers), faults,
# misuse, the collective sequences, nesting and the random-program test. Installs what is
# missing first. Called by scripts/test.sh; runs on its own too.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
source scripts/install-deps.sh

pmap_install_aarch64_deps
cmake --preset ci-aarch64
cmake --build --preset ci-aarch64 --parallel "$(nproc)"
ctest --preset ci-aarch64 --parallel "$(nproc)"
