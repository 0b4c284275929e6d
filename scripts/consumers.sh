#!/usr/bin/env bash
# The ways a project uses pmap (README "Using pmap in your project"), each building a
# program against pmap and running it:
#   1. find_package(pmap) on the installed package (tests/package),
#   2. pkg-config on the installed package, from a plain Makefile (tests/package/pkgconfig),
#   3. add_subdirectory of this source tree, without MPI (tests/package/subdirectory),
#   4. FetchContent from this git repository at HEAD, with MPI (tests/package/fetchcontent),
#   5. the Debian package from CPack: installed with apt (which checks its Depends), built
#      against under /usr by find_package and pkg-config, removed again (root only).
# Usage: scripts/consumers.sh BUILD_DIR WORK_DIR, BUILD_DIR a built release tree.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "$1" && pwd)"
work="$2"
mkdir -p "${work}"
jobs="$(nproc)"
quickstart="${root}/examples/quickstart.cpp"
say() { printf -- '--- consumers: %s\n' "$1"; }

prefix="${work}/prefix"
say "cmake --install ${build} --prefix ${prefix}"
cmake --install "${build}" --prefix "${prefix}" > /dev/null

say "1. find_package(pmap) on the installed package"
cmake -S "${root}/tests/package" -B "${work}/find_package" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="${prefix}" > /dev/null
cmake --build "${work}/find_package" --parallel "${jobs}"
"${work}/find_package/consumer"

say "2. pkg-config from a plain Makefile"
pcdir="$(dirname "$(find "${prefix}" -name pmap.pc | head -n 1)")"
PKG_CONFIG_PATH="${pcdir}" make -s -C "${root}/tests/package/pkgconfig" \
  QUICKSTART="${quickstart}" OUT="${work}/pkgconfig_quickstart"
"${work}/pkgconfig_quickstart"

say "3. add_subdirectory, PMAP_WITH_MPI=OFF"
cmake -S "${root}/tests/package/subdirectory" -B "${work}/subdirectory" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DPMAP_SOURCE_DIR="${root}" -DPMAP_WITH_MPI=OFF > /dev/null
cmake --build "${work}/subdirectory" --parallel "${jobs}"
"${work}/subdirectory/quickstart"

say "4. FetchContent from the git repository at HEAD"
if git -C "${root}" rev-parse --verify -q HEAD > /dev/null; then
  cmake -S "${root}/tests/package/fetchcontent" -B "${work}/fetchcontent" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DPMAP_GIT_REPOSITORY="${root}" \
    -DPMAP_GIT_TAG="$(git -C "${root}" rev-parse HEAD)" > /dev/null
  cmake --build "${work}/fetchcontent" --parallel "${jobs}"
  "${work}/fetchcontent/quickstart"
else
  say "skipped: ${root} is not a git checkout"
fi

say "5. cpack -G DEB"
(cd "${build}" && cpack -G DEB > /dev/null)
deb="$(ls "${build}"/libpmap-dev_*.deb)"
dpkg-deb --field "${deb}" Package Version Depends
if ((EUID != 0)); then
  say "not root: the package is built, not installed"
  exit 0
fi
if dpkg -s libpmap-dev > /dev/null 2>&1; then
  echo "consumers: libpmap-dev is installed already; not replacing it" >&2
  exit 1
fi
trap 'apt-get remove -y -qq libpmap-dev > /dev/null || true' EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${deb}" > /dev/null
cmake -S "${root}/tests/package" -B "${work}/deb_find_package" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "${work}/deb_find_package" --parallel "${jobs}"
"${work}/deb_find_package/consumer"
make -s -C "${root}/tests/package/pkgconfig" QUICKSTART="${quickstart}" \
  OUT="${work}/deb_pkgconfig_quickstart"
"${work}/deb_pkgconfig_quickstart"
say "all ways built and ran"
