"""compare layers' routing section: where the model has routers (an MoE
model; the engine names them, Engine.routers), two runs' routing of the same
tokens, MoE layer by MoE layer.

Each router's input and logits are captured by a forward hook during the
run the module rows already make (no extra forward pass). Both runs are
routed from their captured logits by numerics/routing.route, with the
algorithm the model's config declares (experiments/router_model.algorithm)
in fp32 arithmetic, as transformers' routers compute their softmax or
sigmoid, and the correction bias as each run holds it (a bf16 copy rounds
it). Per MoE layer (numerics/routing.flip_fields, the router command's
names): the tokens whose top-k set changed, the routed weight moved (L1),
the sets that only changed slot order; each flip's margin (the first run's
k-th minus (k+1)-th value) in ulps of the second run's dtype; and the fp64
call: both runs' router inputs routed again in float64 with each side's
fp32 weights. A flip that vanishes there is the routers' rounding (the GEMM,
the logits' dtype, the bias's dtype). One that persists is algorithmic: the
routers themselves differ (A's router in fp64 on B's input still chooses
otherwise than B's: its weights, bias or algorithm), or else the router's
input moved past the margin (the modules above).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from precisionlab.engines.protocol import NotSupported
from precisionlab.errors import UsageError
from precisionlab.numerics import routing


@dataclass
class Captured:
    """One run's one router: the tensors themselves, not copies (its input is
    its MLP's, which the module capture holds anyway; its weight the model's),
    turned into float64 numpy one layer at a time where compared (as64), so a
    large MoE costs no float64 copy of every router."""
    hidden: object        # (T, H) its input
    logits: object        # (T, E) its logits, as the run computed them
    weight: object        # (E, H) its weight, as the run held it
    bias: object | None   # (E,) its correction bias, as the run held it

    def as64(self) -> Captured:
        return Captured(*(None if t is None else _as64(t) for t in (self.hidden, self.logits, self.weight, self.bias)))


@dataclass
class Routers:
    """What a model's routers are: their names and the algorithm (alg None: no routing section; note says why
    where the model has routers but they cannot be compared)."""
    names: list[str]
    alg: routing.Algorithm | None
    note: str | None = None

    def info(self) -> dict | None:
        a = self.alg
        return None if a is None else {"moe_layers": len(self.names), "top_k": a.top_k, "scoring": a.scoring,
                                       "n_group": a.n_group, "topk_group": a.topk_group, "normalize": a.normalize,
                                       "ties": a.tie}


def find(engine, model, who: str = "") -> Routers:
    """The engine's routers in `model` and the algorithm its config declares; none for a dense model."""
    from precisionlab.experiments import router_model

    try:
        gates = engine.routers(model)
    except NotSupported as e:
        return Routers([], None, f"{who or engine.name} does not expose its routing ({e}): no routing compared")
    if not gates:
        return Routers([], None)
    try:
        alg = router_model.model_algorithm(engine, model)
    except UsageError as e:
        return Routers([n for n, _ in gates], None, f"routing not compared: {str(e).removeprefix('--inputs: ')}")
    return Routers([n for n, _ in gates], alg)


def _as64(t) -> np.ndarray:
    return t.detach().double().cpu().numpy()


@contextmanager
def watch(engine, model, routers: Routers, out: dict):
    """While the block runs, out[router name] = Captured for each of model's routers (their last call)."""
    from precisionlab.engines import hooks

    handles = []
    if routers.alg is not None:
        for name, mod in engine.routers(model):
            def hook(m, args, output, name=name):
                logits = hooks.output_tensor(output, "module")  # transformers' routers return (logits, ...)
                bias = hooks.router_bias(m)
                out[name] = Captured(args[0].detach().reshape(-1, args[0].shape[-1]),
                                     logits.detach().reshape(-1, logits.shape[-1]), m.weight.detach(),
                                     None if bias is None else bias.detach())
            handles.append(mod.register_forward_hook(hook))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def _route(c: Captured, alg) -> routing.Routed:
    return routing.route(c.logits, c.bias, alg, routing.Precision(bias_dtype=None))  # the bias as the run held it


