"""What `compare engine --engine llamacpp:FILE` costs against llama-cpp-python's
own evaluation of the same work (issue 39's done-when: at most 1.5x, the
reference served from its cache, and growing linearly with --steps). A
benchmark, not a timed test: run it on an idle machine (`uptime` load < 3).

    .venv/bin/python scripts/bench_engine_speed.py                     # the embedded model, exported to gguf:f32
    .venv/bin/python scripts/bench_engine_speed.py --gguf FILE --reference SPEC [--tokens 512] [--steps 50,200,400]

The same work on both sides: one evaluation of the text's --tokens positions
(every position's logits, copied out) and a greedy decode of --steps tokens
from the prompt's ids, through llama.cpp's KV cache (a prefill, then one
token an evaluation), on as many threads as compare engine's default (torch's
count), in a model loaded by each side. compare engine runs in this process
(experiments/engines.run, after its imports: a CLI run adds the interpreter's
start-up, reported apart), after one untimed run fills the reference cache,
so the reference's own work is 0 here; the best of --repeats runs is kept on
both sides. Prints one table and, with --json FILE, writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def export_embedded(work: Path) -> Path:
    out = work / "embedded-f32.gguf"
    if not out.is_file():
        subprocess.run([sys.executable, "-m", "precisionlab", "export", "embedded", "--to", "gguf:f32",
                        "--out", str(out)], check=True, cwd=ROOT, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    return out


def clocks() -> tuple[float, float]:
    """(wall, CPU) seconds now: the CPU clock is the whole process's, every thread (torch's, llama.cpp's)."""
    return time.perf_counter(), time.process_time()


def raw_llama(path: Path, ids: list[int], prompt_ids: list[int], steps: int, threads: int, ctx: int) -> dict:
    """llama-cpp-python itself, wall and CPU seconds: load, one eval of ids (every position's logits copied
    out), then greedy decoding of `steps` tokens from prompt_ids through its cache (greedy_s: that part)."""
    import llama_cpp
    import numpy as np

    from precisionlab.engines.llamacpp import _model_params, _quantised_amx_default

    w0, c0 = clocks()
    # llama.cpp's weight buffers as compare engine sets them (extra=0 for a quantised file on an AMX CPU,
    # where the repacked kernels crashed this eval): the same configuration on both sides
    with _model_params(llama_cpp, use_extra_bufts=not _quantised_amx_default(llama_cpp, str(path))):
        llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
                              n_gpu_layers=0, verbose=False)
    llm.eval(ids)
    rows = np.array(llm.scores[:len(ids)], dtype=np.float32)
    g0 = time.perf_counter()
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    for step in range(steps):
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        out.append(int(np.argmax(last)))
        if step + 1 < steps:
            llm.eval(out[-1:])
    w1, c1 = clocks()
    del llm, rows
    return {"wall_s": w1 - w0, "cpu_s": c1 - c0, "greedy_s": w1 - g0}


def ours(spec: str, reference: str, tokens: int, steps: int, text: str | None):
    """compare engine in this process: ({wall_s, cpu_s}, its result)."""
    from precisionlab.experiments import engines as eexp

    cfg = eexp.EnginesConfig(engines=[spec], reference=reference, tokens=tokens, steps=steps, text=text)
    w0, c0 = clocks()
    res = eexp.run(cfg)
    w1, c1 = clocks()
    return {"wall_s": w1 - w0, "cpu_s": c1 - c0}, res


def cli_wall(spec: str, reference: str, tokens: int, steps: int, text: str | None) -> float:
    cmd = [sys.executable, "-m", "precisionlab", "compare", "engine", "--engine", spec, "--reference", reference,
           "--tokens", str(tokens), "--steps", str(steps), "--json"] + (["--text", text] if text else [])
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t


