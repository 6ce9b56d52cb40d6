"""What `precisionlab --version` reports: the package, the library it loads
(ABI, compiler, CUDA archs) and torch's version only where torch is already
imported: asking must never import torch."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from precisionlab import __version__

# nvcc's -gencode arch=compute_XY,code=sm_XY (SASS) or code=compute_XY (PTX)
_GENCODE = re.compile(r"code=(sm|compute)_(\d+)")


@dataclass(frozen=True)
class LibraryBuild:
    compiler: str  # "nvcc 13.0" or "c++ (host only)"
    host_only: bool  # built without nvcc: no GPU kernels
    sass: tuple[str, ...]  # ("sm_90",): machine code for these GPUs
    ptx: tuple[str, ...]  # ("compute_90",): PTX the driver JIT-compiles for newer GPUs
    flags: str


def parse_build_info(text: str) -> LibraryBuild:
    """pl_build_info()'s "compiler=...; flags=...; cuda_archs=..." as fields."""
    fields = dict(part.split("=", 1) for part in text.split("; ") if "=" in part)
    compiler, flags = fields.get("compiler", "unknown"), fields.get("flags", "unknown")
    codes = _GENCODE.findall(flags)
    return LibraryBuild(compiler=compiler, host_only=not compiler.startswith("nvcc"),
                        sass=tuple(dict.fromkeys(f"sm_{a}" for k, a in codes if k == "sm")),
                        ptx=tuple(dict.fromkeys(f"compute_{a}" for k, a in codes if k == "compute")),
                        flags=flags)


def describe_build(b: LibraryBuild) -> str:
    if b.flags.startswith("pl_emu"):  # make emu-test's library: the CUDA kernels compiled for the CPU
        return "the CPU emulator of the CUDA kernels (tests/cuda_emu), not a GPU build"
    if b.host_only:
        return "host-only (built without nvcc: no GPU kernels)"
    archs = " + ".join([f"{a} SASS" for a in b.sass] + [f"{a} PTX" for a in b.ptx]) or "archs unknown"
    return f"{b.compiler}, {archs}"


@dataclass(frozen=True)
class VersionInfo:
    package: str
    library_path: str | None
    library_abi: int | None
    library_build: LibraryBuild | None
    library_error: str | None  # why there is no library
    torch: str | None  # only when torch was already imported


def collect() -> VersionInfo:
    from precisionlab import native

    torch = sys.modules.get("torch")
    torch_version = str(getattr(torch, "__version__", "unknown")) if torch is not None else None
    try:
        path = native.library_path()
        build = parse_build_info(native.build_info())
    except native.RunError as e:
        return VersionInfo(__version__, None, None, None, str(e), torch_version)
    return VersionInfo(__version__, path, native.ABI_VERSION, build, None, torch_version)
