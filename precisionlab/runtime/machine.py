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
