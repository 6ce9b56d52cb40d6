"""compare model --trainer SPEC --rollout SPEC: an RL pipeline's two sides,
both computed here. The rollout side samples N sequences (seeded; temperature,
top-p) one token a step from its KV cache, as an inference engine decodes,
keeping the log-probs its sampler saw: raw (the log-softmax of logits / T)
and renormalised over the top-p support. Then both sides score the same
tokens teacher-forced, one forward per sequence (Engine.forward), and every
pair of streams goes through compare logprobs' statistics
(experiments.logprob_compare.compare_streams).

The comparisons, each trainer (A) against a rollout stream (B):
- sampler: the rollout's raw log-probs from its decoding steps;
- sampler_top_p (top-p < 1): the renormalised ones, what an engine that
  reports processed log-probs gives (compare logprobs' renormalisation
  diagnosis names the offset log S);
- teacher_forced: the rollout side's teacher-forced pass in its dtype, the
  baseline the changes below are measured against;
- rollout_head_fp32: the same with its LM head in fp32 (the final hidden
  states as its dtype left them, cast up);
- rollout_fp32: the whole rollout side in fp32;
- trainer_head_fp32: the trainer's LM head in fp32 (where it computes in
  a low precision).
A change that would repeat the baseline (its side already in fp32) is listed
as skipped, not run. Both sides apply the temperature (logits / T) before the
log-softmax, as RL trainers score, so T alone makes no mismatch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats
from precisionlab.engines import registry
from precisionlab.engines.protocol import check_finite
from precisionlab.errors import UsageError
from precisionlab.experiments import startup
from precisionlab.experiments.logprob_compare import compare_streams
from precisionlab.io import logprob_streams
from precisionlab.numerics import logprobs as lpstats
from precisionlab.numerics.metrics import exact_sum
from precisionlab.runtime import memory, progress, threads

DTYPES = formats.COMPUTE
DEFAULT_SAMPLES = 8
DEFAULT_TOKENS = 64
TOP_K = 5    # alternatives kept per token: compare_streams' evidence for a renormalisation
WORST = 5    # worst sequences and positions kept per comparison
BASELINE = "teacher_forced"
CHANGES = ("rollout_head_fp32", "rollout_fp32", "trainer_head_fp32")  # what each removes is measured


@dataclass
class RolloutConfig:
    trainer: str
    rollout: str
    trainer_dtype: str = "fp32"
    rollout_dtype: str = "bf16"
    samples: int = DEFAULT_SAMPLES
    tokens: int = DEFAULT_TOKENS
    prompt: str = registry.DEFAULT_PROMPT
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None


@dataclass
class RolloutResult:
    params: dict
    models: dict              # trainer, rollout: the engine's info and its dtype
    rows: list[dict]          # one per comparison: compare logprobs' row, labelled
    details: list[dict]       # per comparison: diagnoses, nonfinite, worst sequences and positions, takeaways
    skipped: list[dict]       # changes not run: comparison, reason
    best_change: str | None   # the change that removes most of the baseline's mean |Δ|
    texts: list[str]          # the sampled continuations
    takeaways: list[str]
    timing: dict
    diff: np.ndarray = field(repr=False, default=None)      # the baseline's Δ per token
    position: np.ndarray = field(repr=False, default=None)


def check(cfg: RolloutConfig) -> tuple[str, str]:
    """Every option refused before anything loads (exit 2); the two dtypes, canonical."""
    tdt = formats.parse_one(cfg.trainer_dtype, DTYPES, "--trainer-dtype")
    rdt = formats.parse_one(cfg.rollout_dtype, DTYPES, "--rollout-dtype")
    if cfg.samples <= 0:
        raise UsageError(f"--samples must be > 0 (got {cfg.samples})")
    if cfg.tokens <= 0:
        raise UsageError(f"--tokens must be > 0 (got {cfg.tokens})")
    if not (math.isfinite(cfg.temperature) and cfg.temperature > 0):
        raise UsageError(f"--temperature must be a finite number > 0 (got {cfg.temperature})")
    if not (0 < cfg.top_p <= 1):
        raise UsageError(f"--top-p must be in (0, 1] (got {cfg.top_p})")
    startup.check_prompt(cfg.prompt, "sampling needs at least one token to start from")
    threads.check(cfg.threads)
    return tdt, rdt


def estimate(cfg: RolloutConfig, tdt: str, rdt: str) -> int:
    """The run's peak (runtime/memory.rollout), from the engines' shapes, before any weight is read."""
    sides = {}  # spec -> (engine class, arg, dtypes it computes in)
    for spec, dt, option in ((cfg.trainer, tdt, "--trainer"), (cfg.rollout, rdt, "--rollout")):
        cls, arg = startup.resolve(spec, option)
        sides.setdefault(spec, (cls, arg, set()))[2].add(dt)
    sides[cfg.rollout][2].add("fp32")  # the rollout_fp32 change runs on the fp32 model
    total, kinds = 0, set()
    for cls, arg, dts in sides.values():
        shape = cls.shape(arg, cfg.tokens, cfg.prompt)
        if shape is None:
            continue
        total += memory.rollout(shape, sorted(d for d in dts if d != "fp32"), cfg.samples, cfg.tokens, TOP_K,
                                fixed=shape.kind not in kinds)
        kinds.add(shape.kind)
    return total


def run(cfg: RolloutConfig, advance=lambda k=1: None) -> RolloutResult:
    tdt, rdt = check(cfg)
    need = estimate(cfg, tdt, rdt)  # the specs resolved here, a bad one named by its option
    device = startup.device(cfg.device)
    t0 = time.perf_counter()
    rollout, trainer = startup.open_engines(
        [startup.Load(cfg.rollout, device, cfg.tokens, cfg.prompt), startup.Load(cfg.trainer, device, cfg.tokens,
                                                                                 cfg.prompt)],
        lambda _shapes: need, f"compare rollout --trainer {cfg.trainer} --rollout {cfg.rollout} "
                              f"--samples {cfg.samples} --tokens {cfg.tokens}")
    with threads.torch_scope():
        return _run(cfg, tdt, rdt, device, rollout, trainer, t0, advance)


def _run(cfg: RolloutConfig, tdt: str, rdt: str, device: str, rollout, trainer, t0, advance) -> RolloutResult:
    prompt = _prompt_ids(trainer, rollout, cfg)
    t_load = time.perf_counter() - t0
    params = max(trainer.info()["parameters"], rollout.info()["parameters"])
    n_threads = threads.fit_torch(cfg.threads, 2.0 * params) if device == "cpu" else None
    models: dict = {}

    def model(engine, dt):
        key = (id(engine), dt)
        if key not in models:  # fp32 is the engine's own base: no copy
            models[key] = engine.base if dt == "fp32" else engine.model(dt)
        return models[key]

    with startup.numerics():  # fp32 means IEEE fp32 on both sides
        t1 = time.perf_counter()
        sampled = sample(rollout, model(rollout, rdt), prompt, cfg, rdt, advance)
        t_sample = time.perf_counter() - t1
        t2 = time.perf_counter()
        progress.stage("scoring")
        seqs = sampled["sequences"]
        a = score(trainer, model(trainer, tdt), prompt, seqs, cfg.temperature, tdt)
        advance()
        b_streams = {"sampler": sampled["raw"]}
        if cfg.top_p < 1:
            b_streams["sampler_top_p"] = sampled["renormalised"]
        b_streams[BASELINE] = score(rollout, model(rollout, rdt), prompt, seqs, cfg.temperature, rdt)
        skipped = []
        if rdt != "fp32":
            b_streams["rollout_head_fp32"] = score(rollout, model(rollout, rdt), prompt, seqs, cfg.temperature, rdt,
                                                   head="fp32")
            b_streams["rollout_fp32"] = score(rollout, model(rollout, "fp32"), prompt, seqs, cfg.temperature, "fp32")
        else:
            skipped += [{"comparison": c, "reason": "the rollout already computes in fp32"}
                        for c in ("rollout_head_fp32", "rollout_fp32")]
        a_head = None
        if tdt != "fp32":
            a_head = score(trainer, model(trainer, tdt), prompt, seqs, cfg.temperature, tdt, head="fp32")
        else:
            skipped.append({"comparison": "trainer_head_fp32", "reason": "the trainer already computes in fp32"})
        advance()
        pairs = [(k, a, b) for k, b in b_streams.items()]
        if a_head is not None:
            pairs.append(("trainer_head_fp32", a_head, b_streams[BASELINE]))
        labels = _labels(tdt, rdt, cfg.top_p)
        rows, details, results = [], [], {}
        for key, sa, sb in pairs:
            res = compare_streams(sa, sb, lpstats.DEFAULT_CLIPS, lpstats.DEFAULT_CAP, WORST,
                                  lambda i: trainer.decode([i]))
            results[key] = res
            a_what, b_what = labels[key]
            rows.append({"comparison": key, "label": f"{a_what} vs {b_what}", "a": a_what, "b": b_what,
                         **{k: v for k, v in res.rows[0].items() if k != "label"}})
            details.append({"comparison": key, "diagnoses": res.diagnoses, "nonfinite": res.nonfinite,
                            "worst_sequences": res.worst_sequences, "worst_positions": res.worst_positions,
                            "takeaways": res.takeaways})
            advance()
        t_score = time.perf_counter() - t2
    base = next(r for r in rows if r["comparison"] == BASELINE)
    for r in rows:
        if r["comparison"] in CHANGES:
            r["mean_abs_diff_removed"] = _removed(r["mean_abs_diff"], base["mean_abs_diff"])
            r["kl_k3_removed"] = _removed(r["kl_k3"], base["kl_k3"])
    best = _best(rows)
    out_params = {"trainer": cfg.trainer, "rollout": cfg.rollout, "trainer_dtype": tdt, "rollout_dtype": rdt,
                  "samples": cfg.samples, "tokens": cfg.tokens, "prompt": cfg.prompt, "prompt_tokens": len(prompt),
                  "temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed, "device": device,
                  "clips": list(lpstats.DEFAULT_CLIPS), "cap": lpstats.DEFAULT_CAP, "top_k": TOP_K,
                  "worst": WORST}
    info = {"trainer": trainer.info() | {"dtype": tdt}, "rollout": rollout.info() | {"dtype": rdt}}
    texts = [rollout.decode(s) for s in seqs]
    same = bool(np.array_equal(b_streams["sampler"].logprobs, b_streams[BASELINE].logprobs))
    return RolloutResult(out_params, info, rows, details, skipped, best, texts,
                         takeaways(rows, results, best, tdt, rdt, same),
                         {"load_s": t_load, "sample_s": t_sample, "score_s": t_score, "torch_threads": n_threads},
                         results[BASELINE].diff, results[BASELINE].position)


def _prompt_ids(trainer, rollout, cfg: RolloutConfig) -> list[int]:
    ids = rollout.encode(cfg.prompt, "--prompt")
    if not ids:
        raise UsageError("--prompt encodes to no tokens")
    if trainer is not rollout and trainer.encode(cfg.prompt, "--prompt") != ids:
        raise UsageError("--trainer and --rollout tokenise the prompt differently: they are not the same model's "
                         "two engines, and their log-probs of one token id would not be of one token")
    room = min(trainer.max_len, rollout.max_len)
    if len(ids) + cfg.tokens > room:
        raise UsageError(f"prompt ({len(ids)} tokens) + --tokens {cfg.tokens} exceeds the model's {room} positions")
    return ids


def _labels(tdt: str, rdt: str, top_p: float) -> dict[str, tuple[str, str]]:
    """Each comparison's (A, B), short: the table prints them side by side."""
    trainer = f"trainer {tdt}"
    return {"sampler": (trainer, f"{rdt} sampler, raw"),
            "sampler_top_p": (trainer, f"{rdt} sampler, top-p {top_p:g}"),
            BASELINE: (trainer, f"{rdt} teacher-forced"),
            "rollout_head_fp32": (trainer, f"{rdt}, LM head fp32"),
            "rollout_fp32": (trainer, "fp32 teacher-forced"),
            "trainer_head_fp32": (f"{trainer}, LM head fp32", f"{rdt} teacher-forced")}


