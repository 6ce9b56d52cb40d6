"""nondeterminism --endpoint URL: one prompt sent N times at temperature 0 to an
OpenAI-compatible server, and how many different completions come back.

Streams: the N requests one after another (`sequential`), with C in flight
(`concurrent`), and, with --mix, with C in flight interleaved with other
prompts (`mixed`: the prompt's requests share the server with other work, the
batch mates of a continuous-batching server). Each stream runs once per
--cache setting: `on`/`off` send llama.cpp's `cache_prompt` field true/false,
`server` sends nothing (the server's default). Whether a server honours
cache_prompt is known for llama.cpp's llama-server (its /v1/models says
owned_by "llamacpp": it does) and vLLM (owned_by "vllm": it does not; its
prefix cache is the server's --enable-prefix-caching / --no-enable-prefix-
caching flag, not a request's, so on/off become one `server` run and the
switch says so); for any other the field is sent and said to be unknown.

Time: the --time-limit is planned per run up front: each run (stream x cache)
gets an equal share of what is left when it starts, so every run is started
(the concurrent ones, which find batch mates, are never skipped) and a run
that ends early leaves its rest to the later ones; a run cut at its share
says so (complete false, its share in budget_s).

Per run: k unique completions of N with their counts; the first token position
where the completions part (the common prefix of their token lists), the
tokens there and the smallest top-1/top-2 log-prob margin any completion had
there; the spread (max - min) of the returned log-prob of each position of the
common prefix, where every completion holds the same token; and how many
distinct log-prob vectors came back (k can be 1 while the numbers move).

Bounded: every request has a timeout (--request-timeout, never past its
run's share of the --time-limit), the whole command stops at --time-limit, the
first failed request ends the run with one line (exit 1), and Ctrl-C drops
the connections in flight (runtime/interrupt). Only the user's URL is
contacted: GET URL/v1/models once, then POST URL/v1/completions.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait, FIRST_EXCEPTION
from dataclasses import dataclass, field

from precisionlab.engines.http_client import MAX_TIMEOUT_S, Client, v1_base
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import startup
from precisionlab.io import inputs
from precisionlab.report.output import Rows
from precisionlab.runtime import interrupt

CACHES = ("on", "off", "server")
TOP = 2  # top_logprobs asked for: the top-1/top-2 margin needs two
MAX_REQUESTS = 100_000
MAX_CONCURRENCY = 64
OTHER_PROMPTS = ("JULIET:\nO Romeo, Romeo! wherefore art thou", "First Citizen:\nBefore we proceed any further,",
                 "KING RICHARD II:\nOld John of Gaunt,")


@dataclass
class EndpointConfig:
    url: str
    prompt: str
    requests: int = 100
    concurrency: int = 4
    mix: bool = False
    other_prompts: list[str] = field(default_factory=list)
    cache: str | None = "on,off"
    max_tokens: int = 16
    time_limit: float = 300.0
    request_timeout: float = 60.0
    served_model: str | None = None


@dataclass
class Completion:
    text: str
    tokens: list[str]
    logprobs: list[float | None]  # the chosen token's, per position
    margins: list[float | None]   # top-1 minus top-2 log-prob, per position (None where fewer than 2 came)


def check(cfg: EndpointConfig) -> tuple[str, list[str]]:
    """Every option before any request: (the API base, the cache settings)."""
    base = v1_base(cfg.url)
    for name, v, lo, hi in (("--requests", cfg.requests, 1, MAX_REQUESTS),
                            ("--concurrency", cfg.concurrency, 1, MAX_CONCURRENCY),
                            ("--max-tokens", cfg.max_tokens, 1, 4096)):
        if not lo <= v <= hi:
            raise UsageError(f"{name} must be in {lo} ... {hi}, got {v}")
    for name, v in (("--time-limit", cfg.time_limit), ("--request-timeout", cfg.request_timeout)):
        if not (math.isfinite(v) and 0 < v <= MAX_TIMEOUT_S):
            raise UsageError(f"{name} must be a positive number of seconds up to {MAX_TIMEOUT_S} (a day), got {v}")
    startup.check_prompt(cfg.prompt, "a request needs at least one token")
    if cfg.other_prompts and not cfg.mix:
        raise UsageError("--other-prompts are the prompts --mix interleaves: add --mix")
    return base, inputs.parse_choices(cfg.cache, CACHES, "cache setting")


def streams(cfg: EndpointConfig) -> list[tuple[str, int]]:
    out = [("sequential", 1)]
    if cfg.concurrency > 1:
        out.append(("concurrent", cfg.concurrency))
    if cfg.mix:
        out.append(("mixed", cfg.concurrency))
    return out


def parse_completion(doc: dict, url: str) -> Completion:
    """choices[0] of a /v1/completions answer, in OpenAI's legacy logprobs form
    (tokens, token_logprobs, top_logprobs as {token: logprob}) or the newer
    one llama-server writes (content: [{token, logprob, top_logprobs: [...]}])."""
    try:
        choice = doc["choices"][0]
        text = choice["text"]
        lp = choice.get("logprobs")
    except (KeyError, IndexError, TypeError):
        raise RunError(f"{url}: the answer has no choices[0].text: not an OpenAI completions answer") from None
    if not isinstance(text, str):
        raise RunError(f"{url}: choices[0].text is not a string")
    try:
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            items = lp["content"]
            tokens = [str(t["token"]) for t in items]
            chosen = [_num(t.get("logprob")) for t in items]
            tops = [[_num(x.get("logprob")) for x in (t.get("top_logprobs") or [])] for t in items]
        elif isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
            tokens = [str(t) for t in lp["tokens"]]
            chosen = [_num(v) for v in lp.get("token_logprobs") or [None] * len(tokens)]
            tops = [list(map(_num, (row or {}).values())) for row in lp.get("top_logprobs") or [None] * len(tokens)]
        else:
            tokens = []
    except _Bad as e:
        raise RunError(f"{url}: {e}") from None
    except (KeyError, TypeError, AttributeError, ValueError):
        raise RunError(f"{url}: choices[0].logprobs is not in a form this reads (OpenAI's tokens/token_logprobs/"
                       "top_logprobs, or content[])") from None
    if not tokens or all(v is None for v in chosen):
        raise RunError(f"{url}: the server returned no logprobs (choices[0].logprobs is "
                       f"{'null' if lp is None else 'empty'}): the parting position and margins need them")
    if len(chosen) != len(tokens) or len(tops) != len(tokens):
        raise RunError(f"{url}: choices[0].logprobs has lists of different lengths")
    margins = []
    for row in tops:
        vals = sorted((v for v in row if v is not None), reverse=True)
        margins.append(vals[0] - vals[1] if len(vals) >= 2 else None)
    return Completion(text, tokens, chosen, margins)


def _num(v) -> float | None:
    """A log-probability from the server: None where it gives none, else checked (inputs.logprob)."""
    return None if v is None else inputs.logprob(v, "the server's answer", _Bad)


class _Bad(ValueError):
    """A log-probability that no probability has: parse_completion's one RunError line names it."""


