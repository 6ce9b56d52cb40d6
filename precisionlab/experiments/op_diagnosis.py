"""compare op's diagnosis: the cause of a flagged kernel, read from the
pattern of its ratios across the input cases, one cause a finding.

Each case's inputs are measured (features()): their RMS and largest finite
|x|, whether they are all finite, the reduction's length and, for RoPE, the
largest position. A comparison's excess at a case is its ratio to its
yardstick ((1) to (0), (3) to (2)) floored at 1: an error within the
precision's own cost counts as that cost, so bit-identical cases (ratio 0)
do not turn a growth into a division by zero. The rules, with the thresholds
chosen from what each mechanism does before any kernel was run:

- exp overflow (softmax, logsumexp, attention): outputs non-finite where
  torch's are finite, on cases whose inputs are all finite, and only on cases
  whose largest |x| is above every clean case's. exp leaves fp32 at
  |x| > 88.7 (103 below zero, 0/0 after the sum), so a kernel that does not
  subtract the row max breaks exactly on the large and shifted logits. No
  threshold: any such element is the signal.
- wrong eps (rmsnorm, layernorm), in (1): eps is an absolute constant beside
  mean(x^2), so a wrong one costs (eps' - eps) / (2 mean(x^2)) relative
  error: 1e8 times more at x * 1e-4 than at x. A rounding error is relative
  and the same at every scale. Fired when the smallest-RMS case is flagged,
  its RMS is at most 1/10 of the random case's and its excess at least
  GROWTH (10x) the random case's.
- range of a low-precision intermediate, in (3): the same growth towards the
  smallest or the largest RMS, seen in a low format only (a sum of squares
  that overflows fp16's 65504, squares that underflow it).
- RoPE phases in low precision (rope): an angle rounded with unit roundoff u
  is off by u * pos * inv_freq, linear in the position until it saturates at
  about a radian; rounding the output does not depend on the position. Fired
  when the largest-position case is flagged, its position at least 10x the
  smallest case's and its excess at least GROWTH the smallest case's.
- accumulation in low precision (reductions): a low-precision accumulator's
  error grows at least like sqrt(K) (terms of random sign) and like K (terms
  of one sign, until it stagnates); the format's own cost is one rounding of
  the result, the same at every K. Fired when the longest case is flagged,
  at least MIN_LENGTH_RATIO (4x) the random case's length, and its excess at
  least LENGTH_GROWTH (2x, sqrt 4) the random case's.
- otherwise: in (1) a formula that differs from torch's even in fp32 (not
  precision); in (3) rounding to the low format somewhere in the kernel
  (excess about the same at every scale and length); non-finite patterns and
  output contracts by their own kind.

A flagged row is explained by at most one cause; rows flagged only because
(1) already failed (their own ratio within the threshold) are not causes.
"""

from __future__ import annotations

import math

import numpy as np

from precisionlab.experiments import op_harness
from precisionlab.numerics import compare as comparison

GROWTH = 10.0            # eps, range, RoPE: a growth a relative rounding error does not show across the cases
LENGTH_GROWTH = 2.0      # accumulation: sqrt(MIN_LENGTH_RATIO)
MIN_LENGTH_RATIO = 4.0   # the shortest length step the accumulation rule reads
SPREAD = 10.0            # the RMS / position step a growth rule needs between its two cases
EXP_OPS = ("softmax", "logsumexp", "attention")
EPS_OPS = ("rmsnorm", "layernorm")


def features(op: str, args: tuple) -> dict:
    """What the diagnosis reads of one case's fp32 inputs."""
    x = args[0].detach().double().cpu().numpy()
    fin = x[np.isfinite(x)]
    length = {"matmul": lambda: args[0].shape[1], "attention": lambda: args[1].shape[1],
              "swiglu": lambda: None}.get(op, lambda: args[0].shape[-1])()
    pos = int(args[1].max()) if op == "rope" and args[1].numel() else None
    return {"rms": float(np.sqrt(np.mean(fin * fin))) if fin.size else 0.0,
            "max_abs": float(np.max(np.abs(fin))) if fin.size else 0.0,
            "all_finite": bool(fin.size == x.size), "length": length, "position": pos}


def _excess(row: dict) -> float:
    r = row.get("ratio")
    return 1.0 if r is None or (isinstance(r, float) and math.isnan(r)) else max(float(r), 1.0)


def _own_flag(row: dict) -> bool:
    """Flagged by its own numbers, not only because (1) already failed."""
    return row["flagged"] and (row["verdict"].startswith("output contract: ")
                               or bool(row.get("nonfinite_pattern_mismatch"))
                               or _excess(row) > comparison.RATIO_THRESHOLD)


def _x(v: float) -> str:
    return f"{v:.3g}x"


