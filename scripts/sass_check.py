"""Static checks of the CUDA kernels' machine code, without a GPU (`make sass-check`).

From the nvcc-built library's cubins (cuobjdump: the toolkit's, or PyPI's
nvidia-cuda-cuobjdump where the toolkit lacks it):

- every kernel: registers, and no stack frame or local memory (a spill, or an
  array the compiler could not keep in registers);
- every single-pass row kernel: each global load is issued before the first
  warp shuffle (the first reduction), and before any instruction reads a
  register a load wrote, so all of a thread's loads are in flight together
  instead of each waiting on the previous one's max chain;
- instructions per element: for a single-pass kernel (no loop: the row sits
  in registers) the growth of its body from one register tier to the next
  over the growth in elements a thread holds; for a streaming kernel its hot
  loop (the backward branch whose body loads) over the elements one trip
  loads; for a tiled kernel (its products over tiles in shared memory) its
  innermost loop that reads the most shared memory a trip, over the elements
  that trip reads.

- two CTAs in flight an SM: the kernels whose CTA holds a row (or piece) of
  up to 16384 elements in at most 512 threads (softmax versions 2 and 5)
  must use few enough registers that two such CTAs share an SM's register
  file (65536 registers, allocated 256 to a warp), so one row's loads
  overlap another's reductions and stores.

Fails (exit 1) on any spill or local memory, a load after the first
reduction or after a use of a loaded register, or instructions per element
above the ceilings the library declares (see below), set from the measured counts (see
README, "Static checks"). Without nvcc the library has no device code and
the check says so and passes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Which kernels get which checks, and their ceilings on instructions per
# element by element type, are the library's: each variant's row declares its
# kernels' (cuda/<op>.cu's X-macro lists, pl_sass_rule), read here through
# native.catalog(). The ceilings were set a little above the counts measured
# on this build (nvcc 13.0, sm_90): single_pass fp32 18.6 (it was 30.9 before
# all loads were issued first and exp taken once, 20.9 with 64-bit indices),
# bf16 17.1 (31.4), fp16 16.6; warp_rows 14.5-17.8 (fp32), 16.0-16.6 (16-bit);
# cluster 20.0 (fp32), 17.4 (bf16), 16.9 (fp16): single_pass's floating-point
# work per element exactly, plus integer index arithmetic against the piece's
# bounds; online_vec 20.0-25.0 a whole trip; sum_blocks 2.6-16.5.


@dataclass(frozen=True)
class Rule:
    """What the library says one kernel family gets: its checks and, by dtype, its ceiling."""
    checks: frozenset  # of "single_pass", "streaming", "two_an_sm", "shared_loops"
    ceilings: dict  # format name -> instructions per element


def rules_from(catalog) -> dict[str, Rule]:
    """Kernel family -> Rule, from the variants' sass_ceiling entries. A kernel
    several variants launch (the sum's three, softmax's cluster) must be
    declared alike by each; a contradiction is an error, not a choice."""
    checks: dict[str, frozenset] = {}
    ceilings: dict[str, dict] = {}
    for v in catalog:
        for c in v.sass_ceiling:
            if checks.setdefault(c.kernel, frozenset(c.checks)) != frozenset(c.checks):
                raise ValueError(f"{c.kernel}: {v.op} {v.name} declares checks {c.checks}, another variant "
                                 f"{sorted(checks[c.kernel])}")
            for dt in c.dtypes:
                if ceilings.setdefault(c.kernel, {}).setdefault(dt, c.ceiling) != c.ceiling:
                    raise ValueError(f"{c.kernel} {dt}: {v.op} {v.name} declares ceiling {c.ceiling}, another "
                                     f"variant {ceilings[c.kernel][dt]}")
    return {k: Rule(checks[k], ceilings.get(k, {})) for k in checks}


def library_rules(lib: Path) -> dict[str, Rule]:
    """The rules of the library at lib (the one whose machine code is checked)."""
    os.environ["PRECISIONLAB_LIB"] = str(lib)
    sys.path.insert(0, str(ROOT))
    from precisionlab import native

    return rules_from(native.catalog())


# The "two_an_sm" kernels are launched with at most PAIR_THREADS threads a CTA
# (softmax.cu's kPairThreads) and must fit two CTAs an SM, in the register
# file they share (sm_90: 65536 registers a SM, allocated in units of 256 a warp).
PAIR_THREADS = 512
SM_REGISTERS = 65536
REG_UNIT = 256


def ctas_per_sm(regs: int, threads: int = PAIR_THREADS) -> int:
    """CTAs of `threads` threads an SM's registers hold at `regs` a thread."""
    per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    return SM_REGISTERS // (per_warp * -(-threads // 32))


