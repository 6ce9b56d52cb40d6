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
    "gguf": (("f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m"), "gguf", False),
    "ct2": (("float32", "int8", "bfloat16", "int8_float32"), "ctranslate2", True),
    "onnx": (formats.ONNX_EXPORT, "onnx", False),
}
# Asked for by name, not offered, and why.
UNAVAILABLE: dict[str, str] = {}
# variants written by another package than the format's own (llama.cpp's quantizer for K-quants)
VARIANT_PACKAGE = {("gguf", "q4_k_m"): "llama_cpp"}
# Where an export records its source (the model it was exported from, as a spec: `embedded` or
# `hf:/abs/dir`): a GGUF metadata key (exporters/gguf.SOURCE_KEY), a json file in a ct2 folder,
# a json file beside an ONNX file. compare model --engine takes it as the default reference.
SOURCE_FILE = "precisionlab-source.json"
SOURCE_SUFFIX = ".precisionlab-source.json"
# what a file target's --out must end in (a folder target takes any name)
FILE_EXTENSIONS = {"gguf": (".gguf",), "onnx": (".onnx",)}
_EXTRA = {"transformers": "hf", "gguf": "engines", "ctranslate2": "ct2", "onnx": "onnx", "llama_cpp": "engines"}


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
    side_files: list[str] = field(default_factory=list)  # written beside --out, named in the success line
    force: bool = False  # --force: a non-empty folder filled, an existing side file replaced


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


def check(spec: str, to: str, out: str, force: bool = False) -> tuple[str, str | None, str | None]:
    """Everything that can be refused before a weight is read: (kind, variant, HF folder or None).
    Nothing the user did not name is replaced without `force`: a non-empty folder (with force it is
    filled, never emptied: its other files stay), the ONNX file's side file."""
    from precisionlab.engines.registry import parse

    kind, variant = parse_format(to)
    # The route first: a source that can never reach this format is refused the same way whether or
    # not the format's package is installed.
    prefix, arg = parse(spec)
    if prefix not in ("embedded", "hf", "llamacpp"):
        raise UsageError(f"export {spec!r}: exports the embedded model, a Hugging Face folder (hf:DIR) or a "
                         "GGUF file to a folder (llamacpp:FILE --to hf)")
    src = None
    if prefix == "llamacpp":
        _check_gguf_source(arg, kind)
        src = arg
    package = FORMATS[kind][1]
    for need in {package, "transformers", VARIANT_PACKAGE.get((kind, variant), "transformers")}:
        if importlib.util.find_spec(need) is None:
            raise UsageError(f"--to {to}: needs the {need} package: pip install 'precisionlab[{_EXTRA[need]}]'")
    if kind == "onnx" and importlib.util.find_spec("torch.onnx") is None:
        raise UsageError("--to onnx: this torch has no torch.onnx")
    if prefix == "hf":
        from precisionlab.engines.hf import HFEngine

        HFEngine.check(arg)  # refuses foreign code (auto_map) before transformers reads the folder
        if not Path(arg).is_dir():
            raise UsageError(f"export hf:{arg}: give a local folder")
        src = arg
        if kind == "onnx" and importlib.util.find_spec("onnxscript") is None:
            raise UsageError("--to onnx of a Hugging Face folder: needs the onnxscript package (torch's dynamo "
                             "exporter): pip install 'precisionlab[onnx]'")
    p = Path(out)
    if not out or (p.exists() and not (p.is_dir() if FORMATS[kind][2] else p.is_file())):
        raise UsageError(f"--out {out!r}: {'a folder' if FORMATS[kind][2] else 'a file'} is written there")
    if p.resolve() == Path.cwd().resolve() or p.resolve() == Path(p.resolve().anchor):
        raise UsageError(f"--out {out!r}: not the current or the root folder")
    from precisionlab.io import outputs

    read = [("MODEL", src)] if src is not None and prefix != "llamacpp" else []  # never over the folder it reads, nor in it, nor around it
    if FORMATS[kind][2]:
        outputs.check_output_dir(out, (), "--out", read)
        outputs.check_folder_to_fill(out, "--out", force)
    else:
        outputs.check_output_path(out, None, "--out", read)
        outputs.check_extension(out, FILE_EXTENSIONS[kind], "--out", f"a {kind} file")
        outputs.check_side_file(out + SOURCE_SUFFIX, "--out", force)
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out!r}: {str(parent)!r} is not a writable folder")
    return kind, variant, src


