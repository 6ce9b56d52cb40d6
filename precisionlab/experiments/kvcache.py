"""kvcache: the embedded model with its KV cache kept in fp8.

The model computes in fp32 throughout; only what the cache stores changes:
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

Per cache: the teacher-forced logit error along the reference's greedy path
against the fp32 cache, its ratio to the bf16 cache's, the number of
saturated cache entries (an entry whose scaled value lies past max + half the
format's last spacing: where rounding without a range limit would have gone
past max, so the clamp changed it), and the first step where free-running
greedy decoding leaves the reference's tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from precisionlab import devices, formats, inputs, memory
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
    """One layer's cache format: Attention.kv_store. Counts what it stores."""

    def __init__(self, fmt: str | None, mode: str | None, activation_scale: float,
                 calibrated: tuple[float, float] | None = None):
        self.fmt = None if fmt is None else formats.get(fmt)
        self.mode, self.a, self.calibrated = mode, activation_scale, calibrated
        self.amax = [0.0, 0.0]  # of K and V as stored (activation scale applied)
        self.entries = 0
        self.saturated = 0

    def __call__(self, k, v):
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
            # past max + half the last spacing, an unbounded format would round above max
            beyond = top + float(self.fmt.spacing(top)) / 2
            self.saturated += int(((z.abs() >= beyond) | ~torch.isfinite(z)).sum())
            fp8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}[self.fmt.name]
            q = z.clamp(-top, top).to(fp8).float() * s
        return (q / self.a).to(x.dtype)


def _install(model, make) -> list:
    stores = []
    for i, layer in enumerate(model.layers):
        layer.attn.kv_store = make(i)
        stores.append(layer.attn.kv_store)
    return stores


def _greedy(model, prompt: list[int], steps: int, device: str) -> list[int]:
    torch = _torch()
    ids = list(prompt)
    with torch.no_grad():
        logits, cache = model(torch.tensor([ids], device=device))
        for _ in range(steps):
            ids.append(int(logits[0, -1].argmax()))
            logits, cache = model(torch.tensor([ids[-1:]], device=device), cache, len(ids) - 1)
    return ids[len(prompt):]


def _forced(model, ids: list[int], first: int, device: str) -> np.ndarray:
    """Logits predicting ids[first:], reading the whole path at once (K/V go through kv_store all the same)."""
    torch = _torch()
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids[:-1]], device=device))
    return logits[0, first - 1:].double().cpu().numpy()


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


def run(cfg: KVCacheConfig, advance=lambda k=1: None) -> KVCacheResult:
    kv_dtypes = inputs.parse_choices(cfg.dtypes, FP8, "KV cache dtype")
    modes = inputs.parse_choices(cfg.scales, SCALES, "KV scale")
    if not (math.isfinite(cfg.activation_scale) and cfg.activation_scale > 0):
        raise UsageError(f"--activation-scale must be a positive finite number (got {cfg.activation_scale})")
    if cfg.steps <= 0:
        raise UsageError(f"--steps must be > 0 (got {cfg.steps})")
    plan = devices.resolve(cfg.device)
    torch = _torch()
    from precisionlab.models import charlm

    if plan.cuda and not torch.cuda.is_available():
        if not plan.cpu:
            raise NoDeviceError("--device cuda: torch sees no CUDA device")
    names = [d for d in plan.names if d == "cpu" or torch.cuda.is_available()]
    if not charlm.DEFAULT_WEIGHTS.is_file():
        raise RunError(f"the embedded model's weights are missing ({charlm.DEFAULT_WEIGHTS})")
    # the embedded model at prompt + steps positions, as compare model holds it (a few caches more are small)
    inputs.check_memory(memory.compare_model_for(None, cfg.steps, cfg.prompt), f"kvcache --steps {cfg.steps}")
    rows: list[dict] = []
    info = {}
    for device in names:
        model, tok = charlm.load_default(torch.float32, device)
        info = {"name": "precisionlab char-LM (embedded, bf16 weights)",
                "parameters": sum(p.numel() for p in model.parameters()), "layers": len(model.layers),
                "heads": model.cfg.n_heads, "head_dim": model.cfg.head_dim}
        missing = sorted({c for c in cfg.prompt if c not in tok.index})
        if missing or not cfg.prompt:
            raise UsageError(f"--prompt must be non-empty text the model knows (unknown: {''.join(missing)!r})")
        prompt = tok.encode(cfg.prompt)
        if len(prompt) + cfg.steps > model.cfg.max_seq_len:
            raise UsageError(f"prompt + steps must stay within {model.cfg.max_seq_len} tokens")
        calib_text = charlm.DEFAULT_WEIGHTS.with_name("shakespeare.txt").read_text()[:CALIBRATION_CHARS]
        calib_ids = [tok.index[c] for c in calib_text if c in tok.index]

        ref_tokens = _greedy(model, prompt, cfg.steps, device)
        path = prompt + ref_tokens
        ref = _forced(model, path, len(prompt), device)
        cal = _install(model, lambda i: KVStore(None, None, cfg.activation_scale))
        with torch.no_grad():
            model(torch.tensor([calib_ids], device=device))
        calibrated = [tuple(s.amax) for s in cal]

        caches = [("fp32", None), ("bf16", None)] + [(d, m) for d in kv_dtypes for m in modes]
        bf16_err = None
        for fmt, mode in caches:
            stores = _install(model, lambda i: KVStore(None if fmt == "fp32" else fmt, mode, cfg.activation_scale,
                                                       calibrated[i]))
            tokens = _greedy(model, prompt, cfg.steps, device)
            for s in stores:
                s.entries = s.saturated = 0  # count the teacher-forced pass alone
            err = _rel_l2(_forced(model, path, len(prompt), device), ref)
            if fmt == "bf16":
                bf16_err = float(np.mean(err))
            first = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), None)
            sat, entries = sum(s.saturated for s in stores), sum(s.entries for s in stores)
            rows.append({"device": device, "cache": fmt, "scale": mode, "activation_scale": cfg.activation_scale,
                         "mean_rel_l2": float(np.mean(err)), "max_rel_l2": float(np.max(err)),
                         "vs_bf16": None, "saturated": sat, "entries": entries,
                         "first_divergence": first, "tokens_agree": first is None,
                         "flag": "saturating" if sat else ""})
            advance()
        _install(model, lambda i: None)
        for r in rows:
            if r["device"] == device and bf16_err:
                r["vs_bf16"] = r["mean_rel_l2"] / bf16_err
    return KVCacheResult(
        params={"dtypes": kv_dtypes, "scales": modes, "activation_scale": cfg.activation_scale, "steps": cfg.steps,
                "prompt": cfg.prompt, "device": cfg.device, "calibration_chars": CALIBRATION_CHARS,
                "seed": cfg.seed},
        rows=rows, model_info=info, takeaways=takeaways(rows))


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
                           "cache's.")
        dyn = [r for r in rs if r["scale"] == "dynamic"]
        for r in dyn:
            out.append(f"{dev}: {r['cache']} with dynamic per-head, per-token scales: logit error "
                       f"{r['mean_rel_l2']:.3g} ({_x(r['vs_bf16'])} the bf16 cache's), {r['saturated']} saturated.")
    return out
