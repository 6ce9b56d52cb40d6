"""The report of compare model --metrics and compare logits: distribution
statistics per run, flips by fp32's top-2 margin, the CI verdicts, the plot."""

from __future__ import annotations

import numpy as np
from rich.markup import escape
from rich.table import Table

from precisionlab.report.console import note, error_line, footer, hint, num, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_json
from precisionlab.numerics.small_n import CONFIDENCE as _CONFIDENCE, MIN_TAIL as _MIN_TAIL

# Rows of the main table: (label, key, formatter), one line per statistic.
_PCT = lambda x: "-" if x is None else f"{x:.2f} %"  # noqa: E731
STATS = (
    ("KLD mean", "kld_mean", sci), ("KLD median", "kld_median", sci), ("KLD p90", "kld_p90", sci),
    ("KLD p99", "kld_p99", sci), ("KLD p99.9", "kld_p99_9", sci), ("KLD max", "kld_max", sci),
    ("top-1 agreement", "top1_agree", None),
    ("fp32 top-1 in its top 5", "ref_top1_in_top5_pct", _PCT),
    ("its top-1 in fp32 top 5", "top1_in_ref_top5_pct", _PCT),
    ("Δp mean", "dp_mean", sci), ("Δp RMS", "dp_rms", sci),
    ("perplexity", "ppl", lambda x: num(x, 6)), ("ln(PPL / PPL fp32)", "ln_ppl_ratio", sci),
)


def show(res, plot: str | None, json_out: bool) -> None:
    if plot:
        draw(res, plot)
    (as_json if json_out else table)(res)
    for f in res.failures:  # a failed run's line: the prefix every error line has (it was a bare dim line)
        error_line(f"FAIL {f}")


# compare logits: the sides by role, never by a format ("fp32" is what
# compare model --metrics compares against; here it is REF, whatever it is).
FILE_STATS = (
    ("KLD mean", "kld_mean", "kld_mean_se"), ("KLD median", "kld_median", None), ("KLD p90", "kld_p90", None),
    ("KLD p99", "kld_p99", None), ("KLD p99.9", "kld_p99_9", None), ("KLD max", "kld_max", None),
    ("top-1 agreement", "top1_agree_pct", "top1_agree_pct_se"),
    ("REF top-1 in its top 5", "ref_top1_in_top5_pct", None),
    ("its top-1 in REF top 5", "top1_in_ref_top5_pct", None),
    ("Δp mean", "dp_mean", "dp_mean_se"), ("Δp RMS", "dp_rms", "dp_rms_se"),
    ("perplexity", "ppl", None), ("ln(PPL / PPL REF)", "ln_ppl_ratio", "ln_ppl_ratio_se"),
)
# llama-perplexity's closing report, in its order, with its names and its
# printf formats (so the two printouts can be read side by side)
_F6, _F3 = "{:.6f}", "{:.3f}"
LLAMA_STATS = (
    ("Mean PPL(Q)", "ppl_q", None, _F6), ("Mean PPL(base)", "ppl_base", None, _F6),
    ("Mean ln(PPL(Q)/PPL(base))", "mean_ln_ppl_ratio", "mean_ln_ppl_ratio_se", _F6),
    ("Mean    KLD", "mean_kld", "mean_kld_se", _F6), ("Maximum KLD", "max_kld", None, _F6),
    ("99.9%   KLD", "kld_p99_9", None, _F6), ("99.0%   KLD", "kld_p99", None, _F6),
    ("95.0%   KLD", "kld_p95", None, _F6), ("90.0%   KLD", "kld_p90", None, _F6),
    ("Median  KLD", "median_kld", None, _F6), ("10.0%   KLD", "kld_p10", None, _F6),
    (" 5.0%   KLD", "kld_p5", None, _F6), (" 1.0%   KLD", "kld_p1", None, _F6),
    (" 0.1%   KLD", "kld_p0_1", None, _F6), ("Minimum KLD", "min_kld", None, _F6),
    ("Mean    Δp (%)", "mean_dp_pct", "mean_dp_pct_se", _F3), ("RMS Δp    (%)", "rms_dp_pct", "rms_dp_pct_se", _F3),
    ("Same top p (%)", "same_top_p_pct", "same_top_p_pct_se", _F3),
)


def _fixed(fmt: str, v, se) -> str:
    return fmt.format(v) if se is None else f"{fmt.format(v)} ± {fmt.format(se)}"


