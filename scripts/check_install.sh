#!/usr/bin/env bash
# Installs the wheel and the sdist in DIST (default dist/, from `make dist`) each
# into a fresh venv, as a user would, and runs the CLI from outside the source
# tree. The venvs reuse .venv's torch through a .pth file (no multi-GB download;
# `--system-site-packages` would not see .venv): pip finds every dependency
# already there, so it installs only precisionlab itself, and the sdist's
# install compiles the library again with the Makefile's rule.
#   usage: scripts/check_install.sh [DIST]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dist=$(cd "${1:-$root/dist}" && pwd)
py=$root/.venv/bin/python   # the same interpreter as .venv, so its site-packages fit
shared=$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# the build `make lib` gave this tree: every installed library must match it
want=$(cd "$root" && "$py" -m precisionlab --version | grep "^library: ")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"   # outside the source tree: nothing can be imported from it

for artifact in "$dist"/precisionlab-*.whl "$dist"/precisionlab-*.tar.gz; do
    [ -f "$artifact" ] || { echo "check_install: no wheel or sdist in $dist (make dist)" >&2; exit 1; }
    name=$(basename "$artifact")
    venv=$work/venv-${name##*.}
    echo "== $name: fresh venv, reusing torch from $shared"
    "$py" -m venv "$venv"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    echo "$shared" > "$site/zz_reuse_precisionlab_dev_venv.pth"   # zz: after the venv's own packages
    # --no-cache-dir: the sdist really compiles (pip would reuse a wheel it built before)
    "$venv/bin/pip" install -q --no-cache-dir "$artifact" 2> >(grep -v "^WARNING: Location" >&2)
    [ -x "$venv/bin/precisionlab" ] || { echo "check_install: $name installed no precisionlab command" >&2; exit 1; }
    [ ! -e "$site/torch" ] || { echo "check_install: $name downloaded torch instead of reusing it" >&2; exit 1; }
    # The package and its library come from the new venv, not from the checkout.
    "$venv/bin/python" - "$venv" <<'PY'
import sys
from pathlib import Path
import precisionlab
from precisionlab import native
venv = Path(sys.argv[1]).resolve()
for what, path in (("package", precisionlab.__file__), ("library", native.library_path())):
    if venv not in Path(path).resolve().parents:
        sys.exit(f"check_install: the {what} was loaded from {path}, not from {venv}")
PY
    got=$(PATH=$venv/bin:$PATH precisionlab --version)
    echo "$got"
    grep -qxF "$want" <<< "$got" || { echo "check_install: $name's library differs from make lib's: $want" >&2; exit 1; }
    PATH=$venv/bin:$PATH precisionlab accumulate --dtype bf16 --n 10000
done
echo "check_install: the wheel and the sdist install and run"
