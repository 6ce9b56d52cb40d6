"""info's tables and JSON."""

from __future__ import annotations

from rich.table import Table
from rich.markup import escape

from precisionlab.report.console import stdout
from precisionlab.report.jsondoc import emit_json

def table(d: dict) -> None:
    t = Table(title="precisionlab info", title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", overflow="fold")
    for k, v in d["versions"].items():
        t.add_row(k, str(v))
    t.add_row("CPU", f"{d['cpu']['model']} ({d['cpu']['threads']} threads, {d['cpu']['affinity']} usable)")
    lib = d["library"]
    if "error" in lib:
        t.add_row("library", escape(lib["error"]))
    else:
        t.add_row("library", lib["path"])
        t.add_row("library ABI", str(lib["abi"]))
        t.add_row("library build", escape(lib["build"]))
    c = d["cuda"]
    t.add_row("CUDA runtime (library)", str(c["runtime"]))
    t.add_row("CUDA driver", str(c["driver"]) if c["driver"] else "none")
    if d["gpus"]:
        for i, g in enumerate(d["gpus"]):
            t.add_row(f"GPU {i}", f"{g['name']}, {g['sm_count']} SMs, compute {g['compute_capability']}, "
                                  f"{g['total_mem_bytes'] / 2**30:.1f} GiB")
    else:
        t.add_row("GPU", f"none: {escape(c['unavailable'] or '')}")
    if d.get("torch_cuda"):
        tc = d["torch_cuda"]
        t.add_row("torch CUDA", f"{tc['version']} (available: {tc['available']}, cuDNN {tc['cudnn']})")
    for k, v in d["flags"].items():
        t.add_row(k, str(v))
    stdout.print(t)
    if "catalog" in d:
        _catalog_tables(d["catalog"])


def _catalog_tables(c: dict) -> None:
    yes = lambda b: "-" if b is None else ("yes" if b else "no")
    t = Table(title="kernel variants (the library's catalog)", title_justify="left")
    for col in ("op", "variant", "kind", "devices", "batch-invariant", "deterministic", "default", "what it does"):
        t.add_column(col, overflow="fold")
    for v in c["variants"]:
        t.add_row(v["op"], v["name"], v["kind"], ", ".join(v["devices"]), yes(v["batch_invariant"]),
                  yes(v["deterministic"]), yes(v["default"]), escape(v["summary"]))
    stdout.print(t)
    t = Table(title="formats", title_justify="left")
    for col in ("format", "bits", "p", "emin", "emax", "max", "inf", "NaN", "pl_format code"):
        t.add_column(col, justify="right" if col in ("bits", "p", "emin", "emax", "max") else "left")
    for f in c["formats"]:
        t.add_row(f["name"], str(f["bits"]), str(f["precision"]), str(f["emin"]), str(f["emax"]), f"{f['max']:g}",
                  yes(f["has_inf"]), yes(f["has_nan"]), "storage only" if f["code"] is None else str(f["code"]))
    stdout.print(t)
    t = Table(title="block-scaled formats", title_justify="left")
    for col in ("format", "element", "block", "scale", "tensor scale", "bits/element"):
        t.add_column(col)
    for b in c["block_formats"]:
        t.add_row(b["name"], b["element"], str(b["block"]), b["scale"],
                  f"fp{b['tensor_scale_bits']}" if b["tensor_scale_bits"] else "-", f"{b['bits_per_element']:g}")
    stdout.print(t)


def as_json(d: dict) -> None:
    emit_json("info", {**d, "rows": [{"key": k, "value": v} for k, v in _flatten(d)]})


def _flatten(d, prefix=""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _flatten(v, key + ".")
        elif isinstance(v, list):
            for i, item in enumerate(v):
                yield from _flatten(item, f"{key}.{i}.") if isinstance(item, dict) else [(f"{key}.{i}", item)]
        else:
            yield key, v