def _removed(x: float, base: float) -> float:
    """The share of the baseline's figure a change removes (1: all of it; negative: it grew)."""
    return 1.0 - x / base if base > 0 else math.nan


def _best(rows: list[dict]) -> str | None:
    found = [(r["mean_abs_diff_removed"], r["comparison"]) for r in rows
             if r["comparison"] in CHANGES and r["mean_abs_diff_removed"] == r["mean_abs_diff_removed"]]
    return max(found)[1] if found else None


def log_softmax(logits, temperature: float) -> np.ndarray:
    """fp32 log-softmax of logits / T (low-precision logits upcast first, as an
    engine's sampler computes it), as float64 rows."""
    import torch

    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return torch.log_softmax(x, dim=-1).double().cpu().numpy()


def _top(lp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest log-probs of each row (ties by id) and their ids."""
    # a copy: the slice alone would keep the whole vocabulary's int64 argsort alive in every kept
    # stream (8 x vocab bytes a token, outside memory.rollout: --samples 300 of a 151,936-token vocabulary
    # grew 1.6 GiB against 0.25 GiB estimated)
    idx = np.argsort(-lp, axis=-1, kind="stable")[..., :k].copy()
    return idx, np.take_along_axis(lp, idx, axis=-1)


def top_p_support(lp: np.ndarray, top_p: float) -> tuple[np.ndarray, float]:
    """The smallest set of tokens, most probable first, whose probability
    reaches top_p (ties by id), and the log of its exact mass log S."""
    order = np.argsort(-lp, kind="stable")
    if top_p >= 1:
        keep = order
    else:
        cum = np.cumsum(np.exp(lp[order]))
        keep = order[:min(order.size, int(np.searchsorted(cum, top_p)) + 1)]
    return keep, math.log(exact_sum(np.exp(lp[keep])))


def sample(engine, model, prompt: list[int], cfg: RolloutConfig, dtype: str, advance) -> dict:
    """cfg.samples continuations of cfg.tokens tokens, each from a fresh KV-cache
    session, one token a step; numpy's generator seeded with cfg.seed draws
    them, in order, so a seed is a set of sequences. Returns the sequences and
    the sampler's streams: raw (log-softmax of logits / T) and renormalised
    over the top-p support (-inf outside it), each with its top TOP_K."""
    rng = np.random.default_rng(cfg.seed)
    seqs, raw, ren, raw_top, ren_top = [], [], [], [], []
    for s in range(cfg.samples):
        progress.stage(f"{dtype} sampling", s, cfg.samples)
        feed = engine.session(model)
        logits = feed(prompt)[-1]
        tokens = []
        for step in range(cfg.tokens):
            lp = log_softmax(logits, cfg.temperature)
            check_finite(lp, dtype, step, f"sampling sequence {s}")
            keep, log_s = top_p_support(lp, cfg.top_p)
            w = np.exp(lp[keep] - log_s)
            x = int(keep[rng.choice(keep.size, p=w / exact_sum(w))])
            plp = np.full_like(lp, -np.inf)
            plp[keep] = lp[keep] - log_s
            tokens.append(x)
            raw.append(lp[x])
            ren.append(plp[x])
            raw_top.append(_top(lp, TOP_K))
            ren_top.append(_top(plp, TOP_K))
            if step + 1 < cfg.tokens:  # the last token needs no logits of its own
                logits = feed([x])[-1]
        seqs.append(tokens)
        advance()
    ids = np.asarray(seqs, dtype=np.int64).ravel()
    offsets = np.arange(cfg.samples + 1, dtype=np.int64) * cfg.tokens

    def stream(lps, tops, name):
        return logprob_streams.from_arrays(ids, np.asarray(lps), offsets, np.stack([t[0] for t in tops]),
                                           np.stack([t[1] for t in tops]), name=name)

    return {"sequences": seqs, "raw": stream(raw, raw_top, "rollout sampler"),
            "renormalised": stream(ren, ren_top, "rollout sampler, top-p")}


def score(engine, model, prompt: list[int], seqs: list[list[int]], temperature: float, dtype: str,
          head: str | None = None):
    """Each sequence teacher-forced in one forward (prompt and continuation but
    its last token): the log-prob of every sampled token, and the top TOP_K."""
    import torch

    lps, tids, tlps = [], [], []
    for s, tokens in enumerate(seqs):
        x = torch.tensor([prompt + tokens[:-1]], device=engine.device)
        out = engine.forward(model, x) if head is None else engine.forward(model, x, head_dtype=head)
        rows = log_softmax(out[0, len(prompt) - 1:], temperature)  # row t predicts tokens[t]
        for t, row in enumerate(rows):
            check_finite(row, dtype if head is None else f"{dtype} (LM head {head})", t,
                         f"teacher-forced sequence {s}")
        if rows.shape[1] <= max(tokens):
            raise UsageError(f"the model scores {rows.shape[1]} token ids, the rollout sampled id {max(tokens)}: "
                             "--trainer and --rollout have different vocabularies")
        lps.append(rows[np.arange(len(tokens)), tokens])
        i, v = _top(rows, TOP_K)
        tids.append(i)
        tlps.append(v)
    ids = np.asarray(seqs, dtype=np.int64).ravel()
    offsets = np.arange(len(seqs) + 1, dtype=np.int64) * len(seqs[0])
    return logprob_streams.from_arrays(ids, np.concatenate(lps), offsets, np.concatenate(tids),
                                       np.concatenate(tlps), name=f"{type(engine).__name__} {dtype}")


def _clip(row: dict, c: float = lpstats.DEFAULT_CLIPS[0]) -> float:
    return next((o["frac_outside"] for o in row["outside_clip"] if o["clip"] == c), math.nan)


def takeaways(rows: list[dict], results: dict, best: str | None, tdt: str, rdt: str,
              sampler_is_teacher_forced: bool = False) -> list[str]:
    by = {r["comparison"]: r for r in rows}
    c = lpstats.DEFAULT_CLIPS[0]
    band = f"[1/{c:g}, {c:g}]"
    base = by[BASELINE]
    lines = []

    def figures(r):
        return (f"{100 * _clip(r):.2f} % of ratios outside {band}, mean |Δ| {r['mean_abs_diff']:.3g} nats, "
                f"KL(B||A) k3 {r['kl_k3']:.3g}")

    if any(d["kind"] == "identical" for d in results[BASELINE].diagnoses):
        lines.append(f"Trainer {tdt} and rollout {rdt} teacher-forced agree at every one of the {base['n']} tokens: "
                     "Δ = 0, every ratio r = 1 (the same arithmetic on both sides).")
    else:
        lines.append(f"Rollout {rdt} against trainer {tdt}, teacher-forced over the same {base['n']} tokens: "
                     f"{figures(base)}.")
    s = by["sampler"]
    if sampler_is_teacher_forced:
        lines.append("The rollout's sampler log-probs (KV cache, one token a step) are bit for bit its "
                     "teacher-forced pass's: decoding adds nothing here.")
    else:
        lines.append(f"The rollout's sampler log-probs (KV cache, one token a step): {figures(s)} (its decoding "
                     "steps round differently from its teacher-forced pass).")
    if "sampler_top_p" in by:
        ren = next((d for d in results["sampler_top_p"].diagnoses if d["kind"] == "renormalised"), None)
        r = by["sampler_top_p"]
        if ren is not None:
            lines.append(f"Renormalised over top-p: {figures(r)}; compare logprobs finds the renormalisation "
                         f"(mean offset log S {ren['offset_mean']:.4g} nats, kept mass {ren['kept_mass']:.4g}): "
                         "score the raw log-probs, not the sampler's processed ones.")
        else:
            lines.append(f"Renormalised over top-p: {figures(r)}; no renormalisation offset was found (the "
                         "support kept nearly all the mass).")
    for key, what in (("rollout_head_fp32", "the rollout's LM head in fp32"), ("rollout_fp32", "the whole rollout in fp32"),
                      ("trainer_head_fp32", "the trainer's LM head in fp32")):
        r = by.get(key)
        if r is None:
            continue
        lines.append(f"With {what}: {100 * _clip(base):.2f} % → {100 * _clip(r):.2f} % outside {band}, mean |Δ| "
                     f"{base['mean_abs_diff']:.3g} → {r['mean_abs_diff']:.3g} ({_pct(r['mean_abs_diff_removed'])} of "
                     f"it removed), KL k3 {base['kl_k3']:.3g} → {r['kl_k3']:.3g}.")
    if best is not None:
        names = {"rollout_head_fp32": "the rollout's LM head in fp32", "rollout_fp32": "the whole rollout in fp32",
                 "trainer_head_fp32": "the trainer's LM head in fp32"}
        line = f"Most of the mismatch goes with {names[best]} ({_pct(by[best]['mean_abs_diff_removed'])} of mean |Δ|)."
        head, whole = by.get("rollout_head_fp32"), by.get("rollout_fp32")
        if head is not None and whole is not None and whole["mean_abs_diff_removed"] > 0:
            share = head["mean_abs_diff_removed"] / whole["mean_abs_diff_removed"]
            where = ("the logits' rounding is most of the mismatch" if share >= 0.5 else
                     "most of it comes from the layers before the head")
            line += f" The LM head alone accounts for {_pct(share)} of what the whole fp32 rollout removes: {where}."
        lines.append(line)
    return lines


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f} %"
