"""Re-run every example in README.md and docs/*.md: paste its real output, or
(--check) fail when the output changed in anything but timings, machine names
and paths.

An example is a fenced block whose first line is `$ precisionlab ARGS`,
optionally piped through `| head -N` or `| tail -N`; it runs as `python -m precisionlab ARGS`
from the repository root with COLUMNS=160, and its body is what the command
printed on stdout. An HTML comment on the line before the fence marks it:

  <!-- example: gpu -->      needs a GPU: skipped (and counted) unless --gpu
  <!-- example: machine -->  its output is the machine itself (`info`): --check
                             runs it and wants exit 0, but compares nothing
  <!-- example: smollm2 CPU -->  reads SmolLM2-135M-Instruct (`make smollm2`) through
                             docs/data/smollm2/ (a link to its cache, made
                             here): skipped (and counted) where it is not cached;
                             its numbers are the CPU's, as under `cpu NAME`
  <!-- example: cpu NAME -->  its numbers depend on the CPU's own kernels (torch's
                             CPU matmuls pick their blocking and vector width by
                             the instruction set, so fp32/bf16 sums round in
                             another order on an AMX Xeon than on an AMD EPYC).
                             Recorded on the CPU NAME (runtime.machine's
                             cpu_kernel_key: the name, family, model and cache;
                             rewritten on each run); --check on that CPU
                             compares every character,
                             on another it compares the text with every number
                             masked, and counts the example apart; where even
                             that text differs (a sampled string, a verdict at
                             a rounding-sized margin, a table wrapped around
                             wider numbers, llama.cpp's CPU buffer types), the
                             example must still run (exit 0 or 1, output, no
                             internal error) and is listed as "ran on another
                             CPU", not compared: its output is that CPU's

    .venv/bin/python scripts/update_docs.py            # rewrite the files
    .venv/bin/python scripts/update_docs.py --check    # CI: exit 1 on a difference
    .venv/bin/python scripts/update_docs.py --only softmax   # examples whose command matches
    .venv/bin/python scripts/update_docs.py docs/router.md   # one page's examples (a new page, say)

Every page is README.md or docs/*.md: a new page in docs/ is re-run and checked
with no edit here.

Files run two at a time (--jobs), each file's examples in their order: an example
may read what an earlier one in its file wrote, never what another file wrote.

The engine examples (compare engine) read models exported into
docs/data/engines/ (gitignored): before any example that names that folder
runs, ENGINE_MODELS are exported there with `precisionlab export embedded`
(a few seconds; the same bits each time), so a clean clone with the engines
installed (`make engines`) checks them too.

What --check ignores (normalise() below, and tests/test_update_docs.py):
  - timings: a number followed by a time unit (`0.27 s`, `12 ms`, `3 µs`,
    `1.5 ns`), and every cell of the table columns that hold timings or
    throughputs, named by their header: TIMING_COLUMNS. Rich sizes columns to
    their widest cell, so table rows are compared cell by cell, stripped, and
    border lines without their widths;
  - machine names: the values of the JSON fields `cpu_name` and `gpu_name`;
  - paths: the library's folder, the repository root and site-packages before
    a path the package knows, and temporary folders (`/tmp/tmp...`);
  - package versions: the values of the JSON `versions` object.
Every other character counts: a result (an error, a ulp count, a sum, a
verdict) that changes in one digit is a difference.
"""

import argparse
import difflib
import os
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(?:<!-- example: (?P<mark>\w+)(?: (?P<arg>[^\n]*?))? -->\n)?```\n\$ precisionlab (?P<cmd>[^\n]*)\n(?P<body>.*?)```", re.S)
MARKS = {None, "gpu", "machine", "cpu", "smollm2"}

# Table columns whose every cell is a timing or a throughput (bench, tf32).
TIMING_COLUMNS = {"time (ms)", "GB/s", "TFLOP/s", "ns/element", "x numpy.sum", "vs baseline", "% of copy"}

