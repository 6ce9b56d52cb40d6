"""compare model's table, JSON and plot."""

from __future__ import annotations

from rich.table import Table

from precisionlab.report.console import stdout, safe_text, num, sci, footer
from precisionlab.report.jsondoc import emit_json
from precisionlab.report.plots import figure

def _marked(text: str, at: int | None) -> str:
    """The text with everything from the divergence on in red; split before
    escaping, so the mark stays at the character where the texts part."""
    if at is None:
        return safe_text(text)
    return safe_text(text[:at]) + "[bold red]" + safe_text(text[at:]) + "[/bold red]"


def table(res) -> None:
    info = res.model_info
    p = res.params
    t = Table(title=f"compare model: {safe_text(info['name'])} ({info['parameters']:,} parameters), {p['steps']} greedy steps "
                    f"on {p['device']}", title_justify="left")
    for col in ("dtype", "tokens agree", "first divergence", "fp32 top-2 margin there", "teacher-forced rel L2 (mean)",
                "max rel L2", "max abs", "argmax flips (teacher-forced)"):
        t.add_column(col, justify="right" if col != "dtype" else "left")
    for s in res.summary:
        t.add_row(s["dtype"], "yes" if s["agree"] else "no",
                  "-" if s["diverged_at"] is None else f"step {s['diverged_at']}",
                  num(s["fp32_margin_at_divergence"], 4), sci(s["mean_rel_l2"]), sci(s["max_rel_l2"]),
                  sci(s["max_abs_error"]), str(s["teacher_forced_argmax_flips"]))
    stdout.print(t)
    steps = Table(title="teacher-forced logit error per step (every dtype reads the fp32 path)", title_justify="left")
    steps.add_column("step", justify="right")
    for s in res.summary:
        steps.add_column(f"{s['dtype']} rel L2", justify="right")
        steps.add_column(f"{s['dtype']} max abs", justify="right")
    by = {(r["dtype"], r["step"]): r for r in res.rows}
    for i in range(p["steps"]):
        cells = []
        for s in res.summary:
            r = by[(s["dtype"], i)]
            mark = "*" if s["diverged_at"] == i else ""
            cells += [sci(r["rel_l2"]) + mark, sci(r["max_abs_error"])]
        steps.add_row(str(i), *cells)
    stdout.print(steps)
    stdout.print("* the step where that dtype's free-running tokens first leave fp32's.", style="dim", highlight=False)
    stdout.print(f"prompt: {safe_text(repr(p['prompt']))}", highlight=False)
    for s in [{"dtype": "fp32", "divergence_char": None}, *res.summary]:
        text = res.texts[s["dtype"]].replace("\n", "⏎")  # one character for one, so the mark stays in place
        stdout.print(f"[bold]{s['dtype']:>5}[/bold] │ " + _marked(text, s["divergence_char"]), highlight=False)
    stdout.print(f"load {res.timing['load_s']:.2f} s, run {res.timing['run_s']:.2f} s (after the torch import)",
                 style="dim", highlight=False)
    footer(None, res.takeaways)


def as_json(res) -> None:
    emit_json("compare model", {"params": res.params, "model": res.model_info, "summary": res.summary,
                                "texts": res.texts, "timing": res.timing, "rows": res.rows,
                                "takeaways": res.takeaways})


def plot(res, path: str) -> None:
    with figure(path, f"{res.model_info['name']}: low precision against fp32", "step",
                 "logit relative L2 vs fp32 (teacher-forced)") as ax:
        for s in res.summary:
            r = sorted((x for x in res.rows if x["dtype"] == s["dtype"]), key=lambda x: x["step"])
            line, = ax.plot([x["step"] for x in r], [x["rel_l2"] for x in r], marker=".", label=s["dtype"])
            if s["diverged_at"] is not None:
                ax.axvline(s["diverged_at"], color=line.get_color(), ls="--", lw=1,
                           label=f"{s['dtype']} diverges (step {s['diverged_at']})")
        ax.set_yscale("log")