def diagnose(op: str, rows: list[dict], feats: dict, who: str) -> list[dict]:
    """The causes, each {cause, device, cases, rows, text}: rows of one device
    are read together; a series is one (comparison, dtype) across the cases."""
    out = []
    for dev in dict.fromkeys(r["device"] for r in rows):
        mine = [r for r in rows if r["device"] == dev and r["comparison"] in (1, 3)]
        explained: set[int] = set()
        for rule in (_exp_overflow, _eps, _range, _rope, _accumulation):
            cause = rule(op, mine, feats, explained)
            if cause is not None:
                out.append({"device": dev, **cause})
        out += [{"device": dev, **c} for c in _otherwise(mine, explained)]
    for c in out:
        c["text"] = f"{who}: {c['device']}: {c['text']}"
    return out


def _series(rows: list[dict]) -> dict:
    by: dict = {}
    for r in rows:
        by.setdefault((r["comparison"], r["dtype"]), {})[r["case"]] = r
    return by


def _take(explained: set, picked: list[dict]) -> None:
    explained.update(id(r) for r in picked)


def _cause(name: str, text: str, picked: list[dict]) -> dict:
    return {"cause": name, "cases": list(dict.fromkeys(r["case"] for r in picked)), "text": text,
            "rows": [{"case": r["case"], "dtype": r["dtype"], "comparison": r["comparison"], "ratio": r["ratio"]}
                     for r in picked]}


def _exp_overflow(op, rows, feats, explained):
    if op not in EXP_OPS:
        return None
    finite = [r for r in rows if feats[r["case"]]["all_finite"] and id(r) not in explained]
    bad = [r for r in finite if r.get("nonfinite_pattern_mismatch")]
    clean = [feats[r["case"]]["max_abs"] for r in finite if not r.get("nonfinite_pattern_mismatch")]
    if not bad or min(feats[r["case"]]["max_abs"] for r in bad) <= max(clean, default=-math.inf):
        return None
    _take(explained, bad)
    per_case = {}
    for r in bad:
        per_case.setdefault(r["case"], []).append(f"{r['dtype']} {r['nonfinite_pattern_mismatch']}")
    cases = "; ".join(f"{c} (max |x| {feats[c]['max_abs']:.4g}: {', '.join(v)} element(s))" for c, v in per_case.items())
    calm = max(clean, default=None)
    tail = f"; every case up to max |x| {calm:.4g} is finite" if calm is not None else ""
    return _cause("exp_overflow", "exp overflow: subtract the row max. Non-finite outputs where torch's are finite "
                  f"on {cases}{tail}. exp(x) leaves fp32 past x = 88.7 (and underflows to 0, giving 0/0, below "
                  "-103); exp(x - max) never does.", bad)


def _base(feats: dict) -> str:
    """The case the others are measured against: the seeded random inputs, or a --from file's."""
    return op_harness.FILE.name if op_harness.FILE.name in feats else op_harness.RANDOM.name


def _magnitude_rule(rows, feats, explained, comparisons, towards_small: bool):
    found, base = [], _base(feats)
    for (comp, dtype), by_case in _series(rows).items():
        if comp not in comparisons or base not in by_case:
            continue
        # all-finite inputs at the base case's length: the scale alone changes between them
        by_case = {c: r for c, r in by_case.items() if feats[c]["all_finite"]
                   and feats[c]["length"] == feats[base]["length"]}
        if base not in by_case:
            continue
        end = (min if towards_small else max)(by_case, key=lambda c: feats[c]["rms"])
        a, b = (feats[end]["rms"], feats[base]["rms"])
        if end == base or min(a, b) <= 0 or (b / a if towards_small else a / b) < SPREAD:
            continue
        if _own_flag(by_case[end]) and _excess(by_case[end]) >= GROWTH * _excess(by_case[base]):
            found.append((comp, dtype, end, by_case))
    return found


def _series_text(comp, dtype, by_case, feats, key, fmt) -> str:
    """The series along `key`: its two ends, the base case and every case flagged by its own numbers."""
    order = sorted((c for c in by_case if feats[c][key] is not None), key=lambda c: feats[c][key])
    order = [c for i, c in enumerate(order) if i in (0, len(order) - 1) or c == _base(feats) or _own_flag(by_case[c])]
    return f"({comp}) {dtype}: " + ", ".join(f"{c} ({fmt(feats[c][key])}) {_x(_excess(by_case[c]))}" for c in order)


def _eps(op, rows, feats, explained):
    if op not in EPS_OPS:
        return None
    found = _magnitude_rule(rows, feats, explained, (1,), towards_small=True)
    if not found:
        return None
    (comp, dtype, end, by_case), = found
    # every case whose fp32 row is off (at any length: eps does not depend on it), in (1) and (3)
    off = {r["case"] for r in rows if r["comparison"] == comp and _own_flag(r)}
    picked = [r for r in rows if _own_flag(r) and id(r) not in explained and r["case"] in off]
    _take(explained, picked)
    full = _series(rows)[(comp, dtype)]  # every length: the text names each case the cause explains
    return _cause("eps", "wrong eps: the error grows as the inputs shrink, already in fp32 "
                  f"(excess by input RMS: {_series_text(comp, dtype, full, feats, 'rms', lambda v: f'rms {v:.2g}')}). "
                  "eps is added to mean(x^2), so a different eps matters most where mean(x^2) is small; rounding "
                  "costs the same at every scale. Use the eps argument, not a constant.", picked)