def _route64(hidden: np.ndarray, fp32: Captured, alg) -> routing.Routed:
    """The router in float64 on `hidden`, with the fp32 run's weight and bias."""
    return routing.route(routing.gate_logits(hidden, fp32.weight, routing.FP64), fp32.bias, alg, routing.FP64)


def compare(routers: tuple[Routers, Routers], a: dict, b: dict, margin_dtype: str, a32: dict, b32: dict,
            extra: dict) -> list[dict]:
    """Per MoE layer, run A (the reference: fp32, or REF) vs run B, each routed by its own model's algorithm
    (routers: A's and B's): its row. a32 / b32: each side's fp32 run, whose weights the fp64 re-runs use;
    extra: the fields that name the comparison (dtype, view)."""
    rows = []
    alg, alg_b = routers[0].alg, routers[1].alg
    for i, name in enumerate(routers[0].names):
        if name not in a or name not in b:
            continue
        ca, cb, ca32, cb32 = (d[name].as64() for d in (a, b, a32, b32))
        ra, rb = _route(ca, alg), _route(cb, alg_b)
        experts = max(ca.logits.shape[1], cb.logits.shape[1])
        b64 = _route64(cb.hidden, cb32, alg_b)
        persists = ~routing.same_set(_route64(ca.hidden, ca32, alg).ids, b64.ids)
        m, kth = routing.margins(ra, alg.top_k, routing.margin_scale(alg, ca.bias))
        stats = routing.flip_fields(ra, rb, persists, routing.margin_ulps(m, kth, margin_dtype), experts)
        same = routing.same_set(ra.ids, rb.ids)
        differs = ~same & persists & _routers_differ(cb.hidden, ca32, alg, b64)
        rows.append({**extra, "layer": i, "module": name, **stats, "flips_router_differs": int(differs.sum()),
                     "order_only_rate": float((same & np.any(ra.ids != rb.ids, axis=1)).mean()),  # compare routing's name
                     "margin_dtype": margin_dtype,
                     "verdict": verdict(stats["flips"], stats["flips_persisting_fp64"], int(differs.sum()))})
    return rows


def _routers_differ(hidden: np.ndarray, a32: Captured, alg, b64: routing.Routed) -> np.ndarray:
    """(T,) where A's router (its fp32 weights, its algorithm) in fp64 on B's input chooses otherwise than B's own
    router did there: the two routers themselves differ (weights, bias, algorithm), whatever their inputs."""
    if hidden.shape[1] != a32.weight.shape[1]:
        return np.ones(hidden.shape[0], bool)
    return ~routing.same_set(_route64(hidden, a32, alg).ids, b64.ids)


def verdict(flips: int, persisting: int, router_differs: int) -> str:
    if flips == 0:
        return "no flips"
    if router_differs:
        return "persists in fp64: the routers differ"
    if persisting:
        return "persists in fp64: the router's input moved"
    return "vanishes in fp64: the router's rounding"


def takeaways(rows: list[dict], label) -> list[str]:
    """One line per comparison (label(row) names it) with flips: the worst MoE layer and the fp64 call."""
    out = []
    for key in dict.fromkeys(label(r) for r in rows):
        mine = [r for r in rows if label(r) == key]
        worst = max(mine, key=lambda r: r["flip_share"])
        if not worst["flips"]:
            out.append(f"routing, {key}: every MoE layer chooses the same top-k set for every token.")
            continue
        persisting, differ = (sum(r[k] for r in mine) for k in ("flips_persisting_fp64", "flips_router_differs"))
        flips = sum(r["flips"] for r in mine)
        first = next((r["module"] for r in mine if r["flips_router_differs"]), None)
        out.append(f"routing, {key}: {100 * worst['flip_share']:.2f} % of tokens change their top-k set at "
                   f"{worst['module']} (the most of {len(mine)} MoE layers); of {flips} flips, {differ} persist in "
                   f"fp64 because the routers themselves differ (weights, bias or algorithm"
                   + (f"; first at {first}" if first else "") + f"), {persisting - differ} because the router's "
                   f"input moved, {flips - persisting} vanish (the router's rounding).")
    return out
