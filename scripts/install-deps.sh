#!/usr/bin/env bash
# Installs the Debian 12 packages pmap builds, tests and benchmarks against, when any is
# missing. Sourced by scripts/test.sh and scripts/bench.sh; safe to run on its own.
set -euo pipefail

pmap_packages=(
  build-essential cmake ninja-build g++ pkg-config git
  libtbb-dev libeigen3-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev libomp-dev
  libopenmpi-dev openmpi-bin
  libboost-context-dev
  python3-matplotlib
)

pmap_install_deps() {
  local missing=()
  local package
  for package in "${pmap_packages[@]}"; do
    if ! dpkg -s "${package}" >/dev/null 2>&1; then
      missing+=("${package}")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi

  echo "pmap: installing missing packages: ${missing[*]}"
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { echo "pmap: need root or sudo to install packages" >&2; return 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

# The aarch64 cross build (scripts/aarch64.sh): Debian's cross compiler, qemu user mode and
# the :arm64 multiarch packages of what the tests link.
pmap_aarch64_packages=(
  g++-aarch64-linux-gnu qemu-user libc6:arm64
  libtbb-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64 libboost-context-dev:arm64
)

pmap_install_aarch64_deps() {
  local sudo=()
  if ((EUID != 0)); then
    command -v sudo >/dev/null || { echo "pmap: need root or sudo to install packages" >&2; return 1; }
    sudo=(sudo)
  fi
  local missing=()
  local package
  for package in "${pmap_aarch64_packages[@]}"; do
    if ! dpkg -s "${package}" >/dev/null 2>&1; then
      missing+=("${package}")
    fi
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  echo "pmap: installing missing packages: ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  pmap_install_deps
fi
