"""Memory at real size (issue 39): a Qwen3-0.6B-shaped model (hidden 1024, 28
layers, 16/8 heads of 128, MLP 3072, vocabulary 151,936, tied embeddings;
random weights stored in bf16 safetensors) built into a temporary folder, and
each model command run on it in a child process of its own, one at a time.
A benchmark, not a test: it takes minutes and gigabytes; run it on an idle
machine.

    .venv/bin/python scripts/bench_realsize.py                  # the 0.6B set
    .venv/bin/python scripts/bench_realsize.py --shape 1.5b     # --steps 50 and compare metrics on a 1.5B shape
    .venv/bin/python scripts/bench_realsize.py --only metrics,plain --json out.json

For each run: the command's own estimate (runtime/memory, from the shape read
before any weight, as the command makes it), the peak resident set (VmHWM)
and its growth past the child's start (the interpreter, torch and the command
line imported: what the estimates leave out), growth / estimate, and the peak
over the stored weights plus the largest compute copy the command makes. The
baseline is a plain transformers greedy loop over the same dtypes (a model
loaded in each dtype, generate() 50 tokens, freed).

The tokenizer is SmolLM2's byte-level BPE where `make smollm2` cached it (the
model's vocabulary is wider than any tokenizer's: the ids it reads are the
tokenizer's), else a byte-level BPE trained here on the shipped text.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GiB = 1 << 30

SHAPES = {
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, head_dim=128,
                 intermediate_size=8960),
}
VOCAB = 151_936
SMOL_HF = Path(os.environ.get("PRECISIONLAB_CACHE") or Path.home() / ".cache" / "precisionlab") / "smollm2" / "hf"
LOWS = ["bf16", "fp16"]
CONTRACT_DTYPES = ["fp32", "bf16"]

# Each run: (name, argv after the model, the dtypes it computes in: the largest copy is counted)
RUNS = {
    "steps50": (["compare", "model", "--steps", "50"], ["fp32", *LOWS]),
    "metrics": (["compare", "metrics", "--tokens", "2048"], ["fp32", *LOWS]),
    "layers": (["compare", "layers", "--steps", "50"], ["fp32", *LOWS]),
    "contracts": (["compare", "contracts", "--steps", "50"], ["fp32", "bf16", "fp64"]),
}
SETS = {"0.6b": ["steps50", "metrics", "layers", "contracts", "plain"], "1.5b": ["steps50", "metrics", "plain"]}

# A child: the CLI (or the plain loop) run in-process after its imports; VmRSS at the start and VmHWM at
# the end written to the file named by argv[1].
CHILD = """
import atexit, json, runpy, sys
import numpy, torch
import precisionlab.cli.app
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
out, base = sys.argv[1], status("VmRSS")
atexit.register(lambda: open(out, "w").write(json.dumps({"base": base, "peak": status("VmHWM")})))
if sys.argv[2] == "plain":
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(sys.argv[3])
    ids = torch.tensor([tok("ROMEO:\\n", add_special_tokens=False)["input_ids"]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[3], dtype=dtype).eval()
        with torch.no_grad():
            m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=50, min_new_tokens=50,
                       do_sample=False)
        del m
else:
    sys.argv = ["precisionlab", *sys.argv[2:]]
    runpy.run_module("precisionlab", run_name="__main__")
