"""Rewrite cuda/* for the CPU emulator (pl_emu.h): `__CUDACC__` guards become
`PL_EMU`, and each launch `kernel<T><<<grid, block>>>(args);` becomes
`pl_emu::launch(dim3(grid), dim3(block), [&] { kernel<T>(args); });` (a third
launch argument, the dynamic shared bytes, is passed on), and
`extern __shared__ T name[];` becomes a pointer to the launch's buffer.

    python tests/cuda_emu/translate.py cuda build/emu
"""

from __future__ import annotations

import re
import sys
from pathlib import Path



def _match_forward(s: str, i: int) -> int:
    """Index just past the bracket that closes the one at s[i] (round only)."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "(":
            depth += 1
        elif s[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    raise ValueError("unbalanced parentheses after a launch")


def _callee_start(s: str, end: int) -> int:
    """Start of `name` or `name<targs>` that ends at s[end - 1]."""
    j = end
    if s[j - 1] == ">":
        depth = 0
        while True:
            j -= 1
            if s[j] == ">":
                depth += 1
            elif s[j] == "<":
                depth -= 1
                if depth == 0:
                    break
    while j > 0 and (s[j - 1].isalnum() or s[j - 1] in "_:"):
        j -= 1
    return j


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def rewrite_launches(src: str) -> str:
    while (k := src.find("<<<")) >= 0:
        e = src.index(">>>", k)
        config = [p.strip() for p in _split_top(src[k + 3:e])]
        if len(config) not in (2, 3):
            raise ValueError(f"launch configuration <<<{src[k + 3:e]}>>>: grid, block and at most dynamic shared bytes")
        grid, block = config[:2]
        smem = f", {config[2]}" if len(config) == 3 else ""
        start = _callee_start(src, k)
        args_end = _match_forward(src, e + 3)
        callee, args = src[start:k], src[e + 3:args_end]
        src = (src[:start] + f"pl_emu::launch(dim3({grid}), dim3({block}), [&] {{ {callee}{args}; }}{smem})"
               + src[args_end:])
    return src


# `extern __shared__ T name[];`: the launch's dynamic shared memory, one
# buffer for the block running at the time (blocks run one after another)
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;")


def translate(text: str) -> str:
    text = re.sub(r"\b__CUDACC__\b", "PL_EMU", text)
    text = DYNAMIC_SHARED.sub(r"\1* \2 = static_cast<\1*>(pl_emu::dynamic_shared());", text)
    return rewrite_launches(text)


def main(src_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(src_dir).iterdir()):
        if f.suffix in (".cu", ".cuh", ".h"):
            name = f.name if f.suffix != ".cu" else f.stem + ".cpp"
            (out / name).write_text(translate(f.read_text()))


if __name__ == "__main__":
    main(*sys.argv[1:3])
