"""compare model --contracts: invariance contracts for a whole model.

"The same prompt gave a different answer" is mostly the serving path, not
randomness. Each contract computes one token sequence two ways that should
give the same log-probs, in the run's dtype:

- prefill_vs_decode: one forward pass over the sequence vs its first token
  prefilled, then one token a step through the KV cache;
- chunked: the sequence fed through the cache in chunks of C tokens (--chunks);
- shared_prefix: the prefix's log-probs under two different continuations;
- prefix_cache: the continuation after a prefix served from a saved (copied,
  already used) KV cache vs the whole sequence in one pass;
- padding: the sequence left-padded (attention mask and position ids) in a
  batch of 1 and of 2 vs alone; pad positions are not compared;
- batch: the sequence alone vs in a batch of B (--batches) with other
  sequences of its length.

The sequence is the prompt followed by `steps` tokens of the engine's own
fp32 greedy continuation, fixed once for every dtype. A contract that breaks
(a position not bit-identical) is re-run in the engine's exact dtype (fp64):
where the difference shrinks as rounding would (by about u_fp64 / u_dtype)
it is rounding; where it stays, the difference is in the algorithm.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from precisionlab.catalog import formats
from precisionlab.engines.protocol import NotSupported, greedy, require
from precisionlab.engines.registry import DEFAULT_PROMPT, DEFAULT_SPEC
from precisionlab.experiments import startup
from precisionlab.errors import UsageError
from precisionlab.experiments import spec_draft, spec_verify
from precisionlab.numerics.compare import rounding_ratio
from precisionlab.runtime import memory, progress, threads, torch_flags

CHUNKS = (1, 7, 64)
BATCHES = (2, 4, 16, 64)
PADS = 8  # left-padding tokens in the padding contract
DTYPES = formats.COMPUTE
DEFAULT_DTYPES = ("fp32", formats.LOW_COMPUTE[0])  # fp32 and bf16


@dataclass
class ContractsConfig:
    model: str | None = DEFAULT_SPEC
    steps: int = 50
    prompt: str = DEFAULT_PROMPT
    dtypes: str | None = None  # None: fp32 and bf16, those of them the engine computes in (DEFAULT_DTYPES)
    token_ids: list[int] | None = None  # the user's ids (--token-ids), in place of --prompt's encoding
    chunks: tuple[int, ...] = CHUNKS    # the chunked contract's chunk sizes (the CLI adds --chunks to CHUNKS)
    batches: tuple[int, ...] = BATCHES  # the batch contract's sizes (the CLI adds --batches to BATCHES)
    draft_widths: tuple[int, ...] = spec_verify.DRAFT_WIDTHS  # spec_verify's k (--draft-widths)
    draft: spec_draft.DraftOptions = field(default_factory=spec_draft.DraftOptions)  # --draft / --draft-tokens
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None
    chat: bool = False  # --chat: --prompt under the model's chat template


@dataclass
class ContractsResult:
    params: dict
    rows: list[dict]
    model_info: dict
    flags: dict
    takeaways: list[str]
    timing: dict


def run(cfg: ContractsConfig, advance=lambda k=1: None) -> ContractsResult:
    return threads.scoped(cfg.threads, _run, cfg, advance)


def sizes(extra, base: tuple, option: str) -> tuple[int, ...]:
    """base with the sizes an option adds, sorted, each once; a size <= 0 is a usage error."""
    for v in extra:
        if v <= 0:
            raise UsageError(f"{option} takes positive sizes (got {v})")
    return tuple(sorted(set(base) | set(extra)))


def _widths(cfg: ContractsConfig) -> list:
    """The verify contracts' plan. The default widths run where their window fits (docs/contracts.md);
    a width the user named is run or refused, never dropped without a word."""
    asked = sizes(cfg.draft_widths, (), "--draft-widths")
    too_wide = [k for k in asked if k + 1 > cfg.steps]
    named = tuple(cfg.draft_widths) != tuple(spec_verify.DRAFT_WIDTHS)
    if too_wide and named:
        raise UsageError(f"--draft-widths {too_wide[0]}: a verify window of {too_wide[0] + 1} positions needs "
                         f"--steps {too_wide[0] + 1} or more (--steps {cfg.steps})")
    if named:  # asked for by name: an engine that cannot verify after a copied cache is refused, not a row
        require(startup.resolve(cfg.model, "--model")[0], "forks",
                "--draft-widths (a verify chunk after a copied cache)", UsageError)
    return spec_verify.plan(asked, cfg.steps)


def _run(cfg: ContractsConfig, advance) -> ContractsResult:
    startup.check_run(cfg.steps, cfg.prompt, "the contracts need a prefix of at least one token")
    if cfg.chat and cfg.token_ids is not None:
        raise UsageError("--chat applies the chat template to --prompt; --token-ids are given as read")
    startup.check_chat(cfg.model, cfg.chat)
    dtypes = startup.parse_dtypes(cfg.dtypes or ",".join(DEFAULT_DTYPES), DTYPES)
    chunks = list(sizes(cfg.chunks, (), "--chunks"))
    batches = list(sizes(cfg.batches, (), "--batches"))
    widths = _widths(cfg)
    spec_draft.check(cfg.draft, cfg.model, widths, cfg.steps)
    device = startup.device(cfg.device)
    import torch

    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    # The batches that fit, from the engine's shape, before a weight is read; the padding contract's
    # batch of 2 must fit, or the run is refused.
    batches, left_out = fitting_batches(cfg, batches, dtypes)
    engine, draft = _open(cfg, device, max([2, *batches]), dtypes)
    prompt = _prompt(engine, cfg)
    if cfg.dtypes is None:  # the default pair, less what this engine cannot compute in (llama.cpp: fp32 only)
        dtypes = [d for d in dtypes if d in engine.compute_dtypes] or [engine.compute_dtypes[0]]
    t_load = time.perf_counter() - t0
    t1 = time.perf_counter()
    # fp32 means IEEE fp32: TF32 off, set explicitly; a decoding step is ~2 flops per parameter (an engine
    # that does not count them, llama.cpp, sizes torch's threads for nothing)
    with startup.numerics(cfg.threads, 2.0 * (engine.info()["parameters"] or 0), device) as n_threads:
        flags = torch_flags.torch_flags()
        tokens, _ = greedy(engine, engine.model("fp32"), prompt, cfg.steps, "fp32")  # the copy dropped after
        seq = prompt + tokens
        rng = np.random.default_rng(cfg.seed)
        vocab = int(engine.info()["vocab"])
        # Other sequences of the same length (batch mates, the second continuation, the padded batch's
        # partner): seeded random tokens; what they hold must not matter to the sequence compared.
        others = rng.integers(0, vocab, size=(max([2, *batches]), len(seq) + PADS)).tolist()
        ctx = Context(engine, torch, device, seq, len(prompt), others)
        starts = sorted({p for _, _, kw in widths for p in spec_verify.windows(len(prompt), len(seq), kw["draft"] + 1)})
        ctx.draft, draft_check = spec_draft.proposer(cfg.draft, engine, draft, seq, len(prompt), starts,
                                                     max((kw["draft"] for _, _, kw in widths), default=0))
        rows = _rows(ctx, engine, dtypes, _plan(chunks, batches) + widths, advance)
    t_run = time.perf_counter() - t1
    info = engine.info()
    for e in {id(e): e for e in (engine, draft) if e is not None}.values():
        e.close()
    return ContractsResult(
        params={"model": cfg.model or DEFAULT_SPEC, "steps": cfg.steps, "prompt": cfg.prompt, "chat": cfg.chat, "dtypes": dtypes,
                "prompt_from": "--prompt" if cfg.token_ids is None else "--token-ids",
                "chunks": chunks, "batches": batches, "batches_left_out": left_out, "pads": PADS, "device": device, "seed": cfg.seed,
                "prompt_tokens": len(prompt), "positions": len(seq), "exact_dtype": engine.exact_dtype,
                **_draft_params(cfg.draft, draft_check)},
        rows=rows, model_info=info, flags=flags,
        takeaways=takeaways(rows, info) + spec_verify.takeaways(rows, _draft_label(cfg.draft))
                  + [b["reason"] for b in left_out],
        timing={"load_s": t_load, "run_s": t_run, "torch_threads": n_threads})


def _rows(ctx: "Context", engine, dtypes: list[str], plan: list, advance) -> list[dict]:
    """Every contract in every dtype, then the exact re-runs of those that broke. The re-runs wait until
    the dtypes' copies are dropped, so the exact copy (fp64: twice fp32's bytes) is never alive beside
    another compute copy, and each contract's exact run is made once for every dtype that needs it (the
    same computation: it does not depend on the dtype that broke)."""
    rows: list[dict] = []
    broke: list[tuple[int, int, int]] = []  # (row, plan entry, first position)
    for dtype in dtypes:
        model = engine.model(dtype)  # cast from the held weights, dropped at the end of its dtype
        for i, (contract, label, kw) in enumerate(plan):
            progress.stage(f"{dtype} contracts ({label})", i, len(plan))
            row = {"dtype": dtype, "contract": contract, "label": label, "batch": kw.get("batch"),
                   "chunk": kw.get("chunk"), "pads": kw.get("pads")}
            try:
                ref, got, start = CONTRACTS[contract](ctx, model, **kw)
            except NotSupported as e:
                rows.append(row | _unsupported(str(e)))
                continue
            m = measure(ref, got, dtype, start)
            row |= m | spec_verify.extra(ctx, contract, ref, got, start, kw, dtype)
            if m["bit_identical_share"] < 1.0:
                broke.append((len(rows), i, start))
            else:
                row |= {"verdict": "holds", "exact_dtype": None, "exact_max_abs_diff": None,
                        "exact_bit_identical_share": None, "note": "bit-identical"}
            rows.append(row)
        del model
        advance()
    if broke:
        exact_model, exact = engine.model(engine.exact_dtype), {}
        for j, (r, i, start) in enumerate(broke):
            contract, label, kw = plan[i]
            if i not in exact:
                progress.stage(f"{engine.exact_dtype} re-runs ({label})", j, len(broke))
                e_ref, e_got, _ = CONTRACTS[contract](ctx, exact_model, **kw)
                exact[i] = measure(e_ref, e_got, engine.exact_dtype, start)
            rows[r] |= verdict(rows[r], exact[i], rows[r]["dtype"], engine.exact_dtype)
        del exact_model
    return rows


def _open(cfg: ContractsConfig, device: str, batch: int, dtypes: list[str]) -> tuple:
    """(the target engine, the draft's or None), opened under one estimate
    from their shapes before a weight is read: the target's largest batch
    and the draft's greedy proposals."""
    loads = [startup.Load(cfg.model, device, cfg.steps + PADS, cfg.prompt)]
    loads += spec_draft.load(cfg.draft, device, cfg.steps + PADS, cfg.prompt)
    same = len(loads) == 2 and loads[0].spec == loads[1].spec

    def estimate(shapes):
        own = 0 if shapes[0] is None else memory.compare_contracts(shapes[0], batch, dtypes)
        return own + (spec_draft.estimate(shapes, same) if len(shapes) == 2 else 0)

    what = f"compare contracts --model {cfg.model or DEFAULT_SPEC} --steps {cfg.steps}"
    engines = startup.open_engines(loads, estimate, what + (f" --draft {cfg.draft.spec}" if cfg.draft.spec else ""))
    return engines[0], (engines[1] if len(engines) == 2 else None)


def _plan(chunks: list[int], batches: list[int]) -> list[tuple[str, str, dict]]:
    """Every contract's rows but spec_verify's: (contract, label, its arguments)."""
    plan = [("prefill_vs_decode", "decode 1 token a step", {})]
    plan += [("chunked", f"chunks of {c}", {"chunk": c}) for c in chunks]
    plan += [("shared_prefix", "prefix under two continuations", {}),
             ("prefix_cache", "prefix from a saved cache", {}),
             ("padding", f"{PADS} pads, batch of 1", {"batch": 1, "pads": PADS}),
             ("padding", f"{PADS} pads, batch of 2", {"batch": 2, "pads": PADS})]
    return plan + [("batch", f"batch of {b}", {"batch": b}) for b in batches]


def _draft_params(opts: spec_draft.DraftOptions, check: str | None) -> dict:
    return {"draft_from": opts.given or spec_draft.SEQUENCE,
            "draft_spec": opts.spec if opts.spec is not None else opts.tokens_file,
            "draft_token_check": check}


def _draft_label(opts: spec_draft.DraftOptions) -> str:
    if opts.given is None:
        return "the greedy stream"
    return f"{opts.given} {opts.spec if opts.spec is not None else opts.tokens_file}"


def fitting_batches(cfg: ContractsConfig, batches: list[int], dtypes: list[str]) -> tuple[list[int], list[dict]]:
    """(the batch contract's sizes that fit in memory with the model, those
    left out: {batch, reason}), from the engine's shape before a weight is
    read (runtime/memory.compare_contracts; an engine that cannot tell its
    shape keeps them all). A batch left out is the batch contract's alone:
    the other contracts still run."""
    from precisionlab.io import inputs

    shape = startup.shapes([startup.Load(cfg.model, "cpu", cfg.steps + PADS, cfg.prompt)])[0]
    if shape is None:
        return batches, []
    have = inputs.memory_limit()
    kept, left_out = [], []
    for b in batches:
        need = memory.compare_contracts(shape, max(2, b), dtypes)
        if need <= have:
            kept.append(b)
        else:
            left_out.append({"batch": b, "reason": f"batch of {b} not run: with the model it needs about "
                                                   f"{inputs.gib(need)} of memory, {inputs.gib(have)} is available"})
    return kept, left_out


def _prompt(engine, cfg: ContractsConfig) -> list[int]:
    """--prompt's ids, or the user's own (--token-ids), checked against the vocabulary and the positions."""
    if cfg.token_ids is None:
        return engine.prompt_ids(cfg.prompt, cfg.steps + PADS, cfg.chat)
    ids, vocab = list(cfg.token_ids), int(engine.info()["vocab"])
    if max(ids) >= vocab:
        raise UsageError(f"--token-ids: id {max(ids)} is outside the model's vocabulary of {vocab}")
    if len(ids) + cfg.steps + PADS > engine.max_len:
        raise UsageError(f"--token-ids ({len(ids)} tokens) + --steps {cfg.steps} + {PADS} pads exceeds the "
                         f"model's {engine.max_len} positions")
    return ids


# --- the contracts: each returns (reference rows, rows to compare, first position) ------------------


@dataclass
class Context:
    engine: object
    torch: object
    device: str
    seq: list[int]
    prefix: int          # the prompt's tokens: the shared prefix
    others: list[list[int]]
    draft: Callable[[int, int], list[int]] | None = None  # spec_draft.proposer's; None: the sequence is the draft

    def proposals(self, pos: int, k: int) -> list[int]:
        """The draft's k tokens for the positions after pos (spec_verify's window starting at pos)."""
        return self.seq[pos + 1:pos + 1 + k] if self.draft is None else self.draft(pos, k)

    def ids(self, rows):
        return self.torch.tensor(rows, device=self.device)

    def alone(self, model):
        return self.engine.forward_batch(model, self.ids([self.seq]))[0]


def _prefill_vs_decode(ctx, model):
    return _chunked(ctx, model, chunk=1)


def _chunked(ctx, model, chunk: int):
    feed = ctx.engine.session(model)
    got = [feed(ctx.seq[i:i + chunk]) for i in range(0, len(ctx.seq), chunk)]
    return ctx.alone(model), ctx.torch.cat(got), 0


def _shared_prefix(ctx, model):
    p = ctx.prefix
    other = ctx.seq[:p] + ctx.others[0][:len(ctx.seq) - p]
    got = ctx.engine.forward_batch(model, ctx.ids([other]))[0]
    return ctx.alone(model)[:p], got[:p], 0


def _prefix_cache(ctx, model):
    p = ctx.prefix
    feed = ctx.engine.session(model)
    feed(ctx.seq[:p])
    ctx.engine.fork(feed)(ctx.others[0][:len(ctx.seq) - p])  # the saved cache served another request first
    got = ctx.engine.fork(feed)(ctx.seq[p:])
    return ctx.alone(model)[p:], got, p


def _padding(ctx, model, batch: int, pads: int):
    torch = ctx.torch
    n = len(ctx.seq)
    rows = [[ctx.engine.pad_id] * pads + ctx.seq] + ctx.others[1:batch]  # the partner is longer: no pads
    mask = torch.ones(batch, n + pads, dtype=torch.long, device=ctx.device)
    mask[0, :pads] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each token's place in its own sequence; pads at 0
    out = ctx.engine.forward_batch(model, ctx.ids(rows), attention_mask=mask, position_ids=positions)
    return ctx.alone(model), out[0, pads:], 0


def _batch(ctx, model, batch: int):
    n = len(ctx.seq)
    out = ctx.engine.forward_batch(model, ctx.ids([ctx.seq] + [o[:n] for o in ctx.others[1:batch]]))
    return ctx.alone(model), out[0], 0


CONTRACTS = {"prefill_vs_decode": _prefill_vs_decode, "chunked": _chunked, "shared_prefix": _shared_prefix,
             "prefix_cache": _prefix_cache, "padding": _padding, "batch": _batch,
             spec_verify.CONTRACT: spec_verify.contract}


# --- the figures --------------------------------------------------------------------------------------


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def measure(ref, got, dtype: str, start: int) -> dict:
    """The two runs' rows (positions x vocab, the run's dtype) compared: the
    share of positions bit-identical, the largest |Δ log-prob| over every
    vocabulary entry (nats, and in ulps of `dtype` at that log-prob), the
    first position that differs with the reference's top-1/top-2 margin
    there, and the positions whose argmax (the greedy token) changes."""
    a, b = ref.detach().cpu(), got.detach().cpu()
    same = (a == b).all(dim=-1).numpy()  # NaN == NaN is False: two NaNs never agree
    la = _log_softmax(a.double().numpy())
    lb = _log_softmax(b.double().numpy())
    with np.errstate(invalid="ignore"):
        d = np.abs(la - lb)
    d = np.where(np.isnan(d), np.inf, d)
    worst = np.unravel_index(int(np.argmax(d)), d.shape)
    dmax = float(d[worst])
    spacing = float(formats.get(dtype).spacing(la[worst]))
    first = None if same.all() else int(np.argmin(same))
    margin = None
    if first is not None:
        top2 = np.sort(la[first])[-2:]
        margin = float(top2[1] - top2[0])
    flips = la.argmax(axis=1) != lb.argmax(axis=1)
    return {"supported": True, "positions": int(len(same)), "bit_identical_share": float(same.mean()),
            "max_abs_diff": dmax, "max_abs_diff_ulps": dmax / spacing if math.isfinite(dmax) else dmax,
            "first_diff_position": None if first is None else start + first, "margin_at_first_diff": margin,
            "greedy_flips": int(flips.sum()), "greedy_changes": bool(flips.any())}


def verdict(run: dict, exact: dict, dtype: str, exact_dtype: str) -> dict:
    d, d64 = run["max_abs_diff"], exact["max_abs_diff"]
    if exact_dtype == dtype:  # an engine with nothing finer (llama.cpp): the re-run is the same computation
        return {"verdict": "unresolved", "exact_dtype": exact_dtype, "exact_max_abs_diff": d64,
                "exact_bit_identical_share": exact["bit_identical_share"],
                "note": f"unresolved: the engine has no precision finer than {dtype} to re-run in"}
    ratio = d64 / d if d > 0 and math.isfinite(d) else (0.0 if d64 == 0 else math.inf)
    rounding = exact["bit_identical_share"] == 1.0 or ratio <= rounding_ratio(dtype, exact_dtype)
    if rounding:
        note = (f"rounding: vanishes in {exact_dtype} (max |Δ logprob| {d:.3g} -> {d64:.3g} nats)")
    else:
        note = (f"algorithmic: persists in {exact_dtype} (max |Δ logprob| {d:.3g} -> {d64:.3g} nats)")
    return {"verdict": "rounding" if rounding else "algorithmic", "exact_dtype": exact_dtype,
            "exact_max_abs_diff": d64, "exact_bit_identical_share": exact["bit_identical_share"], "note": note}


def _unsupported(why: str) -> dict:
    return {"supported": False, "positions": 0, "bit_identical_share": None, "max_abs_diff": None,
            "max_abs_diff_ulps": None, "first_diff_position": None, "margin_at_first_diff": None,
            "greedy_flips": None, "greedy_changes": None, "verdict": "not supported", "exact_dtype": None,
            "exact_max_abs_diff": None, "exact_bit_identical_share": None,
            "note": f"not supported by this engine ({why})"}


def takeaways(rows: list[dict], info: dict) -> list[str]:
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        mine = [r for r in rows if r["dtype"] == dtype]
        held = [r["label"] for r in mine if r["verdict"] == "holds"]
        alg = [r for r in mine if r["verdict"] == "algorithmic"]
        rnd = [r for r in mine if r["verdict"] == "rounding"]
        open_ = [r for r in mine if r["verdict"] == "unresolved"]
        parts = [f"{dtype}: {len(held)} of {len(mine)} contracts bit-identical"]
        if open_:
            parts.append(f"{len(open_)} break, unresolved: this engine has no finer precision to re-run them in "
                         f"(largest |Δ logprob| {max(r['max_abs_diff'] for r in open_):.2g} nats)")
        if rnd:
            flips = sum(r["greedy_flips"] for r in rnd)
            parts.append(f"{len(rnd)} break by rounding only (largest |Δ logprob| "
                         f"{max(r['max_abs_diff'] for r in rnd):.2g} nats; vanishes in fp64"
                         + (f"; the greedy token changes at {flips} positions" if flips else "") + ")")
        if alg:
            parts.append(f"{len(alg)} break in the algorithm, persisting in fp64: "
                         + ", ".join(r["label"] for r in alg))
        lines.append("; ".join(parts) + ".")
        batch_rnd = [r for r in rnd if r["contract"] == "batch"]
        if batch_rnd and info:
            lines.append(f"{dtype}: the logits depend on the batch size ({', '.join(r['label'] for r in batch_rnd)}):"
                         " the matmuls reduce in a batch-dependent order here, a rounding, not a bug.")
    unsupported = sorted({r["label"] for r in rows if r["verdict"] == "not supported"})
    if unsupported:
        lines.append(f"not supported by this engine: {', '.join(unsupported)}.")
    return lines
