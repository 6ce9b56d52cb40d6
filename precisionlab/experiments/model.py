"""compare model: one model in fp32 and in bf16/fp16 on the same input.

Free-running: greedy decoding in each dtype; where does it first leave the
fp32 path, and how close were fp32's top two logits there?
Teacher-forced: every dtype reads the fp32 greedy path, so the per-step logit
errors stay comparable after the free-running paths split.

The default model ships with the package (precisionlab/models): a trained
character-level decoder stored in bf16, so its fp32 run is an exact upcast and
the differences measure the arithmetic alone. --model loads a Hugging Face
causal LM from a local directory or the local cache, never the network.
"""

from __future__ import annotations

import copy
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

from pathlib import Path

import numpy as np

from precisionlab.engines import shape
from precisionlab.runtime import devices, threads
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.numerics import metrics
from precisionlab.errors import NoDeviceError, RunError, UsageError

DEFAULT_PROMPT = "ROMEO:\n"
LOW_DTYPES = ("bf16", "fp16")


@dataclass
class ModelConfig:
    model: str | None = None
    steps: int = 50
    prompt: str = DEFAULT_PROMPT
    dtypes: str = "bf16,fp16"
    device: str = "cpu"
    seed: int = 0
    threads: int | None = None  # torch CPU threads; None: sized for the model (precisionlab.runtime.threads)


@dataclass
class ModelResult:
    params: dict
    rows: list[dict]       # teacher-forced, one per (dtype, step)
    summary: list[dict]    # free-running, one per dtype
    texts: dict[str, str]
    model_info: dict
    takeaways: list[str]
    timing: dict


def _torch():
    import torch

    return torch


def _tdtype(name: str):
    _torch()
    return formats.get(name).torch_dtype


# ---------------------------------------------------------------------------
# runners: the embedded model and Hugging Face models behind one interface


class Runner:
    """Greedy decoding with a KV cache and full-sequence logits, for any model
    that implements _prefill, _step and _all."""

    base = tok = None
    device = "cpu"

    def model(self, dtype: str):
        return copy.deepcopy(self.base).to(_tdtype(dtype))

    def greedy(self, model, prompt: list[int], steps: int, dtype: str = "fp32"):
        """tokens, and the logits each was chosen from (steps x vocab, float64)."""
        torch = _torch()
        ids, out = list(prompt), []
        with torch.no_grad():
            logits, state = self._prefill(model, torch.tensor([ids], device=self.device))
            for step in range(steps):
                last = logits.double().cpu().numpy()
                check_finite(last, dtype, step, "greedy decoding")
                out.append(last)
                ids.append(int(np.argmax(last)))
                logits, state = self._step(model, torch.tensor([ids[-1:]], device=self.device), state, len(ids) - 1)
        return ids[len(prompt):], np.stack(out)

    def forward_all(self, model, ids: list[int]) -> np.ndarray:
        torch = _torch()
        with torch.no_grad():
            return self._all(model, torch.tensor([ids], device=self.device)).double().cpu().numpy()


def check_finite(logits: np.ndarray, dtype: str, step: int, where: str) -> None:
    """Non-finite logits end the run (exit 1): every figure after them would be
    NaN, and an argmax over NaN picks token 0 and calls it a prediction."""
    if np.all(np.isfinite(logits)):
        return
    from precisionlab.errors import RunError

    n_nan, n_inf = int(np.isnan(logits).sum()), int(np.isinf(logits).sum())
    raise RunError(f"{dtype} logits became non-finite at step {step} ({where}): {n_nan} NaN and {n_inf} inf of "
                   f"{logits.size}; NaN or inf in the weights, or an overflow in {dtype}")


