"""precisionlab compare op: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.errors import RunError
from precisionlab.catalog import formats
from precisionlab.cli.options import (DeviceOpt, JsonOpt, SeedOpt, ThreadsOpt, TolOpt, accumulator_option,
                                      format_names, parse_tol)


MatmulAccumulatorOpt = accumulator_option("matmul: also each model's result on the same inputs (the tf32 and "
                                          "formats models), (4) the model against float64 and (5) yours against "
                                          "the model, judged by (4), with the share of bit-identical outputs.")


def command(
    name: Annotated[str, typer.Argument(help="softmax | logsumexp | rmsnorm | layernorm | matmul | rope | attention | swiglu")],
    shape: Annotated[Optional[str], typer.Option("--shape", help="ROWSxCOLS (matmul: MxKxN; attention: BHxTxD). Defaults: "
                                                 "64x4096, matmul 256x1024x256, rope 64x128 (positions 0..32767), "
                                                 "attention 4x128x64.")] = None,
    dtype: Annotated[str, typer.Option("--dtypes", help="Low precisions to test: "
                                       f"{format_names(formats.LOW_COMPUTE)} or {format_names(formats.LOW_COMPUTE, ',')} "
                                       f"(computed in them); or storage formats {format_names(formats.STORAGE)} "
                                       "(inputs rounded to them, computed in fp32).")] = format_names(formats.LOW_COMPUTE, ","),
    impl: Annotated[Optional[str], typer.Option("--impl", help="Your implementation, package.module:function, taking and "
                                                "returning torch tensors: softmax(x); logsumexp(x); rmsnorm(x, weight, eps); "
                                                "layernorm(x, weight, bias, eps); matmul(a, b); rope(x, positions, base); "
                                                "attention(q, k, v, kv_start) (causal, scale 1/sqrt(d), zeros where a "
                                                "query sees no key); swiglu(gate, up). Default: this project's kernels.")] = None,
    cases: Annotated[Optional[str], typer.Option("--cases", help="Input cases: all (default: random plus the op's edge "
                                                 "cases: large, shifted and masked logits, non-finite rows, scales "
                                                 "that overflow a 16-bit accumulator, long K, long RoPE positions, "
                                                 "...) or a comma list of their names.")] = None,
    masked: Annotated[str, typer.Option("--masked", help="softmax: a row of all -inf gives nan (textbook) "
                                        "| zero.")] = "nan",
    scale: Annotated[float, typer.Option("--scale", help="Multiply the random data inputs by this.")] = 1.0,
    out_dtype: Annotated[Optional[str], typer.Option("--out-dtype", help="The dtype your low-precision outputs are "
                                                     "declared to have (default: the input's).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Inputs from a .npy/.npz/.pt/.safetensors file: one "
                                                     "tensor (the first argument), or tensors named after the "
                                                     "arguments (x, weight, bias, a, b, positions, q, k, v, kv_start, "
                                                     "gate, up).")] = None,
    accumulator: MatmulAccumulatorOpt = None,
    tol: TolOpt = None,
    device: DeviceOpt = "all",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """Three comparisons: yours fp32 vs torch fp32, torch low vs torch fp32, yours low vs torch low, on every
    input case; batch invariance and determinism; the tolerance that would pass.

    Exit 1 when a comparison or a contract is flagged (so CI can run it on your kernel)."""
    from precisionlab.experiments import compare as exp

    from precisionlab.io import inputs

    for value, what in ((impl, "--impl"), (out_dtype, "--out-dtype"), (from_file, "--from")):
        inputs.check_given(value, what)
    rtol, atol = parse_tol(tol)
    cfg = exp.CompareOpConfig(op=name, shape=shape, dtypes=dtype, impl=impl, device=device, seed=seed, atol=atol,
                              rtol=rtol, cases=cases, masked=masked, scale=scale, out_dtype=out_dtype,
                              from_file=from_file, threads=threads,
                              accumulators=accumulator)
    from precisionlab.report import compare_op as compare_op_report
    from precisionlab.report.output import Output

    result = Output(compare_op_report, json_out).run(f"compare {name}", lambda advance: exp.compare_op(cfg, advance))
    if result.contract_violation:  # the table says it per row; stderr names the function once
        raise RunError(result.contract_violation)
    if result.any_failed:
        raise typer.Exit(1)
