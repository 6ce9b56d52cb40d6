"""compare moved REF A B: where did build B move away from REF more than build
A did? Three per-layer dumps of one input (compare tensors' files: this
tool's --dump, an engine's .safetensors/.npz/.pt); in REF's execution order,
each tensor all three hold with one shape gives

  A's error   rel-L2 of A against REF: what an accepted build costs there, the
              yardstick (compare tensors' (2), REF_LOW against REF_FP32);
  B - A       rel-L2 of B against A: how far B moved from the accepted build
              (compare tensors' (3), YOURS against REF_LOW);
  B's error   rel-L2 of B against REF, shown beside them;

and numerics.divergence's rules, unchanged, in compare tensors' three-way
roles (REF_FP32 = REF, REF_LOW = A, YOURS = B): overflow (B non-finite where
REF and A are finite), ratio (B - A beyond 4x A's error), scale_fit (B = s x
A), and over the order first_differs (B's first difference from A after
bit-identical tensors, at least A's error there) and first_jump (B - A 10x the
tensor before's). The first flagged tensor is where B moved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from precisionlab.errors import UsageError
from precisionlab.io import inputs, tensorfiles
from precisionlab.numerics import compare, divergence


@dataclass
class MovedConfig:
    ref: str
    a: str
    b: str


@dataclass
class MovedResult:
    params: dict
    rows: list[dict]
    first_divergence: dict | None
    missing: list[dict]
    failures: list[str]
    takeaways: list[str]
    timing: dict


def _values(tf, name: str) -> np.ndarray:
    return np.asarray(tf.get(name), dtype=np.float64)


def run(cfg: MovedConfig, advance=lambda k=1: None) -> MovedResult:
    files = {}
    for side, path in (("REF", cfg.ref), ("A", cfg.a), ("B", cfg.b)):
        try:
            files[side] = tensorfiles.open_tensor_file(path)
        except UsageError as e:
            raise UsageError(f"{side}: {e}") from None
    ref, a, b = files["REF"], files["A"], files["B"]
    t0 = time.perf_counter()
    rows, judged, missing = [], [], []
    for name in ref.names:
        absent = [s for s, f in (("A", a), ("B", b)) if name not in f.shapes]
        if absent:
            missing.append({"name": name, "missing_from": absent})
            continue
        shapes = {s: tuple(f.shapes[name]) for s, f in files.items()}
        if len(set(shapes.values())) > 1:
            missing.append({"name": name, "shapes": {s: list(v) for s, v in shapes.items()}})
            continue
        inputs.check_memory(4 * 8 * int(np.prod(shapes["REF"], dtype=np.int64)), f"tensor {name!r}")
        r, va, vb = _values(ref, name), _values(a, name), _values(b, name)
        err_a, err_b, moved = compare.rel_l2(va, r), compare.rel_l2(vb, r), compare.rel_l2(vb, va)
        both = np.isfinite(r) & np.isfinite(va)
        over = divergence.overflow_split(np.where(both, r, np.nan), vb)
        fit = divergence.scale_fit(vb, va, err_a) if np.isfinite(vb).all() and np.isfinite(va).all() else None
        flags = [divergence.Flag(f.rule, f.text.replace("YOURS", "B", 1), f.value)  # B is YOURS here
                 for f in divergence.judge_tensor(moved, err_a, scale=fit, overflow=over, against="A",
                                                  ref="REF and A")]
        j = divergence.Judged(name, moved, compare.ratio(moved, err_a), flags)
        judged.append(j)
        rows.append({"name": name, "shape": list(shapes["REF"]), "error_a": err_a, "error_b": err_b,
                     "diff_ba": moved, "ratio": j.ratio, "scale_fit": fit[0] if fit else None,
                     "bias_z": fit[1] if fit else None})
        advance()
    if not rows:
        raise UsageError("no tensor is in all of REF, A and B with one shape: nothing to compare")
    first = divergence.first_divergence(judged)
    for row, j in zip(rows, judged, strict=True):
        row.update(divergence.row_fields(j.flags))
    fd = first.as_dict() if first else None
    params = {"ref": cfg.ref, "a": cfg.a, "b": cfg.b, "compared": len(rows)}
    failures = [f"B moved at {fd['name']}: {fd['text']}"] if fd else []
    return MovedResult(params, rows, fd, missing, failures, takeaways(fd, rows, missing),
                       {"run_s": time.perf_counter() - t0})


def takeaways(fd: dict | None, rows: list[dict], missing: list[dict]) -> list[str]:
    lines = []
    if fd is None:
        lines.append(f"B stays within A's distance from REF at all {len(rows)} compared tensors "
                     f"(no rule fired): nothing moved beyond the yardstick.")
    else:
        r = next(x for x in rows if x["name"] == fd["name"])
        lines.append(f"B moved first at {fd['name']}: {fd['text']} (B against A: rel-L2 {r['diff_ba']:.3g}; "
                     f"against REF: B {r['error_b']:.3g}, A {r['error_a']:.3g}).")
    if missing:
        lines.append(f"{len(missing)} tensors of REF were not compared (missing from A or B, or shapes differ); "
                     f"they are listed apart, never a divergence.")
    return lines