class EmbeddedRunner(Runner):
    def __init__(self, device: str):
        from precisionlab.errors import RunError
        from precisionlab.engines import charlm

        if not charlm.DEFAULT_WEIGHTS.is_file():
            raise RunError(f"the embedded model's weights are missing ({charlm.DEFAULT_WEIGHTS}): "
                           "reinstall, or train them with scripts/train_model.py")
        self.base, self.tok = charlm.load_default(_tdtype("fp32"), device)
        self.device = device
        self.name = "precisionlab char-LM (embedded, bf16 weights)"
        self.max_len = self.base.cfg.max_seq_len

    def info(self) -> dict:
        n = sum(p.numel() for p in self.base.parameters())
        return {"name": self.name, "parameters": n, "vocab": len(self.tok), "max_seq_len": self.max_len}

    def encode(self, text: str) -> list[int]:
        missing = sorted({c for c in text if c not in self.tok.index})
        if missing:
            raise UsageError(f"--prompt has characters the embedded model does not know: {''.join(missing)!r}")
        return self.tok.encode(text)

    def decode(self, ids) -> str:
        return self.tok.decode(ids)

    def _prefill(self, model, ids):
        logits, cache = model(ids)
        return logits[0, -1], cache

    def _step(self, model, token, cache, pos):
        logits, cache = model(token, cache, pos)
        return logits[0, -1], cache

    def _all(self, model, ids):
        return model(ids)[0][0]


# The files of a model folder that can name custom code for transformers to import.
_CODE_MAPS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
              "generation_config.json")


def refuse_foreign_code(folder) -> None:
    """Refuse (exit 2) a model folder that could make transformers import code
    from it: a config with auto_map (custom classes in the folder's .py files).
    trust_remote_code=False would refuse them too; this says why in one line,
    before transformers is asked anything. Entries that are not regular files
    or folders (FIFOs, devices) are refused as well: reading one would hang."""
    import json
    import stat

    for entry in sorted(folder.iterdir()):
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link: transformers reports it if it needs the file
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise UsageError(f"--model {str(folder)!r}: {entry.name!r} is not a regular file (a FIFO, device or "
                             "socket); refused")
    for name in _CODE_MAPS:
        f = folder / name
        if not f.is_file():
            continue
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue  # unreadable: transformers gives the error
        if isinstance(doc, dict) and doc.get("auto_map"):
            raise UsageError(f"--model {str(folder)!r}: {name} maps to custom code (auto_map); "
                             "precisionlab never runs code from a model folder")


@contextmanager
def _quiet_library():
    """Nothing transformers prints reaches stdout (under --json stdout is the
    JSON alone), its progress bars and notices go away, and stdin is closed to
    it: no prompt can wait for, or read, an answer."""
    import contextlib
    import io
    import sys

    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # an older transformers without these switches
        pass
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO("")  # input() gets EOF at once
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdin = saved_stdin


def cache_keyword(module, command: str) -> str:
    """The forward() keyword a cache object is passed by: `cache` in
    transformers 5.x (`past_key_values` deprecated there, to go in 5.40),
    `past_key_values` before. Neither: one line, exit 1."""
    import inspect

    try:
        names = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        names = {}
    for kw in ("cache", "past_key_values"):
        if kw in names:
            return kw
    import transformers

    raise RunError(f"transformers {getattr(transformers, '__version__', '?')}: {type(module).__name__}.forward "
                   f"takes neither cache= nor past_key_values=; {command} cannot hand it a cache")


def returned_cache(out):
    """The cache a forward() call returns, under either name (see cache_keyword)."""
    for name in ("cache", "past_key_values"):
        found = getattr(out, name, None)
        if found is not None:
            return found
    raise RunError("the model returned no cache (use_cache=True): compare model cannot decode step by step")


class HFRunner(Runner):
    def __init__(self, spec: str, device: str):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never the network, whatever the cache says
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import transformers
        except ImportError:
            raise UsageError("--model needs transformers: pip install 'precisionlab[hf]'") from None
        from pathlib import Path

        if "/" not in spec and not Path(spec).exists():
            raise UsageError(f"--model {spec!r}: no such directory (a repo id looks like org/name)")
        if Path(spec).exists() and not Path(spec).is_dir():
            raise UsageError(f"--model {spec!r} is a file; give the model's directory")
        if Path(spec).is_dir():
            refuse_foreign_code(Path(spec))
        try:
            with _quiet_library():
                config = transformers.AutoConfig.from_pretrained(spec, local_files_only=True, trust_remote_code=False)
                if getattr(config, "auto_map", None):  # a cached repo id: its config is only readable now
                    raise UsageError(f"--model {spec!r}: its config maps to custom code (auto_map); "
                                     "precisionlab never runs code from a model")
                # trust_remote_code=False on every loader: a model folder never runs its own code
                self.tok = transformers.AutoTokenizer.from_pretrained(spec, trust_remote_code=False,
                                                                      local_files_only=True)
                self.base = transformers.AutoModelForCausalLM.from_pretrained(spec, trust_remote_code=False,
                                                                              config=config, local_files_only=True)
        except UsageError:
            raise
        except Exception as e:  # OSError, ValueError, KeyError... from an unusable directory or cache entry
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"--model {spec!r}: not a loadable causal LM offline ({msg})") from None
        self.base = self.base.float().to(device).eval()
        self.device = device
        self.name = spec
        self.max_len = getattr(self.base.config, "max_position_embeddings", 1 << 20)

    def info(self) -> dict:
        n = sum(p.numel() for p in self.base.parameters())
        return {"name": self.name, "parameters": n, "vocab": int(self.base.config.vocab_size),
                "max_seq_len": self.max_len, "architecture": type(self.base).__name__}

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids) -> str:
        return self.tok.decode(ids)

    def _prefill(self, model, ids):
        res = model(input_ids=ids, use_cache=True)
        return res.logits[0, -1], returned_cache(res)

    def _step(self, model, token, cache, pos):
        res = model(input_ids=token, use_cache=True, **{cache_keyword(model, "compare model"): cache})
        return res.logits[0, -1], returned_cache(res)

    def _all(self, model, ids):
        return model(input_ids=ids).logits[0]


