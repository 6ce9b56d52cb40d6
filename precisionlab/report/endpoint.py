"""nondeterminism --endpoint's table and JSON. Every string the server sent
(completions, tokens, model names) is shown escaped."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, num, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_json

SHOWN_TEXTS = 2  # completions shown per run in the table (--json has them all)
SHOWN_CHARS = 24


def _counts(r) -> str:
    shown = [f"{c['count']}× {safe_text(_clip(c['text']))}" for c in r["counts"][:SHOWN_TEXTS]]
    more = len(r["counts"]) - SHOWN_TEXTS
    return "; ".join(shown) + (f"; +{more} more" if more > 0 else "")


def _clip(text: str) -> str:
    return repr(text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…")


def table(res) -> None:
    p = res.params
    stdout.print(f"{safe_text(p['url'])} (model {safe_text(p['served_model'] or 'not named')}): "
                 f"prompt {safe_text(repr(p['prompt']))}, {p['requests']} requests a run at temperature 0, "
                 f"max_tokens {p['max_tokens']}; prompt cache switch: {safe_text(p['cache_switch'])}",
                 highlight=False)
    t = Table(title="nondeterminism endpoint: one prompt, N times", title_justify="left")
    for col in ("stream", "C", "cache", "unique", "completions", "parts at token", "tokens there",
                "margin there", "distinct log-probs", "max log-prob spread"):
        t.add_column(col, justify="left" if col in ("stream", "cache", "completions", "tokens there") else "right",
                     overflow="fold")
    for r in res.rows:
        if not r["answered"]:
            t.add_row(r["stream"], str(r["concurrency"]), r["cache"], f"- of {r['requests']}", "no answer in time",
                      "-", "-", "-", "-", "-")
            continue
        part = r["first_parting_token"]
        spread = "-" if r["max_logprob_spread"] is None else \
            f"{sci(r['max_logprob_spread'])} at {r['max_spread_position']}"
        t.add_row(r["stream"], str(r["concurrency"]), r["cache"], f"{r['unique']} of {r['answered']}"
                  + ("" if r["complete"] else f" (of {r['requests']})"), _counts(r),
                  "-" if part is None else str(part),
                  "-" if part is None else safe_text(", ".join(map(repr, r["parting_tokens"]))),
                  "-" if r["parting_margin"] is None else num(r["parting_margin"], 4),
                  f"{r['distinct_logprobs']} of {r['answered']}", spread)
    stdout.print(t)
    footer(None, res.takeaways, note="margin there: the smallest top-1 minus top-2 log-prob (nats) any completion had "
           "where they part; log-prob spread: max - min of a position's returned log-prob over the N, on the common "
           "prefix.")


def as_json(res) -> None:
    emit_json("nondeterminism endpoint", {"params": res.params, "rows": res.rows, "takeaways": res.takeaways})
