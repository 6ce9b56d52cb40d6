"""The Typer app: commands parse options, call an experiment, hand the result to
the report. No maths here.

Exit codes: 0 ok, 1 failed run, 2 usage error, 3 --device cuda without a GPU.
Errors are one line on stderr; PRECISIONLAB_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

try:  # typer >= 0.20 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # older typer depends on click
    from click.exceptions import ClickException

from precisionlab.errors import PrecisionLabError, UsageError

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


# Options every command shares.
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CPU, plus GPU where present) | cpu | cuda | all.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for every random draw, passed down to the kernels.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One strict JSON document on stdout (non-finite as strings).")]
AtolOpt = Annotated[Optional[float], typer.Option("--atol", help="Absolute tolerance (default: torch.testing's for the dtype).")]
RtolOpt = Annotated[Optional[float], typer.Option("--rtol", help="Relative tolerance (default: torch.testing's for the dtype).")]


@app.command()
def accumulate(
    dtype: Annotated[str, typer.Option("--dtype", help="Storage format the values are rounded to: "
                                       "fp64, fp32, fp16, bf16, fp8_e4m3, fp8_e5m2 (aliases: float32, bfloat16, ...).")] = "bf16",
    n: Annotated[int, typer.Option("--n", help="Number of values.")] = 10_000,
    value: Annotated[float, typer.Option("--value", help="The value repeated n times.")] = 0.1,
    dist: Annotated[Optional[str], typer.Option("--dist", help="Seeded random values instead: uniform | normal | lognormal.")] = None,
    values: Annotated[Optional[str], typer.Option("--values", help="Explicit values, comma-separated (e.g. 1e8,1,-1e8).")] = None,
    from_file: Annotated[Optional[str], typer.Option("--from", help="Values from a numeric .npy file (flattened).")] = None,
    methods: Annotated[Optional[str], typer.Option("--methods", help="Comma list: sequential, reverse, sorted, sorted_desc, "
                                                   "pairwise, kahan, neumaier, stochastic (CPU); tree, tree_kahan, atomic (GPU). "
                                                   "Default: all that apply.")] = None,
    accumulators: Annotated[Optional[str], typer.Option("--accumulators", help="Accumulator formats, comma list. "
                                                        "Default: bf16,fp16,fp32,fp64 (GPU: bf16, fp32, fp64).")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write the running sum against the step to this PNG.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Sum n values in each accumulator format and method; separate storage from accumulation error."""
    from precisionlab import report
    from precisionlab.experiments import accumulate as exp

    if plot:
        report.require_matplotlib()
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
    methods: Annotated[Optional[str], typer.Option("--methods", help="Comma list: naive, stable, online, single_pass, "
                                                   "online_vec (GPU), and the named bugs bug_zero_identity, bug_zero_start, "
                                                   "bug_no_rescale, lowp_accum. Default: the correct ones, with the bugs in "
                                                   "their own table.")] = None,
    masked: Annotated[str, typer.Option("--masked", help="A row of all -inf gives: nan (textbook) | zero.")] = "nan",
    values: Annotated[Optional[str], typer.Option("--values", help="Logits, comma-separated; rows separated by ';'.")] = None,
    rows: Annotated[Optional[int], typer.Option("--rows", help="Random matrix rows.")] = None,
    cols: Annotated[Optional[int], typer.Option("--cols", help="Random matrix columns.")] = None,
    dist: Annotated[str, typer.Option("--dist", help="Random logits: normal | uniform.")] = "normal",
    scale: Annotated[float, typer.Option("--scale", help="Multiply random logits by this.")] = 1.0,
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
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write rel-L2 per step, divergence marked, to this PNG.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (default) | cuda | auto.")] = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """A whole model in fp32 vs bf16/fp16: where greedy decoding diverges, and the logit error per step."""
    from precisionlab import report
    from precisionlab.experiments import model as exp

    if plot:
        report.require_matplotlib()
    cfg = exp.ModelConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed)
    with report.progress("compare model", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    if plot:
        report.model_plot(result, plot)
    (report.model_json if json_out else report.model_table)(result)


@app.command()
def nondeterminism(
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each computation (at least 2).")] = 100,
    n: Annotated[int, typer.Option("--n", help="Values in the summed array.")] = 1 << 24,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list: atomics, splitk, batch, torch_ops, threads.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Histogram of the atomic results, in ulps around fsum, to this PNG.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Run-to-run and batch-size variation: atomics, split-K, batch invariance, torch ops, threads."""
    from precisionlab import report
    from precisionlab.experiments import nondeterminism as exp

    if plot:
        report.require_matplotlib()
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
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write error against K to this PNG.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """TF32, bf16 and fp16 matmuls against float64: error, speed, integer exactness, error against K."""
    from precisionlab import report
    from precisionlab.experiments import tf32 as exp

    if plot:
        report.require_matplotlib()
    cfg = exp.Tf32Config(m=m, n=n, k=k, sweep_mn=sweep_mn, sweep=not no_sweep, device=device, seed=seed)
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
    name: Annotated[str, typer.Argument(help="softmax | logsumexp | rmsnorm | layernorm | matmul")],
    shape: Annotated[Optional[str], typer.Option("--shape", help="ROWSxCOLS (matmul: MxKxN). Default 64x4096 (256x1024x256).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Low precision(s) to test: bf16, fp16 or bf16,fp16.")] = "bf16,fp16",
    impl: Annotated[Optional[str], typer.Option("--impl", help="Your implementation, package.module:function, taking and "
                                                "returning torch tensors: softmax(x); logsumexp(x); rmsnorm(x, weight, eps); "
                                                "layernorm(x, weight, bias, eps); matmul(a, b). Default: this project's kernels.")] = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Three comparisons: yours fp32 vs torch fp32, torch low vs torch fp32, yours low vs torch low.

    Exit 1 when a comparison is flagged (so CI can run it on your kernel)."""
    from precisionlab import report
    from precisionlab.experiments import compare as exp

    cfg = exp.CompareOpConfig(op=name, shape=shape, dtypes=dtype, impl=impl, device=device, seed=seed, atol=atol,
                              rtol=rtol)
    with report.progress(f"compare {name}", enabled=not json_out) as advance:
        result = exp.compare_op(cfg, advance)
    (report.compare_op_json if json_out else report.compare_op_table)(result)
    if result.any_failed:
        raise typer.Exit(1)


@compare_app.command("tensors")
def compare_tensors(
    a: Annotated[str, typer.Argument(help="Your dump: .npy, .npz, .pt (a tensor or dict of tensors) or .safetensors.")],
    b: Annotated[str, typer.Argument(help="The reference dump, same formats.")],
    only: Annotated[Optional[str], typer.Option("--only", help="Compare this tensor name only.")] = None,
    atol: AtolOpt = None,
    rtol: RtolOpt = None,
    json_out: JsonOpt = False,
):
    """Compare two tensor dumps name by name. Exit 0 when all pass, 1 when any fails."""
    from precisionlab import report
    from precisionlab.experiments import compare as exp

    result = exp.compare_tensors(exp.CompareTensorsConfig(a=a, b=b, only=only, atol=atol, rtol=rtol))
    (report.compare_tensors_json if json_out else report.compare_tensors_table)(result)
    if result.any_failed:
        raise typer.Exit(1)


@app.command()
def bench(
    section: Annotated[Optional[str], typer.Argument(help="Sections to run, comma list: accumulate, softmax, matmul "
                                                     "(default: all). Same as --sections.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller sizes and fewer runs (under 2 minutes on an H200).")] = False,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list of sections (default: all): accumulate, softmax, matmul.")] = None,
    cpu_n: Annotated[Optional[int], typer.Option("--cpu-n", help="Elements for the CPU kernels (default 1e8; 1e7 with --quick).")] = None,
    gpu_n: Annotated[Optional[int], typer.Option("--gpu-n", help="Elements for the GPU kernels (default 2^28; 2^26 with --quick).")] = None,
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
    if section and sections:
        raise UsageError("give the sections once: as an argument or with --sections")
    cfg = exp.BenchConfig(quick=quick, device=device, sections=section or sections, seed=seed, cpu_n=cpu_n,
                          gpu_n=gpu_n)
    with report.progress("bench", enabled=not json_out) as advance:
        result = exp.run(cfg, advance)
    (report.bench_json if json_out else report.bench_table)(result)


def main() -> None:
    """Entry point: run the app, turning every failure into one line and an exit code."""
    debug = os.environ.get("PRECISIONLAB_DEBUG") == "1"
    try:
        # the command's name, also under `python -m`: shell completion is for `precisionlab`
        rc = app(standalone_mode=False, prog_name="precisionlab")
    except PrecisionLabError as e:
        if debug:
            raise
        _fail(str(e), e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    except ClickException as e:  # option parsing: a usage error
        if debug:
            raise
        _fail(e.format_message(), 2)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as e:  # a bug: still one line, unless debugging
        if debug:
            raise
        _fail(f"internal error: {type(e).__name__}: {e} (PRECISIONLAB_DEBUG=1 shows the traceback)", 1)
    sys.exit(rc if isinstance(rc, int) else 0)


def _fail(message: str, code: int) -> None:
    from precisionlab.report import error_line

    error_line(message)
    sys.exit(code)
