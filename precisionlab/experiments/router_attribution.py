"""compare routing: how much of a trainer/rollout log-prob mismatch is routing.

Two log-prob streams of the same tokens (read as compare logprobs reads them,
io/logprob_streams.py: A the trainer's, B the rollout's) and beside each its
routed-expert trace (io/routing_files.py: (tokens, layers, top_k) expert ids).
A token has a routing flip when, in any layer, the two sides chose different
expert sets. The mismatch is split between the tokens with a flip and those
without: per group the tokens, the mean |Δ| (Δ = B - A, nats), the share of
the total |Δ| and of the KL estimate, and the flipped group's excess (its |Δ|
beyond what the unflipped tokens' mean would give it: the part noise alone
does not explain). KL(B || A) at B's sampled tokens is Schulman's k3
estimator, r - 1 - log r with r = p_A / p_B (non-negative per token). Per
layer: the flip rate, and the tokens whose sets agree but whose slot order
differs (replaying ids does not fix the weights' order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import logprob_streams, routing_files


@dataclass
class AttributionConfig:
    a: str
    b: str
    a_experts: str
    b_experts: str
    experts: int
    moe_shape: str | None = None


@dataclass
class AttributionResult:
    params: dict
    rows: list[dict]
    layers: list[dict] = field(default_factory=list)
    takeaways: list[str] = field(default_factory=list)


def _moe_shape(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        layers, k = (int(v) for v in text.split(":"))
    except ValueError:
        layers = k = 0
    if layers <= 0 or k <= 0:
        raise UsageError(f"--moe-shape is LAYERS:TOP_K, both positive (got {text!r})")
    return layers, k


def run(cfg: AttributionConfig, advance=lambda k=1: None) -> AttributionResult:
    if cfg.experts <= 0:
        raise UsageError(f"--experts must be > 0 (got {cfg.experts})")
    shape = _moe_shape(cfg.moe_shape)
    a = logprob_streams.read(cfg.a, "A")
    b = logprob_streams.read(cfg.b, "B")
    logprob_streams.check_pair(a, b)
    ta = routing_files.read_traces(cfg.a_experts, cfg.experts, "--a-experts", shape)
    tb = routing_files.read_traces(cfg.b_experts, cfg.experts, "--b-experts", shape)
    for name, t in (("--a-experts", ta), ("--b-experts", tb)):
        if t.shape[0] != a.n:
            raise UsageError(f"{name}: {t.shape[0]} tokens of routing, but the streams hold {a.n} tokens")
    if ta.shape[1:] != tb.shape[1:]:
        raise UsageError(f"the traces differ in shape: --a-experts (layers, top_k) {ta.shape[1:]}, --b-experts "
                         f"{tb.shape[1:]}")
    advance()
    rows, layers, flipped = attribute(a.logprobs, b.logprobs, ta, tb)
    params = {"a": cfg.a, "b": cfg.b, "a_experts": cfg.a_experts, "b_experts": cfg.b_experts,
              "experts": cfg.experts, "tokens": int(a.n), "sequences": int(a.sequences),
              "layers": int(ta.shape[1]), "top_k": int(ta.shape[2])}
    return AttributionResult(params, rows, layers, takeaways(rows, layers))


def attribute(lp_a: np.ndarray, lp_b: np.ndarray, ta: np.ndarray, tb: np.ndarray):
    """(group rows, per-layer rows, the (T,) any-layer flip mask)."""
    same_set = np.all(np.sort(ta, axis=2) == np.sort(tb, axis=2), axis=2)  # (T, L)
    same_order = np.all(ta == tb, axis=2)
    flipped = ~np.all(same_set, axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        d = lp_b - lp_a
        log_r = lp_a - lp_b
        k3 = np.expm1(log_r) - log_r
    ok = np.isfinite(d) & np.isfinite(k3)
    abs_d = np.where(ok, np.abs(d), 0.0)
    k3 = np.where(ok, k3, 0.0)
    total_abs, total_k3 = float(abs_d.sum()), float(k3.sum())
    base = float(abs_d[ok & ~flipped].mean()) if (ok & ~flipped).any() else 0.0
    rows = []
    for name, m in (("routing flip in a layer", flipped), ("no routing flip", ~flipped)):
        mk = m & ok
        s_abs, s_k3 = float(abs_d[mk].sum()), float(k3[mk].sum())
        row = {"group": name, "tokens": int(m.sum()), "token_share": float(m.mean()),
               "nonfinite_tokens": int((m & ~ok).sum()),
               "mean_abs_diff": float(abs_d[mk].mean()) if mk.any() else None,
               "abs_diff_share": s_abs / total_abs if total_abs else None,
               "kl_k3_mean": float(k3[mk].mean()) if mk.any() else None,
               "kl_k3_share": s_k3 / total_k3 if total_k3 else None}
        if m is flipped:
            row["excess_abs_diff_share"] = max(0.0, s_abs - base * mk.sum()) / total_abs if total_abs else None
        rows.append(row)
    layers = [{"layer": int(layer), "flip_share": float(1 - same_set[:, layer].mean()),
               "order_only_rate": float((same_set[:, layer] & ~same_order[:, layer]).mean())}
              for layer in range(ta.shape[1])]
    return rows, layers, flipped


def takeaways(rows, layers) -> list[str]:
    f, n = rows
    out = [f"{100 * f['token_share']:.1f} % of tokens have a routing flip in at least one of {len(layers)} layers; "
           f"they carry {_pct(f['abs_diff_share'])} of the total |Δ| and {_pct(f['kl_k3_share'])} of the KL "
           f"estimate (mean |Δ| {_num(f['mean_abs_diff'])} vs {_num(n['mean_abs_diff'])} nats without a flip)."]
    if f.get("excess_abs_diff_share") is not None:
        out.append(f"Beyond the unflipped tokens' mean |Δ|, routing explains {_pct(f['excess_abs_diff_share'])} "
                   f"of the total |Δ|.")
    worst = max(layers, key=lambda r: r["flip_share"])
    out.append(f"Most flips at layer {worst['layer']}: {100 * worst['flip_share']:.2f} % of tokens.")
    order = [r for r in layers if r["order_only_rate"] > 0]
    if order:
        out.append(f"In {len(order)} layer{'s' if len(order) > 1 else ''} the same experts come in another slot "
                   "order for some tokens: "
                   "replaying ids alone leaves the weights' order to differ.")
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"
