"""precisionlab export's lines and JSON."""

from __future__ import annotations

from precisionlab.report.console import safe_text, stdout
from precisionlab.report.jsondoc import emit_json


def table(res) -> None:
    beside = "".join(f" and {safe_text(f)}" for f in res.side_files)
    stdout.print(f"export {safe_text(res.spec)} --to {safe_text(res.to)}: wrote {safe_text(res.out)}{beside} "
                 f"({sum(f['bytes'] for f in res.files):,} bytes in {len(res.files)} file(s), "
                 f"{res.timing['export_s']:.1f} s)")
    stdout.print("What the conversion changed:")
    for c in res.changes:
        stdout.print(f"  - {safe_text(c)}")


def as_json(res) -> None:
    emit_json("export", {"params": {"model": res.spec, "to": res.to, "out": res.out, "force": res.force}, "changes": res.changes,
                         "side_files": res.side_files,
                         "rows": res.files, "timing": res.timing})
