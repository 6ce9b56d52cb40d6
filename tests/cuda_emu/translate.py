"""Rewrite cuda/* for the CPU emulator (pl_emu.h): `__CUDACC__` guards become
`PL_EMU`, and each launch `kernel<T><<<grid, block>>>(args);` becomes
`pl_emu::launch(dim3(grid), dim3(block), [&] { kernel<T>(args); });` (a third
launch argument, the dynamic shared bytes, is passed on);
`extern __shared__ T name[];` becomes a pointer to the running block's buffer,
and `__shared__ T a[32], b;` references to the running block's copies
(pl_emu::shared_var, keyed by a static tag: one per declaration and template
instance), so the blocks of a cluster, which run together, each have their
own; cudaLaunchKernelEx / cudaFuncSetAttribute / cudaFuncGetAttributes /
cudaOccupancyMaxActiveClusters become
pl_emu's, and `#include <cooperative_groups.h>` goes (pl_emu.h has the cluster).

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


# `extern __shared__ T name[];`: the launch's dynamic shared memory, the
# running block's buffer
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;")
# `__shared__ T a[N][M], b;` at the start of a line: static shared variables
STATIC_SHARED = re.compile(r"^(\s*)__shared__\s+([\w:]+)\s+([^;]+);", re.M)
DECLARATOR = re.compile(r"\s*(\w+)\s*((?:\[[^\]]*\])*)\s*")
RENAMED = {"cudaLaunchKernelEx": "pl_emu::launch_ex", "cudaFuncSetAttribute": "pl_emu::func_set_attribute",
           "cudaFuncGetAttributes": "pl_emu::func_get_attributes",
           "cudaOccupancyMaxActiveClusters": "pl_emu::occupancy_max_active_clusters"}


def _static_shared(m: re.Match) -> str:
    indent, type_, decls = m.group(1), m.group(2), m.group(3)
    out = []
    for d in _split_top(decls):
        dm = DECLARATOR.fullmatch(d)
        if not dm:
            raise ValueError(f"__shared__ declarator {d!r}: a name and array bounds only")
        name, dims = dm.groups()
        out.append(f"static char {name}_pl_tag; auto& {name} = pl_emu::shared_var<{type_}{dims}>(&{name}_pl_tag);")
    return indent + " ".join(out)


def translate(text: str) -> str:
    text = re.sub(r"\b__CUDACC__\b", "PL_EMU", text)
    text = DYNAMIC_SHARED.sub(r"\1* \2 = static_cast<\1*>(pl_emu::dynamic_shared());", text)
    text = STATIC_SHARED.sub(_static_shared, text)
    text = re.sub(r"^\s*#\s*include\s*<cooperative_groups\.h>", "", text, flags=re.M)
    for name, emu in RENAMED.items():
        text = re.sub(rf"\b{name}\(", f"{emu}(", text)
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