def say_departure(w: dict) -> str:
    """One yardstick row in words: the statistic, both values, the ratio, the paired difference."""
    fmt = (lambda v: f"{v:.2f} %") if w["statistic"].endswith("_pct") else sci
    text = f"{w['statistic']} {fmt(w['yours'])} against REF_LOW's {fmt(w['ref_low'])}, {w['ratio']:.3g}x"
    if w.get("ratio_lo") is not None:
        text += f" ({w['ratio_lo']:.3g}x to {w['ratio_hi']:.3g}x at {_CONFIDENCE:.0%})"
    if w["z"] is not None:
        text += f", a difference of {sci(w['diff'])} ± {sci(w['diff_se'])} (z = {w['z']:.3g})"
    if w.get("not_judged"):
        text += f"; not judged: {w['not_judged']}"
    return text


def _pm(v, se) -> str:
    return sci(v) if se is None else f"{sci(v)} ± {sci(se)}"


def _side_head(r: dict) -> str:
    return escape(r["side"]) + "\n" + safe_text(r["file"])


def table_files(res) -> None:
    p = res.params
    title = f"compare logits: REF {p['ref']} ({p['ref_dtype']}), {p['tokens']} positions"
    stdout.print(safe_text(title), highlight=False)
    if not res.rows:
        footer(None, res.takeaways)
        return
    ratios = {y["statistic"]: y for y in res.yardstick}
    t = Table(title="next-token distributions against REF", title_justify="left")
    t.add_column("statistic")
    for r in res.rows:
        t.add_column(_side_head(r), justify="right")
    if ratios:
        t.add_column("YOURS / REF_LOW", justify="right")
    for label, key, se in FILE_STATS:
        cells = []
        for r in res.rows:
            if key == "top1_agree_pct":
                cells.append(f"{r['top1_agree']}/{r['positions']} ({r[key]:.2f} ± {r[se]:.2f} %)")
            elif key.endswith("_pct"):
                cells.append(_PCT(r[key]))
            elif key == "ppl":
                cells.append(num(r[key], 6))
            else:
                cells.append(_pm(r[key], r[se] if se else None))
        if ratios:
            y = ratios.get(key)
            cells.append("" if y is None else "-" if y["ratio"] == 0 and y["yours"] == y["ref_low"] else
                         f"{y['ratio']:.3g}x" + (" !" if y["flagged"] else "" if y.get("judged", True) else " (n)"))
        t.add_row(label, *cells)
    stdout.print(t)
    unjudged = [y for y in res.yardstick if not y.get("judged", True)]
    if unjudged:
        stdout.print("(n): shown, not judged at this n: " + "; ".join(
            f"{y['statistic']}: {y['not_judged']}" for y in unjudged), highlight=False)
    stdout.print(f"REF perplexity {num(res.rows[0]['ppl_ref'], 6)} over {res.rows[0]['positions']} positions",
                 highlight=False)
    if res.worst:
        stdout.print(f"departs most from the yardstick: {say_departure(res.worst)}; " + (
            "beyond what REF_LOW's rounding costs" if res.worst["flagged"] else
            "within 4x of the yardstick, or its interval reaches back to 1x"), highlight=False)
    if res.llamacpp:
        lt = Table(title="as llama-perplexity --kl-divergence reports it (KL over base log-probs above -16, "
                         "interpolated percentiles)", title_justify="left")
        lt.add_column("statistic (its printf formats; full values in --json)")
        for side in res.llamacpp:
            lt.add_column(side, justify="right")
        for label, key, se, fmt in LLAMA_STATS:
            lt.add_row(label, *[_fixed(fmt, rep[key], rep[se] if se else None) for rep in res.llamacpp.values()])
        stdout.print(lt)
    _flips(res, "REF")
    # The footnote explains only the columns this table printed: a two-way run has no ratio column.
    note("KLD: KL(P_REF || P_side) per position in nats; percentiles are nearest-rank; ± is the standard "
         "error of the mean (of the per-position differences for ln PPL). Δp: the side's probability of "
         "the text's next token minus REF's." + (
             " YOURS / REF_LOW: the ratio of their departures from REF (for agreement, of the disagreement); "
             f"! beyond 4x, its {_CONFIDENCE:.0%} paired block-bootstrap interval wholly past 1x; (n): too few "
             f"positions for that percentile (a verdict needs {_MIN_TAIL} beyond it)." if ratios else ""))
    footer(None, res.takeaways)


