"""Running the CLI the way a user does: a subprocess, its exit code, stdout, stderr."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> Run:
    e = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    e.update({"PYTHONPATH": str(ROOT), **(env or {})})
    p = subprocess.run([sys.executable, "-m", "precisionlab", *args], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=ROOT)
    return Run(p.returncode, p.stdout, p.stderr)


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity literals."""
    def bad(c):
        raise ValueError(f"non-strict JSON constant {c}")
    return json.loads(text, parse_constant=bad)
