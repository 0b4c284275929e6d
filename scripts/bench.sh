#!/usr/bin/env bash
# Builds the release preset and runs the benchmark report on all local cores.
# Arguments go to pmap-bench (e.g. --quick); without pmap-bench, to each Google Benchmark
# binary instead.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
source scripts/install-deps.sh
pmap_install_deps

jobs="$(nproc)"
# Same configuration as scripts/test.sh, so running both builds the tree once.
cmake --preset ci-release
cmake --build --preset ci-release --parallel "${jobs}"

# All local cores unless the caller chose otherwise.
export PMAP_NUM_DEVICES="${PMAP_NUM_DEVICES:-${jobs}}"
export PMAP_NUM_THREADS="${PMAP_NUM_THREADS:-${jobs}}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-${jobs}}"

bench_dir=build/release/bench
if [[ -x "${bench_dir}/pmap-bench" ]]; then
  # The table on stdout, the JSON and its chart under build/.
  "${bench_dir}/pmap-bench" --json build/report.json "$@"
  /usr/bin/python3 bench/plot_report.py build/report.json build/report.png
  echo "pmap: chart in build/report.png, JSON in build/report.json"
  exit 0
fi

ran=0
for binary in "${bench_dir}"/bench_*; do
  [[ -x "${binary}" ]] || continue
  echo "=== ${binary}"
  "${binary}" "$@"
  ran=1
done
if ((ran == 0)); then
  echo "pmap: no benchmark binaries in ${bench_dir}" >&2
  exit 1
fi