_NUM = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_TIME = re.compile(rf"(?<![\w.]){_NUM} ?(?:s|ms|µs|us|ns)\b")
_JSON_MACHINE = re.compile(r'^(\s*"(?:cpu_name|gpu_name)": )(?:"[^"\n]*"|null)', re.M)
_VERSIONS = re.compile(r'^(\s*"versions": \{\n)(.*?)(^\s*\})', re.M | re.S)
_VERSION_VALUE = re.compile(r'^(\s*"[\w.-]+": )(?:"[^"\n]*"|null)', re.M)
# an absolute path's prefix, up to a part this package knows
_PATH_PREFIX = re.compile(r"(?<![\w./-])/[^\s\"'│┃]*?/(?=(?:precisionlab/(?:lib|models)/|build/libprecisionlab|"
                          r"site-packages/|tests/|scripts/))")
_TMP = re.compile(r"/tmp/tmp[\w-]+")
# wherever the library was found ($PRECISIONLAB_LIB, the package, build/)
_LIB = re.compile(r"(?<![\w./-])/[^\s\"'│┃]*/(?=libprecisionlab[\w.-]*\.so)")
_VERTICAL = "│┃|"
_BOX = set("━─═┏┓┗┛┡┩┢┪┣┫┳┻╇╋┌┐└┘├┤┬┴┼╞╡╪╭╮╰╯ ") | set(_VERTICAL)


def _cells(line: str) -> list[str]:
    sep = "┃" if "┃" in line else "│"
    return [c.strip() for c in line.strip().strip(sep).split(sep)]


def normalise(text: str) -> str:
    """The text with timings, machine names and paths replaced by placeholders
    and tables reduced to their cells (see the module's docstring)."""
    text = _JSON_MACHINE.sub(r"\1<machine>", text)
    text = _VERSIONS.sub(lambda m: m.group(1) + _VERSION_VALUE.sub(r"\1<version>", m.group(2)) + m.group(3), text)
    text = _LIB.sub("<lib>/", text)
    text = _TMP.sub("<tmp>", text)
    text = _PATH_PREFIX.sub("<root>/", text)
    out, header, timing = [], [], set()
    for line in text.splitlines():
        s = line.strip()
        if s and set(s) <= _BOX and not set(s) & set(_VERTICAL):  # a border line: its shape, not its widths
            if s[0] in "┏┌╭":
                header, timing = [], set()
            out.append(re.sub(r"([━─═])\1+", r"\1", s))
            continue
        if s[:1] == "┃":  # a header line; a wrapped header name continues on the next one
            cells = _cells(s)
            header = cells if not header else [f"{a} {b}".strip() for a, b in zip(header, cells, strict=True)]
            timing = {i for i, name in enumerate(header) if name in TIMING_COLUMNS}
            out.append("┃ " + " ┃ ".join(cells) + " ┃")
            continue
        if s[:1] == "│" and s[-1:] == "│":
            cells = [("~" if i in timing and c else c) for i, c in enumerate(_cells(s))]
            s = "│ " + " │ ".join(cells) + " │"
            out.append(_TIME.sub("<time>", s))
            continue
        out.append(_TIME.sub("<time>", line.rstrip()))
    return "\n".join(out) + "\n"


def mask_numbers(text: str) -> str:
    """normalise()'s text with every number a placeholder: an example marked
    cpu, checked on another CPU than the one it was recorded on."""
    return re.sub(_NUM, "#", text)


def this_cpu() -> str:
    sys.path.insert(0, str(ROOT))
    from precisionlab.runtime.machine import cpu_kernel_key

    return cpu_kernel_key()