def row(steps: int, mine: list[dict], raw: list[dict], greedy: list[float], cli_s: float, window: int) -> dict:
    """The best of the repeats on each side (the least disturbed by the machine's other work), wall and CPU,
    their ratios, and each side's greedy decoding per step (linear in --steps: the same at 50, 200, 400)."""
    best = {k: min(r[k] for r in mine) for k in ("wall_s", "cpu_s")}
    base = {k: min(r[k] for r in raw) for k in ("wall_s", "cpu_s", "greedy_s")}
    return {"steps": steps, "compare_engine_s": best["wall_s"], "compare_engine_cpu_s": best["cpu_s"],
            "llama_cpp_s": base["wall_s"], "llama_cpp_cpu_s": base["cpu_s"],
            "ratio": best["wall_s"] / base["wall_s"], "cpu_ratio": best["cpu_s"] / base["cpu_s"],
            "engine_greedy_s": min(greedy), "greedy_per_step_s": min(greedy) / steps,
            "llama_cpp_greedy_per_step_s": base["greedy_s"] / steps, "cli_wall_s": cli_s, "window": window}


def show(out: dict, path, reference: str, tokens: int, threads: int) -> None:
    print(f"{'steps':>6} {'ours s':>8} {'ours CPU s':>10} {'llama.cpp s':>11} {'its CPU s':>9} {'ratio':>6} "
          f"{'CPU ratio':>9} {'ours ms/step':>12} {'its ms/step':>11} {'CLI wall s':>10}")
    for r in out["rows"]:
        print(f"{r['steps']:>6} {r['compare_engine_s']:>8.2f} {r['compare_engine_cpu_s']:>10.2f} "
              f"{r['llama_cpp_s']:>11.2f} {r['llama_cpp_cpu_s']:>9.2f} {r['ratio']:>6.2f} {r['cpu_ratio']:>9.2f} "
              f"{1e3 * r['greedy_per_step_s']:>12.2f} {1e3 * r['llama_cpp_greedy_per_step_s']:>11.2f} "
              f"{r['cli_wall_s']:>10.2f}")
    print(f"gguf {path}, reference {reference}, {tokens} tokens, {threads} threads, load {out['load_avg']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", help="the GGUF (default: the embedded model exported to gguf:f32)")
    ap.add_argument("--reference", default=None, help="the reference's spec (default: embedded)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--steps", default="50,200,400")
    ap.add_argument("--text", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="both sides' threads (default: torch's count, compare engine's default); on a loaded "
                         "machine 1 keeps ggml's thread barriers from waiting on the scheduler")
    ap.add_argument("--work", default=None, help="folder for the export (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the numbers here")
    a = ap.parse_args()

    import torch

    work = Path(a.work or tempfile.mkdtemp(prefix="bench-engine-speed-"))
    path = Path(a.gguf) if a.gguf else export_embedded(work)
    reference = a.reference or "embedded"
    threads = a.threads or torch.get_num_threads()
    spec = f"llamacpp:{path}" + (f",threads={a.threads}" if a.threads else "")
    out = {"gguf": str(path), "reference": reference, "tokens": a.tokens, "threads": threads,
           "load_avg": os.getloadavg(), "rows": []}
    for steps in [int(s) for s in a.steps.split(",")]:
        _, warm = ours(spec, reference, a.tokens, steps, a.text)  # fills the reference cache
        from precisionlab.experiments import engines as eexp
        from precisionlab.experiments import logits as lexp
        from precisionlab.experiments import startup

        with startup.numerics():  # as compare engine keys its cache: the ids and prompt ids from the warm run
            text = lexp.read_text(a.text) if a.text else lexp.default_text()
            cfg = eexp.EnginesConfig(engines=[spec], reference=reference, tokens=a.tokens, steps=steps, text=a.text)
            ref = eexp.Reference(reference, cfg, text, "--text", "cpu", True)
            _, window, ids, prompt_ids, _, _ = ref.start()
        assert not ref.misses, "the warm run's entry was not found"
        ctx = int(warm.rows[0]["engine"]["n_ctx"])
        mine, raw, greedy = [], [], []
        for _ in range(a.repeats):
            s, res = ours(spec, reference, a.tokens, steps, a.text)
            assert res.timing["reference_cache"] == "hit", res.timing
            mine.append(s)
            greedy.append(res.rows[0]["greedy_s"])
            raw.append(raw_llama(path, ids[:a.tokens], prompt_ids, steps, threads, ctx))
        wall = cli_wall(spec, reference, a.tokens, steps, a.text)
        out["rows"].append(row(steps, mine, raw, greedy, wall, window))
    show(out, path, reference, a.tokens, threads)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