"""


def build(folder: Path, shape: str) -> Path:
    """The random model, its weights in bf16 (made in bf16: no fp32 copy of them is ever held), and a tokenizer."""
    import torch
    import transformers

    if (folder / "config.json").is_file():
        return folder
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, max_position_embeddings=40960, tie_word_embeddings=True,
                                   rope_theta=1_000_000, rms_norm_eps=1e-6, **SHAPES[shape])
    torch.manual_seed(0)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = transformers.Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)
    model.save_pretrained(folder)
    del model
    _tokenizer(folder)
    return folder


def _tokenizer(folder: Path) -> None:
    if (SMOL_HF / "tokenizer.json").is_file():
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(SMOL_HF / name, folder / name)
        return
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from precisionlab.experiments.logits import default_text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(default_text().splitlines(), trainers.BpeTrainer(
        vocab_size=4096, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)


def estimate(name: str, model: str, batches: list[int] | None = None) -> int:
    """The command's own estimate, as it makes it before loading (contracts: for the batches it ran)."""
    from precisionlab.engines.shape import model_shape
    from precisionlab.engines.registry import DEFAULT_PROMPT
    from precisionlab.experiments import contracts, logits
    from precisionlab.runtime import memory

    if name == "metrics":
        return logits.estimate(model_shape(model, 0, ""), 2048, LOWS, {}, 0.0)
    if name == "contracts":
        shape = model_shape(model, 50 + contracts.PADS, DEFAULT_PROMPT)
        return memory.compare_contracts(shape, max([2, *(batches or [])]), CONTRACT_DTYPES)
    shape = model_shape(model, 50, DEFAULT_PROMPT)
    return memory.compare_model(shape, LOWS) if name == "steps50" else memory.compare_layers(shape, LOWS)


def measure(argv: list[str], work: Path) -> dict:
    out = work / "peak.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", CHILD, str(out), *argv], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    got = json.loads(out.read_text()) if out.is_file() else {"base": 0, "peak": 0}
    return got | {"rc": p.returncode, "stderr": p.stderr.strip()[-400:], "stdout": p.stdout}


def run_one(name: str, model: str, work: Path) -> dict:
    from precisionlab.engines.shape import model_shape
    from precisionlab.runtime import memory

    shape = model_shape(model, 0, "")
    if name == "plain":
        m = measure(["plain", model], work)
        return {"run": "plain transformers loop (fp32, bf16, fp16; 50 steps)", **m, "estimate": None,
                "weights_and_copy": shape.weight_bytes + 4 * shape.params}
    argv, dtypes = RUNS[name]
    m = measure([*argv, "--model", model, "--json"], work)
    if m["rc"] == 0 and name == "contracts":
        m["batches"] = json.loads(m["stdout"])["params"]["batches"]
        m["batches_left_out"] = json.loads(m["stdout"])["params"]["batches_left_out"]
    largest = max(memory.COPY_BYTES[d] * shape.params for d in dtypes)
    return {"run": " ".join(argv), **m, "estimate": estimate(name, model, m.get("batches")),
            "weights_and_copy": shape.weight_bytes + largest}


def show(r: dict, plain_peak: int | None) -> str:
    growth = r["peak"] - r["base"]
    est = r["estimate"]
    parts = [f"{r['run']}: rc {r['rc']}, peak {r['peak'] / GiB:.2f} GiB (growth {growth / GiB:.2f})"]
    if est:
        parts.append(f"estimate {est / GiB:.2f} GiB, growth/estimate {growth / est:.2f}, peak/estimate "
                     f"{r['peak'] / est:.2f}")
    parts.append(f"peak/(stored weights + largest copy) {r['peak'] / r['weights_and_copy']:.2f}")
    if plain_peak and r["estimate"] is not None:
        parts.append(f"peak/plain loop {r['peak'] / plain_peak:.2f}")
    if r.get("batches") is not None:
        parts.append(f"batches run {r['batches']}, left out {[b['batch'] for b in r['batches_left_out']]}")
    if r["rc"] != 0:
        parts.append("stderr: " + r["stderr"])
    return "; ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.6b")
    ap.add_argument("--only", help="comma-separated runs of " + ", ".join([*RUNS, "plain"]))
    ap.add_argument("--keep", help="build the model in this folder (kept; reused when it exists)")
    ap.add_argument("--json", help="write the numbers to this file")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else SETS[args.shape]
    work = Path(tempfile.mkdtemp(prefix="bench_realsize_"))
    try:
        model = str(build(Path(args.keep) if args.keep else work / f"qwen3-{args.shape}", args.shape))
        results, plain = [], None
        for name in ["plain", *[n for n in names if n != "plain"]] if "plain" in names else names:
            r = run_one(name, model, work)
            plain = r["peak"] if name == "plain" else plain
            results.append(r)
            print(show(r, plain), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps([{k: v for k, v in r.items() if k != "stdout"} for r in results],
                                                  indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
