"""The built distributions (make dist, CI): a platform-tagged wheel that carries
the library, an sdist that carries what building and testing need.

They read $PRECISIONLAB_DIST (CI sets it after `make dist`) and skip without it:
building a wheel compiles the library, too slow for every `make test`.
scripts/check_install.sh installs both and runs them from outside the tree."""

import ctypes
import os
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.utils import parse_sdist_filename, parse_wheel_filename

from precisionlab import __version__, native

ROOT = Path(__file__).resolve().parent.parent
DIST = os.environ.get("PRECISIONLAB_DIST")
pytestmark = pytest.mark.skipif(not DIST, reason="set PRECISIONLAB_DIST to a `make dist` folder (CI does)")


def _one(pattern: str) -> Path:
    found = sorted(Path(DIST).glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {DIST}, found {[p.name for p in found]}"
    return found[0]


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _one("precisionlab-*.whl")


@pytest.fixture(scope="module")
def sdist() -> Path:
    return _one("precisionlab-*.tar.gz")


def test_wheel_is_tagged_for_this_platform(wheel):
    name, version, _, tags = parse_wheel_filename(wheel.name)
    assert (name, str(version)) == ("precisionlab", __version__)
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    # any Python 3 (the library is loaded with ctypes), but only this platform
    assert {(t.interpreter, t.abi, t.platform) for t in tags} == {("py3", "none", platform)}
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(f"precisionlab-{__version__}.dist-info/WHEEL").decode())
    assert meta["Root-Is-Purelib"] == "false" and meta.get_all("Tag") == [f"py3-none-{platform}"]


def test_wheel_carries_the_library_built_like_make_lib(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert "precisionlab/lib/libprecisionlab.so" in names
        assert "precisionlab/engines/data/charlm.safetensors" in names
        lib = tmp_path / native.LIB_NAME
        lib.write_bytes(z.read("precisionlab/lib/libprecisionlab.so"))
    assert not [n for n in names if n.startswith(("cuda/", "tests/"))]
    wheel_lib = ctypes.CDLL(str(lib))
    wheel_lib.pl_build_info.restype = ctypes.c_char_p
    assert wheel_lib.pl_abi_version() == native.ABI_VERSION
    # One description of the build: the wheel's library has the flags `make lib` gives this tree's.
    assert wheel_lib.pl_build_info().decode() == native.build_info()


def test_wheel_metadata_has_the_license(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(z.read(f"precisionlab-{__version__}.dist-info/METADATA").decode())
        assert z.read(f"precisionlab-{__version__}.dist-info/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"


def test_sdist_holds_the_sources_build_files_and_tests(sdist):
    name, version = parse_sdist_filename(sdist.name)
    assert (name, str(version)) == ("precisionlab", __version__)
    top = f"precisionlab-{__version__}/"
    with tarfile.open(sdist) as t:
        names = {m.name.removeprefix(top) for m in t.getmembers() if m.isfile()}
    # every CUDA source, test and docs page of this tree (the README links the pages), whatever has been added since
    wanted = {str(p.relative_to(ROOT)) for pattern in ("cuda/*", "tests/*.py", "tests/cuda_emu/*", "docs/*.md")
              for p in ROOT.glob(pattern) if p.is_file()}
    assert any(n.startswith("cuda/") and n.endswith(".cu") for n in wanted)
    assert not wanted - names, f"missing from the sdist: {sorted(wanted - names)}"
    assert {"Makefile", "setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "README.md",
            "precisionlab/cli/app.py"} <= names
    assert not [n for n in names if n.endswith(".so") or "__pycache__" in n]  # built from source, never shipped


def test_sdist_metadata_has_the_license(sdist):
    with tarfile.open(sdist) as t:
        meta = Parser().parsestr(t.extractfile(f"precisionlab-{__version__}/PKG-INFO").read().decode())
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
