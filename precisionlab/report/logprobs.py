"""The report of `precisionlab compare logprobs`: the token and sequence
statistics, the diagnoses, the worst sequences and positions, strict JSON, and
a plot of Δ per position with the ratios' histogram."""

from __future__ import annotations

import numpy as np
from rich.table import Table

from precisionlab.report.console import footer, num, safe_text, sci, stdout
from precisionlab.report.jsondoc import emit_json


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.2f} %"


def _g(x, digits: int = 4) -> str:
    return num(x, digits)


def _side(res, side: str) -> str:
    i = res.inputs[side]
    top = f", top {i['top_k']}" if i["top_k"] else ""
    return (f"{side.upper()} = {safe_text(i['path'])} ({i['format']}, {i['dtype']}, {i['sequences']} sequences, "
            f"{i['n']} tokens{top})")


def table(res) -> None:
    r = res.rows[0]
    stdout.print(f"compare logprobs, tokens compared by {res.params['compared_by']}:", highlight=False)
    for side in ("a", "b"):
        stdout.print(f"  {_side(res, side)}", highlight=False)
    t = Table(title="per token: Δ = logp_A - logp_B = log r, r = p_A / p_B", title_justify="left")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    rows = [
        ("tokens compared", f"{r['n']}" + (f" ({r['excluded']} left out: non-finite)" if r["excluded"] else "")),
        ("mean Δ (signed)", sci(r["mean_diff"])),
        ("|Δ| mean", sci(r["mean_abs_diff"])), ("Δ RMS", sci(r["rms_diff"])),
        ("|Δ| p50", sci(r["p50_abs_diff"])), ("|Δ| p99", sci(r["p99_abs_diff"])), ("|Δ| max", sci(r["max_abs_diff"])),
        ("Pearson of p_A, p_B", _g(r["prob_pearson"], 8)),
        ("r mean", _g(r["mean_ratio"], 6)), ("r std", sci(r["std_ratio"])),
        ("r min", _g(r["min_ratio"], 6)), ("r max", _g(r["max_ratio"], 6)),
    ]
    for c in r["outside_clip"]:
        rows.append((f"r outside [1/{c['clip']:g}, {c['clip']:g}]", f"{c['n_outside']} ({_pct(c['frac_outside'])})"))
    rows += [
        ("ESS = (Σr)² / Σr²", f"{_g(r['ess'], 6)} ({_pct(r['ess_frac'])} of n)"),
        ("KL(B||A) k1 = mean -log r", sci(r["kl_k1"])), ("KL(B||A) k2 = mean (log r)²/2", sci(r["kl_k2"])),
        ("KL(B||A) k3 = mean (r-1) - log r", sci(r["kl_k3"])), ("χ² = mean (r-1)²", sci(r["chi2"])),
        ("ln(PPL_A / PPL_B)", sci(r["ln_ppl_ratio"])), ("PPL A, PPL B", f"{_g(r['ppl_a'], 6)}, {_g(r['ppl_b'], 6)}"),
    ]
    for label, value in rows:
        t.add_row(label, value)
    stdout.print(t)

    s = Table(title="per sequence: log R = Σ Δ over the sequence, R the product ratio", title_justify="left")
    s.add_column("statistic")
    s.add_column("value", justify="right")
    srows = [("sequences", f"{r['seq_n']}" + (f" ({r['seq_excluded']} left out: a non-finite token)"
                                               if r["seq_excluded"] else "")),
             ("log R mean", sci(r["mean_seq_log_ratio"])), ("log R std", sci(r["std_seq_log_ratio"])),
             ("log R min", sci(r["min_seq_log_ratio"])), ("log R max", sci(r["max_seq_log_ratio"])),
             (f"R > cap {r['cap']:g} (truncated IS clips)", _pct(r["seq_frac_above_cap"])),
             (f"R < 1/{r['cap']:g}", _pct(r["seq_frac_below_inv_cap"])),
             ("ESS of R", f"{_g(r['seq_ess'], 6)} ({_pct(r['seq_ess_frac'])} of sequences)")]
    for label, value in srows:
        s.add_row(label, value)
    stdout.print(s)

    if res.worst_sequences:
        w = Table(title="worst sequences, by |log R|", title_justify="left")
        for col in ("sequence", "tokens", "log R", "R", "|Δ| mean", "|Δ| max", "at position"):
            w.add_column(col, justify="right")
        for q in res.worst_sequences:
            w.add_row(str(q["sequence"]), str(q["n"]), sci(q["log_ratio"]), _g(q["ratio"]), sci(q["mean_abs_diff"]),
                      sci(q["max_abs_diff"]), str(q["worst_position"]))
        stdout.print(w)
    if res.worst_positions:
        p = Table(title="worst positions, by |Δ|", title_justify="left")
        for col in ("sequence", "position", "token id", "token", "logp A", "logp B", "Δ", "r"):
            p.add_column(col, justify="left" if col == "token" else "right")
        for q in res.worst_positions:
            p.add_row(str(q["sequence"]), str(q["position"]), "-" if q["token_id"] is None else str(q["token_id"]),
                      "-" if q["token"] is None else safe_text(repr(q["token"])), _g(q["logprob_a"], 6),
                      _g(q["logprob_b"], 6), sci(q["diff"]), _g(q["ratio"]))
        stdout.print(p)
    footer(None, res.takeaways, note="KL(B||A) over tokens sampled from B (Schulman's k1, k2, k3; r = p_A/p_B); "
           "ln(PPL_A / PPL_B) is -mean Δ, which over the same tokens is k1. Percentiles are nearest-rank, std the "
           "population's.")


def as_json(res) -> None:
    emit_json(res.command, {"params": res.params, "inputs": res.inputs, "timing": res.timing, "rows": res.rows,
                            "nonfinite": res.nonfinite, "diagnoses": res.diagnoses,
                            "worst_sequences": res.worst_sequences, "worst_positions": res.worst_positions,
                            "failures": res.failures, "takeaways": res.takeaways})


def plot(res, path: str) -> None:
    """Δ at every token against its position (mean per position as a line),
    and, inset, the histogram of log10 r."""
    from precisionlab.report.plots import figure

    ok = np.isfinite(res.diff)
    d, pos = res.diff[ok], res.position[ok]
    with figure(path, "compare logprobs: Δ = logp_A - logp_B per position", "position in the sequence",
                "Δ (nats)") as ax:
        ax.scatter(pos, d, s=2, alpha=0.3, label="tokens")
        if pos.size:
            counts = np.bincount(pos)
            sums = np.bincount(pos, weights=d)
            at = np.flatnonzero(counts)
            ax.plot(at, sums[at] / counts[at], lw=1, color="black", label="mean over sequences")
        ax.axhline(0.0, lw=0.5, color="grey")
        inset = ax.inset_axes([0.64, 0.08, 0.33, 0.3])
        inset.hist(d / np.log(10.0), bins=60)
        inset.set_title("log10 r", fontsize=7)
        inset.tick_params(labelsize=6)
