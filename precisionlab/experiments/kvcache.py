"""kvcache: a model with its KV cache kept in fp8.

The embedded model, or a Hugging Face causal LM (`--model hf:DIR`), computes in
fp32 throughout; only what the cache stores changes:
  fp32                      the reference cache (the model as shipped);
  bf16                      K and V rounded to bf16;
  fp8_e4m3 / fp8_e5m2 with  unit        scale 1: the values as they are;
                            calibrated  one scale per layer for K and one for V,
                                        amax / fp8 max measured on a separate
                                        calibration text (the first
                                        CALIBRATION_CHARS characters of the
                                        training text), fixed afterwards;
                            dynamic     one scale per (head, token) vector,
                                        its amax / fp8 max, computed as the
                                        entry is written.
An fp8 entry is x / s rounded to nearest even, clamped to +-max (saturating),
times s. `activation_scale` multiplies K and V before they are stored and
divides them after they are read: the same model with large activations in
its cache, as models with outlier channels have.

Where the cache sits is the engine's KV-cache hook (engines/protocol.py,
Engine.session(model, stores)): the embedded model's `Attention.kv_store`;
for a Hugging Face model a transformers DynamicCache whose update() rounds the
new keys and values before appending them (engines/hf.py,
`stored_cache_class`). The rounding itself (KVStore, below) is this
experiment's, not the engine's. Both receive the keys
after RoPE (what both caches hold), and in both attention reads what the cache
returns, so every query reads quantized K and V, its own token's included, in
the prompt's pass as in each decoding step. A Hugging Face model's cache holds
its key/value heads (fewer than the query heads under GQA): dynamic scales are
per key/value head.

Per cache: the teacher-forced logit error along the reference's greedy path
against the fp32 cache, its ratio to the bf16 cache's, the next-token
distribution statistics of `compare model --metrics` (precisionlab.numerics.distribution:
KL, top-1 agreement, delta-p, flips by fp32's margin) on the same logits
against the fp32 cache and against the bf16 cache, the number of saturated
cache entries (an entry whose scaled value lies past max + half the format's
last spacing: where rounding without a range limit would have gone past max,
so the clamp changed it), and the first step where free-running greedy
decoding leaves the reference's tokens (a non-finite logit leaves it: NaN
never agrees).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from precisionlab.engines.protocol import check_finite, greedy, require
from precisionlab.engines.registry import DEFAULT_PROMPT, DEFAULT_SPEC
from precisionlab.experiments import startup
from precisionlab.runtime import devices, memory, progress
from precisionlab.numerics import compare as comparison, distribution
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.errors import NoDeviceError, RunError, UsageError
from precisionlab.runtime.torch_import import import_torch

FP8 = formats.FP8  # the caches' formats: fp32 and bf16 caches are the yardsticks
SCALES = ("unit", "calibrated", "dynamic")
CALIBRATION_CHARS = 512


@dataclass
class KVCacheConfig:
    dtypes: str | None = None     # fp8 formats; None: both
    scales: str | None = None     # None: all three
    activation_scale: float = 1.0
    steps: int = 50
    prompt: str = DEFAULT_PROMPT
    device: str = "cpu"
    seed: int = 0
    model: str | None = DEFAULT_SPEC  # an engine spec (engines/registry.py); None: the embedded model
    text: str | None = None  # --text: the calibration text file; None: the shipped Shakespeare's start
    chat: bool = False  # --chat: --prompt under the model's chat template


@dataclass
class KVCacheResult:
    params: dict
    rows: list[dict]
    model_info: dict
    takeaways: list[str]


class KVStore:
    """One layer's cache format: what it stores of K and V. Counts what it stores."""

    def __init__(self, fmt: str | None, mode: str | None, activation_scale: float,
                 calibrated: tuple[float, float] | None = None):
        self.fmt = None if fmt is None else formats.get(fmt)
        self.mode, self.a, self.calibrated = mode, activation_scale, calibrated
        self.amax = [0.0, 0.0]  # of K and V as stored (activation scale applied)
        self.entries = 0
        self.saturated = 0
        self.heads = self.head_dim = 0  # of the last K written: (batch, heads, tokens, head_dim)

    def __call__(self, k, v):
        self.heads, self.head_dim = int(k.shape[1]), int(k.shape[-1])
        return self._store(k, 0), self._store(v, 1)

    def _store(self, x, which: int):
        torch = import_torch()
        y = x.float() * self.a
        self.amax[which] = max(self.amax[which], float(y.abs().max()))
        self.entries += y.numel()
        if self.fmt is None:
            q = y
        elif self.fmt.name == "bf16":
            q = y.to(torch.bfloat16).float()
            self.saturated += int((~torch.isfinite(q) & torch.isfinite(y)).sum())
        else:
            top = self.fmt.max
            if self.mode == "unit":
                s = torch.ones((), dtype=torch.float32, device=y.device)
            elif self.mode == "calibrated":
                amax = self.calibrated[which]
                s = torch.tensor(amax / top if amax > 0 else 1.0, dtype=torch.float32, device=y.device)
            else:  # dynamic: per (batch, head, token), over head_dim
                s = y.abs().amax(dim=-1, keepdim=True) / top
                s = torch.where(s > 0, s, torch.ones_like(s))
            z = y / s
            # past max + half the last spacing, an unbounded format would round above max; at
            # exactly that midpoint only when ties go up, i.e. max's last significand bit is odd
            # (e5m2: 57344 = 7 * 8192 -> 65536; e4m3: 448 = 14 * 32 keeps 448 at 464)
            last = float(self.fmt.spacing(top))
            beyond = top + last / 2
            tie_up = int(top / last) % 2 == 1
            over = (z.abs() >= beyond) if tie_up else (z.abs() > beyond)
            self.saturated += int((over | ~torch.isfinite(z)).sum())
            q = z.clamp(-top, top).to(self.fmt.torch_dtype).float() * s
        return (q / self.a).to(x.dtype)