# Stack frames that are not spills, each with its reason and the most bytes
# allowed. CUDA's accurate cosf/sinf reduce a large argument (|x| > 105615)
# the Payne-Hanek way with a small table on the stack; the alternative would
# be __cosf/__sinf, the approximate intrinsics this project never uses.
STACK_ALLOWED = {
    "rope_v1": (32, "cosf/sinf's Payne-Hanek reduction for |angle| > 105615 rad keeps its table on the stack"),
    "matmul_acc_thread": (256, "the accumulator models' per-thread arrays indexed at run time: fp32-pairwise's "
                               "64 partial sums, exact's 640-bit fixed-point sum"),
}

ELEM_BYTES = {"float": 4, "double": 8, "__nv_bfloat16": 2, "__half": 2, "__nv_fp8_e4m3": 1, "__nv_fp8_e5m2": 1}
# the element C types by the library's format names (the rules' dtypes)
ELEM_FORMAT = {"float": "fp32", "double": "fp64", "__nv_bfloat16": "bf16", "__half": "fp16",
               "__nv_fp8_e4m3": "fp8_e4m3", "__nv_fp8_e5m2": "fp8_e5m2"}


def _find(tool: str) -> str | None:
    env = os.environ.get(tool.upper())
    if env:
        return env
    found = shutil.which(tool)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / tool).is_file():
            return str(Path(home) / "bin" / tool)
    try:  # PyPI's nvidia-cuda-cuobjdump / -nvdisasm put the binaries in the nvidia namespace package
        import nvidia

        for base in nvidia.__path__:
            for cand in Path(base).glob(f"cu*/bin/{tool}"):
                return str(cand)
    except ImportError:
        pass
    return None


def find_cuobjdump() -> str | None:
    """cuobjdump, with the nvdisasm that its -sass runs: both, or None."""
    cuobjdump, nvdisasm = _find("cuobjdump"), _find("nvdisasm")
    if not cuobjdump or not nvdisasm:
        return None
    os.environ["PATH"] = f"{Path(nvdisasm).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return cuobjdump


def run(tool: str, *args: str) -> str:
    return subprocess.run([tool, *args], check=True, capture_output=True, text=True).stdout


def demangle(names: list[str]) -> dict[str, str]:
    filt = shutil.which("c++filt")
    if not filt or not names:
        return {n: n for n in names}
    out = subprocess.run([filt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines(), strict=True))


@dataclass
class Kernel:
    mangled: str
    name: str = ""
    regs: int = 0
    stack: int = 0
    local: int = 0
    sass: list = field(default_factory=list)  # (address, opcode, operands)
    problems: list = field(default_factory=list)
    ipe: float | None = None
    ipe_what: str = ""
    notes: str = ""
    elems: float = 0.0  # single-pass: elements a thread holds
    body: int = 0       # single-pass: instructions from the first load to the last store
    ctas_per_sm: int | None = None  # TWO_AN_SM kernels: 512-thread CTAs an SM's registers hold

    @property
    def family(self) -> str:
        m = re.search(r"::(\w+)<", self.name) or re.search(r"(\w+)<", self.name)
        return m.group(1) if m else self.name

    @property
    def elem(self) -> str:
        m = re.search(r"<([\w:]+)", self.name)
        return m.group(1) if m else ""


RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def parse_resources(text: str) -> dict[str, Kernel]:
    kernels: dict[str, Kernel] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            current = kernels.setdefault(m.group(1), Kernel(m.group(1)))
            continue
        r = RES.search(line)
        if r and current is not None:
            current.regs, current.stack, current.local = int(r.group(1)), int(r.group(2)), int(r.group(4))
            current = None
    return kernels


def parse_sass(text: str, kernels: dict[str, Kernel]) -> None:
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            current = kernels.setdefault(m.group(1), Kernel(m.group(1)))
            current.sass = []
            continue
        i = INSN.search(line)
        if i and current is not None:
            current.sass.append((int(i.group(1), 16), i.group(3), i.group(4).strip()))


def _regs(operand_text: str) -> list[int]:
    """Register numbers an operand list names (R5, R5.64 -> R5 and R6, [R8.64] ...)."""
    out = []
    for m in re.finditer(r"\bR(\d+)(\.64)?", operand_text):
        r = int(m.group(1))
        out += [r, r + 1] if m.group(2) else [r]
    return out


