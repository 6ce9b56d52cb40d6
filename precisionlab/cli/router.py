"""precisionlab router: options parsed here; the work is experiments/router.py's, the output report/router.py's.

A command of its own, not a `compare` verb: it runs one path (the router's)
under many precisions against its own fp64 emulation, as softmax and
attention do, rather than comparing two runs the user brings."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.options import plot_option, SeedOpt, JsonOpt, accumulator_option, format_names

GateAccumulatorOpt = accumulator_option("For the gate GEMM, each model a path.")


def command(
    gate_dtypes: Annotated[str, typer.Option("--gate-dtypes", help=f"The gate GEMM's input formats (hidden states "
                                             f"and gate weights), comma list: {format_names(formats.COMPUTE)}.")]
    = format_names(formats.ROUTER_DEFAULT, ","),
    accumulator: GateAccumulatorOpt = "fp32",
    logit_dtypes: Annotated[str, typer.Option("--logit-dtypes", help="The router logits' formats, comma list: "
                                              f"{format_names(formats.COMPUTE)}.")]
    = format_names(formats.ROUTER_DEFAULT, ","),
    bias_dtypes: Annotated[Optional[str], typer.Option("--bias-dtypes", help="The correction bias's formats (with "
                                                       f"--bias), comma list: {format_names(formats.COMPUTE)} "
                                                       "(default fp32).")] = None,
    scoring: Annotated[str, typer.Option("--scoring", help="softmax (Qwen3-MoE, Mixtral) | sigmoid "
                                         "(DeepSeek-V3, GLM).")] = "softmax",
    top_k: Annotated[int, typer.Option("--top-k", help="Experts per token.")] = 8,
    experts: Annotated[int, typer.Option("--experts", help="Routed experts (synthetic inputs).")] = 128,
    groups: Annotated[str, typer.Option("--groups", help="Grouped top-k N:M: N expert groups, the M best kept "
                                        "(DeepSeek-V3's n_group:topk_group); 1:1 is plain top-k.")] = "1:1",
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="Divide the top-k weights by "
                                            "their sum (norm_topk_prob).")] = True,
    ties: Annotated[str, typer.Option("--ties", help="An exact tie goes to the lowest | highest expert index.")]
    = "lowest",
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens (synthetic inputs; with a model, the seeded "
                                        "token ids run through it).")] = 4096,
    hidden: Annotated[int, typer.Option("--hidden", help="Hidden size (synthetic gate GEMM).")] = 512,
    layers: Annotated[int, typer.Option("--layers", help="MoE layers (synthetic inputs), independent draws.")] = 4,
    scales: Annotated[str, typer.Option("--scales", help="HIDDEN,GATE: hidden states ~ N(0, HIDDEN^2), gate "
                                        "weights ~ N(0, GATE^2 / hidden); with --inputs logits, the logits' "
                                        "standard deviation; with --inputs margins, SD,MEAN: the logits' "
                                        "standard deviation and the mean top-k margin.")] = "1,1",
    inputs_from: Annotated[str, typer.Option("--inputs", help="gate: synthetic hidden states through a gate GEMM "
                                             "| logits: synthetic fp32 router logits | margins: the same with each token's top-k margin "
                                             "(k-th minus (k+1)-th logit) drawn from an exponential of mean "
                                             "--scales' second value | FILE.npy: a router-logit dump, "
                                             "(tokens, experts) or (layers, tokens, experts) | hf:DIR: the routers of "
                                             "a Qwen3-MoE, Mixtral or DeepSeek-V3-style model (its config sets the "
                                             "routing; --tokens seeded token ids run through it in fp32).")]
    = "gate",
    bias: Annotated[Optional[str], typer.Option("--bias", help="Correction bias (e_score_correction_bias): none | "
                                                "glm (evenly spread over [6.817, 7.063], GLM-5.2's) | LO:HI.")]
    = None,
    impl: Annotated[Optional[str], typer.Option("--impl", help="Your router kernel, package.module:function "
                                                "(docs/router.md gives its signature): run on the adversarial "
                                                "cases against the emulated fp64 router.")] = None,
    threshold: Annotated[Optional[int], typer.Option("--threshold", help="With --impl: your kernel's fused/"
                                                     "unfused token count; cases run either side of it.")] = None,
    plot: plot_option("flips by margin bucket") = None,
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """An MoE router under low precision: top-k flips by margin, mass moved, rounding or bug.

    Exit 1 when your --impl fails an adversarial case."""
    from precisionlab.experiments import router as exp
    from precisionlab.report import router
    from precisionlab.report.output import Output

    out = Output(router, json_out, plot, inputs=[("--inputs", inputs_from)])
    cfg = exp.RouterConfig(gate_dtypes=gate_dtypes, accumulator=accumulator, logit_dtypes=logit_dtypes,
                           bias_dtypes=bias_dtypes, scoring=scoring, top_k=top_k, experts=experts, groups=groups,
                           normalize=normalize, ties=ties, tokens=tokens, hidden=hidden, layers=layers,
                           scales=scales, inputs=inputs_from, bias=bias, impl=impl,
                           threshold=threshold, seed=seed)
    result = out.run("router", lambda advance: exp.run(cfg, advance))
    if any(not c["passed"] for c in result.cases):  # --impl: a failing case fails the run, so CI can hold a kernel
        raise typer.Exit(1)
