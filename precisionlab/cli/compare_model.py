"""precisionlab compare model: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.errors import UsageError
from precisionlab.catalog import formats
from precisionlab.cli.options import ModelOpt, SeedOpt, JsonOpt, ThreadsOpt, WideOpt, check_model, format_names
from precisionlab.engines.registry import DEFAULT_PROMPT, DEFAULT_SPEC, spec_path


# The runs compare model makes, and the options that mean something in each:
# an option given in a mode it has no effect in is a usage error naming the
# modes it needs (never accepted and ignored).
PLAIN = "the plain run (no --metrics, --layers, --dump, --contracts, --trainer/--rollout or --engine)"
METRICS, LAYERS, CONTRACTS, ROLLOUT, ENGINE = ("--metrics", "--layers/--dump", "--contracts", "--trainer/--rollout",
                                               "--engine")
ONE_MODEL = (PLAIN, METRICS, LAYERS, CONTRACTS)  # the modes that run --model in --dtypes
APPLIES = {
    "model": ONE_MODEL, "dtypes": ONE_MODEL, "plot": (PLAIN, METRICS, LAYERS, ROLLOUT), "threads": (PLAIN, CONTRACTS, ROLLOUT),
    "steps": (PLAIN, LAYERS, CONTRACTS, ENGINE), "prompt": (PLAIN, LAYERS, CONTRACTS, ROLLOUT, ENGINE),
    "text": (METRICS, ENGINE), "tokens": (METRICS, ROLLOUT, ENGINE), "save_logits": (METRICS,),
    "max_kld": (METRICS, ENGINE), "min_top1": (METRICS, ENGINE), "reference": (ENGINE, LAYERS),
    "inject": (METRICS, LAYERS), "chunks": (CONTRACTS,), "batches": (CONTRACTS,), "trainer_dtype": (ROLLOUT,),
    "rollout_dtype": (ROLLOUT,), "samples": (ROLLOUT,), "temperature": (ROLLOUT,), "top_p": (ROLLOUT,),
    "wide": (LAYERS,),
}


def check_mode_options(ctx: typer.Context, mode: str) -> None:
    """Refuse (exit 2) every option the user gave that `mode` does not use."""
    for name, modes in APPLIES.items():
        source = ctx.get_parameter_source(name)  # by name: typer may vendor its own click
        if mode in modes or source is None or source.name == "DEFAULT":
            continue
        opt = "--" + name.replace("_", "-")
        raise UsageError(f"{opt} has no effect in {mode}; it is read only by {' and '.join(modes)}")

DEFAULT_STEPS = 50
DEFAULT_DTYPES = format_names(formats.LOW_COMPUTE, ",")


def command(
    ctx: typer.Context,
    model: ModelOpt = DEFAULT_SPEC,
    steps: Annotated[int, typer.Option("--steps", help="Greedy decoding steps.")] = DEFAULT_STEPS,
    prompt: Annotated[str, typer.Option("--prompt", help="The text to continue (--rollout: every sample's).")] = DEFAULT_PROMPT,
    dtypes: Annotated[str, typer.Option("--dtypes", help="Low precisions against fp32: "
                                        f"{format_names(formats.LOW_COMPUTE)}.")] = DEFAULT_DTYPES,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write rel-L2 per step, divergence marked, to this file (.png, .svg, .pdf, ...).")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu (the default for a model run, unlike the other "
                                          "commands) | cuda | auto (the GPU where present, else the CPU).")] = "cpu",
    metrics: Annotated[bool, typer.Option("--metrics", help="Instead: next-token distribution statistics over a text, "
                                          "teacher-forced (KL divergence, top-1/top-5 agreement, Δp, perplexity, flips "
                                          "by margin); --dtypes may include fp32; --plot draws KLD and flips.")] = False,
    text: Annotated[Optional[str], typer.Option("--text", help="--metrics: a UTF-8 text file (default: the held-out "
                                                "part of the shipped Shakespeare text).")] = None,
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="--metrics: positions scored (default 8192); "
                                                  "--rollout: new tokens a sample (default 64).")] = None,
    save_logits: Annotated[Optional[list[str]], typer.Option("--save-logits", help="--metrics: write a run's logits and "
                                                             "token ids as safetensors: FILE (fp32) or DTYPE=FILE; "
                                                             "repeatable.")] = None,
    max_kld: Annotated[Optional[float], typer.Option("--max-kld", help="--metrics: exit 1 when a mean KLD is above this.")] = None,
    min_top1: Annotated[Optional[float], typer.Option("--min-top1", help="--metrics: exit 1 when a top-1 agreement (%) "
                                                      "is below this.")] = None,
    layers: Annotated[bool, typer.Option("--layers", help="Module by module: each module's accumulated and local "
                                         "error against what rounding alone costs there; names the first "
                                         "divergence. With --reference SPEC (or --engine SPEC): two models on "
                                         "the same tokens, every module of both, fp32 vs fp32 and three-way per "
                                         "--dtypes; --plot draws the error along the model.")] = False,
    inject: Annotated[Optional[list[str]], typer.Option("--inject", help="TARGET:KEY=VALUE, repeatable. With --metrics: "
                                                        "logits:noise=SIGMA adds seeded Gaussian noise to the compared "
                                                        "runs' logits. With --layers/--dump: perturb one module of the "
                                                        "low-precision run: scale=F, eps=F (a norm) or "
                                                        f"rope={format_names(formats.LOW_COMPUTE, '|')} "
                                                        "(the RoPE module; 'rope' in the embedded model).")] = None,
    dump: Annotated[Optional[str], typer.Option("--dump", help="Write each run's per-module outputs to "
                                                "DIR/fp32.safetensors, DIR/bf16.safetensors, ... (execution order "
                                                "and token ids in the metadata), for compare tensors.")] = None,
    contracts: Annotated[bool, typer.Option("--contracts", help="Instead: invariance contracts of the serving path "
                                            "(prefill vs decode, chunked prefill, shared prefix, padding, batch "
                                            "mates) on the prompt + --steps fp32 greedy tokens; each break re-run "
                                            "in fp64: rounding or algorithmic. --dtypes default fp32,bf16.")] = False,
    chunks: Annotated[Optional[list[int]], typer.Option("--chunks", help="--contracts: chunk sizes beyond 1, 7, 64; "
                                                        "repeatable.")] = None,
    batches: Annotated[Optional[list[int]], typer.Option("--batches", help="--contracts: batch sizes beyond 2, 4, 16, "
                                                         "64; repeatable.")] = None,
    trainer: Annotated[Optional[str], typer.Option("--trainer", help="Instead: an RL pipeline's two sides. The "
                                                   "trainer's engine spec (as --model); with --rollout, N sequences "
                                                   "sampled from the rollout are scored by both, and compare "
                                                   "logprobs' statistics reported, also with the rollout's LM head "
                                                   "and the whole rollout in fp32.")] = None,
    rollout: Annotated[Optional[str], typer.Option("--rollout", help="The rollout's engine spec (as --model); "
                                                   "with --trainer.")] = None,
    trainer_dtype: Annotated[str, typer.Option("--trainer-dtype", help="--trainer: what the trainer computes in: "
                                               f"{format_names(formats.COMPUTE)}.")] = "fp32",
    rollout_dtype: Annotated[str, typer.Option("--rollout-dtype", help="--rollout: what the rollout computes in: "
                                               f"{format_names(formats.COMPUTE)}.")] = "bf16",
    samples: Annotated[Optional[int], typer.Option("--samples", help="--rollout: sequences sampled (default 8).")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="--rollout: sampling temperature "
                                                         "(default 1); both sides score logits / T.")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="--rollout: nucleus sampling's kept mass, in "
                                                   "(0, 1] (default 1: the whole distribution).")] = None,
    engine: Annotated[Optional[list[str]], typer.Option("--engine", help="Instead: a real engine against --reference, "
                                                        "teacher-forced over --text (--tokens, default 512) and "
                                                        "greedy from --prompt: llamacpp:FILE.gguf with optional ,kv=f32 ,flash=1 "
                                                        ",threads=N, ct2:DIR[,compute=int8], onnx:FILE, or any "
                                                        "--model spec; repeatable.")] = None,
    reference: Annotated[Optional[str], typer.Option("--reference", help="--engine or --layers: the reference "
                                                     "model's spec, run in fp32 (default for --engine: the source "
                                                     "the export recorded, else the embedded model).")] = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
    wide: WideOpt = False,
):
    """A whole model in fp32 vs bf16/fp16: where greedy decoding diverges, and the logit error per step."""
    from precisionlab.io import inputs
    from precisionlab.experiments import model as exp

    from precisionlab.report.plots import check_plot_path
    from precisionlab.runtime import threads as threads_mod

    modes = [m for m, on in ((METRICS, metrics), (LAYERS, layers or dump is not None), (CONTRACTS, contracts),
                             (ROLLOUT, trainer is not None or rollout is not None),
                             (ENGINE, not layers and (bool(engine) or reference is not None))) if on]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(modes)} are separate runs: give one")
    threads_mod.check(threads)  # the one --threads validation, whatever the mode
    inputs.check_text(prompt, "--prompt")
    check_mode_options(ctx, modes[0] if modes else PLAIN)
    if modes == [ENGINE]:
        return _engines(engine, reference, text, tokens, steps, prompt, device, max_kld, min_top1, json_out)
    if layers and (engine or reference is not None):
        return _layers_pair(ctx, model, engine, reference, inject, dump, steps, prompt, dtypes, device, seed, plot,
                            json_out, wide)
    if modes == [ROLLOUT]:
        return _rollout(trainer, rollout, trainer_dtype, rollout_dtype, samples, tokens, prompt, temperature, top_p,
                        seed, device, threads, json_out,
                        check_plot_path(plot, _spec_paths(("--trainer", trainer), ("--rollout", rollout))))
    inputs.check_given(model, "--model")
    check_model(model)
    inputs.check_given(text, "--text")
    # before the run: a bad path, or one the run reads, must not cost the result
    plot = check_plot_path(plot, [("--text", text), ("--model", spec_path(model))])
    if contracts:
        return _contracts(ctx, json_out=json_out, dtypes=dtypes, model=model, steps=steps, prompt=prompt,
                          chunks=chunks or [], batches=batches or [], device=device, seed=seed, threads=threads)
    if layers or dump is not None:
        from precisionlab.report import layers as layers_report
        from precisionlab.report.output import Output
        from precisionlab.experiments import layers as lexp

        lcfg = lexp.LayersConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                                 inject=inject or [], dump=dump)
        lres = Output(layers_report, json_out, plot, table_kw={"wide": wide}).run(
            "compare model --layers", lambda advance: lexp.run(lcfg, advance))
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
    cfg = exp.ModelConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                          threads=threads)
    from precisionlab.report import model as model_report
    from precisionlab.report.output import Output

    Output(model_report, json_out, plot).run("compare model", lambda advance: exp.run(cfg, advance))


def _spec_paths(*specs: tuple[str, str | None]) -> list[tuple[str, str | None]]:
    """(option, the file or folder a model spec reads) for each spec: what an
    output must not be, nor lie inside. A spec that does not parse is left to
    the run's own refusal, which names its option."""
    out = []
    for option, spec in specs:
        try:
            out.append((option, spec_path(spec)))
        except UsageError:
            pass
    return out


