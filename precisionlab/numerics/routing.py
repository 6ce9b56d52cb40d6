"""An MoE router's path, emulated in numpy, each choice declared once.

The path (DeepSeek-V3's noaux_tc router, of which Qwen3-MoE's and Mixtral's
are the special case n_group = 1, no bias):

1. gate GEMM: logits = hidden @ gate^T, both operands rounded to ``gate_dtype``
   and the dot products carried by an accumulator model
   (numerics/accumulators.py), the fp32 result rounded to ``logit_dtype``;
2. scores = softmax(logits) or sigmoid(logits), in the path's arithmetic;
3. choice = scores + bias, the correction bias stored in ``bias_dtype``
   (e_score_correction_bias: it steers the choice, never the weights);
4. grouped top-k: the experts split into n_group equal groups, a group's score
   the sum of its two best choices (its best where a group holds one), the
   topk_group best groups kept, the rest masked;
5. top-k of the kept choices; an exact tie goes to the lowest index
   (torch.topk's and the fused kernels' rule) or the highest (``tie``);
6. weights = the chosen experts' scores (without the bias), divided by their
   sum where ``normalize``.

The reference path is the same algorithm in float64 on the unrounded inputs,
the GEMM a float64 matmul. A precision path's arithmetic (steps
2-6) is fp32, as the kernels' is, each operation rounded to fp32 (exp and the
sums correctly rounded once), so that a run gives the same bits on any CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from precisionlab.catalog import formats

SCORINGS = ("softmax", "sigmoid")
TIES = ("lowest", "highest")  # which expert index wins an exact tie
# The margin buckets, in ulps of the path's narrowest format at the k-th
# choice score: below one ulp a rounding can swap the k-th and (k+1)-th expert
# outright; the bucket edges are powers of 4 from there.
MARGIN_EDGES_ULPS = (0.0, 1.0, 4.0, 16.0, 64.0, 256.0, float("inf"))
REFERENCE = "fp64"


@dataclass(frozen=True)
class Algorithm:
    """What the router computes, whatever the precision."""
    top_k: int
    scoring: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    normalize: bool = True
    tie: str = "lowest"


@dataclass(frozen=True)
class Precision:
    """One precision path: every format the router's numbers pass through."""
    gate_dtype: str = "fp32"
    accumulator: str = "fp32"  # an accumulators.parse spelling
    logit_dtype: str = "fp32"
    bias_dtype: str | None = "fp32"  # None: no bias of this run's choosing (a model's own is routed as it is)

    @property
    def is_reference(self) -> bool:
        return self.gate_dtype == REFERENCE

    @property
    def arithmetic(self):
        """The numpy type steps 2-6 compute in."""
        return np.float64 if self.is_reference else np.float32

    @property
    def narrowest(self) -> str:
        """The format of the path with the fewest significand bits: its ulp measures the margins."""
        if self.is_reference:
            return REFERENCE
        names = [n for n in (self.gate_dtype, self.logit_dtype, self.bias_dtype) if n is not None]
        return min(names, key=lambda n: formats.get(n).precision)

    def label(self) -> str:
        if self.is_reference:
            return "fp64"
        return (f"gate {self.gate_dtype} / acc {self.accumulator} / logits {self.logit_dtype}"
                + (f" / bias {self.bias_dtype}" if self.bias_dtype is not None else ""))


FP64 = Precision(REFERENCE, REFERENCE, REFERENCE, REFERENCE)


@dataclass
class Routed:
    ids: np.ndarray      # (T, k) int64, the chosen experts, best first
    weights: np.ndarray  # (T, k) float64
    choice: np.ndarray   # (T, E) float64: the choice scores as this path holds them (masked groups -inf)
    logits: np.ndarray | None = None  # (T, E) float64: the logits routed, where route() was given them


def gate_logits(hidden: np.ndarray, gate: np.ndarray, prec: Precision) -> np.ndarray:
    """Step 1: (T, H) @ (E, H)^T -> (T, E) float64 holding logit_dtype values."""
    if prec.is_reference:
        return _matmul64(np.asarray(hidden, np.float64), np.asarray(gate, np.float64))
    from precisionlab.numerics import accumulators

    f = formats.get(prec.gate_dtype)
    acc = accumulators.parse(prec.accumulator)
    out = acc.matmul(f.round(hidden), f.round(gate).T, backend=accumulators.default_backend(f.name), dtype=f.name)
    return store_logits(out, prec)


