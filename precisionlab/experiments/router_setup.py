"""The router command's configuration and the pieces its two runs share (the
precision sweep in experiments/router.py, your kernel's cases in
experiments/router_cases.py): the options' checks, the routing algorithm and
the correction bias they describe, the result and the verdict. Here, below
both, so that neither imports the other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.io import inputs
from precisionlab.numerics import routing

DTYPES = formats.COMPUTE  # the gate's operands, the logits and the bias are held in these


SYNTHETIC = ("gate", "logits", "margins")


def input_kind(text: str) -> str:
    """--inputs: "gate", "logits" or "margins" (synthetic), "dump" (a .npy of router logits) or "model" (an engine spec)."""
    if text in SYNTHETIC:
        return text
    if not text.strip():
        raise UsageError("--inputs: empty; gate | logits | FILE.npy | hf:DIR")
    return "dump" if text.lower().endswith(".npy") else "model"


BIAS_PRESETS = {"glm": (6.817, 7.063)}  # GLM-5.2's e_score_correction_bias range (SGLang PR #37133)


MAX_PATHS = 64


@dataclass
class RouterConfig:
    gate_dtypes: str = ",".join(formats.ROUTER_DEFAULT)
    accumulator: str = "fp32"
    logit_dtypes: str = ",".join(formats.ROUTER_DEFAULT)
    bias_dtypes: str | None = None  # None: fp32
    scoring: str = "softmax"
    top_k: int = 8
    experts: int = 128
    groups: str = "1:1"
    normalize: bool = True
    ties: str = "lowest"
    tokens: int = 4096
    hidden: int = 512
    layers: int = 4
    scales: str = "1,1"
    inputs: str = "gate"  # gate | logits (synthetic) | FILE.npy (a logit dump) | an engine spec (hf:DIR)
    bias: str | None = None
    impl: str | None = None
    threshold: int | None = None
    seed: int = 0


@dataclass
class RouterResult:
    params: dict
    rows: list[dict]
    buckets: list[dict] = field(default_factory=list)
    cases: list[dict] = field(default_factory=list)
    takeaways: list[str] = field(default_factory=list)


def algorithm(cfg: RouterConfig, experts: int) -> routing.Algorithm:
    if cfg.scoring not in routing.SCORINGS:
        raise UsageError(f"--scoring must be one of {', '.join(routing.SCORINGS)} (got {cfg.scoring!r})")
    if cfg.ties not in routing.TIES:
        raise UsageError(f"--ties must be one of {', '.join(routing.TIES)} (got {cfg.ties!r})")
    try:
        n_group, topk_group = inputs.integers(cfg.groups, ":", "--groups")
    except ValueError:
        n_group = topk_group = 0
    if n_group < 1 or not 1 <= topk_group <= n_group or experts % n_group:
        raise UsageError(f"--groups N:M: N groups dividing the {experts} experts, 1 <= M <= N (got {cfg.groups!r})")
    kept = experts // n_group * topk_group
    if kept < 2:
        raise UsageError(f"the kept groups hold {kept} expert: a top-k margin needs one left out (--experts, --groups)")
    if not 1 <= cfg.top_k <= kept - 1:
        raise UsageError(f"--top-k must be in 1 ... {kept - 1} (the kept groups hold {kept} experts; "
                         f"one must be left out for a margin), got {cfg.top_k}")
    return routing.Algorithm(cfg.top_k, cfg.scoring, n_group, topk_group, cfg.normalize, cfg.ties)


def bias_vector(cfg: RouterConfig, experts: int) -> np.ndarray | None:
    if cfg.bias is None or cfg.bias == "none":
        return None
    text = cfg.bias
    if text in BIAS_PRESETS:
        lo, hi = BIAS_PRESETS[text]
    else:
        try:
            lo, hi = (float(v) for v in text.split(":"))
        except ValueError:
            raise UsageError(f"--bias is none, {', '.join(BIAS_PRESETS)} or LO:HI (got {text!r})") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise UsageError(f"--bias LO:HI must be finite with LO <= HI (got {text!r})")
    return routing.spread_bias(experts, lo, hi, 1 + cfg.seed)


def _check_sizes(cfg: RouterConfig) -> None:
    for name, v in (("--tokens", cfg.tokens), ("--hidden", cfg.hidden), ("--experts", cfg.experts),
                    ("--layers", cfg.layers)):
        if v <= 0:
            raise UsageError(f"{name} must be > 0 (got {v})")


def verdict(flips: int, persisting: int) -> str:
    if flips == 0:
        return "no flips"
    if persisting:
        return "persists in fp64: algorithmic"
    return "vanishes in fp64: rounding"