def _load_width(opcode: str) -> int:
    m = re.search(r"\.(128|64|32|U16|16|U8|8)\b", opcode)
    width = {"128": 16, "64": 8, "32": 4, "U16": 2, "16": 2, "U8": 1, "8": 1}
    return width[m.group(1)] if m else 4


def check_single_pass(k: Kernel) -> None:
    ops = k.sass
    loads = [i for i, (_, op, _) in enumerate(ops) if op.startswith("LDG")]
    shfl = [i for i, (_, op, _) in enumerate(ops) if op.startswith("SHFL")]
    stores = [i for i, (_, op, _) in enumerate(ops) if op.startswith("STG")]
    if not loads or not shfl:
        k.problems.append("no global load or no shuffle found")
        return
    if loads[-1] > shfl[0]:
        k.problems.append(f"a global load at {ops[loads[-1]][0]:#06x} after the first shuffle at {ops[shfl[0]][0]:#06x}")
    # no instruction between the first and the last load may read a loaded register
    loaded: set[int] = set()
    for i in range(loads[0], loads[-1] + 1):
        addr, op, operands = ops[i]
        if op.startswith("LDG"):
            dest, _, _src = operands.partition(",")
            n = max(1, _load_width(op) // 4)
            base = _regs(dest)
            if base:
                loaded.update(range(base[0], base[0] + n))
            continue
        parts = operands.split(",")
        sources = ",".join(parts[1:]) if op[0] not in "BS" else operands  # stores/branches: every operand is read
        used = loaded.intersection(_regs(sources))
        if used:
            k.problems.append(f"{op} at {addr:#06x} reads loaded R{min(used)} before the last load at "
                              f"{ops[loads[-1]][0]:#06x} is issued")
            break
    k.elems = sum(_load_width(ops[i][1]) for i in loads) / ELEM_BYTES.get(k.elem, 4)
    k.body = (stores[-1] if stores else len(ops) - 1) - loads[0] + 1


def single_pass_marginals(kernels: list[Kernel]) -> None:
    """Instructions per element of a register-resident kernel: the body grows by
    this much for each element a thread holds, so compare its two largest tiers
    (VPT vectors a thread) of one element type; the fixed cost of the
    reductions cancels out."""
    groups: dict[tuple, list[Kernel]] = {}
    for k in kernels:
        if getattr(k, "elems", None):
            groups.setdefault((k.family, k.elem), []).append(k)
    for tiers in groups.values():
        tiers.sort(key=lambda k: k.elems)
        for small, big in itertools.pairwise(tiers):
            big.ipe = (big.body - small.body) / (big.elems - small.elems)
            big.ipe_what = (f"({big.body} - {small.body}) instructions / ({big.elems:g} - {small.elems:g}) "
                            f"elements a thread holds")


def check_residency(k: Kernel) -> None:
    k.ctas_per_sm = ctas_per_sm(k.regs)
    if k.ctas_per_sm < 2:
        k.problems.append(f"{k.regs} registers a thread: {k.ctas_per_sm} CTA of {PAIR_THREADS} threads an SM, not two")


def _hot_loop(k: Kernel, load: str, innermost: bool):
    """(instructions, bytes loaded) of the loop (a backward branch and its body)
    whose body loads the most bytes with `load` ("LDG": global, "LDS": shared)
    per trip; innermost: only loops holding no other loop. None: no such loop."""
    ops = k.sass
    addr_index = {a: i for i, (a, _, _) in enumerate(ops)}
    loops = []
    for i, (addr, op, operands) in enumerate(ops):
        if not op.startswith("BRA"):
            continue
        m = re.search(r"0x([0-9a-f]+)", operands)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target >= addr or target not in addr_index:
            continue
        loops.append((addr_index[target], i))
    best = None
    for j, i in loops:
        if innermost and any(j <= j2 and i2 <= i and (j2, i2) != (j, i) for j2, i2 in loops):
            continue
        body = ops[j:i + 1]
        loaded = sum(_load_width(op2) for _, op2, _ in body if op2.startswith(load))
        if loaded and (best is None or loaded > best[1]):
            best = (len(body), loaded, ops[j][0], ops[i][0])
    return best


def check_streaming(k: Kernel) -> None:
    best = _hot_loop(k, "LDG", innermost=False)
    if best is None:
        return
    n, loaded, start, end = best
    elems = loaded / ELEM_BYTES.get(k.elem, 4)
    k.ipe = n / elems
    k.ipe_what = f"loop {start:#06x}-{end:#06x}: {n} instructions / {elems:g} elements a trip"


def check_shared_loops(k: Kernel) -> None:
    """A tiled kernel's inner products run over tiles in shared memory: its
    innermost loop that reads the most shared memory a trip, over the elements
    that trip reads."""
    best = _hot_loop(k, "LDS", innermost=True)
    if best is None:
        k.problems.append("no innermost loop reading shared memory found")
        return
    n, loaded, start, end = best
    elems = loaded / ELEM_BYTES.get(k.elem, 4)
    k.ipe = n / elems
    k.ipe_what = f"inner loop {start:#06x}-{end:#06x}: {n} instructions / {elems:g} shared elements a trip"


def ceiling(k: Kernel, rules: dict[str, Rule]) -> float | None:
    rule = rules.get(k.family)
    return rule.ceilings.get(ELEM_FORMAT.get(k.elem, k.elem)) if rule else None


def analyse(lib: Path, tool: str, rules: dict[str, Rule]) -> list[Kernel]:
    kernels = parse_resources(run(tool, "-res-usage", str(lib)))
    parse_sass(run(tool, "-sass", str(lib)), kernels)
    names = demangle(list(kernels))
    for k in kernels.values():
        k.name = names.get(k.mangled, k.mangled)
        allowed, why = STACK_ALLOWED.get(k.family, (0, ""))
        if k.local or k.stack > allowed:
            k.problems.append(f"stack frame {k.stack} bytes, local memory {k.local} bytes (spills)")
        elif k.stack:
            k.notes = f"stack frame {k.stack} bytes allowed: {why}"
        checks = rules[k.family].checks if k.family in rules else frozenset()
        if "single_pass" in checks:
            check_single_pass(k)
        if "two_an_sm" in checks:
            check_residency(k)
        elif "streaming" in checks:
            check_streaming(k)
        elif "shared_loops" in checks:
            check_shared_loops(k)
    single_pass_marginals(list(kernels.values()))
    for k in kernels.values():
        c = ceiling(k, rules)
        if k.ipe is not None and c is not None and k.ipe > c:
            k.problems.append(f"{k.ipe:.2f} instructions per element, above the ceiling {c:g}")
    return sorted(kernels.values(), key=lambda k: k.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=str(ROOT / "build" / "libprecisionlab.so"))
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--all", action="store_true", help="list every kernel, not only the checked families")
    ap.add_argument("--find", action="store_true", help="print the cuobjdump found (exit 1 if none) and stop")
    args = ap.parse_args()
    if args.find:
        tool = find_cuobjdump()
        print(tool or "no cuobjdump")
        return 0 if tool else 1
    lib = Path(args.lib)
    if not lib.is_file():
        print(f"sass-check: no library at {lib}: run make lib", file=sys.stderr)
        return 2
    tool = find_cuobjdump()
    if tool is None:
        print("sass-check: no cuobjdump (toolkit or pip install nvidia-cuda-cuobjdump)", file=sys.stderr)
        return 2
    listing = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True)
    if "sm_" not in listing.stdout:
        print(f"sass-check: {lib} holds no device code (built host-only, without nvcc): nothing to check")
        return 0
    rules = library_rules(lib)
    kernels = analyse(lib, tool, rules)
    bad = [k for k in kernels if k.problems]
    if args.json:
        print(json.dumps({"cuobjdump": tool, "library": str(lib), "kernels": [
            {k2: v for k2, v in asdict(k).items() if k2 != "sass"} | {"family": k.family, "elem": k.elem}
            for k in kernels]}, indent=1))
    else:
        shown = [k for k in kernels if args.all or k.problems or k.ipe is not None or k.notes or k.ctas_per_sm]
        for k in shown:
            status = "FAIL" if k.problems else "ok"
            ipe = f"{k.ipe:6.2f} insn/elem (ceiling {ceiling(k, rules)})" if k.ipe is not None else ""
            resident = f"{k.ctas_per_sm} CTAs/SM" if k.ctas_per_sm is not None else ""
            print(f"{status:4} REG {k.regs:3} STACK {k.stack} LOCAL {k.local}  {ipe:32} {resident:10} {k.name[:100]}")
            for p in k.problems:
                print(f"       - {p}")
            if k.notes:
                print(f"       ({k.notes})")
        print(f"sass-check: {len(kernels)} kernels, {len(bad)} failing; "
              f"{sum(1 for k in kernels if (k.stack or k.local) and not k.notes)} with a stack frame or local memory "
              f"beyond the allowed ({sum(1 for k in kernels if k.notes)} allowed, said above)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
