"""precisionlab compare model: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.errors import UsageError
from precisionlab.cli.options import SeedOpt, JsonOpt, ThreadsOpt


def command(
    model: Annotated[Optional[str], typer.Option("--model", help="A Hugging Face causal LM: a local directory or a repo id "
                                                 "already in the local cache (offline only; needs precisionlab[hf]). "
                                                 "Default: the embedded char-level model.")] = None,
    steps: Annotated[int, typer.Option("--steps", help="Greedy decoding steps.")] = 50,
    prompt: Annotated[str, typer.Option("--prompt", help="The text to continue.")] = "ROMEO:\n",
    dtypes: Annotated[str, typer.Option("--dtypes", help="Low precisions against fp32: bf16, fp16.")] = "bf16,fp16",
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write rel-L2 per step, divergence marked, to this file (.png, .svg, .pdf, ...).")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (the default for a model run, unlike the other "
                                          "commands) | cuda | auto (the GPU where present, else the CPU).")] = "cpu",
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
    from precisionlab.io import inputs
    from precisionlab.experiments import model as exp

    from precisionlab.report.plots import check_plot_path

    plot = check_plot_path(plot)  # before the run: a bad path must not cost the result
    inputs.check_given(model, "--model")
    inputs.check_given(text, "--text")
    if metrics and (layers or dump is not None):
        raise UsageError("--metrics and --layers/--dump are separate runs: give one")
    if layers or dump is not None:
        from precisionlab.report import layers as layers_report
        from precisionlab.report.output import Output
        from precisionlab.experiments import layers as lexp

        lcfg = lexp.LayersConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                                 inject=inject or [], dump=dump)
        lres = Output(layers_report, json_out).run("compare model --layers", lambda advance: lexp.run(lcfg, advance))
        if lres.first_divergence is not None:
            raise typer.Exit(1)
        return
    if metrics:
        from precisionlab.report import logits as logits_report
        from precisionlab.report.console import progress
        from precisionlab.experiments import logits as lexp

        mcfg = lexp.MetricsConfig(model=model, text=text, tokens=lexp.DEFAULT_TOKENS if tokens is None else tokens,
                                  dtypes=dtypes, device=device, seed=seed, inject=inject or [],
                                  save_logits=save_logits or [], plot=plot, max_kld=max_kld, min_top1=min_top1)
        with progress("compare model --metrics", enabled=not json_out) as advance:
            mres = lexp.run_model(mcfg, advance)
        logits_report.show(mres, plot, json_out)
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
    from precisionlab.report import model as model_report
    from precisionlab.report.output import Output

    Output(model_report, json_out, plot).run("compare model", lambda advance: exp.run(cfg, advance))
