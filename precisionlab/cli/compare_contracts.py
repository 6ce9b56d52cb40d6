"""precisionlab compare contracts: options parsed here; the work is the experiment's, the output the report's."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from precisionlab.catalog import formats
from precisionlab.cli.model_options import (DEFAULT_PROMPT, DEFAULT_SPEC, DEFAULT_STEPS, ChatOpt, ModelDeviceOpt,
                                            PromptOpt, StepsOpt, early_checks)
from precisionlab.cli.options import JsonOpt, ModelOpt, SeedOpt, ThreadsOpt, format_names


def command(
    model: ModelOpt = DEFAULT_SPEC,
    steps: StepsOpt = DEFAULT_STEPS,
    prompt: PromptOpt = DEFAULT_PROMPT,
    chat: ChatOpt = False,
    dtypes: Annotated[Optional[str], typer.Option("--dtypes", help="Precisions the contracts run in: "
                                                  f"{format_names(formats.COMPUTE)} (default fp32,{formats.LOW_COMPUTE[0]}, "
                                                  "those the engine computes in).",
                                                  show_default=False)] = None,
    chunks: Annotated[Optional[list[int]], typer.Option("--chunks", help="Chunk sizes beyond 1, 7, 64; "
                                                        "repeatable.")] = None,
    batches: Annotated[Optional[list[int]], typer.Option("--batches", help="Batch sizes beyond 2, 4, 16, 64; "
                                                         "repeatable.")] = None,
    draft_widths: Annotated[Optional[list[int]], typer.Option("--draft-widths", help="spec_verify's draft widths k "
                                                              "(a verify chunk of k + 1 rows against decoding), "
                                                              "replacing 1, 2, 4, 8; repeatable.")] = None,
    draft: Annotated[Optional[str], typer.Option("--draft", help="The draft whose k tokens spec_verify verifies, in "
                                                 "place of the sequence's own: a model spec (as --model's: a smaller "
                                                 "or quantised export with the same tokenizer; it proposes greedily "
                                                 "in fp32), or tokens:FILE, a token stream in --token-ids' formats "
                                                 "(id i is the draft's token at position prompt + i; at least --steps "
                                                 "ids).", show_default=False)] = None,
    token_ids: Annotated[Optional[str], typer.Option("--token-ids", help="Your token ids in place of --prompt's: "
                                                     "a text file of integers, a .npy, or a dump (its "
                                                     "precisionlab.token_ids).", show_default=False)] = None,
    device: ModelDeviceOpt = "cpu",
    seed: SeedOpt = 0,
    json_out: JsonOpt = False,
    threads: ThreadsOpt = None,
):
    """Invariance contracts of the serving path (prefill vs decode, chunked prefill, shared prefix, padding, batch
    mates) on the prompt + --steps fp32 greedy tokens; each break re-run in fp64: rounding or algorithmic."""
    from precisionlab.experiments import contracts as cexp
    from precisionlab.experiments import spec_draft
    from precisionlab.report import contracts as contracts_report
    from precisionlab.report.output import Output

    from precisionlab.io import token_ids as token_files

    early_checks(model=model, threads=threads)
    ids = None if token_ids is None else token_files.read(token_ids)
    stream_file = draft[len(spec_draft.TOKENS):] if draft and draft.startswith(spec_draft.TOKENS) else None
    stream = None if stream_file is None else token_files.read(stream_file, spec_draft.STREAM)
    cfg = cexp.ContractsConfig(model=model, steps=steps, prompt=prompt,
                               **({} if dtypes is None else {"dtypes": dtypes}),
                               chunks=cexp.sizes(chunks or [], cexp.CHUNKS, "--chunks"),
                               batches=cexp.sizes(batches or [], cexp.BATCHES, "--batches"),
                               **({} if not draft_widths else {"draft_widths": tuple(draft_widths)}),
                               draft=spec_draft.DraftOptions(None if stream_file is not None else draft, stream, stream_file),
                               token_ids=ids, device=device, seed=seed, threads=threads, chat=chat)
    Output(contracts_report, json_out).run("compare contracts", lambda advance: cexp.run(cfg, advance))
