"""kvcache: a model with its KV cache kept in fp8.

The embedded model, or a Hugging Face causal LM (`--model DIR`), computes in
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

Where the cache sits: the embedded model's `Attention.kv_store`; for a Hugging
Face model a transformers DynamicCache whose update() rounds the new keys and
values before appending them (`stored_cache_class`). Both receive the keys
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

import functools
import inspect
import math
from dataclasses import dataclass

import numpy as np

from precisionlab.engines import shape
from precisionlab.runtime import devices, memory
from precisionlab.numerics import distribution
from precisionlab.catalog import formats
from precisionlab.io import inputs
from precisionlab.errors import NoDeviceError, RunError, UsageError

DEFAULT_PROMPT = "ROMEO:\n"
FP8 = ("fp8_e4m3", "fp8_e5m2")
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
    model: str | None = None      # a Hugging Face folder or cached repo id; None: the embedded model


@dataclass
class KVCacheResult:
    params: dict
    rows: list[dict]
    model_info: dict
    takeaways: list[str]


def _torch():
    import torch

    return torch


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
        torch = _torch()
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
            fp8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[self.fmt.name]
            q = z.clamp(-top, top).to(fp8).float() * s
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


# ---------------------------------------------------------------------------
# the two models behind one interface: session(stores) -> feed(ids) -> logits


class EmbeddedModel:
    """The embedded char-LM: the stores go in as each layer's Attention.kv_store."""

    def __init__(self, cfg: KVCacheConfig, device: str):
        torch = _torch()
        from precisionlab.engines import charlm

        self.model, tok = charlm.load_default(torch.float32, device)
        self.device = device
        self.layers = len(self.model.layers)
        self.info = {"name": "precisionlab char-LM (embedded, bf16 weights)",
                     "parameters": sum(p.numel() for p in self.model.parameters()), "layers": self.layers,
                     "heads": self.model.cfg.n_heads, "head_dim": self.model.cfg.head_dim}
        missing = sorted({c for c in cfg.prompt if c not in tok.index})
        if missing or not cfg.prompt:
            raise UsageError(f"--prompt must be non-empty text the model knows (unknown: {''.join(missing)!r})")
        self.prompt = tok.encode(cfg.prompt)
        if len(self.prompt) + cfg.steps > self.model.cfg.max_seq_len:
            raise UsageError(f"prompt + steps must stay within {self.model.cfg.max_seq_len} tokens")
        self.calibration = [tok.index[c] for c in calibration_text() if c in tok.index]

    def session(self, stores: Stores | None):
        torch = _torch()
        for i, layer in enumerate(self.model.layers):
            layer.attn.kv_store = None if stores is None else stores[i]
        state = {"cache": None, "pos": 0}

        def feed(ids: list[int]):
            logits, state["cache"] = self.model(torch.tensor([ids], device=self.device), state["cache"], state["pos"])
            state["pos"] += len(ids)
            return logits[0]

        return feed

    def calibrate(self, stores: Stores, ids: list[int]) -> None:
        self.session(stores)(ids)

    def close(self) -> None:
        self.session(None)


def calibration_text() -> str:
    from precisionlab.engines import charlm

    return charlm.DEFAULT_WEIGHTS.with_name("shakespeare.txt").read_text("utf-8")[:CALIBRATION_CHARS]


def _transformers_version() -> str:
    import transformers

    return getattr(transformers, "__version__", "?")


@functools.cache
def stored_cache_class():
    """A transformers DynamicCache whose update(key_states, value_states,
    layer_idx, ...) passes the new keys and values through the layer's
    KVStore before appending them, and returns what attention reads. update()
    with that head is the one Cache surface stable from transformers 4.36 to
    5.x (its later arguments changed name: cache_kwargs, then kwargs; they
    pass through untouched). Anything else: one line, exit 1."""
    try:
        from transformers import DynamicCache
    except ImportError:
        raise RunError(f"transformers {_transformers_version()} has no DynamicCache; kvcache --model needs "
                       "transformers >= 4.45") from None
    try:
        head = list(inspect.signature(DynamicCache.update).parameters)[:4]
    except (TypeError, ValueError):
        head = []
    if head != ["self", "key_states", "value_states", "layer_idx"]:
        raise RunError(f"transformers {_transformers_version()}: DynamicCache.update is not "
                       f"update(key_states, value_states, layer_idx, ...) (found {head}); kvcache --model cannot "
                       "put its fp8 rounding in this version's cache")

    class StoredCache(DynamicCache):
        def __init__(self, stores: Stores | None, config):
            try:
                super().__init__(config=config)  # what the model itself builds (sliding layers included)
            except TypeError:  # transformers before 4.56: no config argument
                super().__init__()
            self.stores = stores
            self.calls = 0

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            self.calls += 1
            if self.stores is not None:
                key_states, value_states = self.stores[layer_idx](key_states, value_states)
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    return StoredCache


