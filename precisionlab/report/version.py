"""`precisionlab --version`: plain lines on stdout (no Rich: a version string is
read by scripts and bug reports)."""

from __future__ import annotations

import sys

from precisionlab.report.console import printable
from precisionlab.runtime.version import VersionInfo, describe_build


def version_lines(v: VersionInfo) -> None:
    lines = [f"precisionlab {v.package}"]
    if v.library_build is None:
        lines.append(f"library: unavailable: {printable(v.library_error or '')}")
    else:
        lines.append(f"library: ABI {v.library_abi}, {describe_build(v.library_build)}")
        lines.append(f"library path: {printable(v.library_path or '')}")
    if v.torch is not None:
        lines.append(f"torch {v.torch}")
    sys.stdout.write("\n".join(lines) + "\n")