def _range(op, rows, feats, explained):
    texts, picked = [], []
    for towards_small, what in ((True, "shrink (underflow)"), (False, "grow (overflow)")):
        for comp, dtype, end, by_case in _magnitude_rule([r for r in rows if id(r) not in explained], feats,
                                                         explained, (3,), towards_small):
            picked.append(by_case[end])
            texts.append(f"{dtype} as the inputs {what}: {_series_text(comp, dtype, by_case, feats, 'rms', lambda v: f'rms {v:.2g}')}")
    if not picked:
        return None
    _take(explained, picked)
    return _cause("range", "an intermediate leaves the low format's range: " + "; ".join(texts) + ". Only the low "
                  "formats show it: keep that intermediate (a sum of squares, a product) in fp32.", picked)


def _ends(by_case, feats, key, spread, need):
    cases = [c for c in by_case if feats[c][key] is not None]
    if not cases:
        return None
    lo = _base(feats) if need == "base" else min(cases, key=lambda c: feats[c][key])
    if lo not in by_case or feats[lo][key] is None:
        return None
    hi = max(cases, key=lambda c: feats[c][key])
    if hi == lo or feats[lo][key] <= 0 or feats[hi][key] / feats[lo][key] < spread:
        return None
    return lo, hi


def _along(rows, feats, explained, key, spread, growth, need):
    """The series whose excess grows by `growth` from the low to the high end of `key`."""
    hits, picked = [], []
    for (comp, dtype), by_case in _series([r for r in rows if id(r) not in explained]).items():
        ends = _ends(by_case, feats, key, spread, need)
        if ends is None:
            continue
        lo, hi = ends
        if _own_flag(by_case[hi]) and _excess(by_case[hi]) >= growth * _excess(by_case[lo]):
            hits.append((comp, dtype, by_case))
            picked += [r for r in by_case.values() if _own_flag(r)]
    return hits, picked


def _growth_cause(name, rows, feats, explained, key, spread, growth, need, label, head, tail):
    hits, picked = _along(rows, feats, explained, key, spread, growth, need)
    if not hits:
        return None
    _take(explained, picked)
    text = "; ".join(_series_text(c, d, b, feats, key, label) for c, d, b in hits)
    return _cause(name, f"{head} ({text}). {tail}", picked)


def _rope(op, rows, feats, explained):
    if op != "rope":
        return None
    return _growth_cause("rope_phases", rows, feats, explained, "position", SPREAD, GROWTH, "lowest",
                         lambda v: f"pos <= {v}", "RoPE phases in low precision: the error grows with the position",
                         "An angle pos * inv_freq rounded to the low format is off by about its unit roundoff times "
                         "pos (at 32767 a bf16 angle is a multiple of 256 rad): compute inv_freq, the angles and "
                         "cos/sin in fp32, then cast.")


def _accumulation(op, rows, feats, explained):
    return _growth_cause("accumulation", rows, feats, explained, "length", MIN_LENGTH_RATIO, LENGTH_GROWTH, "base",
                         lambda v: f"length {v}",
                         "accumulation in low precision: the error grows with the reduction's length",
                         "The format's own cost is one rounding of the result at any length; an accumulator kept in "
                         "the low format loses more with every term: accumulate in fp32.")


def _otherwise(rows, explained):
    left = [r for r in rows if _own_flag(r) and id(r) not in explained]
    groups: dict = {}
    for r in left:
        if r["verdict"].startswith("output contract: "):
            kind = ("contract", r["verdict"])
        elif r.get("nonfinite_pattern_mismatch"):
            kind = ("nonfinite", "")
        else:
            kind = ("formula" if r["comparison"] == 1 else "rounding", "")
        groups.setdefault(kind, []).append(r)
    out = []
    for (kind, verdict), picked in groups.items():
        cases = ", ".join(f"{r['case']} {r['dtype']}" + (f" {_x(_excess(r))}" if kind in ("formula", "rounding") else
                                                          f" {r.get('nonfinite_pattern_mismatch')}" if kind == "nonfinite"
                                                          else "") for r in picked)
        text = {
            "contract": f"{verdict} (cases {cases})",
            "nonfinite": f"non-finite outputs differ from torch's (element counts): {cases}. Not an overflow of "
                         "finite inputs: a NaN/inf convention (masked rows, NaN or inf inputs) differs",
            "formula": f"your fp32 result differs from torch's by more than fp32 costs (excess over (0)): {cases}. "
                       "It shows in fp32, so not the low format: a different formula or order of operations "
                       "(a sequential sum against torch's blocked one costs a few x; a wrong formula far more)",
            "rounding": f"rounding: (3) beyond what the format costs (excess over (2)): {cases}, with no growth "
                        "measured across the cases run (scale, length, position): an intermediate rounded to the low format (a cast "
                        "between steps)",
        }[kind]
        out.append(_cause(kind, text, picked))
    return out
