"""precisionlab nondeterminism endpoint URL: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.cli.options import JsonOpt
from precisionlab.engines.registry import DEFAULT_PROMPT


def command(
    url: Annotated[str, typer.Argument(help="An OpenAI-compatible server's URL (http://HOST:PORT). Only this URL is "
                                       "contacted.")],
    prompt: Annotated[str, typer.Option("--prompt", help="The prompt sent N times.")] = DEFAULT_PROMPT,
    requests: Annotated[Optional[int], typer.Option("--requests", help="Requests a run (default 100).", show_default=False)] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="Requests in flight in the concurrent and mixed runs (default 4; 1: only the sequential run).", show_default=False)] = None,
    mix: Annotated[bool, typer.Option("--mix", help="Also a run that interleaves other prompts with the prompt's requests (their batch mates).")] = False,
    other_prompts: Annotated[Optional[list[str]], typer.Option("--other-prompts", help="With --mix: a prompt to interleave (repeat the option for more; default three built-in ones).", show_default=False)] = None,
    cache: Annotated[Optional[str], typer.Option("--cache", help="Comma list of on, off (llama.cpp's cache_prompt true/false), server (the field not sent) (default on,off; vLLM ignores the field, so there on,off is one server run).", show_default=False)] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", help="Tokens a completion (default 16).", show_default=False)] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="Seconds for the whole command, shared out over its runs up front (each an equal part of what is left); a run stops at its share with what it has (default 300).", show_default=False)] = None,
    request_timeout: Annotated[Optional[float], typer.Option("--request-timeout", help="Seconds one request may take (default 60).", show_default=False)] = None,
    served_model: Annotated[Optional[str], typer.Option("--served-model", help="The model name to send (default: the first the server's /v1/models lists).", show_default=False)] = None,
    json_out: JsonOpt = False,
):
    """A server's unique completions: one prompt sent N times at temperature 0, sequential, concurrent and mixed
    with other prompts, with and without the prompt cache."""
    from precisionlab.experiments import endpoint as ep
    from precisionlab.io import inputs
    from precisionlab.report import endpoint as ep_report
    from precisionlab.report.output import Output

    for text in other_prompts or []:  # --prompt: the run's start-up (experiments/startup.check_prompt)
        inputs.check_text(text, "--other-prompts")
    cfg = ep.EndpointConfig(url=url, prompt=prompt, mix=mix, other_prompts=list(other_prompts or []),
                            served_model=served_model,
                            **{k: v for k, v in (("requests", requests), ("concurrency", concurrency),
                                                 ("cache", cache), ("max_tokens", max_tokens),
                                                 ("time_limit", time_limit),
                                                 ("request_timeout", request_timeout)) if v is not None})
    ep.check(cfg)
    Output(ep_report, json_out).run("nondeterminism endpoint", lambda advance: ep.run(cfg, advance))
