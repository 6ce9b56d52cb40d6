"""The Typer app: commands parse options, call an experiment, hand the result to
the report. No maths here.

Exit codes: 0 ok, 1 failed run, 2 usage error, 3 --device cuda without a GPU.
Errors are one line on stderr; PRECISIONLAB_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated, Optional

import typer

try:  # typer >= 0.20 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # older typer depends on click
    from click.exceptions import ClickException

from precisionlab.errors import PrecisionLabError, RunError, UsageError

app = typer.Typer(
    name="precisionlab",
    help="A command-line lab for numerical precision: floating-point formats and reduction orders, "
    "shown, measured and explained.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (typer's, no torch)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


compare_app = typer.Typer(help="Error reports: the three comparisons for an op, tensor dumps, a whole model.",
                           no_args_is_help=True)
app.add_typer(compare_app, name="compare")


def _version(value: bool) -> None:
    if value:
        from precisionlab import version
        from precisionlab.report_version import version_lines

        version_lines(version.collect())
        raise typer.Exit()


@app.callback()
def _root(
    _v: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                               help="The package, the library's ABI and build, and exit.")] = None,
) -> None:
    """A command-line lab for numerical precision: floating-point formats and reduction orders,
    shown, measured and explained. Every command takes --json, --device and --seed."""


def _names(op: str, device: str | None = None, kinds: tuple[str, ...] = ("algorithm", "kernel", "bug"),
           default: bool | None = None) -> str:
    """The op's variant names from the library's catalog, for help text: the
    help lists what the library implements, never a copy of it. Raises
    PrecisionLabError without the library (see _catalog_help)."""
    from precisionlab import native

    return ", ".join(v.name for v in native.variants(op, device) if v.kind in kinds
                     and (default is None or v.default == default))


def _catalog_help(build, what: str) -> str:
    """build() (help text naming the catalog's variants), or, without the
    library, one line saying where the names come from: --help and --version
    still work."""
    try:
        return build()
    except PrecisionLabError:
        return f"Comma list of {what} (the library's catalog names them: build it with `make lib`)."


def _formats(storage_only: bool | None = None) -> str:
    """Format names from the registry, which the library's table declares."""
    try:
        from precisionlab import formats

        return ", ".join(f.name for f in formats.FORMATS.values()
                         if storage_only is None or f.storage_only == storage_only)
    except PrecisionLabError:
        return "(the library's formats: build it with `make lib`)"


def _compare_storage() -> str:
    from precisionlab.experiments.compare import STORAGE_DTYPES  # numpy only: no torch, no library

    return ", ".join(STORAGE_DTYPES)


def _block_formats() -> str:
    try:
        from precisionlab import native

        return ", ".join(native.block_formats())
    except PrecisionLabError:
        return "(the library's block formats: build it with `make lib`)"


# Options every command shares.
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CPU, plus GPU where present) | cpu | cuda | all.")]
SEED_MAX = 2**64 - 1  # the kernels take the seed as a uint64


def _seed_in_range(value: int) -> int:
    if not 0 <= value <= SEED_MAX:
        raise typer.BadParameter(f"must be in 0 ... 2^64-1 ({SEED_MAX}), got {value}")
    return value


SeedOpt = Annotated[int, typer.Option("--seed", callback=_seed_in_range,
                                      help="Seed for every random draw, passed down to the kernels (0 ... 2^64-1).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One strict JSON document on stdout (non-finite as strings).")]
AtolOpt = Annotated[Optional[float], typer.Option("--atol", help="Absolute tolerance (default: torch.testing's for the dtype).")]
RtolOpt = Annotated[Optional[float], typer.Option("--rtol", help="Relative tolerance (default: torch.testing's for the dtype).")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch work, at most 4 per "
                                                   "core (default: sized for the work, one for small matrices).")]


