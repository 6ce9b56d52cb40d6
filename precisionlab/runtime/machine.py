"""Facts of this machine that decide the numbers: package versions and the CPU."""

from __future__ import annotations

import platform
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
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