def _contracts(ctx, json_out: bool, dtypes: str, **kw) -> None:
    """The --contracts mode (check_mode_options has refused the other modes'
    options); --dtypes defaults to fp32,bf16 here."""
    from precisionlab.experiments import contracts as cexp
    from precisionlab.report import contracts as contracts_report
    from precisionlab.report.output import Output

    source = ctx.get_parameter_source("dtypes")  # typer vendors its own click: compared by name
    if source is None or source.name in ("DEFAULT", "DEFAULT_MAP"):
        dtypes = cexp.ContractsConfig.dtypes
    kw["chunks"] = cexp.sizes(kw["chunks"], cexp.CHUNKS, "--chunks")
    kw["batches"] = cexp.sizes(kw["batches"], cexp.BATCHES, "--batches")
    cfg = cexp.ContractsConfig(dtypes=dtypes, **kw)
    Output(contracts_report, json_out).run("compare model --contracts", lambda advance: cexp.run(cfg, advance))


def _rollout(trainer, rollout, trainer_dtype, rollout_dtype, samples, tokens, prompt, temperature, top_p, seed,
             device, threads, json_out, plot):
    """--trainer SPEC --rollout SPEC: its own mode; the other modes' options are refused."""
    from precisionlab.experiments import rollout as rexp
    from precisionlab.report import rollout as report
    from precisionlab.report.output import Output

    if trainer is None or rollout is None:
        raise UsageError("--trainer and --rollout come together: give both engine specs")
    cfg = rexp.RolloutConfig(trainer=trainer, rollout=rollout, trainer_dtype=trainer_dtype,
                             rollout_dtype=rollout_dtype,
                             samples=rexp.DEFAULT_SAMPLES if samples is None else samples,
                             tokens=rexp.DEFAULT_TOKENS if tokens is None else tokens, prompt=prompt,
                             temperature=1.0 if temperature is None else temperature,
                             top_p=1.0 if top_p is None else top_p, seed=seed, device=device, threads=threads)
    Output(report, json_out, plot).run("compare model --rollout", lambda advance: rexp.run(cfg, advance))


