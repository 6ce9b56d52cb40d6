"""precisionlab export: options parsed here; the work is engines/export.py's, the output the report's."""

from __future__ import annotations

from typing import Annotated

import typer

from precisionlab.cli.options import JsonOpt, force_option
from precisionlab.engines.export import format_help


def command(
    model: Annotated[str, typer.Argument(help="What to export: embedded (the shipped model) or hf:DIR.")],
    to: Annotated[str, typer.Option("--to", help=f"The format: {format_help()}.")],
    out: Annotated[str, typer.Option("--out", help="The file (gguf, onnx) or folder (hf, ct2) to write; "
                                     "written atomically.")],
    force: force_option("files of the same names in a non-empty folder (its other files are kept) or an "
                        "existing side file (m.onnx.precisionlab-source.json)") = False,
    json_out: JsonOpt = False,
):
    """A model in another engine's format (Hugging Face, GGUF, CTranslate2, ONNX), with what the conversion changed."""
    from precisionlab.engines import export
    from precisionlab.report import export as export_report
    from precisionlab.report.output import Output

    export.check(model, to, out, force)
    Output(export_report, json_out).run("export", lambda advance: export.run(model, to, out, force))
