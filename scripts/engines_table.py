"""Measure docs/engines.md's tables on this machine: the embedded model
exported into every engine format, every setting run through the real CLI
(`precisionlab compare engine --engine SPEC --reference hf:HF_EXPORT --json`),
and the markdown written between the doc's `engines_table` markers.

    .venv/bin/python scripts/engines_table.py                 # all formats, rewrite docs/engines.md
    .venv/bin/python scripts/engines_table.py --print         # the tables on stdout, the doc untouched
    .venv/bin/python scripts/engines_table.py --only gguf:q8_0,ct2:int8   # a subset (the doc untouched)

The formats are export.FORMATS' variants (every one `precisionlab export`
offers; a new one, gguf:q4_k_m say, joins the table with no edit here), and
the settings of each are SETTINGS below. The exported files go to a temporary
folder (--work DIR keeps them). Needs precisionlab[engines].

Against two yardsticks: the reference is the Hugging Face fp32 run of the
`--to hf` export; HF bf16 is the same folder run in bf16 (`compare
metrics --dtypes bf16`), and "÷ bf16" is an engine's mean KLD over HF bf16's:
below 1, the engine departs less than computing in bf16 does. Then each engine
against itself: opened twice, and at two thread counts and batch settings
(`--reference SPEC_A --engine SPEC_B`): bit-identical or by how much.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from precisionlab.engines import export  # noqa: E402
from precisionlab.io import logits_file, outputs  # noqa: E402

DOC = ROOT / "docs" / "engines.md"
BEGIN, END = "<!-- engines_table: begin -->", "<!-- engines_table: end -->"
TOKENS, STEPS = 512, 30

# How each format is run: its engine spec prefix, the exported file's name, and
# the settings (spec suffixes) of the accuracy table, in groups of one CLI run
# each (a group whose run fails is re-run one setting at a time, and a refusal
# is a row). gguf: every KV-cache type with flash attention off and on; a
# quantised V cache without flash attention is refused by llama.cpp, so alone.
KV = ("f32", "f16", "bf16", "q8_0")
SETTINGS = {
    "gguf": ("llamacpp", "m-{v}.gguf", [[f",kv={kv},flash=0" for kv in KV if kv != "q8_0"], [",kv=q8_0,flash=0"],
                                        [f",kv={kv},flash=1" for kv in KV]]),
    "ct2": ("ct2", "ct2-{v}", [[""]]),
    "onnx": ("onnx", "m-{v}.onnx", [[""]]),
}
# Repeatability: (format, base setting, [(label, setting A, setting B), ...]).
PAIRS = [
    ("gguf:f32", ",kv=f32", [("run twice", "", ""), ("n_threads 1 vs 2", "", ",threads=2"),
                             ("n_batch 512 vs 64", "", ",batch=64"), ("flash: run twice", ",flash=1", ",flash=1")]),
    ("gguf:q8_0", ",kv=f32", [("run twice", "", ""), ("n_threads 1 vs 2", "", ",threads=2"),
                              ("n_batch 512 vs 64", "", ",batch=64")]),
    ("ct2:float32", "", [("run twice", "", ""), ("intra_threads 1 vs 2", "", ",threads=2"),
                         ("batch of 1 vs 4 prompts", "", ",batch=4")]),
    ("ct2:int8", "", [("run twice", "", ""), ("intra_threads 1 vs 2", "", ",threads=2"),
                      ("batch of 1 vs 4 prompts", "", ",batch=4")]),
    ("onnx:fp32", "", [("run twice", "", ""), ("intra_op threads 1 vs 2", "", ",threads=2"),
                       ("batch of 1 vs 4 prompts", "", ",batch=4")]),
]
PACKAGES = ("llama_cpp_python", "ctranslate2", "onnxruntime", "transformers", "torch", "gguf", "onnx")


def cli(*args: str) -> tuple[int, dict | None, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "precisionlab", *args, "--json"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=1800)
    doc = json.loads(p.stdout) if p.returncode == 0 else None
    return p.returncode, doc, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""


def formats(only: list[str] | None) -> list[str]:
    every = [f"{k}:{v}" for k, (variants, _, _) in export.FORMATS.items() if k in SETTINGS for v in variants]
    if only:
        unknown = [f for f in only if f not in every]
        if unknown:
            sys.exit(f"engines_table: --only {','.join(unknown)}: not among {', '.join(every)}")
        return [f for f in every if f in only]
    return every


def exported(work: Path, fmt: str) -> str:
    kind, _, v = fmt.partition(":")
    out = work / SETTINGS[kind][1].format(v=v)
    if not out.exists():
        code, _, err = cli("export", "embedded", "--to", fmt, "--out", str(out))
        if code:
            sys.exit(f"engines_table: export --to {fmt} failed (exit {code}): {err}")
    return f"{SETTINGS[kind][0]}:{out}"


def compare(specs: list[str], reference: str) -> dict[str, dict | str]:
    """Each spec's row, or the one line its refusal printed: the specs in one
    run (the reference computed once), each alone where that run failed."""
    base = ["compare", "engine", "--reference", reference, "--tokens", str(TOKENS), "--steps", str(STEPS)]
    code, doc, _ = cli(*base, *[a for s in specs for a in ("--engine", s)])
    if code == 0:
        return {r["engine_spec"]: r for r in doc["rows"]}
    out: dict[str, dict | str] = {}
    for s in specs:
        code, doc, err = cli(*base, "--engine", s)
        out[s] = doc["rows"][0] if code == 0 else f"exit {code}: {err.removeprefix('precisionlab: ')}"
    return out


def yardstick(hf: str, work: Path) -> dict:
    """HF bf16 against HF fp32 over the same positions, and its greedy divergence."""
    from precisionlab.experiments.engines import shifted_max_abs

    f32, b16 = work / "hf-fp32.safetensors", work / "hf-bf16.safetensors"
    code, doc, err = cli("compare", "metrics", "--model", hf, "--dtypes", "bf16", "--tokens", str(TOKENS),
                         "--save-logits", f"fp32={f32}", "--save-logits", f"bf16={b16}")
    if code:
        sys.exit(f"engines_table: compare metrics failed: {err}")
    row = doc["rows"][0]
    a, b = logits_file.open_file(str(f32), "fp32"), logits_file.open_file(str(b16), "bf16")
    row["max_abs_diff_shifted"] = shifted_max_abs(a.rows(0, a.positions), b.rows(0, b.positions))
    code, plain, err = cli("compare", "model", "--model", hf, "--dtypes", "bf16", "--steps", str(STEPS))
    if code:
        sys.exit(f"engines_table: compare model failed: {err}")
    s = plain["summary"][0]
    row["greedy_diverged_at"], row["reference_margin_at_divergence"] = s["diverged_at"], s["fp32_margin_at_divergence"]
    return row


def sci(x) -> str:
    return "-" if x is None else ("0" if x == 0 else f"{x:.2e}")


def greedy(r: dict) -> str:
    at = r.get("greedy_diverged_at")
    return "-" if at is None else f"step {at} ({r['reference_margin_at_divergence']:.3g})"


def settings_text(r: dict) -> str:
    e = r["engine"]
    if e.get("engine") == "llama.cpp":
        return (f"kv {e['kv_cache_type']}, flash {int(e['flash_attn'])}"
                + ("" if e.get("extra_bufts") else ", no extra bufts"))
    if e.get("engine") == "ctranslate2":
        return f"compute {e['compute_type']}" + ("" if e["compute_type"] == e["compute_type_asked"] or
                                                  e["compute_type_asked"] == "default"
                                                  else f" (asked {e['compute_type_asked']})")
    return f"{e.get('output_type', '')}, opt {e.get('graph_optimization', '')}"


def accuracy_table(rows: list[tuple[str, dict | str]], bf16: dict) -> list[str]:
    head = ["| engine · file | settings | KLD mean | KLD p99 | ÷ HF bf16 | top-1 % | max \\|Δ logit\\| shifted |"
            " greedy divergence (ref margin) | µs/token |", "|---|---|---|---|---|---|---|---|---|",
            f"| HF bf16 (the yardstick) | torch bf16 | {sci(bf16['kld_mean'])} | {sci(bf16['kld_p99'])} | 1 | "
            f"{bf16['top1_agree_pct']:.2f} | {sci(bf16['max_abs_diff_shifted'])} | {greedy(bf16)} | - |"]
    for name, r in rows:
        if isinstance(r, str):
            head.append(f"| {name} | {r} | | | | | | | |")
            continue
        ratio = r["kld_mean"] / bf16["kld_mean"] if bf16["kld_mean"] else None
        head.append(f"| {name} | {settings_text(r)} | {sci(r['kld_mean'])} | {sci(r['kld_p99'])} | "
                    f"{'-' if ratio is None else f'{ratio:.2g}'} | {r['top1_agree_pct']:.2f} | "
                    f"{sci(r['max_abs_diff_shifted'])} | {greedy(r)} | {1e6 * r['forward_s'] / r['positions']:.0f} |")
    return head


def repeat_table(rows: list[tuple[str, str, dict | str]]) -> list[str]:
    out = ["| engine · file | A vs B | bit-identical | max \\|Δ logit\\| | max \\|Δ logit\\| shifted | max KLD |"
           " greedy divergence |", "|---|---|---|---|---|---|---|"]
    for name, label, r in rows:
        if isinstance(r, str):
            out.append(f"| {name} | {label} | {r} | | | | |")
            continue
        out.append(f"| {name} | {label} | {'yes' if r['bit_identical'] else 'no'} | {sci(r['max_abs_diff'])} | "
                   f"{sci(r['max_abs_diff_shifted'])} | {sci(r['kld_max'])} | {greedy(r)} |")
    return out


def machine() -> str:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = set(next(line for line in info.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        pass
    have = [f for f in ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8") if f in flags]
    return (f"{cpu}, {os.cpu_count()} cores ({', '.join(have) or 'no AVX-512'}"
            f"{'' if 'amx_int8' in flags else '; no AMX'})")


def versions() -> str:
    got = []
    for p in PACKAGES:
        try:
            got.append(f"{p} {importlib.metadata.version(p)}")
        except importlib.metadata.PackageNotFoundError:
            got.append(f"{p} (absent)")
    return ", ".join(got)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated formats (gguf:q8_0,ct2:int8); the doc is untouched")
    ap.add_argument("--print", action="store_true", help="print the tables instead of rewriting docs/engines.md")
    ap.add_argument("--work", default=None, help="keep the exported models in this folder (default: a temporary one)")
    args = ap.parse_args()
    only = args.only.split(",") if args.only else None
    with tempfile.TemporaryDirectory(prefix="precisionlab-engines-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        hf = work / "hf"
        if not hf.exists():
            code, _, err = cli("export", "embedded", "--to", "hf", "--out", str(hf))
            if code:
                sys.exit(f"engines_table: export --to hf failed: {err}")
        ref = f"hf:{hf}"
        bf16 = yardstick(ref, work)
        rows = []
        for fmt in formats(only):
            spec = exported(work, fmt)
            for group in SETTINGS[fmt.partition(":")[0]][2]:
                specs = [spec + s for s in group]
                got = compare(specs, ref)
                rows += [(fmt, got[s]) for s in specs]
        pairs = []
        for fmt, base, cases in PAIRS:
            if fmt not in formats(only):
                continue
            spec = exported(work, fmt) + base
            for label, a, b in cases:
                pairs.append((fmt, label, compare([spec + b], spec + a)[spec + b]))
    lines = [f"Measured on {machine()}; {versions()}; {TOKENS} positions of the held-out text teacher-forced, "
             f"{STEPS} greedy steps from `ROMEO:`. Made by `python scripts/engines_table.py` (the exports, then "
             f"one `compare engine --engine ... --reference hf:HF --json` per file). µs/token: the engine's "
             "teacher-forced forward alone, on a shared machine (a rough figure).", "",
             "Against the HF fp32 run (÷ HF bf16: the engine's mean KLD over HF bf16's):", "",
             *accuracy_table(rows, bf16), "",
             "Each engine against itself (`--reference A --engine B`; A is the first setting, kv=f32 for GGUF):", "",
             *repeat_table(pairs)]
    text = "\n".join(lines) + "\n"
    if args.print or only:
        print(text, end="")
        return 0
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        sys.exit(f"engines_table: {DOC} has no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    outputs.atomic_write(DOC, (head + BEGIN + "\n" + text + END + rest.split(END, 1)[1]).encode())
    print(f"engines_table: {DOC.relative_to(ROOT)} rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
