"""Issue 38's limit: no function over 80 lines in the package outside the
emulators (numerics/flash_attention.py and numerics/accumulators.py step
through a kernel's arithmetic one stage after another, as the kernel does)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EMULATORS = {"precisionlab/numerics/flash_attention.py", "precisionlab/numerics/accumulators.py"}
LIMIT = 80


def test_no_function_over_80_lines_outside_the_emulators():
    long = []
    for path in sorted((ROOT / "precisionlab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in EMULATORS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LIMIT:
                    long.append(f"{rel}:{node.lineno} {node.name}: {lines} lines")
    assert not long, "\n".join(long)