# ---------------------------------------------------------------------------


def open_runner(model: str | None, device: str, prompt: str, steps: int,
                memory_check: bool = False, command: str = "compare model",
                estimate=None) -> tuple[Runner, list[int]]:
    """The model (a Hugging Face folder or repo id, or the embedded one) and
    the prompt's token ids, checked to fit prompt + steps positions. A folder
    is refused first if it holds custom code or a FIFO: nothing else, the
    memory estimate (memory_check: estimate(model, steps, prompt) bytes,
    shape.compare_model_for by default, the refusal naming `command`)
    included, may open its files before that."""
    if model and Path(model).is_dir():
        refuse_foreign_code(Path(model))
    if memory_check:
        estimate = estimate or shape.compare_model_for
        inputs.check_memory(estimate(model, steps, prompt), f"{command} {model or '(embedded)'} --steps {steps}")
    runner = HFRunner(model, device) if model else EmbeddedRunner(device)
    ids = runner.encode(prompt)
    if not ids:
        raise UsageError("--prompt encodes to no tokens")
    if len(ids) + steps > runner.max_len:
        raise UsageError(f"prompt ({len(ids)} tokens) + --steps {steps} exceeds the model's "
                         f"{runner.max_len} positions")
    return runner, ids


def run(cfg: ModelConfig, advance=lambda k=1: None) -> ModelResult:
    threads.check(cfg.threads)
    with threads.torch_scope():
        return _run(cfg, advance)


