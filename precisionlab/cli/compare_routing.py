"""precisionlab compare routing: options parsed here; the work is experiments/router_attribution.py's,
the output report/router_attribution.py's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import JsonOpt


def command(
    a: Annotated[str, typer.Argument(help="A: the trainer's log-probs (any format compare logprobs reads).")],
    b: Annotated[str, typer.Argument(help="B: the rollout's log-probs of the same tokens.")],
    a_experts: Annotated[str, typer.Option("--a-experts", help="A's routed experts: .npy (tokens, layers, top_k) or "
                                           ".jsonl of vLLM's routed_experts / SGLang's meta_info.routed_experts, "
                                           "one record a sequence.")],
    b_experts: Annotated[str, typer.Option("--b-experts", help="B's routed experts, as --a-experts.")],
    experts: Annotated[int, typer.Option("--experts", help="Routed experts of the model: ids lie in 0 ... N-1 "
                                         "(-1: no routed expert).")],
    moe_shape: Annotated[Optional[str], typer.Option("--moe-shape", help="LAYERS:TOP_K of SGLang's base64 "
                                                     "routed_experts (flat int32 ids).")] = None,
    json_out: JsonOpt = False,
):
    """How much of a trainer/rollout log-prob mismatch comes with routing flips: |Δ| and KL per group, flips by
    layer."""
    from precisionlab.experiments import router_attribution as exp
    from precisionlab.report import router_attribution as report
    from precisionlab.report.output import Output

    out = Output(report, json_out)
    cfg = exp.AttributionConfig(a=a, b=b, a_experts=a_experts, b_experts=b_experts, experts=experts,
                                moe_shape=moe_shape)
    out.run("compare routing", lambda advance: exp.run(cfg, advance))
