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


def raw_llama(path: Path, ids: list[int], prompt_ids: list[int], steps: int, threads: int, ctx: int) -> float:
    """Seconds for llama-cpp-python itself: load, one eval of ids (every position's logits copied out),
    then greedy decoding of `steps` tokens from prompt_ids through its cache."""
    import llama_cpp
    import numpy as np

    t = time.perf_counter()
    llm = llama_cpp.Llama(str(path), logits_all=True, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
                          n_gpu_layers=0, verbose=False)
    llm.eval(ids)
    rows = np.array(llm.scores[:len(ids)], dtype=np.float32)
    llm.reset()
    llm.eval(prompt_ids)
    out = []
    for step in range(steps):
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        out.append(int(np.argmax(last)))
        if step + 1 < steps:
            llm.eval(out[-1:])
    elapsed = time.perf_counter() - t
    del llm, rows
    return elapsed


def ours(spec: str, reference: str, tokens: int, steps: int, text: str | None):
    from precisionlab.experiments import engines as eexp

    cfg = eexp.EnginesConfig(engines=[spec], reference=reference, tokens=tokens, steps=steps, text=text)
    t = time.perf_counter()
    res = eexp.run(cfg)
    return time.perf_counter() - t, res


def cli_wall(spec: str, reference: str, tokens: int, steps: int, text: str | None) -> float:
    cmd = [sys.executable, "-m", "precisionlab", "compare", "engine", "--engine", spec, "--reference", reference,
           "--tokens", str(tokens), "--steps", str(steps), "--json"] + (["--text", text] if text else [])
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t


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
        ours_s, raw_s, row = [], [], None
        for _ in range(a.repeats):
            s, res = ours(spec, reference, a.tokens, steps, a.text)
            assert res.timing["reference_cache"] == "hit", res.timing
            ours_s.append(s)
            row = res.rows[0]
            raw_s.append(raw_llama(path, ids[:a.tokens], prompt_ids, steps, threads, ctx))
        wall = cli_wall(spec, reference, a.tokens, steps, a.text)
        out["rows"].append({"steps": steps, "compare_engine_s": min(ours_s), "llama_cpp_s": min(raw_s),
                            "ratio": min(ours_s) / min(raw_s), "engine_forward_s": row["forward_s"],
                            "engine_greedy_s": row["greedy_s"], "cli_wall_s": wall, "window": window})
    print(f"{'steps':>6} {'compare engine s':>17} {'llama-cpp-python s':>19} {'ratio':>6} {'greedy s':>9} "
          f"{'CLI wall s':>11}")
    for r in out["rows"]:
        print(f"{r['steps']:>6} {r['compare_engine_s']:>17.3f} {r['llama_cpp_s']:>19.3f} {r['ratio']:>6.2f} "
              f"{r['engine_greedy_s']:>9.3f} {r['cli_wall_s']:>11.2f}")
    print(f"gguf {path}, reference {reference}, {a.tokens} tokens, {threads} threads, load {out['load_avg']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