def _matmul64(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(T, H) @ (E, H)^T in float64. BLAS's order (and its FMAs) follow the
    CPU, but only in float64's last bits: a reference top-k changes with them
    only at a margin near 1e-16, and the measures shown keep 3 digits, so the
    speed (a k-loop in numpy took seconds a layer) wins."""
    return h @ w.T


def store_logits(logits: np.ndarray, prec: Precision) -> np.ndarray:
    """Logits as the path holds them (logit_dtype; float64 for the reference)."""
    return np.asarray(logits, np.float64) if prec.is_reference else formats.get(prec.logit_dtype).round(logits)


def store_bias(bias: np.ndarray | None, prec: Precision) -> np.ndarray | None:
    if bias is None or prec.is_reference or prec.bias_dtype is None:
        return bias
    return formats.get(prec.bias_dtype).round(bias)


def _exp(x: np.ndarray, dt) -> np.ndarray:
    """exp in the arithmetic dt: in fp32, float64's exp rounded once to fp32
    (correctly rounded but within float64's own error of a tie): numpy's own
    float32 exp picks a SIMD kernel by the CPU, and its last bit with it."""
    return np.exp(x) if dt is np.float64 else np.exp(x.astype(np.float64)).astype(np.float32)


def _sum(x: np.ndarray, dt, axis: int = 1) -> np.ndarray:
    """A row sum in dt: in fp32 the float64 sum rounded once (numpy's float32
    reductions also vary in order with the CPU's vector width)."""
    return x.sum(axis=axis, keepdims=True) if dt is np.float64 else \
        x.astype(np.float64).sum(axis=axis, keepdims=True).astype(np.float32)


def scores(logits: np.ndarray, scoring: str, dt) -> np.ndarray:
    """Step 2 in the arithmetic dt: every operation rounded to dt (the sums once)."""
    x = np.asarray(logits, dtype=dt)
    with np.errstate(over="ignore", under="ignore"):
        if scoring == "softmax":
            e = _exp(x - x.max(axis=1, keepdims=True), dt)
            return e / _sum(e, dt)
        return dt(1) / (dt(1) + _exp(-x, dt))


def top_k(s: np.ndarray, k: int, tie: str) -> np.ndarray:
    """The k best columns of each row, best first; an exact tie by `tie`."""
    if tie == "lowest":
        return np.argsort(-s, axis=1, kind="stable")[:, :k]
    n = s.shape[1]
    return (n - 1 - np.argsort(-s[:, ::-1], axis=1, kind="stable"))[:, :k]


def route_scores(sc: np.ndarray, bias: np.ndarray | None, alg: Algorithm, dt) -> Routed:
    """Steps 3-6 from the scores (T, E) in the arithmetic dt."""
    sc = np.asarray(sc, dtype=dt)
    choice = sc + np.asarray(bias, dtype=dt)[None, :] if bias is not None else sc.copy()
    t, e = choice.shape
    if alg.n_group > 1:
        per = e // alg.n_group
        g = choice.reshape(t, alg.n_group, per)
        best = -np.sort(-g, axis=2)[:, :, :2]
        group_score = (best[:, :, 0] + best[:, :, 1]) if per > 1 else best[:, :, 0]
        kept = top_k(group_score, alg.topk_group, alg.tie)
        mask = np.ones((t, alg.n_group), bool)
        np.put_along_axis(mask, kept, False, axis=1)
        choice = np.where(np.repeat(mask, per, axis=1), dt(-np.inf), choice)
    ids = top_k(choice, alg.top_k, alg.tie)
    w = np.take_along_axis(sc, ids, axis=1)
    if alg.normalize:
        w = w / _sum(w, dt)
    return Routed(ids.astype(np.int64), w.astype(np.float64), choice.astype(np.float64))


def route(logits: np.ndarray, bias: np.ndarray | None, alg: Algorithm, prec: Precision) -> Routed:
    """Steps 2-6: logits (already as the path holds them), the bias stored by the path."""
    dt = prec.arithmetic
    out = route_scores(scores(logits, alg.scoring, dt), store_bias(bias, prec), alg, dt)
    out.logits = np.asarray(logits, np.float64)
    return out


def margin_scale(alg: Algorithm, bias) -> str:
    """Where a margin is measured: on the logits where the choice is a monotone
    function of them alone (no bias, one group: the order of the logits is the
    order of the choices, and the logits are what the low formats round), else
    on the choice scores (score + bias), where the bias is rounded."""
    return "logits" if bias is None and alg.n_group == 1 else "choice scores"


def same_set(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(T,) bool: the two (T, k) id lists choose the same experts (order aside)."""
    return np.all(np.sort(a, axis=1) == np.sort(b, axis=1), axis=1)


def dense_weights(r: Routed, experts: int) -> np.ndarray:
    out = np.zeros((r.ids.shape[0], experts))
    np.put_along_axis(out, r.ids, r.weights, axis=1)
    return out


def weight_l1(a: Routed, b: Routed, experts: int) -> np.ndarray:
    """(T,) the routed-weight mass moved: sum over experts of |w_a - w_b| (0 ... 2 for normalised weights)."""
    return np.abs(dense_weights(a, experts) - dense_weights(b, experts)).sum(axis=1)


def margins(ref: Routed, k: int, scale: str = "choice scores") -> tuple[np.ndarray, np.ndarray]:
    """(T,) the reference's top-k margin (k-th minus (k+1)-th value on `scale`,
    margin_scale()'s; inf where no (k+1)-th is left) and (T,) its k-th value."""
    s = -np.sort(-(ref.logits if scale == "logits" else ref.choice), axis=1)
    kth = s[:, k - 1]
    nxt = s[:, k] if s.shape[1] > k else np.full(s.shape[0], -np.inf)
    with np.errstate(invalid="ignore"):
        m = np.where(np.isfinite(nxt), kth - nxt, np.inf)
    return m, kth


def margin_ulps(margin: np.ndarray, at: np.ndarray, fmt_name: str) -> np.ndarray:
    """Margins in ulps of fmt at the k-th score."""
    return margin / formats.get(fmt_name).spacing(at)


def margin_buckets(m_ulps: np.ndarray, flipped: np.ndarray) -> list[dict]:
    """Flips by margin bucket (MARGIN_EDGES_ULPS)."""
    out = []
    for lo, hi in zip(MARGIN_EDGES_ULPS[:-1], MARGIN_EDGES_ULPS[1:], strict=False):
        inside = (m_ulps >= lo) & (m_ulps < hi)
        n = int(inside.sum())
        f = int((inside & flipped).sum())
        out.append({"margin_lo_ulps": lo, "margin_hi_ulps": hi, "tokens": n, "flips": f,
                    "flip_share": f / n if n else None})
    return out


def independence_prediction(per_layer: list[float]) -> float:
    """1 - prod(1 - p_l): the any-layer share if layers flipped independently."""
    return float(1.0 - np.prod([1.0 - p for p in per_layer]))


def spread_bias(experts: int, lo: float, hi: float, seed: int) -> np.ndarray:
    """`experts` fp32 correction biases evenly spread over [lo, hi], in a seeded random order."""
    v = formats.get("fp32").round(np.linspace(lo, hi, experts))
    return np.random.default_rng(seed).permutation(v)


def flip_fields(ref: Routed, got: Routed, persists: np.ndarray, m_ulps: np.ndarray, experts: int) -> dict:
    """One layer's flips between two routings of the same tokens (the router's
    and compare layers' rows): tokens, flips (top-k set changed), flip_share,
    the routed weight moved (weight_l1_mean / _p99 / _max), the flips that
    persist in fp64 (`persists`: where the fp64 re-runs still disagree) and
    the median margin in ulps (m_ulps) of those that vanish there."""
    flipped = ~same_set(got.ids, ref.ids)
    persists = flipped & persists
    vanish = flipped & ~persists
    l1 = weight_l1(got, ref, experts)
    return {"tokens": int(flipped.size), "flips": int(flipped.sum()), "flip_share": float(flipped.mean()),
            "weight_l1_mean": float(l1.mean()), "weight_l1_p99": float(np.quantile(l1, 0.99)),
            "weight_l1_max": float(l1.max()), "flips_persisting_fp64": int(persists.sum()),
            "median_flip_margin_ulps": float(np.median(m_ulps[vanish])) if vanish.any() else None}


def agreement(a_ids: np.ndarray, a_weights: np.ndarray, b_ids: np.ndarray, b_weights: np.ndarray,
              experts: int) -> dict:
    """Two runs' routing of the same tokens at one MoE layer ((T, k) ids and
    weights each, as a model's router returns them): what a per-layer model
    comparison adds for a layer with a router. topk_agreement: the share of
    tokens whose expert sets agree; order_only_share: sets that agree in
    another slot order; weight_l1_mean / weight_l1_max: the routed weight
    moved, sum over experts of |w_a - w_b|."""
    a = Routed(np.asarray(a_ids, np.int64), np.asarray(a_weights, np.float64), np.empty((0, 0)))
    b = Routed(np.asarray(b_ids, np.int64), np.asarray(b_weights, np.float64), np.empty((0, 0)))
    same = same_set(a.ids, b.ids)
    l1 = weight_l1(a, b, experts)
    return {"tokens": int(same.size), "topk_agreement": float(same.mean()),
            "order_only_share": float((same & np.any(a.ids != b.ids, axis=1)).mean()),
            "weight_l1_mean": float(l1.mean()), "weight_l1_max": float(l1.max())}