def summarize(comps: list[Completion]) -> dict:
    """k of N, where the completions part, and how far the numbers move where they do not."""
    counts = Counter(c.text for c in comps)
    seqs = [c.tokens for c in comps]
    common = min(len(s) for s in seqs)
    part = next((j for j in range(common) if len({s[j] for s in seqs}) > 1), None)
    if part is None and len({len(s) for s in seqs}) > 1:
        part = common  # one list ends where another goes on
    prefix = common if part is None else part
    spread = []
    for j in range(prefix):
        vals = [c.logprobs[j] for c in comps if c.logprobs[j] is not None]
        spread.append(max(vals) - min(vals) if vals else None)
    known = [(j, s) for j, s in enumerate(spread) if s is not None]
    worst = max(known, key=lambda js: js[1]) if known else (None, None)
    row = {"answered": len(comps), "unique": len(counts),
           "counts": [{"text": t, "count": n} for t, n in counts.most_common()],
           "distinct_token_lists": len({tuple(s) for s in seqs}),
           "distinct_logprobs": len({tuple(c.logprobs) for c in comps}),
           "first_parting_token": part, "parting_tokens": None, "parting_margin": None,
           "logprob_spread": spread, "max_logprob_spread": worst[1], "max_spread_position": worst[0]}
    if part is not None:
        row["parting_tokens"] = sorted({s[part] for s in seqs if part < len(s)})
        margins = [c.margins[part] for c in comps if part < len(c.margins) and c.margins[part] is not None]
        row["parting_margin"] = min(margins) if margins else None
    return row


