"""precisionlab compare engine: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.model_options import (DEFAULT_PROMPT, DEFAULT_STEPS, ChatOpt, MaxKldOpt, MinTop1Opt,
                                            ModelDeviceOpt, PromptOpt, ReferenceOpt, StepsOpt, TextOpt)
from precisionlab.cli.options import JsonOpt, seed_in_range
from precisionlab.errors import UsageError


def command(
    engine: Annotated[Optional[list[str]], typer.Option("--engine", help="A real engine, teacher-forced over --text "
                                                        "and greedy from --prompt: llamacpp:FILE.gguf with optional "
                                                        ",kv=f32 ,flash=1 ,threads=N, ct2:DIR with optional ,compute=int8, "
                                                        "onnx:FILE, or any --model spec; repeatable.",
                                                        show_default=False)] = None,
    reference: ReferenceOpt = None,
    text: TextOpt = None,
    tokens: Annotated[Optional[int], typer.Option("--tokens", help="Positions scored (default 512).")] = None,
    steps: StepsOpt = DEFAULT_STEPS,
    prompt: PromptOpt = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    max_kld: MaxKldOpt = None,
    min_top1: MinTop1Opt = None,
    device: ModelDeviceOpt = "cpu",
    seed: Annotated[int, typer.Option("--seed", callback=seed_in_range, help="Accepted as by every command; this run draws nothing "
                                      "random.")] = 0,
    no_ref_cache: Annotated[bool, typer.Option("--no-ref-cache", help="Compute the reference afresh rather than "
                                               "read its logits from ~/.cache/precisionlab/reference/ (keyed by the "
                                               "model's files, the text, tokens, prompt, steps and settings).")] = False,
    json_out: JsonOpt = False,
):
    """A real engine (llama.cpp, CTranslate2, ONNX Runtime, a server, any --model spec) against a reference
    model in fp32: compare metrics' statistics teacher-forced, and greedy agreement.

    Exit 1 when --max-kld or --min-top1 fails."""
    from precisionlab.experiments import engines as eexp
    from precisionlab.report import engines as engines_report
    from precisionlab.report.output import Output

    if not engine:
        raise UsageError("compare engine needs --engine SPEC")
    cfg = eexp.EnginesConfig(engines=engine, reference=reference, text=text,
                             tokens=eexp.DEFAULT_TOKENS if tokens is None else tokens, steps=steps, prompt=prompt,
                             device=device, max_kld=max_kld, min_top1=min_top1,
                             reference_cache=not no_ref_cache, chat=chat)
    res = Output(engines_report, json_out).run("compare engine", lambda advance: eexp.run(cfg, advance))
    if res.failures:
        raise typer.Exit(1)