class Stores(dict):
    """Layer index -> KVStore, made on first use: a Hugging Face model calls
    its cache by layer index, and a hybrid model's non-attention layers never
    do."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, i):
        self[i] = store = self.make(i)
        return store

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.values())

    @property
    def saturated(self) -> int:
        return sum(s.saturated for s in self.values())


def calibration_text(path: str | None = None) -> str:
    """The first CALIBRATION_CHARS characters of the user's --text (a real model is calibrated on text
    like its own use, not on the character model's Shakespeare), else of the shipped Shakespeare."""
    if path is not None:
        p = inputs.check_regular_file(path, "--text")
        try:
            with p.open(encoding="utf-8") as f:  # only what is used: a large file is not read whole
                return f.read(CALIBRATION_CHARS)
        except UnicodeDecodeError as e:
            raise UsageError(f"--text {path!r}: not UTF-8 text (byte {e.start})") from None
        except OSError as e:
            raise UsageError(f"--text {path!r}: cannot read ({e.strerror})") from None
    from precisionlab.engines import charlm

    return charlm.DEFAULT_WEIGHTS.with_name("shakespeare.txt").read_text("utf-8")[:CALIBRATION_CHARS]


def _forced(engine, stores, ids: list[int], first: int) -> np.ndarray:
    """Logits predicting ids[first:], reading the whole path in one pass (through the same cache)."""
    return engine.session(engine.base, stores)(ids[:-1])[first - 1:].double().cpu().numpy()


def run(cfg: KVCacheConfig, advance=lambda k=1: None) -> KVCacheResult:
    kv_dtypes = startup.parse_dtypes(cfg.dtypes, FP8)
    modes = inputs.parse_choices(cfg.scales, SCALES, "KV scale")
    if not (math.isfinite(cfg.activation_scale) and cfg.activation_scale > 0):
        raise UsageError(f"--activation-scale must be a positive finite number (got {cfg.activation_scale})")
    startup.check_run(cfg.steps, cfg.prompt)
    startup.check_chat(cfg.model, cfg.chat)
    plan = devices.resolve(cfg.device)
    torch = import_torch()
    from precisionlab.engines import charlm

    if plan.cuda and not torch.cuda.is_available():
        if not plan.cpu:
            raise NoDeviceError("--device cuda: torch sees no CUDA device")
    names = [d for d in plan.names if d == "cpu" or torch.cuda.is_available()]
    text = calibration_text(cfg.text) if cfg.text is not None else None  # a bad file: refused before loading
    if text is None and not charlm.DEFAULT_WEIGHTS.with_name("shakespeare.txt").is_file():
        raise RunError(f"the calibration text is missing ({charlm.DEFAULT_WEIGHTS.with_name('shakespeare.txt')})")

    rows: list[dict] = []
    info: dict = {}
    calibration_tokens = 0
    with startup.numerics(), torch.no_grad():  # fp32 means IEEE fp32 here
        for device in names:
            engine = startup.open_engine(cfg.model, device, cfg.steps, cfg.prompt,
                                         lambda s: memory.kvcache(s, CALIBRATION_CHARS),
                                         f"kvcache --model {cfg.model or DEFAULT_SPEC} --steps {cfg.steps}")
            try:
                require(engine, "stores_kv", "kvcache", UsageError)
                prompt = engine.prompt_ids(cfg.prompt, cfg.steps, cfg.chat)
                source = f"--text {cfg.text!r}" if cfg.text is not None else "the calibration text"
                calibration = engine.encode(text if text is not None else calibration_text(),
                                            source)[:int(engine.max_len)]
                if not calibration:
                    raise RunError("the calibration text encodes to no tokens with this model's tokenizer")
                device_rows, info = _device_rows(engine, prompt, calibration, cfg, kv_dtypes, modes, device,
                                                 advance)
            finally:
                engine.close()
            rows += device_rows
            calibration_tokens = len(calibration)
    return KVCacheResult(
        params={"model": cfg.model or DEFAULT_SPEC, "dtypes": kv_dtypes, "scales": modes,
                "activation_scale": cfg.activation_scale, "steps": cfg.steps, "prompt": cfg.prompt, "chat": cfg.chat,
                "device": cfg.device, "calibration_chars": CALIBRATION_CHARS,
                "calibration_tokens": calibration_tokens, "text": cfg.text, "seed": cfg.seed},
        rows=rows, model_info=info, takeaways=takeaways(rows))