def _check_gguf_source(arg: str, kind: str) -> None:
    """llamacpp:FILE is exported to a Hugging Face folder only (the exact-weights reference)."""
    if kind != "hf":
        raise UsageError(f"export llamacpp:{arg}: a GGUF file is exported --to hf (its dequantised weights); "
                         "export that folder to other formats")
    if not arg or not Path(arg).is_file() or not arg.endswith(".gguf"):
        raise UsageError(f"export llamacpp:{arg!r}: give a .gguf file")
    if importlib.util.find_spec("accelerate") is None or importlib.util.find_spec("gguf") is None:
        raise UsageError("export llamacpp:FILE --to hf: needs the accelerate and gguf packages (transformers' "
                         "GGUF loader): pip install 'precisionlab[engines]'")


def run(spec: str, to: str, out: str, force: bool = False) -> ExportResult:
    from precisionlab.engines.exporters import hf
    from precisionlab.io import outputs

    kind, variant, src = check(spec, to, out, force)
    t0 = time.perf_counter()
    changes: list[str] = []
    written: list[str] = []  # the members a folder target received
    from precisionlab.engines.registry import parse

    gguf_source = parse(spec)[0] == "llamacpp"
    source = "embedded" if src is None else f"{'llamacpp' if gguf_source else 'hf'}:{Path(src).resolve()}"
    from precisionlab.engines.model_folders import quiet_library

    with quiet_library(), tempfile.TemporaryDirectory(prefix="precisionlab-export-") as work:
        if src is None and kind != "onnx":
            changes += hf.write_embedded(work)
            src = work
        if kind == "hf" and gguf_source:
            written += outputs.atomic_dir(out, lambda tmp: changes.extend(hf.from_gguf(src, tmp)), force)
        elif kind == "hf":
            if src == work:
                written += outputs.atomic_dir(out, lambda tmp: _copy(work, tmp), force)
            else:
                written += outputs.atomic_dir(out, lambda tmp: changes.extend(hf.resave(src, tmp)), force)
        elif kind == "gguf":
            from precisionlab.engines.exporters import gguf

            outputs.atomic_write(out, lambda tmp: changes.extend(gguf.write(src, tmp, variant, source)))
        elif kind == "ct2":
            from precisionlab.engines.exporters import ct2

            def ct2_dir(tmp):
                changes.extend(ct2.write(src, tmp, variant))
                (Path(tmp) / SOURCE_FILE).write_text(_source_json(source))

            written += outputs.atomic_dir(out, ct2_dir, force)
        else:
            from precisionlab.engines.exporters import onnx

            if src is None:
                outputs.atomic_write(out, lambda tmp: changes.extend(onnx.write_embedded(tmp, variant)))
            else:
                outputs.atomic_write(out, lambda tmp: changes.extend(onnx.write_hf(src, tmp, variant)))
            outputs.atomic_write(out + SOURCE_SUFFIX, _source_json(source).encode())
    if kind != "hf":
        changes.append(f"source recorded ({'GGUF key ' + _gguf_key() if kind == 'gguf' else 'beside it'}): "
                       f"{source} (compare engine's default reference)")
    p = Path(out)
    # what this run wrote, and only that (a folder filled with --force keeps the user's other files)
    side = [out + SOURCE_SUFFIX] if kind == "onnx" else []
    paths = [p / n for n in sorted(written)] if FORMATS[kind][2] else [p, *map(Path, side)]
    files = [{"name": f.name, "bytes": f.stat().st_size} for f in paths]
    return ExportResult(spec, to, out, changes, files, {"export_s": time.perf_counter() - t0}, side, force)


def _copy(src: str, dst: str) -> None:
    import shutil

    for f in Path(src).iterdir():
        shutil.copy2(f, Path(dst) / f.name)


def _gguf_key() -> str:
    from precisionlab.engines.exporters import gguf

    return gguf.SOURCE_KEY


def _source_json(source: str) -> str:
    import json

    return json.dumps({"source": source}) + "\n"


def recorded_source(spec: str | None) -> str | None:
    """The source an engine's export recorded, as a spec (`embedded` or
    `hf:DIR`), or None where it records none (not an export of this tool, or
    an older one). A record that is neither, or names a folder that is gone,
    is a usage error shown escaped: it comes from a file."""
    import json

    from precisionlab.engines.registry import parse
    prefix, arg = parse(spec)
    if prefix not in ("llamacpp", "ct2", "onnx") or not arg:
        return None
    path = arg.split(",")[0]
    if prefix == "llamacpp":
        from precisionlab.engines.exporters import gguf

        got = gguf.read_source(path)
    else:
        record = Path(path) / SOURCE_FILE if prefix == "ct2" else Path(path + SOURCE_SUFFIX)
        try:
            got = json.loads(record.read_text(encoding="utf-8")).get("source") if record.is_file() else None
        except (OSError, ValueError, AttributeError):
            got = None
    if got is None:
        return None
    if not isinstance(got, str) or not (got == "embedded" or (got.startswith("hf:") and Path(got[3:]).is_dir())):
        raise UsageError(f"{spec!r}: its export records the source {got!r}, which is "
                         "not the embedded model nor an existing folder; give --reference")
    return got
