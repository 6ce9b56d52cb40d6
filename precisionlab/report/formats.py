"""The report of `precisionlab formats`: a table per distribution, strict JSON,
and a plot written atomically to a path checked before the run."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import footer, hint, sci, stdout
from precisionlab.report.jsondoc import emit_rows
from precisionlab.report.plots import save


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def table(res) -> None:
    for dist in res.params["dists"]:
        rows = [r for r in res.rows if r["dist"] == dist]
        title = f"formats: {dist.replace('_', ' ')}" + (f" (df {res.params['student_df']})" if dist == "student_t" else "")
        t = Table(title=title, title_justify="left")
        models = bool(res.params.get("accumulators"))  # the accumulator column only when models were asked for
        for col in ("format", "scale", "rule", "block", "bits/elem") + (("accumulator",) if models else ()):
            t.add_column(col, overflow="fold")
        for col in ("rel RMSE", "blocks clipped", "flushed to 0", "matmul rel err") + (("accum. rel err",) if models else ()):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(r["format"], r["scale"] or "-", r["rule"] or "-", "-" if r["block"] is None else str(r["block"]),
                      f"{r['bits_per_element']:.4g}", *((r["accumulator"],) if models else ()), sci(r["rel_l2"]),
                      _pct(r["clip_share"]), _pct(r["flush_share"]), sci(r["matmul_rel_l2"]),
                      *((sci(r["accumulation_rel_l2"]),) if models else ()))
        stdout.print(t)
    m, k, n = res.params["shape"]
    acc = bool(res.params.get("accumulators"))
    footer(None, res.takeaways, note=(
        f"{res.params['n']} values per distribution (fp32); matmul {m}x{k} @ {k}x{n}, operands block-scaled along K, "
        "dequantized, " + ("under each accumulator model" if acc else "fp32 accumulation") +
        ", against float64 of the unquantized operands" + ("; accum. rel err: against float64 of the dequantized "
        "operands, the accumulator's own error" if acc else "") + ". blocks clipped: the block's largest element "
        "came back smaller than it went in, at the element's max code. bits/elem: element bits + scale bits / block."))


def as_json(res) -> None:
    emit_rows("formats", res, devices=res.devices)


def plot(res, path: str) -> None:
    """Relative RMSE of every configuration, one line per distribution
    (plots.save: a temporary file beside `path`, renamed over it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(_label(r) for r in res.rows))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.28 * len(labels)), 5.5))
    try:
        for dist in res.params["dists"]:
            by = {_label(r): r["rel_l2"] for r in res.rows if r["dist"] == dist}
            ax.plot(range(len(labels)), [by.get(lb, float("nan")) for lb in labels], marker="o", ms=3, lw=1,
                    label=dist)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("relative RMSE")
        ax.set_title("block-scaled formats: relative RMSE by format / rule / block")
        ax.legend(fontsize=8)
        fig.tight_layout()
        written = save(fig, path)
    finally:
        plt.close(fig)
    hint(f"plot written to {written}")


def _label(r: dict) -> str:
    return "/".join(str(v) for v in (r["format"], r["rule"], r["block"]) if v is not None)