def run(cmd: str) -> tuple[str, int, str]:
    cut = None
    m = re.search(r"\s*\|\s*(head|tail) -(\d+)\s*$", cmd)
    if m:
        cut, cmd = (m.group(1), int(m.group(2))), cmd[: m.start()]
    env = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "160"})
    p = subprocess.run([sys.executable, "-m", "precisionlab", *shlex.split(cmd)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=900)
    lines = [line.rstrip() for line in p.stdout.splitlines()]
    if cut is not None:  # a summary at the end of a long table: tail
        lines = lines[:cut[1]] if cut[0] == "head" else lines[-cut[1]:]
    return "\n".join(lines) + "\n", p.returncode, p.stderr


SMOLLM2_DATA = ROOT / "docs/data/smollm2"


def smollm2_linked() -> bool:
    """docs/data/smollm2 -> the SmolLM2 cache (scripts/fetch_smollm2.py), where both of its pieces are there."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import fetch_smollm2

    cache = fetch_smollm2.cache_dir()
    if not ((cache / fetch_smollm2.NAME).is_file() and (cache / "hf" / "config.json").is_file()):
        return False
    if not SMOLLM2_DATA.is_symlink():
        SMOLLM2_DATA.parent.mkdir(parents=True, exist_ok=True)
        SMOLLM2_DATA.symlink_to(cache, target_is_directory=True)
    (ROOT / "docs/data/smollm2-out").mkdir(exist_ok=True)  # where the examples write (gitignored)
    return True


ENGINE_DATA = "docs/data/engines/"
# (--to FORMAT, file name): what the examples under ENGINE_DATA read
ENGINE_MODELS = [("gguf:q8_0", "m-q8_0.gguf"), ("ct2:int8", "ct2-int8"), ("onnx:fp16", "m-fp16.onnx")]


def export_engine_models(cmds: list[str]) -> list[str]:
    """Export ENGINE_MODELS into ENGINE_DATA when one of cmds reads that folder;
    the failures, one line each (an engine's package missing, say)."""
    if not any(ENGINE_DATA in c for c in cmds):
        return []
    (ROOT / ENGINE_DATA).mkdir(parents=True, exist_ok=True)
    failures = []
    for to, name in ENGINE_MODELS:
        # --force: the folder is this script's, and a second run re-exports over the first (same bits)
        out, code, _ = run(f"export embedded --to {to} --out {ENGINE_DATA}{name} --force")
        if code:
            failures.append(f"precisionlab export embedded --to {to}: exit {code} (the engine examples need "
                            "`make engines`)")
    return failures


def files(only: list[str] | None = None) -> list[Path]:
    """README.md and docs/*.md, or those of them named in only (paths from the
    current folder); a name that is not one of them is refused."""
    every = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if not only:
        return every
    chosen = [Path(p).resolve() for p in only]
    unknown = [p for p, c in zip(only, chosen, strict=True) if c not in every]
    if unknown:
        raise ValueError(f"not README.md or docs/*.md: {', '.join(unknown)}")
    return list(dict.fromkeys(chosen))


def check_file(path: Path, args, cpu: str) -> dict:
    """Run one file's examples in their order (a later one may read what an earlier one wrote) and return
    the file's new text, its counts, failures and log lines; files are independent of one another."""
    text = path.read_text()
    rel = path.relative_to(ROOT)
    res = {"checked": 0, "skipped": 0, "machine": 0, "masked": 0, "other_cpu": [], "failures": [], "log": [],
           "text": text}

    def replace(m):
        mark, cmd, body = m.group("mark"), m.group("cmd"), m.group("body")
        if mark not in MARKS:
            res["failures"].append(f"{rel}: unknown example mark {mark!r} before `precisionlab {cmd}`")
            return m.group(0)
        if args.only and args.only not in cmd:
            return m.group(0)
        if (mark == "gpu" and not args.gpu) or (mark == "smollm2" and not smollm2_linked()):
            res["skipped"] += 1
            return m.group(0)
        t0 = time.perf_counter()
        out, code, err = run(cmd)
        recorded_on = m.group("arg") if mark in ("cpu", "smollm2") else None
        dt = time.perf_counter() - t0
        if args.check:
            if mark == "machine":
                res["machine"] += 1
                status = "ran" if code == 0 else f"FAILED (exit {code})"
                if code != 0:
                    res["failures"].append(f"{rel}: precisionlab {cmd}: exit {code}")
            else:
                res["checked"] += 1
                want, got = normalise(body), normalise(out)
                other = recorded_on is not None and recorded_on != cpu
                if other:  # recorded on another CPU: its text, not its digits
                    res["masked"] += 1
                    want, got = mask_numbers(want), mask_numbers(got)
                status = "ok" if want == got else "DIFFERS"
                if want != got and other and code in (0, 1) and out.strip() and "internal error" not in err:
                    status = "ran"  # that CPU's output, not this one's: run, not compared
                    res["other_cpu"].append(f"{rel}: precisionlab {cmd}")
                elif want != got:
                    diff = list(difflib.unified_diff(want.splitlines(), got.splitlines(), f"{rel} (committed)",
                                                     "regenerated", lineterm="", n=2))
                    res["failures"].append(f"{rel}: precisionlab {cmd}\n" + "\n".join(diff[:60])
                                           + (f"\n... {len(diff) - 60} more diff lines" if len(diff) > 60 else ""))
            print(f"{status:>8} {dt:6.1f} s  {rel}: precisionlab {cmd}", file=sys.stderr, flush=True)
            return m.group(0)
        print(f"{dt:6.1f} s  {rel}: precisionlab {cmd}", file=sys.stderr, flush=True)
        prefix = f"<!-- example: {mark}{' ' + cpu if mark in ('cpu', 'smollm2') else ''} -->\n" if mark else ""
        return f"{prefix}```\n$ precisionlab {cmd}\n{out}```"

    res["text"] = BLOCK.sub(replace, text)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare instead of rewriting; exit 1 on a difference")
    ap.add_argument("--gpu", action="store_true", help="also run the examples marked gpu")
    ap.add_argument("--only", default=None, help="only the examples whose command contains this text")
    ap.add_argument("pages", nargs="*", help="only these files (README.md, docs/PAGE.md); default: every one")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="files run at once (default: 2, or 1 on a one-core machine)")
    args = ap.parse_args()
    t_all = time.perf_counter()
    cpu = this_cpu()
    try:
        pages = files(args.pages)
    except ValueError as e:
        ap.error(str(e))  # one line and exit 2
    selected = [m.group("cmd") for path in pages for m in BLOCK.finditer(path.read_text())
                if not args.only or args.only in m.group("cmd")]
    failures = export_engine_models(selected)
    # The longest files first, so the last one to start is a short one.
    paths = sorted(pages, key=lambda f: -len(BLOCK.findall(f.read_text())))
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = dict(zip(paths, pool.map(lambda f: check_file(f, args, cpu), paths), strict=True))
    count = {k: sum(done[f][k] for f in paths) for k in ("checked", "skipped", "machine", "masked")}
    other_cpu = [x for f in pages for x in done[f]["other_cpu"]]
    for path in pages:  # report and write in the files' own order
        failures += done[path]["failures"]
        if not args.check and done[path]["text"] != path.read_text():
            path.write_text(done[path]["text"])
    total = time.perf_counter() - t_all
    skipped = count["skipped"]
    note = (f"{skipped} skipped (need a GPU: --gpu runs them; or SmolLM2: make smollm2)" if skipped
            else "none skipped")
    if args.check:
        print(f"update_docs --check: {count['checked']} examples compared ({count['masked']} of them recorded on "
              f"another CPU: numbers masked), {count['machine']} machine-specific run only, {note}; {total:.0f} s",
              file=sys.stderr)
        if other_cpu:
            print(f"{len(other_cpu)} recorded on another CPU ran here but print that CPU's text, not compared: "
                  + "; ".join(other_cpu), file=sys.stderr)
    else:
        print(f"update_docs: examples re-run, {note}; {total:.0f} s", file=sys.stderr)
    for f in failures:
        print(f"\n{f}", file=sys.stderr)
    if failures:
        print(f"\nupdate_docs: {len(failures)} example(s) differ or failed. If the change is intended, run "
              "scripts/update_docs.py and commit the regenerated docs.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