@app.command()
def accumulate(
    dtype: Annotated[str, typer.Option("--dtype", help=f"Storage format the values are rounded to: {_formats()} "
                                       "(aliases: float32, bfloat16, fp4, ...).")] = "bf16",
    n: Annotated[int, typer.Option("--n", help="Number of values.")] = 10_000,
    value: Annotated[float, typer.Option("--value", help="The value repeated n times.")] = 0.1,
    dist: Annotated[Optional[str], typer.Option("--dist", help="Seeded random values instead: uniform | normal | lognormal.")] = None,
    values: Annotated[Optional[str], typer.Option("--values", help="Explicit values, comma-separated (e.g. 1e8,1,-1e8).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Values from a numeric .npy file (flattened).")] = None,
    methods: Annotated[Optional[str], typer.Option("--variants", "--methods", help=_catalog_help(
        lambda: f"Comma list of sum variants: {_names('sum', 'cpu')} (CPU); {_names('sum', 'cuda')} (GPU). "
                "Default: all that apply.", "sum variants"))] = None,
    accumulators: Annotated[Optional[str], typer.Option("--accumulators", help="Accumulator formats, comma list. "
                                                        "Default: bf16,fp16,fp32,fp64 (GPU: bf16, fp32, fp64).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write the running sum against the step to this file (.png, .svg, .pdf, ...).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Sum n values in each accumulator format and method; separate storage from accumulation error."""
    from precisionlab import report
    from precisionlab.experiments import accumulate as exp

    plot = report.check_plot_path(plot)  # before the run: a bad path must not cost the result
    cfg = exp.AccumulateConfig(dtype=dtype, n=n, value=value, dist=dist, values=values, from_file=from_file,
                               methods=methods, accumulators=accumulators, device=device, seed=seed,
                               trace=plot is not None)
    with report.progress("accumulate", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    if plot:
        report.accumulate_plot(result, plot)
    (report.accumulate_json if json_out else report.accumulate_table)(result)


@app.command()
def softmax(
    dtype: Annotated[str, typer.Option("--dtype", help="Input format(s), comma list: fp32, bf16, fp16. Arithmetic is fp32.")] = "fp32",
    methods: Annotated[Optional[str], typer.Option("--variants", "--methods", help=_catalog_help(
        lambda: f"Comma list of softmax variants: {_names('softmax', 'cpu', ('algorithm',))} (CPU and GPU); "
                f"{_names('softmax', 'cuda', ('kernel',))} (GPU); the named bugs {_names('softmax', kinds=('bug',))}. "
                f"Default: {_names('softmax', default=True)}, with the bugs in their own table.",
        "softmax variants"))] = None,
    masked: Annotated[str, typer.Option("--masked", help="A row of all -inf gives: nan (textbook) | zero.")] = "nan",
    values: Annotated[Optional[str], typer.Option("--values", help="Logits, comma-separated; rows separated by ';'.")] = None,
    rows: Annotated[Optional[int], typer.Option("--rows", help="Random matrix rows.")] = None,
    cols: Annotated[Optional[int], typer.Option("--cols", help="Random matrix columns.")] = None,
    dist: Annotated[Optional[str], typer.Option("--dist", help="Random logits (--rows/--cols): normal (default) | "
                                                "uniform.")] = None,
    scale: Annotated[Optional[float], typer.Option("--scale", help="Multiply random logits (--rows/--cols) by this "
                                                   "(default 1).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Logits from a 2-D .npy file.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Naive vs stable vs online softmax and log-sum-exp: the edge cases, the classic bugs, the errors."""
    from precisionlab import report
    from precisionlab.experiments import softmax as exp

    cfg = exp.SoftmaxConfig(dtype=dtype, methods=methods, masked=masked, values=values, rows=rows, cols=cols,
                            dist=dist, scale=scale, from_file=from_file, device=device, seed=seed)
    with report.progress("softmax", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    (report.softmax_json if json_out else report.softmax_table)(result)


@compare_app.command("model")
def compare_model(
    model: Annotated[Optional[str], typer.Option("--model", help="A Hugging Face causal LM: a local directory or a repo id "
                                                 "already in the local cache (offline only; needs precisionlab[hf]). "
                                                 "Default: the embedded char-level model.")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Greedy decoding steps.")] = 50,
    prompt: Annotated[str, typer.Option("--prompt", help="The text to continue.")] = "ROMEO:\n",
    dtypes: Annotated[str, typer.Option("--dtypes", help="Low precisions against fp32: bf16, fp16.")] = "bf16,fp16",
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write rel-L2 per step, divergence marked, to this file (.png, .svg, .pdf, ...).")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (default) | cuda | auto.")] = "cpu",
    metrics: Annotated[bool, typer.Option("--metrics", help="Instead: next-token distribution statistics over a text, "
                                          "teacher-forced (KL divergence, top-1/top-5 agreement, Δp, perplexity, flips "
                                          "by margin); --dtypes may include fp32; --plot draws KLD and flips.")] = False,
    text: Annotated[Optional[str], typer.Option("--text", help="--metrics: a UTF-8 text file (default: the held-out "
                                                "part of the shipped Shakespeare text).")] = None,
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="--metrics: positions scored (default 8192).")] = None,
    save_logits: Annotated[Optional[list[str]], typer.Option("--save-logits", help="--metrics: write a run's logits and "
                                                             "token ids as safetensors: FILE (fp32) or DTYPE=FILE; "
                                                             "repeatable.")] = None,
    max_kld: Annotated[Optional[float], typer.Option("--max-kld", help="--metrics: exit 1 when a mean KLD is above this.")] = None,
    min_top1: Annotated[Optional[float], typer.Option("--min-top1", help="--metrics: exit 1 when a top-1 agreement (%) "
                                                      "is below this.")] = None,
    layers: Annotated[bool, typer.Option("--layers", help="Module by module: each module's accumulated and local "
                                         "error against what rounding alone costs there; names the first "
                                         "divergence.")] = False,
    inject: Annotated[Optional[list[str]], typer.Option("--inject", help="TARGET:KEY=VALUE, repeatable. With --metrics: "
                                                        "logits:noise=SIGMA adds seeded Gaussian noise to the compared "
                                                        "runs' logits. With --layers/--dump: perturb one module of the "
                                                        "low-precision run: scale=F, eps=F (a norm) or rope=bf16|fp16 "
                                                        "(the RoPE module; 'rope' in the embedded model).")] = None,
    dump: Annotated[Optional[str], typer.Option("--dump", help="Write each run's per-module outputs to "
                                                "DIR/fp32.safetensors, DIR/bf16.safetensors, ... (execution order "
                                                "and token ids in the metadata), for compare tensors.")] = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """A whole model in fp32 vs bf16/fp16: where greedy decoding diverges, and the logit error per step."""
    from precisionlab import inputs, report
    from precisionlab.experiments import model as exp

    plot = report.check_plot_path(plot)  # before the run: a bad path must not cost the result
    inputs.check_given(model, "--model")
    inputs.check_given(text, "--text")
    if metrics and (layers or dump is not None):
        raise UsageError("--metrics and --layers/--dump are separate runs: give one")
    if layers or dump is not None:
        from precisionlab import report_tensors
        from precisionlab.experiments import layers as lexp

        lcfg = lexp.LayersConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                                 inject=inject or [], dump=dump)
        with report.progress("compare model --layers", enabled=not json_out) as advance:
            lres = lexp.run(lcfg, advance)
        (report_tensors.layers_json if json_out else report_tensors.layers_table)(lres)
        if lres.first_divergence is not None:
            raise typer.Exit(1)
        return
    if plot:
        report.require_matplotlib()
    if metrics:
        from precisionlab import report_logits
        from precisionlab.experiments import logits as lexp

        mcfg = lexp.MetricsConfig(model=model, text=text, tokens=lexp.DEFAULT_TOKENS if tokens is None else tokens,
                                  dtypes=dtypes, device=device, seed=seed, inject=inject or [],
                                  save_logits=save_logits or [], plot=plot, max_kld=max_kld, min_top1=min_top1)
        with report.progress("compare model --metrics", enabled=not json_out) as advance:
            mres = lexp.run_model(mcfg, advance)
        report_logits.show(mres, plot, json_out)
        if mres.failures:
            raise typer.Exit(1)
        return
    given = [o for o, v in (("--text", text), ("--tokens", tokens), ("--save-logits", save_logits),
                            ("--max-kld", max_kld), ("--min-top1", min_top1)) if v not in (None, [])]
    if given:
        raise UsageError(f"{', '.join(given)} need --metrics")
    if inject:
        raise UsageError("--inject needs --metrics (logits:noise) or --layers/--dump (scale, eps, rope)")
    cfg = exp.ModelConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                          threads=threads)
    with report.progress("compare model", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    if plot:
        report.model_plot(result, plot)
    (report.model_json if json_out else report.model_table)(result)


@app.command()
def nondeterminism(
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each computation (at least 2).")] = 100,
    n: Annotated[int, typer.Option("--n", help="Values in the summed array.")] = 1 << 24,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list: atomics, splitk, batch, torch_ops, threads, tp.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Histogram of the atomic results, in ulps around fsum, to this file (.png, .svg, .pdf, ...).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Run-to-run and batch-size variation: atomics, split-K, batch invariance, torch ops, threads, tensor parallel."""
    from precisionlab import report
    from precisionlab.experiments import nondeterminism as exp

    plot = report.check_plot_path(plot)  # before the run: a bad path must not cost the result
    cfg = exp.NondetConfig(runs=runs, n=n, device=device, seed=seed, sections=sections, keep_samples=plot is not None)
    with report.progress("nondeterminism", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    if plot:
        report.nondeterminism_plot(result, plot)
    (report.nondeterminism_json if json_out else report.nondeterminism_table)(result)


@app.command()
def tf32(
    m: Annotated[int, typer.Option("--m", help="Rows of A.")] = 4096,
    n: Annotated[int, typer.Option("--n", help="Columns of B.")] = 4096,
    k: Annotated[int, typer.Option("--k", help="Inner dimension.")] = 4096,
    sweep_mn: Annotated[int, typer.Option("--sweep-mn", help="m = n for the error-against-K sweep.")] = 256,
    no_sweep: Annotated[bool, typer.Option("--no-sweep", help="Skip the K sweep (256 ... 16384).")] = False,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write error against K to this file (.png, .svg, .pdf, ...).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """TF32, bf16 and fp16 matmuls against float64: error, speed, integer exactness, error against K."""
    from precisionlab import report
    from precisionlab.experiments import tf32 as exp

    plot = report.check_plot_path(plot)  # before the run: a bad path must not cost the result
    cfg = exp.Tf32Config(m=m, n=n, k=k, sweep_mn=sweep_mn, sweep=not no_sweep, device=device, seed=seed,
                         threads=threads)
    with report.progress("tf32", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    if plot:
        report.tf32_plot(result, plot)
    (report.tf32_json if json_out else report.tf32_table)(result)


@app.command()
def info(json_out: JsonOpt = False):
    """Everything that decides the numbers on this machine: versions, GPU, library, precision flags."""
    from precisionlab import report
    from precisionlab.experiments import info as exp

    (report.info_json if json_out else report.info_table)(exp.run())





@compare_app.command("op")
def compare_op(
    name: Annotated[str, typer.Argument(help="softmax | logsumexp | rmsnorm | layernorm | matmul | rope | attention | swiglu")],
    shape: Annotated[Optional[str], typer.Option("--shape", help="ROWSxCOLS (matmul: MxKxN; attention: BHxTxD). Defaults: "
                                                 "64x4096, matmul 256x1024x256, rope 64x128 (positions 0..32767), "
                                                 "attention 4x128x64.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Low precision(s) to test: bf16, fp16 or bf16,fp16 (computed in "
                                       f"them); or storage formats {_compare_storage()} "
                                       "(inputs rounded to them, computed in fp32).")] = "bf16,fp16",
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
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """Three comparisons: yours fp32 vs torch fp32, torch low vs torch fp32, yours low vs torch low, on every
    input case; batch invariance and determinism; the tolerance that would pass.

    Exit 1 when a comparison or a contract is flagged (so CI can run it on your kernel)."""
    from precisionlab import report
    from precisionlab.experiments import compare as exp

    from precisionlab import inputs

    inputs.check_tolerance(atol, "--atol")
    inputs.check_tolerance(rtol, "--rtol")
    for value, what in ((impl, "--impl"), (out_dtype, "--out-dtype"), (from_file, "--from")):
        inputs.check_given(value, what)
    cfg = exp.CompareOpConfig(op=name, shape=shape, dtypes=dtype, impl=impl, device=device, seed=seed, atol=atol,
                              rtol=rtol, cases=cases, masked=masked, scale=scale, out_dtype=out_dtype,
                              from_file=from_file, threads=threads)
    with report.progress(f"compare {name}", enabled=not json_out) as advance:
        result = exp.compare_op(cfg, advance)
    (report.compare_op_json if json_out else report.compare_op_table)(result)
    if result.contract_violation:  # the table says it per row; stderr names the function once
        raise RunError(result.contract_violation)
    if result.any_failed:
        raise typer.Exit(1)


@compare_app.command("logits")
def compare_logits(
    ref: Annotated[str, typer.Argument(help="The reference logits file (safetensors: 'logits' positions x vocab, "
                                       "'tokens' positions), e.g. from compare model --metrics --save-logits.")],
    yours: Annotated[str, typer.Argument(help="Your engine's logits file, same layout and the same tokens.")],
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write KLD per position and flips by margin to this PNG.")] = None,
    max_kld: Annotated[Optional[float], typer.Option("--max-kld", help="Exit 1 when the mean KLD is above this.")] = None,
    min_top1: Annotated[Optional[float], typer.Option("--min-top1", help="Exit 1 when top-1 agreement (%) is below this.")] = None,
    json_out: JsonOpt = False,
):
    """Next-token distribution statistics between two logits files: KL divergence, agreement, Δp, perplexity.

    Exit 1 when --max-kld or --min-top1 is not met."""
    from precisionlab import report, report_logits
    from precisionlab.experiments import logits as exp

    if plot:
        report.require_matplotlib()
    cfg = exp.LogitsConfig(ref=ref, yours=yours, plot=plot, max_kld=max_kld, min_top1=min_top1)
    with report.progress("compare logits", enabled=not json_out) as advance:
        result = exp.compare_files(cfg, advance)
    report_logits.show(result, plot, json_out)
    if result.failures:
        raise typer.Exit(1)


@compare_app.command("tensors")
def compare_tensors(
    files: Annotated[list[str], typer.Argument(help="A B (two dumps), or REF_FP32 REF_LOW YOURS (three-way). Each: "
                                               ".npy, .npz, .pt (nested containers flattened; weights_only) or "
                                               ".safetensors.", show_default=False)],
    maps: Annotated[Optional[list[str]], typer.Option("--map", help="Rename one side's tensors: 'REGEX=REPLACEMENT' "
                                                      "(re.sub; repeatable; applied to the side where it makes more "
                                                      "names match, YOURS/B on a tie).")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Compare only names matching this glob "
                                                      "(repeatable).")] = None,
    a_dtype: Annotated[Optional[str], typer.Option("--a-dtype", help="The first file's values were this format "
                                                   "before dumping (bf16, fp16, ...): its tolerances apply.")] = None,
    b_dtype: Annotated[Optional[str], typer.Option("--b-dtype", help="The same for the second file.")] = None,
    c_dtype: Annotated[Optional[str], typer.Option("--c-dtype", help="The same for the third file (YOURS).")] = None,
    sort: Annotated[str, typer.Option("--sort", help="order (execution order, else natural) | error.")] = "order",
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="Stop at the first failing (flagged) tensor.")] = False,
    equal_nan: Annotated[bool, typer.Option("--equal-nan", help="NaN agrees with NaN at the same place.")] = False,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    json_out: JsonOpt = False,
):
    """Compare tensor dumps name by name; with three files, tell your engine's error from what the precision costs.

    Exit 0 when all pass, 1 when any fails, is flagged or is in one file only."""
    from precisionlab import report_tensors as rep
    from precisionlab.experiments import tensors as exp

    cfg = exp.CompareTensorsConfig(files=files, maps=maps or [], only=only or [], dtypes=[a_dtype, b_dtype, c_dtype],
                                   atol=atol, rtol=rtol, equal_nan=equal_nan, sort=sort, fail_fast=fail_fast)
    result = exp.compare(cfg, progress_factory=lambda total: rep.bar("compare tensors", total, not json_out))
    (rep.compare_tensors_json if json_out else rep.compare_tensors_table)(result)
    if result.any_failed:
        raise typer.Exit(1)


@app.command()
def bench(
    section: Annotated[Optional[str], typer.Argument(help="Sections to run, comma list: accumulate, softmax, matmul "
                                                     "(default: all). Same as --sections.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer runs (under 2 minutes on an H200).")] = False,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list of sections (default: all): accumulate, softmax, matmul.")] = None,
    cpu_n: Annotated[Optional[int], typer.Option("--cpu-n", help="Elements for the CPU kernels (default 1e8; 1e7 with --quick).")] = None,
    gpu_n: Annotated[Optional[int], typer.Option("--gpu-n", help="Elements for the GPU sums (default 2^28, --quick too).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Benchmark every kernel beside its baseline (numpy.sum, torch, the copy bandwidth)."""
    from precisionlab import inputs, report
    from precisionlab.experiments import bench as exp

    for name, v in (("--cpu-n", cpu_n), ("--gpu-n", gpu_n)):
        if v is not None:
            inputs.check_n(v, 16, name)
    if section is not None and sections is not None:
        raise UsageError("give the sections once: as an argument or with --sections")
    cfg = exp.BenchConfig(quick=quick, device=device, sections=section if section is not None else sections,
                          seed=seed, cpu_n=cpu_n,
                          gpu_n=gpu_n)
    with report.progress("bench", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    (report.bench_json if json_out else report.bench_table)(result)


@app.command("formats")
def formats_cmd(
    formats: Annotated[Optional[str], typer.Option("--formats", help=f"Block formats, comma list: {_block_formats()} "
                                                   "(default: all).")] = None,
    rules: Annotated[Optional[str], typer.Option("--rules", help="Scale rules, comma list: floor (OCP), rceil (NVIDIA), "
                                                 "ceil, even for the MX formats; nearest (NVFP4's e4m3 scale). "
                                                 "Default: all.")] = None,
    blocks: Annotated[Optional[str], typer.Option("--blocks", help="Block sizes, comma list, 1..1024 (default 16,32).")] = None,
    dists: Annotated[Optional[str], typer.Option("--dists", help="Data, comma list: normal, student_t, outlier_10x, "
                                                 "outlier_30x, outlier_100x (one element per block scaled). "
                                                 "Default: all.")] = None,
    n: Annotated[int, typer.Option("--n", help="Values per distribution for the element statistics.")] = 65536,
    shape: Annotated[str, typer.Option("--shape", help="The matmul, MxKxN; blocks run along K.")] = "64x1024x64",
    baselines: Annotated[bool, typer.Option("--baselines/--no-baselines", help="Also bf16 and per-tensor-scaled fp8 "
                                            "(e4m3, e5m2).")] = True,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write relative RMSE per configuration to this "
                                                ".png/.pdf/.svg (checked before the run, written atomically).")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Block-scaled formats (MXFP8/6/4, NVFP4) by scale rule and block size: error, clipping, flushing, matmul."""
    from precisionlab import report, report_formats
    from precisionlab.experiments import formats as exp

    plot = report.check_plot_path(plot)  # before the run: a bad path must not cost the result
    cfg = exp.FormatsConfig(formats=formats, rules=rules, blocks=blocks, dists=dists, n=n, shape=shape,
                            baselines=baselines, device=device, seed=seed)
    with report.progress("formats", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    if plot:
        report_formats.formats_plot(result, plot)
    (report_formats.formats_json if json_out else report_formats.formats_table)(result)


@app.command("kvcache")
def kvcache_cmd(
    dtypes: Annotated[Optional[str], typer.Option("--dtypes", help="fp8 cache formats, comma list: fp8_e4m3, fp8_e5m2 "
                                                  "(default: both). fp32 and bf16 caches are always shown.")] = None,
    scales: Annotated[Optional[str], typer.Option("--scales", help="KV scales, comma list: unit, calibrated (per "
                                                  "layer, from a calibration text), dynamic (per head and token). "
                                                  "Default: all.")] = None,
    activation_scale: Annotated[float, typer.Option("--activation-scale", help="Multiply K and V by this before they "
                                                    "are cached and divide after: the same model with large "
                                                    "activations (try 1000).")] = 1.0,
    steps: Annotated[int, typer.Option("--steps", help="Greedy steps.")] = 50,
    prompt: Annotated[str, typer.Option("--prompt", help="Prompt text.")] = "ROMEO:\n",
    model: Annotated[Optional[str], typer.Option("--model", help="A Hugging Face causal LM: a local directory or a "
                                                 "repo id already in the local cache (offline only; needs "
                                                 "precisionlab[hf]). Default: the embedded char-level model.")] = None,
    device: DeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """A model (the embedded one, or --model DIR) with its KV cache in fp8 (unit, calibrated or dynamic scales)
    against fp32 and bf16 caches."""
    from precisionlab import inputs, report, report_kvcache
    from precisionlab.experiments import kvcache as exp

    inputs.check_given(model, "--model")
    cfg = exp.KVCacheConfig(dtypes=dtypes, scales=scales, activation_scale=activation_scale, steps=steps,
                            prompt=prompt, device=device, seed=seed, model=model)
    with report.progress("kvcache", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    (report_kvcache.kvcache_json if json_out else report_kvcache.kvcache_table)(result)


def main() -> None:
    """Entry point: run the app, turning every failure into one line and an exit code.

    The command runs in a worker thread while the main thread waits on it:
    Python delivers Ctrl-C to the main thread only between bytecodes, and a
    long ctypes call (a big matmul or sum) holds the worker for seconds, so
    the main thread answers at once, removes half-written files and exits 130
    without waiting for the kernel."""
    import threading

    if sys.stderr is None:  # started with fd 2 closed: nowhere to say anything
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:  # started with fd 1 closed (`precisionlab ... >&-`): no output can be shown
        sys.stderr.write("precisionlab: stdout is closed; redirect it instead (>/dev/null discards the output)\n")
        sys.exit(1)
    from precisionlab import report

    report.tolerate_unencodable()
    if len(sys.argv) <= 1:  # no arguments: the help, on stdout, and the usage exit code
        app(["--help"], prog_name="precisionlab", standalone_mode=False)
        sys.exit(2)
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["code"] = _run()
        except BaseException as e:  # SystemExit from _fail, or a traceback asked for by PRECISIONLAB_DEBUG
            outcome["exc"] = e

    worker = threading.Thread(target=work, name="precisionlab-command", daemon=True)
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        _interrupted()
    if "exc" in outcome:
        raise outcome["exc"]
    sys.exit(outcome.get("code", 0))


def _interrupted() -> None:
    """Ctrl-C: one line, no partial file, exit 130 now (the worker may be inside a kernel)."""
    from precisionlab import interrupt, outputs

    interrupt.run_all()  # child processes and the like, owned by the worker's command
    outputs.remove_pending()
    try:
        sys.stdout.flush()
    except Exception:  # a closed pipe: nothing more to say there
        pass
    os.write(2, b"precisionlab: interrupted\n")
    os._exit(130)


def _run() -> int:
    """The app, every failure turned into one stderr line and an exit code."""
    debug = os.environ.get("PRECISIONLAB_DEBUG") == "1"
    try:
        # the command's name, also under `python -m`: shell completion is for `precisionlab`
        rc = app(standalone_mode=False, prog_name="precisionlab")
    except PrecisionLabError as e:
        if debug:
            raise
        _fail(str(e), e.exit_code)
    except typer.Exit as e:
        if e.exit_code == 130 and isinstance(e.__cause__, KeyboardInterrupt):  # typer's own Ctrl-C answer
            _fail("interrupted", 130)
        sys.exit(e.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    except ClickException as e:  # option parsing: a usage error
        if debug:
            raise
        if not e.format_message().strip():  # a group without a command: its help is already printed
            sys.exit(2)
        _fail(e.format_message(), 2)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as e:  # a bug: still one line, unless debugging
        if debug:
            raise
        if _out_of_memory(e):  # the estimate fit, the allocation failed anyway: a failed run
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            _fail(f"out of memory: {first[:200]} (the memory estimate made before the run fit; free memory or "
                  "choose smaller sizes)", 1)
        if isinstance(e, OSError) and e.errno in _SYSTEM_ERRNOS:  # the system refused, not a bug
            _fail(f"{e.strerror}{f': {e.filename}' if e.filename else ''}", 1)
        _fail(f"internal error: {type(e).__name__}: {e} (PRECISIONLAB_DEBUG=1 shows the traceback)", 1)
    return rc if isinstance(rc, int) else 0


# What a write to a full disk, a failing device or past a size limit raises
# (`precisionlab ... > /dev/full`): a failed run, said as the system says it.
_SYSTEM_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _out_of_memory(e: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError, or torch's CPU allocator refusing."""
    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(e, oom):
        return True
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


def _fail(message: str, code: int) -> None:
    from precisionlab.report import error_line

    error_line(message)
    sys.exit(code)
