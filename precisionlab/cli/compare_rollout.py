"""precisionlab compare rollout: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.model_options import DEFAULT_PROMPT, ModelDeviceOpt, early_checks, spec_paths
from precisionlab.cli.options import plot_option, JsonOpt, SeedOpt, ThreadsOpt, format_names
from precisionlab.errors import UsageError


def command(
    trainer: Annotated[Optional[str], typer.Option("--trainer", help="The trainer's engine spec (as --model).",
                                                   show_default=False)] = None,
    rollout: Annotated[Optional[str], typer.Option("--rollout", help="The rollout's engine spec (as --model).",
                                                   show_default=False)] = None,
    trainer_dtype: Annotated[str, typer.Option("--trainer-dtype", help="What the trainer computes in: "
                                               f"{format_names(formats.COMPUTE)}.")] = "fp32",
    rollout_dtype: Annotated[str, typer.Option("--rollout-dtype", help="What the rollout computes in: "
                                               f"{format_names(formats.COMPUTE)}.")] = "bf16",
    samples: Annotated[Optional[int], typer.Option("--samples", help="Sequences sampled (default 8).")] = None,
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="New tokens a sample (default 64).")] = None,
    prompt: Annotated[str, typer.Option("--prompt", help="Every sample's prompt.")] = DEFAULT_PROMPT,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="Sampling temperature (default 1); "
                                                         "both sides score logits / T.")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling's kept mass, in (0, 1] "
                                                   "(default 1: the whole distribution).")] = None,
    plot: plot_option("the run's plot") = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """An RL pipeline's two sides: N sequences sampled from the rollout are scored by both, and compare logprobs'
    statistics reported, also with the rollout's LM head and the whole rollout in fp32."""
    from precisionlab.experiments import rollout as rexp
    from precisionlab.report import rollout as report
    from precisionlab.report.output import Output
    from precisionlab.report.plots import check_plot_path

    early_checks(threads=threads)
    if trainer is None or rollout is None:
        raise UsageError("--trainer and --rollout come together: give both engine specs")
    plot = check_plot_path(plot, spec_paths(("--trainer", trainer), ("--rollout", rollout)))
    cfg = rexp.RolloutConfig(trainer=trainer, rollout=rollout, trainer_dtype=trainer_dtype,
                             rollout_dtype=rollout_dtype,
                             samples=rexp.DEFAULT_SAMPLES if samples is None else samples,
                             tokens=rexp.DEFAULT_TOKENS if tokens is None else tokens, prompt=prompt,
                             temperature=1.0 if temperature is None else temperature,
                             top_p=1.0 if top_p is None else top_p, seed=seed, device=device, threads=threads)
    Output(report, json_out, plot).run("compare rollout", lambda advance: rexp.run(cfg, advance))
