"""precisionlab nondeterminism: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import DeviceOpt, SeedOpt, JsonOpt
from precisionlab.engines.registry import DEFAULT_PROMPT
from precisionlab.errors import UsageError

_ENDPOINT_ONLY = "--prompt, --requests, --concurrency, --mix, --other-prompts, --cache, --max-tokens, --time-limit, " \
                 "--request-timeout, --served-model"


def command(
    runs: Annotated[int, typer.Option("--runs", help="Repetitions of each computation (at least 2).")] = 100,
    n: Annotated[int, typer.Option("--n", help="Values in the summed array.")] = 1 << 24,
    sections: Annotated[Optional[str], typer.Option("--sections", help="Comma list: atomics, splitk, batch, torch_ops, threads, tp.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Histogram of the atomic results, in ulps around fsum, to this file (.png, .svg, .pdf, ...).")] = None,
    endpoint: Annotated[Optional[str], typer.Option("--endpoint", help="An OpenAI-compatible server's URL (http://HOST:PORT): send one prompt N times at temperature 0 and count the unique completions, instead of the sections. Only this URL is contacted.")] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="--endpoint: the prompt sent N times.", show_default=False)] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", help="--endpoint: requests a run (default 100).", show_default=False)] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="--endpoint: requests in flight in the concurrent and mixed runs (default 4; 1: only the sequential run).", show_default=False)] = None,
    mix: Annotated[bool, typer.Option("--mix", help="--endpoint: also a run that interleaves other prompts with the prompt's requests (their batch mates).")] = False,
    other_prompts: Annotated[Optional[list[str]], typer.Option("--other-prompts", help="--endpoint --mix: a prompt to interleave (repeat the option for more; default three built-in ones).", show_default=False)] = None,
    cache: Annotated[Optional[str], typer.Option("--cache", help="--endpoint: comma list of on, off (llama.cpp's cache_prompt true/false), server (the field not sent) (default on,off).", show_default=False)] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="--endpoint: tokens a completion (default 16).", show_default=False)] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="--endpoint: seconds for the whole command; it stops there with what it has (default 300).", show_default=False)] = None,
    request_timeout: Annotated[Optional[float], typer.Option("--request-timeout", help="--endpoint: seconds one request may take (default 60).", show_default=False)] = None,
    served_model: Annotated[Optional[str], typer.Option("--served-model", help="--endpoint: the model name to send (default: the first the server's /v1/models lists).", show_default=False)] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
):
    """Run-to-run and batch-size variation: atomics, split-K, batch invariance, torch ops, threads, tensor parallel; or, with --endpoint, a server's unique completions of one prompt."""
    from precisionlab.report.output import Output

    endpoint_opts = (prompt, requests, concurrency, other_prompts, cache, max_tokens, time_limit, request_timeout,
                     served_model)
    if endpoint is None:
        if mix or any(v is not None for v in endpoint_opts):
            raise UsageError(f"{_ENDPOINT_ONLY} go with --endpoint URL")
    else:
        if sections is not None or plot is not None:
            raise UsageError("--endpoint runs instead of the sections: drop --sections and --plot")
        from precisionlab.experiments import endpoint as ep
        from precisionlab.io import inputs
        from precisionlab.report import endpoint as ep_report

        prompt = DEFAULT_PROMPT if prompt is None else prompt
        for i, text in enumerate([prompt, *(other_prompts or [])]):
            inputs.check_text(text, "--prompt" if i == 0 else "--other-prompts")

        cfg = ep.EndpointConfig(url=endpoint, prompt=prompt, mix=mix, other_prompts=list(other_prompts or []),
                                served_model=served_model,
                                **{k: v for k, v in (("requests", requests), ("concurrency", concurrency),
                                                     ("cache", cache), ("max_tokens", max_tokens),
                                                     ("time_limit", time_limit),
                                                     ("request_timeout", request_timeout)) if v is not None})
        ep.check(cfg)
        Output(ep_report, json_out).run("nondeterminism --endpoint", lambda advance: ep.run(cfg, advance))
        return

    from precisionlab.experiments import nondeterminism as exp
    from precisionlab.report import nondeterminism

    out = Output(nondeterminism, json_out, plot)
    cfg = exp.NondetConfig(runs=runs, n=n, device=device, seed=seed, sections=sections, keep_samples=plot is not None)
    out.run("nondeterminism", lambda advance: exp.run(cfg, advance))