class _Runner:
    """The requests of every run, under one deadline, stoppable from Ctrl-C."""

    def __init__(self, client: Client, cfg: EndpointConfig, advance):
        self.client, self.cfg, self.advance = client, cfg, advance
        self.end = time.monotonic() + cfg.time_limit  # the whole command's
        self.deadline = self.end                      # the current run's share
        self.out_of_time = False

    def start_run(self, runs_left: int) -> float:
        """The next run's share: an equal part of the time left for the runs left. Returns it (s)."""
        now = time.monotonic()
        share = max(0.0, self.end - now) / max(1, runs_left)
        self.deadline = now + share
        self.out_of_time = False
        return share

    def _one(self, body: dict, target: bool):
        left = self.deadline - time.monotonic()
        if left <= 0 or self.client.closed:
            self.out_of_time = self.out_of_time or left <= 0
            return None
        try:
            doc = self.client.post("/completions", body, timeout=min(self.cfg.request_timeout, left))
        except RunError:
            if time.monotonic() >= self.deadline or self.out_of_time:  # cut short by the time limit, not failed
                self.out_of_time = True
                return None
            raise
        self.advance()
        return parse_completion(doc, self.client.base + "/completions") if target else True

    def stream(self, bodies: list[tuple[dict, bool]], concurrency: int) -> list[Completion]:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="endpoint") as pool:
            futures = [pool.submit(self._one, b, t) for b, t in bodies]
            done, pending = wait(futures, timeout=max(0.0, self.deadline - time.monotonic()) + 1,
                                 return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed or pending:
                for f in futures:
                    f.cancel()
                self.client.close_all()  # the requests still in flight end now
                if failed:
                    raise failed[0].exception()
                self.out_of_time = True
        return [r for (_, target), f in zip(bodies, futures, strict=True)
                if target and f.done() and not f.cancelled() and f.exception() is None
                for r in [f.result()] if r is not None]


VLLM_SWITCH = ("none per request: vLLM ignores cache_prompt; its prefix cache is the server's "
               "--enable-prefix-caching / --no-enable-prefix-caching flag (start one server each way)")


def _owner(models: dict | None):
    data = (models or {}).get("data") or []
    return data[0].get("owned_by") if data and isinstance(data[0], dict) else None


def _cache_switch(models: dict | None, caches: list[str]) -> tuple[str, list[str]]:
    """What the cache settings do on this server, and the settings to run: a
    server known to ignore cache_prompt (vLLM) gets one `server` run, not two
    identical runs labelled on and off."""
    owner = _owner(models)
    if owner == "vllm":
        return VLLM_SWITCH, ["server"]
    if owner == "llamacpp":
        return "llama.cpp's cache_prompt (llama-server)", caches
    if caches == ["server"]:
        return f"none sent: the server's own default (owned_by {owner!r})", caches
    return f"unknown: cache_prompt sent, this server (owned_by {owner!r}) may ignore it", caches


def run(cfg: EndpointConfig, advance=lambda k=1: None) -> Rows:
    base, caches = check(cfg)
    client = Client(base, cfg.request_timeout)
    with interrupt.cleanup(client.close_all):
        models = _models(client, cfg)
        served = cfg.served_model or _first_model(models)
        asked = caches
        switch, caches = _cache_switch(models, caches)
        runner = _Runner(client, cfg, advance)
        rows, skipped = [], []  # skipped stays empty: every run gets its share (kept for the JSON's readers)
        plan = [(mode, conc, cache) for mode, conc in streams(cfg) for cache in caches]
        for k, (mode, conc, cache) in enumerate(plan):
            share = runner.start_run(len(plan) - k)
            t0 = time.monotonic()
            comps = runner.stream(_bodies(cfg, mode, cache, served), conc)
            row = {"stream": mode, "concurrency": conc, "cache": cache, "requests": cfg.requests,
                   "complete": len(comps) == cfg.requests, "time_s": time.monotonic() - t0, "budget_s": share}
            if comps:
                row.update(summarize(comps))
            else:
                row.update({"answered": 0, "unique": None})
            rows.append(row)
    if not any(r.get("answered") for r in rows):  # nothing to count: a failed run, not a table of zeros
        raise RunError(f"{base}/completions: no completion answered within --time-limit {cfg.time_limit:g} s "
                       f"(0 of {cfg.requests} requests a run)")
    params = {"url": base + "/completions", "prompt": cfg.prompt, "requests": cfg.requests,
              "concurrency": cfg.concurrency, "mix": cfg.mix, "other_prompts": _others(cfg) if cfg.mix else [],
              "caches": caches, "max_tokens": cfg.max_tokens, "temperature": 0, "top_logprobs": TOP,
              "time_limit_s": cfg.time_limit, "request_timeout_s": cfg.request_timeout,
              "served_model": served, "cache_switch": switch, "caches_asked": asked, "skipped": skipped}
    notes = [] if caches == asked else [f"--cache {','.join(asked)} ran as one 'server' run: {switch}"]
    return Rows(params, rows, takeaways=notes + _takeaways(rows, skipped, cfg))


def _models(client: Client, cfg: EndpointConfig) -> dict | None:
    """GET /v1/models: the first contact, so a server that does not answer is
    one line here; a server without the route (HTTP 404) is fine."""
    try:
        return client.get("/models", timeout=min(cfg.request_timeout, cfg.time_limit))
    except RunError as e:
        if ": HTTP 404" in str(e):
            return None
        raise RunError(f"the server does not answer: {e}") from None


def _first_model(models: dict | None) -> str | None:
    data = (models or {}).get("data") or []
    mid = data[0].get("id") if data and isinstance(data[0], dict) else None
    return mid if isinstance(mid, str) else None


def _others(cfg: EndpointConfig) -> list[str]:
    return list(cfg.other_prompts) or list(OTHER_PROMPTS)


def _bodies(cfg: EndpointConfig, mode: str, cache: str, served: str | None) -> list[tuple[dict, bool]]:
    def body(prompt: str) -> dict:
        b = {"prompt": prompt, "max_tokens": cfg.max_tokens, "temperature": 0, "logprobs": TOP, "n": 1,
             "stream": False}
        if served:
            b["model"] = served
        if cache != "server":
            b["cache_prompt"] = cache == "on"
        return b

    out = []
    others = _others(cfg)
    for i in range(cfg.requests):
        out.append((body(cfg.prompt), True))
        if mode == "mixed":
            out.append((body(others[i % len(others)]), False))
    return out


def _takeaways(rows: list[dict], skipped: list[str], cfg: EndpointConfig) -> list[str]:
    out = []
    for r in rows:
        label = f"{r['stream']} (C={r['concurrency']}), cache {r['cache']}"
        if not r["answered"]:
            out.append(f"{label}: no answer before the time limit")
            continue
        s = f"{label}: {r['unique']} unique of {r['answered']}"
        if r["first_parting_token"] is not None:
            m = r["parting_margin"]
            s += f", parting at token {r['first_parting_token']}" + (f" (margin {m:.3g} nats)" if m is not None else "")
        if r["distinct_logprobs"] > 1:
            s += f"; {r['distinct_logprobs']} distinct log-prob vectors (max spread {r['max_logprob_spread']:.3g})"
        else:
            s += "; identical log-probs"
        if not r["complete"]:
            s += (f" (stopped at its {r['budget_s']:.3g} s share of the {cfg.time_limit:g} s time limit; "
                  f"{r['answered']} of {r['requests']} answered)")
        out.append(s)
    if skipped:
        out.append(f"not run, past the time limit: {', '.join(skipped)}")
    return out
