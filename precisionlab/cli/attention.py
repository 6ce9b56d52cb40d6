"""precisionlab attention: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.options import plot_option, JsonOpt, SeedOpt, accumulator_option, format_names

# fp64 is not an accumulator model: the emulator's float64 BLAS (flash_attention.model).
PvAccumulatorOpt = accumulator_option("For the P.V MMA; or fp64 (float64 BLAS).", "--pv-accumulator",
                                      many=False)
QkAccumulatorOpt = accumulator_option("For Q.K^T; or fp64 (float64 BLAS).", "--qk-accumulator", many=False)


def command(
    seq: Annotated[int, typer.Option("--seq", help="Keys (S).")] = 4096,
    rows: Annotated[int, typer.Option("--rows", help="Query rows (the last positions under --causal).")] = 128,
    dim: Annotated[int, typer.Option("--dim", help="Head dimension d.")] = 128,
    std: Annotated[str, typer.Option("--std", help="Logit standard deviations to sweep, a list.")] = "0.5,1,2",
    block_r: Annotated[int, typer.Option("--block-r", help="Br: query rows a block (matters under --causal).")] = 128,
    block_c: Annotated[int, typer.Option("--block-c", help="Bc: keys a tile.")] = 128,
    max_offset: Annotated[float, typer.Option("--max-offset", help="FA3's FP8 offset, log2 units: P in (0, 2^offset].")] = 0.0,
    rescale_threshold: Annotated[float, typer.Option("--rescale-threshold", help="Lazy rescale: only when the max grows by more than this (log2 units); 0: eager.")] = 0.0,
    p_dtype: Annotated[str, typer.Option("--p-dtype", help=f"P's format for the P.V product: {format_names(formats.ATTENTION_P)}.")] = "bf16",
    p_scale: Annotated[float, typer.Option("--p-scale", help="Multiplies P before the cast (divided out at the end).")] = 1.0,
    input_dtype: Annotated[str, typer.Option("--input-dtype", help=f"Q, K, V stored in: {format_names(formats.ATTENTION_INPUTS)} (FP8: per-tensor descale amax/max).")] = "fp32",
    splits: Annotated[int, typer.Option("--splits", help="Split-KV: the key tiles over this many splits, then combined.")] = 1,
    combine_order: Annotated[str, typer.Option("--combine-order", help="forward | reverse.")] = "forward",
    pv_accumulator: PvAccumulatorOpt = "fp32",
    qk_accumulator: QkAccumulatorOpt = "fp32",
    promote_tiles: Annotated[Optional[int], typer.Option("--promote-tiles", help="Two-level P.V: promoted to fp32 every N tiles.")] = None,
    causal: Annotated[bool, typer.Option("--causal", help="Causal mask, bottom-right aligned.")] = False,
    arithmetic: Annotated[str, typer.Option("--arithmetic", help="fp32 (the kernel's) | fp64 (the exact model).")] = "fp32",
    out_dtype: Annotated[str, typer.Option("--out-dtype", help=f"The output's format: {format_names(formats.COMPUTE)}.")] = "fp32",
    plot: plot_option("the running error against position") = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """FlashAttention's precision knobs, emulated bit for bit on the CPU: error against float64 and the bf16 path,
    mass kept, saturated and flushed P, where the error jumps."""
    from precisionlab.errors import UsageError
    from precisionlab.experiments import attention as exp
    from precisionlab.numerics import flash_attention as fa
    from precisionlab.report import attention
    from precisionlab.report.output import Output

    out = Output(attention, json_out, plot)
    p_dtype = formats.parse_one(p_dtype, fa.P_DTYPES, "--p-dtype")  # every alias the catalog lists
    input_dtype = formats.parse_one(input_dtype, fa.INPUT_DTYPES, "--input-dtype")
    out_dtype = formats.parse_one(out_dtype, fa.OUT_DTYPES, "--out-dtype")
    try:
        stds = tuple(float(s) for s in std.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--std {std!r}: a list of numbers") from None
    flash = fa.FlashConfig(block_r=block_r, block_c=block_c, max_offset=max_offset, rescale_threshold=rescale_threshold,
                           p_dtype=p_dtype, p_scale=p_scale, input_dtype=input_dtype, splits=splits,
                           combine_order=combine_order, pv_accumulator=pv_accumulator, qk_accumulator=qk_accumulator,
                           promote_tiles=promote_tiles, causal=causal, arithmetic=arithmetic, out_dtype=out_dtype)
    cfg = exp.AttentionConfig(seq=seq, rows=rows, dim=dim, stds=stds, seed=seed, flash=flash)
    out.run("attention", lambda advance: exp.run(cfg, advance))
