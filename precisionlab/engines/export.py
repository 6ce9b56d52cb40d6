"""precisionlab export: a model (the embedded one, or a Hugging Face folder)
written in another engine's format, with the list of what the conversion
changed. Every target goes through one Hugging Face folder (the embedded
model is first written as a Qwen3 checkpoint, exporters/hf.py), so a GGUF,
CTranslate2 or ONNX file holds exactly the numbers `--to hf` does.

FORMATS is the one table of targets and their variants: the CLI's help,
its checks and the tests read it.
"""

from __future__ import annotations

from precisionlab.catalog import formats

import importlib.util
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from precisionlab.errors import UsageError

# target -> (variants, the package it needs, whether it writes a folder)
FORMATS = {
    "hf": ((), "transformers", True),
    "gguf": (("f32", "f16", "bf16", "q8_0", "q4_0"), "gguf", False),
    "ct2": (("float32", "int8", "bfloat16", "int8_float32"), "ctranslate2", True),
    "onnx": (formats.ONNX_EXPORT, "onnx", False),
}
# Asked for by name, not offered, and why.
UNAVAILABLE = {"gguf:q4_k_m": "the gguf package cannot quantize K-quants (only dequantize them), and their "
                              "256-wide super-blocks do not divide the embedded model's 128-wide rows; use gguf:q4_0"}
_EXTRA = {"transformers": "hf", "gguf": "engines", "ctranslate2": "ct2", "onnx": "onnx"}


def format_help() -> str:
    return " | ".join(k if not v else f"{k}:{'|'.join(v)}" for k, (v, _, _) in FORMATS.items())


@dataclass
class ExportResult:
    spec: str
    to: str
    out: str
    changes: list[str]
    files: list[dict] = field(default_factory=list)
    timing: dict = field(default_factory=dict)


def parse_format(to: str) -> tuple[str, str | None]:
    if to in UNAVAILABLE:
        raise UsageError(f"--to {to}: not available: {UNAVAILABLE[to]}")
    kind, _, variant = to.partition(":")
    if kind not in FORMATS:
        raise UsageError(f"--to {to!r}: unknown format; one of {format_help()}")
    variants = FORMATS[kind][0]
    if not variants:
        if variant:
            raise UsageError(f"--to {to!r}: {kind} takes no variant")
        return kind, None
    if variant not in variants:
        raise UsageError(f"--to {to!r}: give {kind}:VARIANT, VARIANT one of {', '.join(variants)}")
    return kind, variant


def check(spec: str, to: str, out: str) -> tuple[str, str | None, str | None]:
    """Everything that can be refused before a weight is read: (kind, variant, HF folder or None)."""
    from precisionlab.engines.registry import parse

    kind, variant = parse_format(to)
    package = FORMATS[kind][1]
    for need in {package, "transformers"}:
        if importlib.util.find_spec(need) is None:
            raise UsageError(f"--to {to}: needs the {need} package: pip install 'precisionlab[{_EXTRA[need]}]'")
    if kind == "onnx" and importlib.util.find_spec("torch.onnx") is None:
        raise UsageError("--to onnx: this torch has no torch.onnx")
    prefix, arg = parse(spec)
    if prefix not in ("embedded", "hf"):
        raise UsageError(f"export {spec!r}: exports the embedded model or a Hugging Face folder (hf:DIR)")
    src = None
    if prefix == "hf":
        from precisionlab.engines.hf import HFEngine

        HFEngine.check(arg)  # refuses foreign code (auto_map) before transformers reads the folder
        if not Path(arg).is_dir():
            raise UsageError(f"export hf:{arg}: give a local folder")
        src = arg
        if kind == "onnx":
            raise UsageError("--to onnx: exports the embedded model only (transformers' mask code does not trace "
                             "with torch.onnx's TorchScript exporter)")
    p = Path(out)
    if not out or (p.exists() and not (p.is_dir() if FORMATS[kind][2] else p.is_file())):
        raise UsageError(f"--out {out!r}: {'a folder' if FORMATS[kind][2] else 'a file'} is written there")
    if p.is_dir() and any(p.iterdir()) and not ((p / "config.json").is_file() or (p / "model.bin").is_file()):
        # a folder is replaced whole: only an earlier export (a model folder) or an empty one
        raise UsageError(f"--out {out!r}: a folder that holds no model (no config.json or model.bin) is not "
                         "replaced; name a new or empty folder")
    if p.resolve() == Path.cwd().resolve() or p.resolve() == Path(p.resolve().anchor):
        raise UsageError(f"--out {out!r}: not the current or the root folder")
    if src is not None:  # never over the folder it reads, nor a file in it, nor around it
        from precisionlab.io import outputs

        read = [("MODEL", src)]
        if FORMATS[kind][2]:
            outputs.check_output_dir(out, (), "--out", read)
        else:
            outputs.check_output_path(out, None, "--out", read)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out!r}: {str(parent)!r} is not a writable folder")
    return kind, variant, src


def run(spec: str, to: str, out: str) -> ExportResult:
    from precisionlab.engines.exporters import hf
    from precisionlab.io import outputs

    kind, variant, src = check(spec, to, out)
    t0 = time.perf_counter()
    changes: list[str] = []
    from precisionlab.engines.hf import quiet_library

    with quiet_library(), tempfile.TemporaryDirectory(prefix="precisionlab-export-") as work:
        if src is None and kind != "onnx":
            changes += hf.write_embedded(work)
            src = work
        if kind == "hf":
            if src == work:
                outputs.atomic_dir(out, lambda tmp: _copy(work, tmp))
            else:
                outputs.atomic_dir(out, lambda tmp: changes.extend(hf.resave(src, tmp)))
        elif kind == "gguf":
            from precisionlab.engines.exporters import gguf

            outputs.atomic_write(out, lambda tmp: changes.extend(gguf.write(src, tmp, variant)))
        elif kind == "ct2":
            from precisionlab.engines.exporters import ct2

            outputs.atomic_dir(out, lambda tmp: changes.extend(ct2.write(src, tmp, variant)))
        else:
            from precisionlab.engines.exporters import onnx

            outputs.atomic_write(out, lambda tmp: changes.extend(onnx.write_embedded(tmp, variant)))
    p = Path(out)
    files = [{"name": f.name, "bytes": f.stat().st_size} for f in (sorted(p.iterdir()) if p.is_dir() else [p])]
    return ExportResult(spec, to, out, changes, files, {"export_s": time.perf_counter() - t0})


def _copy(src: str, dst: str) -> None:
    import shutil

    for f in Path(src).iterdir():
        shutil.copy2(f, Path(dst) / f.name)
