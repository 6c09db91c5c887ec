#!/usr/bin/env bash
# Make a light virtual environment that sees everything in the project's base venv
# (torch, tileops, build tools) through a .pth file and adds only the backend packages
# named after it. The base venv itself never holds a backend, so each overlay decides
# exactly which backends are installed — which is what entry-point discovery sees.
#
#   tools/overlay_venv.sh .venv-example backends/example
#   tools/overlay_venv.sh .venv-both backends/example backends/native_cpu
set -euo pipefail
base=${BASE_VENV:-.venv}
dest=$1; shift
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m venv --without-pip "$dest"
dest_site=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# addsitedir (not a bare path) so the base venv's own .pth files run too: that is how
# its editable tileops install hooks into imports.
echo "import site; site.addsitedir('$(cd "$base_site" && pwd)')" > "$dest_site/_tileops_base.pth"
for pkg in "$@"; do
  # Build with the base venv's tools; install into the overlay only.
  "$dest/bin/python" -m pip install -q --no-build-isolation --no-deps -e "$pkg"
done
