"""Running the CLI the way a user does: a subprocess, its exit code, stdout, stderr."""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def loaded_timeout(seconds: float) -> float:
    """A timeout of `seconds` on an idle machine, stretched by the load per
    core: a command that takes 3 minutes alone takes 15 where the load is 10 on
    2 cores (a shared machine), and a timeout is there to end a hang, not a
    slow run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return seconds * max(1.0, max(os.getloadavg()[:2]) / cores)  # the 1- and 5-minute averages


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> Run:
    e = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    e.update({"PYTHONPATH": str(ROOT), **(env or {})})
    p = subprocess.run([sys.executable, "-m", "precisionlab", *args], capture_output=True, text=True, env=e,
                       timeout=timeout, cwd=ROOT)
    return Run(p.returncode, p.stdout, p.stderr)


def cli_in_process(*argv: str, pre: str = "", from_bash: bool = False) -> subprocess.CompletedProcess:
    """The CLI run by runpy in a fresh interpreter, after the statements `pre`,
    so that what it imported shows: its stderr ends with TORCH=True or
    TORCH=False (whether torch was imported). from_bash: started from a bash, as
    a user types it (typer's --show-completion names the shell it was started
    from)."""
    code = (f"import sys, runpy\n{pre}\nsys.argv = {['precisionlab', *argv]!r}\n"
            "try:\n    runpy.run_module('precisionlab', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "sys.stderr.write('TORCH=' + str('torch' in sys.modules))\n")
    command = ["bash", "-c", '"$0" -c "$1"; exit $?', sys.executable, code] if from_bash else [sys.executable, "-c", code]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity literals."""
    def bad(c):
        raise ValueError(f"non-strict JSON constant {c}")
    return json.loads(text, parse_constant=bad)


class StrictRun(Run):
    """A run whose stdout must be strict JSON where it is read as JSON."""

    def json(self):
        return strict_json(self.out)


