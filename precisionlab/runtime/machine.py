"""Facts of this machine that decide the numbers: package versions and the CPU."""

from __future__ import annotations

import platform
import re
from pathlib import Path
from importlib import metadata

from precisionlab import __version__


def versions() -> dict:
    """Versions that decide the numbers. torch's comes from its metadata, so
    asking does not import it."""
    out = {"precisionlab": __version__, "python": platform.python_version()}
    for pkg in ("numpy", "ml_dtypes", "torch"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform knows."""
    try:
        found = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(errors="replace"), re.M)
    except OSError:
        found = None
    return found.group(1).strip() if found else (platform.processor() or platform.machine())


def cpu_kernel_key() -> str:
    """The CPU as the kernels see it: its name, and where /proc/cpuinfo tells
    them, its family, model and cache size. A virtual machine may show only
    "AMD EPYC" for several generations, whose torch CPU matmuls pick other
    blockings and round in another order; the docs' cpu examples are keyed
    by this, so another generation compares their text, not their digits."""
    name = cpu_name()
    try:
        info = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return name
    fields = {key: re.search(rf"^{key}\s*:\s*(.*)$", info, re.M) for key in ("cpu family", "model", "cache size")}
    known = {key: m.group(1).strip() for key, m in fields.items() if m}
    if not known:
        return name
    return f"{name} ({', '.join(f'{key} {value}' for key, value in known.items())})"
