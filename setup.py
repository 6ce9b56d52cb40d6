"""The build step pip runs (`pip install .`, `pip wheel`, an sdist): it compiles
libprecisionlab.so with the Makefile's own rule and puts it in the wheel's
precisionlab/lib/, where native.py looks. Everything else is in pyproject.toml.

Why a setuptools step that calls `make` rather than scikit-build-core + CMake:
the Makefile already is the one description of how the library is built (nvcc
for sm_90 + compute_90 PTX + the build machine's GPU, --fmad=false, static
cudart, host -ffp-contract=off; g++ -x c++ host-only without nvcc; every
cuda/*.cu by wildcard), and the CPU emulator build (make emu-test) and
scripts/gpu_check.sh use it too. A CMakeLists.txt would be a second description
of the same flags, or would push the emulator build into CMake as well; it
would also need CMake and its CUDA compiler detection at every build, and an
editable install (make setup) would compile. Here the editable install compiles
nothing (`make lib` does, into precisionlab/lib/), and a wheel build runs the
exact rule `make lib` runs.

The wheel holds a native library, so it is tagged for the platform
(py3-none-linux_x86_64): any Python 3, since the library is loaded with ctypes,
not as an extension module.
"""

import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = "libprecisionlab.so"


class BuildPyWithLibrary(build_py):
    """build_py, then the library from the Makefile, copied into the package."""

    def run(self):
        super().run()
        if self.editable_mode:  # make setup: the tree's precisionlab/lib/ comes from `make lib`
            return
        # make prints which compiler it uses ("nvcc not found: ... host-only" otherwise); pip shows it with -v.
        print(f"precisionlab: building {LIB} with the Makefile's rule (make build/{LIB})", file=sys.stderr)
        try:
            subprocess.run(["make", "-C", ROOT, f"build/{LIB}"], check=True)
        except FileNotFoundError:
            sys.exit(f"precisionlab: building {LIB} needs `make` and a C++ compiler (g++), and nvcc for the GPU kernels")
        except subprocess.CalledProcessError as e:
            sys.exit(f"precisionlab: building {LIB} failed (make exited {e.returncode}); the compiler's messages are above")
        dest = os.path.join(self.build_lib, "precisionlab", "lib")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, "build", LIB), os.path.join(dest, LIB))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, "precisionlab", "lib", LIB)]


class NativeDistribution(Distribution):
    """Holds a native library: installed to platlib, its wheel not pure."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """A wheel that carries a native library: platform-tagged, any Python 3."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel})
