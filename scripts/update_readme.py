"""Re-run every example in README.md and paste its real output.

A fenced block whose first line is `$ precisionlab ARGS [| head -N]` is run
(as `python -m precisionlab ARGS`, with COLUMNS=160) and its body replaced by
what the command printed on stdout. Run: .venv/bin/python scripts/update_readme.py
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```\n\$ precisionlab (?P<cmd>[^\n]*)\n(?P<body>.*?)```", re.S)


def run(cmd: str) -> str:
    head = None
    m = re.search(r"\s*\|\s*head -(\d+)\s*$", cmd)
    if m:
        head, cmd = int(m.group(1)), cmd[: m.start()]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    p = subprocess.run([sys.executable, "-m", "precisionlab", *shlex.split(cmd)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=900)
    lines = [line.rstrip() for line in p.stdout.splitlines()]
    if head is not None:
        lines = lines[:head]
    return "\n".join(lines) + "\n"


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()

    def replace(m):
        print(f"running: precisionlab {m.group('cmd')}", file=sys.stderr)
        return f"```\n$ precisionlab {m.group('cmd')}\n{run(m.group('cmd'))}```"

    readme.write_text(BLOCK.sub(replace, text))


if __name__ == "__main__":
    main()
