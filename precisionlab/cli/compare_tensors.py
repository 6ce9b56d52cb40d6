"""precisionlab compare tensors: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import JsonOpt, TolOpt, WideOpt, parse_tol
from precisionlab.errors import UsageError


def _yours(flag: str, text: str):
    """A repeatable option that changes YOURS' layout (io/tensor_layout)."""
    return Annotated[Optional[list[str]], typer.Option(flag, help=text[:-1] + " (repeatable).")]


def command(
    files: Annotated[list[str], typer.Argument(help="A B (two dumps), or REF_FP32 REF_LOW YOURS (three-way). Each: "
                                               ".npy, .npz, .pt (nested containers flattened; weights_only) or "
                                               ".safetensors.", show_default=False)],
    maps: Annotated[Optional[list[str]], typer.Option("--map", help="Rename one side's tensors: 'REGEX=REPLACEMENT' "
                                                      "(re.sub; repeatable; applied to the side where it makes more "
                                                      "names match, YOURS/B on a tie). 'NAME=A+B' (a '+' on the right) "
                                                      "compares NAME with the sum of YOURS' A and B, in float64; each "
                                                      "'*' stands for the same text in every term.")] = None,
    layouts: _yours("--layout", "Permute the axes of YOURS' tensors matching GLOB: 'GLOB=PERM' "
                              "(numpy.transpose's axes, e.g. '*.self_attn=1,0,2').") = None,
    transposes: _yours("--transpose", "Swap the last two axes of YOURS' tensors matching GLOB (logits "
                                      "[vocab,T] -> [T,vocab]).") = None,
    reshapes: _yours("--reshape", "Reshape YOURS' tensors matching GLOB: 'GLOB=SHAPE' (comma list, one -1 "
                                  "allowed; after --layout/--transpose).") = None,
    unshards: _yours("--unshard", "Concatenate YOURS' tensor-parallel shards NAME.shard0, NAME.shard1, ... "
                                  "into NAME along DIM: 'GLOB:DIM'.") = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Compare only names matching this glob "
                                                      "(repeatable).")] = None,
    dtypes: Annotated[Optional[str], typer.Option("--dtypes", metavar="A,B[,C]", help="The formats each file's "
                                                  "values had before dumping (bf16, fp16, ...), in the files' order: "
                                                  "their tolerances apply; '-' for a file as stored (e.g. -,bf16).")]
    = None,
    sort: Annotated[str, typer.Option("--sort", help="order (execution order, else natural) | error.")] = "order",
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="Stop at the first failing (flagged) tensor.")] = False,
    equal_nan: Annotated[bool, typer.Option("--equal-nan", help="NaN agrees with NaN at the same place.")] = False,
    tol: TolOpt = None,
    json_out: JsonOpt = False,
    wide: WideOpt = False,
):
    """Compare tensor dumps name by name; with three files, tell your engine's error from what the precision costs.

    YOURS (B of two files) is brought to the reference's layout by --unshard, --map sums, --layout,
    --transpose and --reshape, in that order; size-1 axes are dropped where that makes shapes agree.
    Exit 0 when all pass, 1 when any fails, is flagged (the rule that fired is named with its number),
    overflows, or is in one file only (listed apart, never the first divergence)."""
    from precisionlab.report import tensors as rep
    from precisionlab.experiments import tensors as exp

    rtol, atol = parse_tol(tol)
    cfg = exp.CompareTensorsConfig(files=files, maps=maps or [], only=only or [], dtypes=_dtypes(dtypes, len(files)),
                                   atol=atol, rtol=rtol, equal_nan=equal_nan, sort=sort, fail_fast=fail_fast,
                                   layouts=layouts or [], transposes=transposes or [], reshapes=reshapes or [],
                                   unshards=unshards or [])
    result = exp.compare(cfg, progress_factory=lambda total: rep.bar("compare tensors", total, not json_out))
    if json_out:
        rep.as_json(result)
    else:
        rep.table(result, wide=wide)
    if result.any_failed:
        raise typer.Exit(1)


def _dtypes(text: str | None, n_files: int) -> list[str | None]:
    """--dtypes A,B[,C] -> one format or None (as stored, '-') per file, three
    entries; a format for a file not given is refused, never ignored."""
    sides = [None if t.strip() in ("-", "") else t.strip() for t in text.split(",")] if text is not None else []
    if text is not None and not 2 <= len(sides) <= 3:
        raise UsageError(f"--dtypes takes A,B or A,B,C, one format (or '-') per file (got {text!r})")
    if len(sides) == 3 and n_files != 3:  # the third file's format, with no third file
        raise UsageError("--dtypes' third format declares the third file (YOURS) of a three-way comparison; with "
                         "two files give A,B")
    return (sides + [None, None, None])[:3]