def _layers_pair(ctx, model, engine, reference, inject, dump, steps, prompt, dtypes, device, seed, plot, json_out,
                 wide=False):
    """--layers --reference SPEC / --layers --engine SPEC: two models, module by module (experiments/layers_pair)."""
    from precisionlab.engines import registry
    from precisionlab.experiments import layers_pair as pexp
    from precisionlab.io import inputs
    from precisionlab.report import layers_pair as report
    from precisionlab.report.output import Output

    if inject or dump is not None:
        raise UsageError(f"{'--inject' if inject else '--dump'} is for one model's --layers; with --reference the "
                         "bug is in the second model itself")
    if engine and len(engine) > 1:
        raise UsageError("--layers --engine takes one engine (YOURS); repeat the run for another")
    if engine and ctx.get_parameter_source("model").name != "DEFAULT":
        raise UsageError("--layers: give YOURS as --model or as --engine, not both")
    inputs.check_given(reference, "--reference")
    yours = engine[0] if engine else model
    inputs.check_given(yours, "--engine" if engine else "--model")
    pexp.check_specs(yours, reference, bool(engine))
    paths = [(o, registry.spec_path(s)) for o, s in (("--model", yours), ("--reference", reference)) if s]
    cfg = pexp.PairConfig(model=None if engine else model, engine=engine[0] if engine else None, reference=reference,
                          steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed)
    res = Output(report, json_out, plot, paths, table_kw={"wide": wide}).run(
        "compare model --layers", lambda advance: pexp.run(cfg, advance))
    if res.first_divergence is not None:
        raise typer.Exit(1)


def _engines(engine, reference, text, tokens, steps, prompt, device, max_kld, min_top1, json_out):
    """compare model --engine: its own block, so the other modes stay as they were."""
    from precisionlab.experiments import engines as eexp
    from precisionlab.report import engines as engines_report
    from precisionlab.report.output import Output

    if not engine:
        raise UsageError("--reference needs --engine")
    cfg = eexp.EnginesConfig(engines=engine, reference=reference, text=text,
                             tokens=eexp.DEFAULT_TOKENS if tokens is None else tokens, steps=steps, prompt=prompt,
                             device=device, max_kld=max_kld, min_top1=min_top1)
    res = Output(engines_report, json_out).run("compare model --engine", lambda advance: eexp.run(cfg, advance))
    if res.failures:
        raise typer.Exit(1)