def _run(cfg: ModelConfig, advance) -> ModelResult:
    if cfg.steps <= 0:
        raise UsageError(f"--steps must be > 0 (got {cfg.steps})")
    if not cfg.prompt:
        raise UsageError("--prompt is empty: greedy decoding needs at least one token to start from")
    lows = list(dict.fromkeys(d.strip() for d in cfg.dtypes.split(",") if d.strip()))  # no repeated rows
    if not lows or any(d not in LOW_DTYPES for d in lows):
        raise UsageError(f"--dtypes must be a comma list of {', '.join(LOW_DTYPES)} (got {cfg.dtypes!r})")
    device = _device(cfg.device)
    torch = _torch()
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    runner, prompt = open_runner(cfg.model, device, cfg.prompt, cfg.steps, memory_check=True)
    t_load = time.perf_counter() - t0
    # One decoding step is ~2 flops per parameter: the work each torch call does.
    n_threads = threads.fit_torch(cfg.threads, 2.0 * runner.info()["parameters"]) if device == "cpu" else None

    from precisionlab.experiments.tf32 import restored_flags

    t1 = time.perf_counter()
    with restored_flags():
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means IEEE fp32 here
        torch.backends.cudnn.allow_tf32 = False
        ref_model = runner.model("fp32")
        ref_tokens, ref_step_logits = runner.greedy(ref_model, prompt, cfg.steps, "fp32")
        path = prompt + ref_tokens
        ref_tf = runner.forward_all(ref_model, path[:-1])[len(prompt) - 1:]
        for i, row in enumerate(ref_tf):
            check_finite(row, "fp32", i, "teacher-forced")
        advance()
        texts = {"fp32": runner.decode(ref_tokens)}
        summary, rows = [], []
        for low in lows:
            m = runner.model(low)
            tokens, _ = runner.greedy(m, prompt, cfg.steps, low)
            tf = runner.forward_all(m, path[:-1])[len(prompt) - 1:]
            for i, row in enumerate(tf):
                check_finite(row, low, i, "teacher-forced, reading fp32's tokens")
            texts[low] = runner.decode(tokens)
            div = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
            step_reports = []
            for i in range(cfg.steps):
                rep = metrics.error_report(tf[i], ref_tf[i], None, 0.0, 0.0)
                step_reports.append(rep)
                rows.append({"dtype": low, "step": i, "token_fp32": ref_tokens[i], "token": tokens[i],
                             "agree": tokens[i] == ref_tokens[i] and (div is None or i < div),
                             "max_abs_error": rep.max_abs_error, "rel_l2": rep.rel_l2, "finite": rep.finite,
                             "argmax_agrees": int(np.argmax(tf[i])) == ref_tokens[i]})
            margin = None
            if div is not None:
                top2 = np.sort(ref_step_logits[div])[-2:]
                margin = float(top2[1] - top2[0])
            rel = [r.rel_l2 for r in step_reports]
            summary.append({
                "dtype": low, "agree": div is None, "diverged_at": div, "fp32_margin_at_divergence": margin,
                "divergence_char": None if div is None else len(runner.decode(tokens[:div])),
                "fp32_token_at_divergence": None if div is None else runner.decode([ref_tokens[div]]),
                "token_at_divergence": None if div is None else runner.decode([tokens[div]]),
                "mean_rel_l2": float(np.mean(rel)), "max_rel_l2": float(np.max(rel)),
                "max_abs_error": float(max(r.max_abs_error for r in step_reports)),
                "teacher_forced_argmax_flips": int(sum(not r["argmax_agrees"] for r in rows if r["dtype"] == low)),
            })
            advance()
        probs = _softmax(ref_tf)
        top1 = float(np.mean(np.max(probs, axis=1)))
    t_run = time.perf_counter() - t1
    info = runner.info() | {"mean_top1_probability_fp32": top1, "uniform_probability": 1.0 / ref_tf.shape[1]}
    return ModelResult(
        params={"model": cfg.model or "embedded", "steps": cfg.steps, "prompt": cfg.prompt, "dtypes": lows,
                "device": device, "seed": cfg.seed, "prompt_tokens": len(prompt)},
        rows=rows, summary=summary, texts=texts, model_info=info, takeaways=takeaways(summary, info),
        timing={"load_s": t_load, "run_s": t_run, "torch_threads": n_threads},
    )


def _device(choice: str) -> str:
    plan = devices.resolve(choice)
    if plan.cuda and choice != "cpu":
        return "cuda"
    if choice in ("cuda", "all") and not plan.cuda:
        raise NoDeviceError("--device cuda: no CUDA GPU available")
    return "cpu"


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def takeaways(summary: list[dict], info: dict) -> list[str]:
    top1 = info["mean_top1_probability_fp32"]
    lines = [f"fp32's mean top-1 probability along its own path is {top1:.2f} (uniform would be "
             f"{info['uniform_probability']:.3f}): "
             + ("the argmax is rarely a near-tie, so a flip is a precision effect." if top1 >= 0.3 else
                "close to uniform, so argmax flips here are mostly tie-breaking noise.")]
    for s in summary:
        if s["agree"]:
            lines.append(f"{s['dtype']}: the same tokens as fp32 all the way; logits off by rel-L2 "
                         f"{s['mean_rel_l2']:.1e} on average.")
        else:
            lines.append(f"{s['dtype']}: leaves the fp32 path at step {s['diverged_at']} "
                         f"({s['token_at_divergence']!r} for {s['fp32_token_at_divergence']!r}), where fp32's top two "
                         f"logits were {s['fp32_margin_at_divergence']:.3g} apart, below the largest logit error "
                         f"{s['max_abs_error']:.2g}; teacher-forced rel-L2 {s['mean_rel_l2']:.1e}.")
            if s["fp32_margin_at_divergence"] is not None and s["fp32_margin_at_divergence"] > s["max_abs_error"]:
                lines[-1] = lines[-1].replace("below the largest", "yet above the largest")
    return lines