class HFModel:
    """A Hugging Face causal LM, opened as compare model opens it
    (model.open_runner: no foreign code, memory checked first), fed through a
    StoredCache."""

    def __init__(self, cfg: KVCacheConfig, device: str):
        from precisionlab.experiments import model as mexp

        estimate = functools.partial(shape.kvcache_for, calibration=CALIBRATION_CHARS)
        self.runner, self.prompt = mexp.open_runner(cfg.model, device, cfg.prompt, cfg.steps, memory_check=True,
                                                    command="kvcache --model", estimate=estimate)
        self.model, self.device = self.runner.base, device
        self.cls = stored_cache_class()
        self.kw = mexp.cache_keyword(self.model, "kvcache --model")
        # Calibration needs no logits: the decoder alone (a 150k vocabulary over 512 tokens would be 300 MB).
        self.decoder = getattr(self.model, "base_model", None) or self.model
        self.decoder_kw = mexp.cache_keyword(self.decoder, "kvcache --model")
        cfg_ = self.model.config
        self.layers = int(getattr(cfg_, "num_hidden_layers", 0) or 0)
        self.info = self.runner.info() | {"layers": self.layers,
                                          "heads": int(getattr(cfg_, "num_attention_heads", 0) or 0),
                                          "transformers": _transformers_version()}
        self.calibration = self.runner.encode(calibration_text())[:int(self.runner.max_len)]
        if not self.calibration:
            raise RunError("the calibration text encodes to no tokens with this model's tokenizer")

    def _call(self, module, kw, cache, ids):
        torch = _torch()
        out = module(input_ids=torch.tensor([ids], device=self.device), use_cache=True, **{kw: cache})
        if cache.calls == 0:
            raise RunError(f"{type(module).__name__} (transformers {_transformers_version()}) never called its KV "
                           "cache's update(): kvcache --model cannot see what this model caches")
        return out

    def session(self, stores: Stores | None):
        cache = self.cls(stores, self.model.config)
        return lambda ids: self._call(self.model, self.kw, cache, ids).logits[0]

    def calibrate(self, stores: Stores, ids: list[int]) -> None:
        self._call(self.decoder, self.decoder_kw, self.cls(stores, self.model.config), ids)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------


def _greedy(feed, prompt: list[int], steps: int, strict: bool) -> list[int]:
    """Greedy tokens from a fresh session. A non-finite logit row ends the
    path there (strict, for the reference: the run fails, exit 1)."""
    from precisionlab.experiments.model import check_finite

    out: list[int] = []
    logits = feed(prompt)[-1]
    for step in range(steps):
        last = logits.double().cpu().numpy()
        if not np.isfinite(last).all():
            if strict:
                check_finite(last, "fp32", step, "greedy decoding, fp32 cache")
            break
        out.append(int(np.argmax(last)))
        if step + 1 < steps:
            logits = feed(out[-1:])[-1]
    return out


def _forced(feed, ids: list[int], first: int) -> np.ndarray:
    """Logits predicting ids[first:], reading the whole path in one pass (through the same cache)."""
    return feed(ids[:-1])[first - 1:].double().cpu().numpy()