def one_line(r: Run, code: int, *words: str) -> None:
    """A refusal as the house says it: exit `code`, one line on stderr that
    starts "precisionlab: " and holds each of `words`, no internal error, no
    traceback, no C function's error string."""
    assert r.code == code, (r.code, r.out[-500:], r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("precisionlab: "), r.err
    assert "internal error" not in r.err and "Traceback" not in r.err
    assert not re.search(r"\bpl_[a-z_]+:", r.err), f"a C error string reached the user: {r.err}"
    for w in words:
        assert w in r.err, (w, r.err)


def fail_if_a_model_runs(monkeypatch) -> None:
    """Every model-running experiment fails if it starts: the refusal must come first."""
    import pytest

    from precisionlab.engines import embedded, hf
    from precisionlab.experiments import logits

    boom = lambda *a, **k: pytest.fail("the run started before its outputs were checked")  # noqa: E731
    monkeypatch.setattr(embedded.EmbeddedEngine, "__init__", boom)  # opening an engine is the run's start
    monkeypatch.setattr(hf.HFEngine, "__init__", boom)
    monkeypatch.setattr(logits, "distribution", None)


# The JSON field glossary (docs/json.md), as rules a document can be checked
# against: one name for each quantity, so no document may use a synonym.
GLOSSARY_FORBIDDEN = {
    # a time is in seconds and its key ends in _s (time_s, load_s, run_s, p10_s)
    "seconds": "time_s", "time": "time_s", "elapsed": "time_s", "duration": "time_s",
    # the largest |yours - reference| is max_abs_error; between two runs or variants, max_abs_diff
    "max_abs": "max_abs_error", "max_abs_err": "max_abs_error", "max_err": "max_abs_error",
    "max_error": "max_abs_error", "maxabs": "max_abs_error", "mean_abs": "mean_abs_error",
    # the statistic first: mean_rel_l2, max_rel_l2
    "rel_l2_mean": "mean_rel_l2", "rel_l2_max": "max_rel_l2",
    # a row's format is its dtype; a second format has its role's name (accumulator, cache, element, scale)
    "storage": "dtype", "storage_dtype": "dtype", "format_name": "dtype",
    "cpu_threads": "torch_threads",
    # one word for a way of computing an op: the catalog's variant
    "method": "variant", "methods": "variants", "kernel": "variant",
    "plan_method": "plan_variant", "plan_version": "plan_kernel",
    # the reference by its role, whatever its format (fp32 in compare metrics, REF in compare logits)
    "ppl_fp32": "ppl_ref", "fp32_top1_in_top5_pct": "ref_top1_in_top5_pct",
    "top1_in_fp32_top5_pct": "top1_in_ref_top5_pct",
    # the share of tokens whose choice flipped (router, compare routing, flips_by_margin)
    "flip_rate": "flip_share",
}
_TIME_UNIT = re.compile(r"(^|_)(ms|us|ns|sec|secs|seconds|millis)$")
_ABS = re.compile(r"max_abs(?!_error|_diff)|(^|_)(mean|median|p\d+)_abs$")


def json_glossary_problems(doc, where: str = "") -> list[str]:
    """Every key in doc (recursively) that breaks the glossary, with its path and
    the name to use; also a `dtype` that is not one format or `dtypes` not a list."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            path = f"{where}.{k}" if where else k
            if k in GLOSSARY_FORBIDDEN:
                out.append(f"{path}: use {GLOSSARY_FORBIDDEN[k]}")
            elif _TIME_UNIT.search(k):
                out.append(f"{path}: a time is in seconds, *_s")
            elif _ABS.search(k):
                out.append(f"{path}: *_abs_error (against a reference) or *_abs_diff (between runs)")
            if k == "dtype" and not (v is None or isinstance(v, str)):
                out.append(f"{path}: dtype is one format; a list is dtypes")
            if k == "dtypes" and not (v is None or isinstance(v, list)):
                out.append(f"{path}: dtypes is a list")
            out += json_glossary_problems(v, path)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += json_glossary_problems(v, f"{where}[{i}]")
    return out


TINY_WORDS = ["[UNK]", "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "it"]


def save_tiny_qwen(folder: Path, hidden: int = 32, layers: int = 2, words=TINY_WORDS, edit=None,
                   vocab: int | None = None) -> Path:
    """A random Qwen3 (seed 0; GQA: 4 query heads, 2 key/value heads of hidden / 4;
    MLP 2 x hidden) with a word-level tokenizer over `words`, saved as a local
    folder. edit(model), when given, changes the model before it is saved.
    vocab: the model's vocabulary where wider than the tokenizer's (a real
    model's 151,936 logits a position at a tiny hidden size)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=max(len(words), vocab or 0), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=64)
    return _save_word_model(folder, Qwen3ForCausalLM, cfg, words, edit)


def _save_word_model(folder: Path, model_class, cfg, words, edit) -> Path:
    """model_class(cfg) drawn at seed 0, edited, saved beside a word-level tokenizer over `words`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    torch.manual_seed(0)
    model = model_class(cfg)
    if edit is not None:
        edit(model)
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return Path(folder)


MOE_WORDS = ["[UNK]"] + [f"w{i}" for i in range(63)]


def save_tiny_qwen3_moe(folder: Path, layers: int = 3, experts: int = 16, top_k: int = 4, hidden: int = 32,
                        edit=None) -> Path:
    """A random Qwen3-MoE (seed 0; `experts` routed experts of width 16, top_k
    a token, the top-k weights normalised; 128 positions) with a word-level
    tokenizer over w0 ... w62, saved as a local folder. edit(model), when
    given, changes the model before it is saved."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=len(MOE_WORDS), hidden_size=hidden, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
                         max_position_embeddings=128)
    return _save_word_model(folder, Qwen3MoeForCausalLM, cfg, MOE_WORDS, edit)


def embedded_gguf(tmp_path_factory, name: str, quant: str) -> str:
    """The embedded model exported to NAME.gguf as gguf:QUANT (skipped without llama-cpp-python and gguf)."""
    import pytest

    pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package")
    path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
    r = cli("export", "embedded", "--to", f"gguf:{quant}", "--out", str(path))
    assert r.code == 0, r.err
    return str(path)


def save_char_qwen(folder: Path, hidden: int, positions: int, seed: int) -> Path:
    """A random Qwen3 (2 layers, MLP 2 x hidden, 4 query heads and 2 key/value
    heads of hidden / 4, tied head, initializer range 0.1) with the embedded
    model's character tokenizer, saved as a local folder: what the exporters'
    tests translate."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from precisionlab.engines import charlm
    from precisionlab.engines.exporters import hf

    _, tok = charlm.load_default(torch.float32)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=positions, tie_word_embeddings=True, initializer_range=0.1)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)
    hf.char_tokenizer(tok.vocab).save_pretrained(str(folder))
    return Path(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_server(argv_for_port, log_path: Path, probe: str, ready, *, what: str, env=None, cwd=None):
    """A server the test starts on 127.0.0.1 and stops by its pid: argv_for_port(port)
    is its command line; yields its URL once GET url+probe answers 200 with a JSON
    body ready() accepts (readiness, not a fixed wait, as long as the process lives,
    up to two minutes stretched by the load); its output goes to log_path."""
    port = free_port()
    log = open(log_path, "w")
    p = subprocess.Popen(argv_for_port(port), stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + loaded_timeout(120)
        while True:
            assert p.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + probe, timeout=2) as resp:
                    if resp.status == 200 and ready(json.loads(resp.read())):
                        break
            except (OSError, ValueError):  # refused while it starts; 503 or a partial body while the model loads
                pass
            assert time.monotonic() < deadline, f"{what} not ready in time:\n" + log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(loaded_timeout(10))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def registered_commands(option: str | None = None) -> list[str]:
    """Every command cli/app.py's COMMANDS registers ('accumulate', 'compare op'),
    in its order; with `option` ('--seed', '--plot'), those that take it. Tests
    that cover every command parametrize over this, so a new command joins them
    the day it is registered."""
    import typer.main

    from precisionlab.cli import app as cli_app

    root = typer.main.get_command(cli_app.app)
    out = []
    for group, name, _module in cli_app.COMMANDS:
        cmd = (root.commands[group].commands if group else root.commands)[name]
        if option is None or any(option in p.opts for p in cmd.params):
            out.append(f"{group} {name}" if group else name)
    return out


def registered(names: dict):
    """A fixture's body (`yield from registered({...})`): the test's engines
    under their registry names for one test, unregistered after it."""
    from precisionlab.engines import registry

    for k, v in names.items():
        registry.register(k, v)
    try:
        yield
    finally:
        for k in names:
            registry.unregister(k)


def temperature_streams(n: int, sequences: int, seed: int = 13, vocab: int = 40, k: int = 8):
    """Two log-prob streams (io/logprob_streams) of one text, B sampled at temperature 0.7 where A is at 1,
    with each side's top-k: the temperature diagnosis's planted case."""
    import numpy as np

    from precisionlab.io import logprob_streams as ls

    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, vocab)) * 2.5

    def logsm(x):
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    la, lb = logsm(logits), logsm(logits / 0.7)
    chosen = np.array([rng.choice(vocab, p=np.exp(lb[i])) for i in range(n)])
    rows, offsets = np.arange(n), np.linspace(0, n, sequences + 1).astype(np.int64)
    ta, tb = np.argsort(-la, 1)[:, :k], np.argsort(-lb, 1)[:, :k]
    a = ls.from_arrays(chosen, la[rows, chosen], offsets, ta, np.take_along_axis(la, ta, 1))
    b = ls.from_arrays(chosen, lb[rows, chosen], offsets, tb, np.take_along_axis(lb, tb, 1))
    return a, b


def write_logits_file(path, logits, tokens, **meta) -> str:
    """A logits file as `compare metrics --save-logits` writes one (io/logits_file): 'logits' (positions x
    vocab, float32), 'tokens' (int64) and `meta` as string metadata. Returns the path as a string."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"logits": np.asarray(logits, np.float32), "tokens": np.asarray(tokens, np.int64)}, str(path),
              metadata={k: str(v) for k, v in meta.items()} or None)
    return str(path)


