"""The report of `precisionlab compare model --trainer SPEC --rollout SPEC`:
each comparison's headline numbers side by side (compare logprobs' row
statistics), what each change to fp32 removes, the diagnoses, strict JSON,
and the baseline's Δ per position as compare logprobs draws it."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report import logprobs as logprobs_report
from precisionlab.report.console import footer, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_json

SHOWN_TEXTS = 2  # sampled continuations printed under the table (the JSON has all)


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.2f} %"


def table(res) -> None:
    p = res.params
    stdout.print(f"compare rollout: trainer {safe_text(p['trainer'])} ({p['trainer_dtype']}) against rollout "
                 f"{safe_text(p['rollout'])} ({p['rollout_dtype']}); {p['samples']} samples of {p['tokens']} tokens "
                 f"after {safe_text(repr(p['prompt']))} (seed {p['seed']}, temperature {p['temperature']:g}, "
                 f"top-p {p['top_p']:g}), scored teacher-forced", highlight=False)
    t = Table(title="Δ = logp_A - logp_B = log r per sampled token; A the trainer, B a rollout stream",
              title_justify="left")
    for col in ("comparison", "A", "B"):
        t.add_column(col)
    for c in p["clips"]:
        t.add_column(f"r outside {c:g}", justify="right")
    for col in ("|Δ| mean", "KL k3", "|Δ| removed", "diagnosis"):
        t.add_column(col, justify="left" if col == "diagnosis" else "right")
    kinds = {d["comparison"]: ", ".join(x["kind"] for x in d["diagnoses"]) or "-" for d in res.details}
    for r in res.rows:
        removed = r.get("mean_abs_diff_removed")
        t.add_row(r["comparison"], safe_text(r["a"]), safe_text(r["b"]),
                  *[_pct(o["frac_outside"]) for o in r["outside_clip"]], sci(r["mean_abs_diff"]), sci(r["kl_k3"]),
                  "-" if removed is None else _pct(removed), kinds[r["comparison"]])
    stdout.print(t)
    for s in res.skipped:
        stdout.print(f"not run: {s['comparison']} ({s['reason']})", style="dim", highlight=False)
    for i, text in enumerate(res.texts[:SHOWN_TEXTS]):
        stdout.print(f"sample {i}: {safe_text(repr(text))}", highlight=False)
    stdout.print("r outside c: the share of ratios outside [1/c, c]. |Δ| removed: the share of the teacher_forced row's mean |Δ| a change takes away. KL(B||A) k3 = "
                 "mean (r-1) - log r over tokens sampled from B; compare logprobs' statistics, its --json has them "
                 "all.", style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json("compare rollout", {"params": res.params, "models": res.models, "timing": res.timing,
                                          "rows": res.rows, "best_change": res.best_change, "skipped": res.skipped,
                                          "details": res.details, "texts": res.texts, "takeaways": res.takeaways})


def plot(res, path: str) -> None:
    """The baseline's (teacher_forced) Δ per position, as compare logprobs draws it."""
    logprobs_report.plot(res, path)