def _flips(res, name: str) -> None:
    ref = res.rows[0]
    m = Table(title=f"top-1 flips by {name}'s top-1 minus top-2 logit margin", title_justify="left")
    m.add_column("margin", justify="right")
    m.add_column("positions", justify="right")
    for r in res.rows:
        m.add_column(f"{escape(r.get('side') or r['dtype'])} flips", justify="right")
    for i, b in enumerate(ref["flips_by_margin"]):
        cells = []
        for r in res.rows:
            c = r["flips_by_margin"][i]
            cells.append("-" if c["flip_share"] is None else f"{c['flips']} ({100 * c['flip_share']:.3g} %)")
        m.add_row(f"[{b['margin_lo']:g}, {b['margin_hi']:g})", str(b["positions"]), *cells)
    stdout.print(m)


def table(res) -> None:
    if res.command == "compare logits":
        return table_files(res)
    p = res.params
    model = True
    if model:
        title = (f"{res.model_info['name']}: {p['tokens']} positions of {p['text']}, "
                 f"teacher-forced in windows of {p['window']}")
        if p["noise_sigma"]:
            title += f", logits + N(0, {p['noise_sigma']:g}²)"
    else:
        title = f"compare logits: {p['yours']} ({p['yours_dtype']}) against {p['ref']} ({p['ref_dtype']}), {p['tokens']} positions"
    stdout.print(safe_text(title), highlight=False)
    t = Table(title="next-token distributions" + (" against fp32" if model else " against REF"),
              title_justify="left")
    t.add_column("statistic")
    for r in res.rows:
        t.add_column(escape(r["dtype"]), justify="right")
    for label, key, fmt in STATS:
        if fmt is None:  # agreement: the count, then the percentage
            t.add_row(label, *[f"{r[key]}/{r['positions']} ({r['top1_agree_pct']:.2f} %)" for r in res.rows])
        else:
            t.add_row(label, *[fmt(r[key]) for r in res.rows])
    stdout.print(t)
    ref = res.rows[0]
    stdout.print(f"fp32 perplexity {num(ref['ppl_ref'], 6)} over {ref['positions']} positions", highlight=False)
    _flips(res, "fp32")
    stdout.print("KLD: KL(P_fp32 || P_run) per position in nats; percentiles are nearest-rank. Δp: the run's "
                 "probability of the text's next token minus fp32's.", style="dim", highlight=False)
    if "load_s" in res.timing:
        t = res.timing
        stdout.print(f"load {t['load_s']:.2f} s, run {t['run_s']:.2f} s ({t['run_cpu_s']:.2f} s of CPU; torch "
                     f"threads: {t['torch_threads']}), after the torch import", style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    extra = {}
    if res.command == "compare logits":
        extra = {"yardstick": res.yardstick, "worst": res.worst, "llamacpp": res.llamacpp}
    emit_json(res.command, {"params": res.params, "model": res.model_info, "timing": res.timing,
                            "rows": res.rows, **extra, "failures": res.failures, "takeaways": res.takeaways})


def draw(res, path: str) -> None:
    """KLD per position (log scale) and flip rate against fp32's top-2 margin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in res.rows:
        name = r.get("side") or r["dtype"]  # compare logits keys its rows by side (YOURS, REF_LOW)
        kl = res.kl[name]
        floor = np.where(kl > 0, kl, np.nan)  # zeros have no place on a log axis
        a.plot(np.arange(kl.size), floor, lw=0.4, alpha=0.8, label=f"{name} (mean {r['kld_mean']:.2e})")
        buckets = [c for c in r["flips_by_margin"] if c["positions"]]
        mids = [np.sqrt(max(c["margin_lo"], 1e-3) * (c["margin_hi"] if np.isfinite(c["margin_hi"]) else 30.0))
                for c in buckets]
        b.plot(mids, [c["flip_share"] for c in buckets], marker="o", label=name)
    a.set_yscale("log")
    a.set_xlabel("position")
    a.set_ylabel("KL(P_fp32 || P_run), nats")
    a.set_title("KLD per position")
    a.legend(fontsize=8)
    b.set_xscale("log")
    b.set_xlabel("fp32 top-1 minus top-2 logit (bucket, geometric middle)")
    b.set_ylabel("top-1 flip rate")
    b.set_title("flips by margin")
    b.legend(fontsize=8)
    fig.tight_layout()
    from precisionlab.report.plots import save

    try:  # as every --plot: the format from the path's extension, atomically, a URL's secrets masked
        written = save(fig, path)
    finally:
        plt.close(fig)
    hint(f"plot written to {written}")