def reference_logits(seed: int, n: int, vocab: int):
    """(rng, ref, tokens): a reference run for compare logits: n positions of standard normal logits times
    2.5 in float32 (peaked, far from one-hot) and n random tokens; rng goes on to draw the test's noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ref = (rng.standard_normal((n, vocab)) * 2.5).astype(np.float32)
    return rng, ref, rng.integers(0, vocab, n)


def planted_gguf_pair(root, ref, planted: str, scale: float, quant: str):
    """A copy of the HF folder `ref` with the tensor `planted` scaled by `scale`, and both exported to GGUF
    in `quant`: (root/clean.gguf, root/bug.gguf)."""
    from safetensors.torch import load_file, save_file

    from precisionlab.engines.exporters import gguf

    bug = root / "hf-bug"
    bug.mkdir()
    for f in ref.iterdir():
        (bug / f.name).write_bytes(f.read_bytes())
    tensors = load_file(bug / "model.safetensors")
    tensors[planted] = tensors[planted] * scale
    save_file(tensors, bug / "model.safetensors", metadata={"format": "pt"})
    gguf.write(str(ref), str(root / "clean.gguf"), quant)
    gguf.write(str(bug), str(root / "bug.gguf"), quant)
    return root / "clean.gguf", root / "bug.gguf"


def need_gguf_engine() -> None:
    """Skip where llama.cpp's engine or the GGUF export cannot run (precisionlab[engines])."""
    import pytest

    pytest.importorskip("llama_cpp", reason="llama.cpp's engine needs llama-cpp-python (precisionlab[engines])")
    pytest.importorskip("gguf", reason="the GGUF export needs the gguf package (precisionlab[engines])")


def embedded_planted_ggufs(root, planted: str, scale: float, quant: str):
    """The embedded model as a Hugging Face folder (root/hf) and two GGUFs of it in `quant`: clean, and with
    `planted` scaled by `scale` in the GGUF only (planted_gguf_pair). Returns (hf folder, clean, bug)."""
    need_gguf_engine()
    from precisionlab.engines.exporters import hf

    ref = root / "hf"
    ref.mkdir()
    hf.write_embedded(str(ref))
    return (ref, *planted_gguf_pair(root, ref, planted, scale, quant))


def gguf_layers(run, gguf_path, ref, code: int, prompt=("--prompt", "ROMEO:\n", "--steps", "24")) -> dict:
    """`compare layers --json` of a GGUF under llama.cpp (its KV cache in f32) against the HF folder `ref`
    (None: the source its export recorded), bf16 the low dtype: its document, once the run exited `code`
    (else the error and the first flags are shown)."""
    refs = ["--reference", f"hf:{ref}"] if ref else []
    r = run("compare", "engine-layers", "--engine", f"llamacpp:{gguf_path},kv=f32", *refs, "--dtypes", "bf16", *prompt,
            "--json")
    doc = strict_json(r.out) if r.out.strip() else None
    assert r.code == code, (r.code, r.err, doc and doc["flags"][:3])
    return doc
