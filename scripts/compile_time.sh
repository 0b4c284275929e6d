#!/usr/bin/env bash
# What a program pays at compile time for pmap: user CPU seconds and peak memory of g++ at
# the release flags (-O3 -DNDEBUG, C++20) for examples/quickstart.cpp against the same work
# written with Eigen alone, and for the headers alone. Median of N runs (default 3).
#   scripts/compile_time.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-3}"
cxx="${CXX:-g++}"
flags=(-std=c++20 -O3 -DNDEBUG -I include -isystem /usr/include/eigen3)
if mpi_flags=$(pkg-config --cflags ompi-c 2>/dev/null); then
  # shellcheck disable=SC2206
  flags+=($mpi_flags -DPMAP_WITH_MPI=1 -DOMPI_SKIP_MPICXX)
fi
flags+=(-DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -DFMT_SHARED)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

measure() {  # name source
  local times=() mems=()
  for _ in $(seq "$runs"); do
    /usr/bin/time -f "%U %M" -o "$out/t" "$cxx" "${flags[@]}" -c "$2" -o "$out/o.o"
    read -r t m < "$out/t"
    times+=("$t")
    mems+=("$m")
  done
  local t m
  t=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
  m=$(printf '%s\n' "${mems[@]}" | sort -n | sed -n "$(((runs + 1) / 2))p")
  printf '%-34s %6.2f s  %5d MiB\n' "$1" "$t" "$((m / 1024))"
}

measure "quickstart.cpp (pmap)" examples/quickstart.cpp
measure "the same work, Eigen alone" bench/compile_time/eigen_only.cpp
measure "#include <pmap/pmap.hpp> alone" bench/compile_time/include_only.cpp
measure "Eigen Tensor's header alone" bench/compile_time/eigen_include_only.cpp