def _rel_l2(a: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per step: ||a - ref|| / ||ref||; a non-finite logit makes the step inf."""
    out = np.empty(ref.shape[0])
    for i in range(ref.shape[0]):
        if not np.isfinite(a[i]).all():
            out[i] = math.inf
            continue
        d = a[i] - ref[i]
        out[i] = math.sqrt(math.fsum(d * d) / math.fsum(ref[i] * ref[i]))
    return out


def _ratio(a: float, b: float | None) -> float | None:
    """a / b; None where b is missing or 0 (a NaN stays NaN: it agrees with nothing)."""
    return None if b is None or b == 0 else a / b


def run(cfg: KVCacheConfig, advance=lambda k=1: None) -> KVCacheResult:
    kv_dtypes = inputs.parse_choices(cfg.dtypes, FP8, "KV cache dtype")
    modes = inputs.parse_choices(cfg.scales, SCALES, "KV scale")
    if not (math.isfinite(cfg.activation_scale) and cfg.activation_scale > 0):
        raise UsageError(f"--activation-scale must be a positive finite number (got {cfg.activation_scale})")
    if cfg.steps <= 0:
        raise UsageError(f"--steps must be > 0 (got {cfg.steps})")
    if not cfg.prompt:
        raise UsageError("--prompt is empty: greedy decoding needs at least one token to start from")
    plan = devices.resolve(cfg.device)
    torch = _torch()
    from precisionlab.engines import charlm

    if plan.cuda and not torch.cuda.is_available():
        if not plan.cpu:
            raise NoDeviceError("--device cuda: torch sees no CUDA device")
    names = [d for d in plan.names if d == "cpu" or torch.cuda.is_available()]
    if not charlm.DEFAULT_WEIGHTS.with_name("shakespeare.txt").is_file():
        raise RunError(f"the calibration text is missing ({charlm.DEFAULT_WEIGHTS.with_name('shakespeare.txt')})")
    if cfg.model is None:
        if not charlm.DEFAULT_WEIGHTS.is_file():
            raise RunError(f"the embedded model's weights are missing ({charlm.DEFAULT_WEIGHTS})")
        inputs.check_memory(shape.kvcache_for(None, cfg.steps, cfg.prompt, CALIBRATION_CHARS),
                            f"kvcache --steps {cfg.steps}")
    from precisionlab.experiments.tf32 import restored_flags

    rows: list[dict] = []
    info: dict = {}
    calibration_tokens = 0
    with restored_flags(), torch.no_grad():
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means IEEE fp32 here
        torch.backends.cudnn.allow_tf32 = False
        for device in names:
            m = HFModel(cfg, device) if cfg.model else EmbeddedModel(cfg, device)
            try:
                device_rows, info = _device_rows(m, cfg, kv_dtypes, modes, device, advance)
            finally:
                m.close()
            rows += device_rows
            calibration_tokens = len(m.calibration)
    return KVCacheResult(
        params={"model": cfg.model or "embedded", "dtypes": kv_dtypes, "scales": modes,
                "activation_scale": cfg.activation_scale, "steps": cfg.steps, "prompt": cfg.prompt,
                "device": cfg.device, "calibration_chars": CALIBRATION_CHARS,
                "calibration_tokens": calibration_tokens, "seed": cfg.seed},
        rows=rows, model_info=info, takeaways=takeaways(rows))


def _device_rows(m, cfg: KVCacheConfig, kv_dtypes, modes, device: str, advance) -> tuple[list[dict], dict]:
    from precisionlab.experiments.model import check_finite

    a = cfg.activation_scale
    ref_tokens = _greedy(m.session(None), m.prompt, cfg.steps, strict=True)
    path = m.prompt + ref_tokens
    ref = _forced(m.session(None), path, len(m.prompt))
    for i, row in enumerate(ref):
        check_finite(row, "fp32", i, "teacher-forced, fp32 cache")
    targets = np.asarray(ref_tokens, dtype=np.int64)
    cal = Stores(lambda i: KVStore(None, None, a))
    m.calibrate(cal, m.calibration)
    calibrated = {i: tuple(s.amax) for i, s in cal.items()}
    some = next(iter(cal.values()))
    info = m.info | {"cache_layers": len(cal), "kv_heads": some.heads, "head_dim": some.head_dim}

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
    for fmt, mode in order:
        tokens = _greedy(m.session(Stores(store_for(fmt, mode))), m.prompt, cfg.steps, strict=False)
        stores = Stores(store_for(fmt, mode))
        logits = _forced(m.session(stores), path, len(m.prompt))  # the teacher-forced pass alone is counted
        err = _rel_l2(logits, ref)
        first = next((i for i in range(cfg.steps) if i >= len(tokens) or tokens[i] != ref_tokens[i]), None)
        dist = distribution.summarize(distribution.position_stats(ref, logits, targets))
        if fmt == "bf16":
            bf16 = {"logits": logits, "mean_rel_l2": float(np.mean(err)), "kld_mean": dist["kld_mean"]}
        dist_bf16 = distribution.summarize(distribution.position_stats(bf16["logits"], logits, targets))
        sat = stores.saturated
        rows.append({"device": device, "cache": fmt, "scale": mode, "activation_scale": a,
                     "mean_rel_l2": float(np.mean(err)), "max_rel_l2": float(np.max(err)),
                     "vs_bf16": _ratio(float(np.mean(err)), bf16["mean_rel_l2"]),
                     "saturated": sat, "entries": stores.entries,
                     "first_divergence": first, "tokens_agree": first is None,
                     "kld_mean": dist["kld_mean"], "kld_vs_bf16": _ratio(dist["kld_mean"], bf16["kld_mean"]),
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
