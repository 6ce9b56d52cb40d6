"""precisionlab compare model: options parsed here; the work is the experiment's, the output the report's.

The plain greedy run, fp32 against the low precisions. The other questions
about a model are verbs of their own (compare metrics, layers, contracts,
rollout, engine), each with only the options it reads."""

from __future__ import annotations



from precisionlab.cli.model_options import (DEFAULT_LOWS, DEFAULT_PROMPT, DEFAULT_SPEC, DEFAULT_STEPS, ChatOpt,
                                            LowDtypesOpt, ModelDeviceOpt, PromptOpt, StepsOpt, early_checks, spec_paths)
from precisionlab.cli.options import plot_option, JsonOpt, ModelOpt, SeedOpt, ThreadsOpt


def command(
    model: ModelOpt = DEFAULT_SPEC,
    steps: StepsOpt = DEFAULT_STEPS,
    prompt: PromptOpt = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    dtypes: LowDtypesOpt = DEFAULT_LOWS,
    plot: plot_option("rel-L2 per step, the divergence marked") = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """A whole model in fp32 vs bf16/fp16: where greedy decoding diverges, and the logit error per step."""
    from precisionlab.experiments import model as exp
    from precisionlab.report import model as model_report
    from precisionlab.report.output import Output
    from precisionlab.report.plots import check_plot_path

    early_checks(model=model, threads=threads)
    plot = check_plot_path(plot, spec_paths(("--model", model)))
    cfg = exp.ModelConfig(model=model, steps=steps, prompt=prompt, dtypes=dtypes, device=device, seed=seed,
                          threads=threads, chat=chat)
    Output(model_report, json_out, plot).run("compare model", lambda advance: exp.run(cfg, advance))