def _device_rows(engine, prompt: list[int], calibration: list[int], cfg: KVCacheConfig, kv_dtypes, modes,
                 device: str, advance) -> tuple[list[dict], dict]:
    a = cfg.activation_scale
    m = engine.base  # fp32 throughout: only what the cache stores changes
    ref_tokens, _ = greedy(engine, m, prompt, cfg.steps, where="greedy decoding, fp32 cache")
    path = prompt + ref_tokens
    ref = _forced(engine, None, path, len(prompt))
    for i, row in enumerate(ref):
        check_finite(row, "fp32", i, "teacher-forced, fp32 cache")
    targets = np.asarray(ref_tokens, dtype=np.int64)
    cal = Stores(lambda i: KVStore(None, None, a))
    engine.calibrate(m, cal, calibration)
    calibrated = {i: tuple(s.amax) for i, s in cal.items()}
    some = next(iter(cal.values()))
    info = engine.cache_info() | {"cache_layers": len(cal), "kv_heads": some.heads, "head_dim": some.head_dim}

    def store_for(fmt, mode):
        def make(i):
            if mode == "calibrated" and i not in calibrated:
                raise RunError(f"layer {i} wrote its KV cache in this run but not in the calibration pass")
            return KVStore(None if fmt == "fp32" else fmt, mode, a, calibrated.get(i))
        return make

    # bf16 first: every other cache is also measured against it; rows keep the table's order
    order = [("bf16", None), ("fp32", None)] + [(d, mode) for d in kv_dtypes for mode in modes]
    bf16 = None
    rows = []
    for i, (fmt, mode) in enumerate(order):
        progress.stage(f"{device} {fmt} cache, {mode} scale", i, len(order))
        tokens, _ = greedy(engine, m, prompt, cfg.steps, stores=Stores(store_for(fmt, mode)), strict=False)
        stores = Stores(store_for(fmt, mode))
        logits = _forced(engine, stores, path, len(prompt))  # the teacher-forced pass alone is counted
        err = np.array([comparison.rel_l2(logits[i], ref[i]) for i in range(ref.shape[0])])  # per step
        first = next((i for i in range(cfg.steps) if i >= len(tokens) or tokens[i] != ref_tokens[i]), None)
        dist = distribution.summarize(distribution.position_stats(ref, logits, targets))
        if fmt == "bf16":
            bf16 = {"logits": logits, "mean_rel_l2": float(np.mean(err)), "kld_mean": dist["kld_mean"]}
        dist_bf16 = distribution.summarize(distribution.position_stats(bf16["logits"], logits, targets))
        sat = stores.saturated
        rows.append({"device": device, "cache": fmt, "scale": mode, "activation_scale": a,
                     "mean_rel_l2": float(np.mean(err)), "max_rel_l2": float(np.max(err)),
                     "vs_bf16": comparison.ratio(float(np.mean(err)), bf16["mean_rel_l2"]),
                     "saturated": sat, "entries": stores.entries,
                     "first_divergence": first, "tokens_agree": first is None,
                     "kld_mean": dist["kld_mean"], "kld_vs_bf16": comparison.ratio(dist["kld_mean"], bf16["kld_mean"]),
                     "top1_agree_pct": dist["top1_agree_pct"],
                     "distribution": dist, "distribution_vs_bf16_cache": dist_bf16,
                     "flag": "saturating" if sat else ""})
        advance()
    rows.insert(0, rows.pop(1))  # fp32, bf16, then the fp8 caches
    return rows, info


def _x(v) -> str:
    return "-" if v is None else f"{v:.3g}x"


def takeaways(rows: list[dict]) -> list[str]:
    out = []
    for dev in dict.fromkeys(r["device"] for r in rows):
        rs = [r for r in rows if r["device"] == dev]
        for r in rs:
            if r["flag"]:
                out.append(f"{dev}: {r['cache']} {r['scale']} scale saturates {r['saturated']} of {r['entries']} "
                           f"cache entries: logit error {r['mean_rel_l2']:.3g}, {_x(r['vs_bf16'])} the bf16 "
                           f"cache's; mean KLD {r['kld_mean']:.3g} nats, top-1 agreement "
                           f"{r['top1_agree_pct']:.3g} %.")
        dyn = [r for r in rs if r["scale"] == "dynamic"]
        for r in dyn:
            out.append(f"{dev}: {r['cache']} with dynamic per-head, per-token scales: logit error "
                       f"{r['mean_rel_l2']:.3g} ({_x(r['vs_bf16'])} the bf16 cache's), mean KLD "
                       f"{r['kld_mean']:.3g} nats ({_x(r['kld_vs_bf16'])} the bf16 cache's), {r['saturated']} "
                       "saturated.")
    return out
