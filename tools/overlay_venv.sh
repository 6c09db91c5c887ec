#!/usr/bin/env bash
# The one way this project makes "an environment where exactly these backends are
# installed": a light virtual environment that sees everything in a base venv (torch,
# tileops, build tools) through a .pth file and adds only the backend packages named.
# The base venv itself never holds a backend, so each overlay decides exactly which
# backends are installed, which is what entry-point discovery sees.
#
#   tools/overlay_venv.sh DEST PKG...             # make (or remake) the overlay at DEST
#   tools/overlay_venv.sh --run PKG... -- CMD...  # CMD in a throwaway overlay, with its
#                                                 # python first on PATH; removed after
#
#   tools/overlay_venv.sh .venv-demo backends/example backends/native_cpu
#   tools/overlay_venv.sh --run backends/native_cpu -- python -m pytest -q tests
#
# A PKG that is not a folder is a requirement (transformers==5.19.0): it is installed from
# the registry into the overlay alone, without its dependencies, so that the overlay's
# release shadows the base's (the oldest transformers CI tests against).
#
# BASE_VENV (default .venv) is the base. BASE_PLAIN=1 lists the base's site-packages as a
# plain path instead of a site dir, so the base's own .pth hooks (its editable tileops)
# do not run: for a base whose tileops is replaced by the overlay's parent (sanitizers).
# Builds read scikit-build-core's SKBUILD_* variables (SKBUILD_BUILD_DIR, ...) as usual.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
base=$(cd "${BASE_VENV:-$root/.venv}" && pwd)

site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

make_overlay() {  # make_overlay DEST PKG...
  local dest=$1 pkg base_site
  shift
  rm -rf "$dest"
  python3 -m venv --without-pip "$dest"
  base_site=$(cd "$(site_of "$base")" && pwd)
  if [ "${BASE_PLAIN:-0}" = 1 ]; then
    echo "$base_site" > "$(site_of "$dest")/_tileops_base.pth"
  else
    # addsitedir (not a bare path) so the base venv's own .pth files run too: that is
    # how its editable tileops install hooks into imports.
    echo "import site; site.addsitedir('$base_site')" > "$(site_of "$dest")/_tileops_base.pth"
  fi
  for pkg in "$@"; do
    if [ -d "$pkg" ]; then
      # Build with the base venv's tools; install into the overlay only.
      (cd "$pkg" && "$dest/bin/python" -m pip install -q --no-build-isolation --no-deps -e .)
    else
      if ! log=$("$dest/bin/python" -m pip install -q --no-deps "$pkg" 2>&1); then
        echo "$log" | grep -v "^WARNING: Location" >&2
        echo "overlay_venv.sh: could not install $pkg into $dest" >&2
        exit 1
      fi
    fi
  done
}

if [ "${1:-}" = "--run" ]; then
  shift
  packages=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    if [ -d "$1" ]; then packages+=("$(cd "$1" && pwd)"); else packages+=("$1"); fi
    shift
  done
  [ "${1:-}" = "--" ] || { echo "usage: $0 --run PKG... -- CMD..." >&2; exit 2; }
  shift
  overlay=$(mktemp -d "${TMPDIR:-/tmp}/tileops-overlay.XXXXXX")
  trap 'rm -rf "$overlay"' EXIT
  make_overlay "$overlay/venv" "${packages[@]}"
  PATH="$overlay/venv/bin:$PATH" VIRTUAL_ENV="$overlay/venv" "$@"
else
  [ $# -ge 1 ] || { echo "usage: $0 DEST PKG... | --run PKG... -- CMD..." >&2; exit 2; }
  dest=$1
  shift
  packages=()
  for pkg in "$@"; do
    if [ -d "$pkg" ]; then packages+=("$(cd "$pkg" && pwd)"); else packages+=("$pkg"); fi
  done
  make_overlay "$(mkdir -p "$(dirname "$dest")" && cd "$(dirname "$dest")" && pwd)/$(basename "$dest")" "${packages[@]}"
fi
