"""compare tensors: two dumps name by name, or three (REF_FP32 REF_LOW YOURS)
with the three-comparison verdict, so rounding is told from a bug.

Two files A B: each tensor passes when every element satisfies
    |a - b| <= atol + rtol * max(|a|, |b|)          (math.isclose's symmetric rule)
with numerics.compare's tolerances (torch.testing's defaults) for the
LOWER-precision side, whichever argument it is, so swapping A and B never
changes a verdict. Identical infinities agree (as in
torch.testing.assert_close); NaN never agrees unless --equal-nan. rel-L2
(numerics.compare.rel_l2) is measured against the higher-precision side (B on
a tie).

Three files: per tensor, (2) REF_LOW vs REF_FP32 is what the low precision
costs there (the yardstick) and (3) YOURS vs REF_LOW is what your engine adds.
numerics.divergence's rules judge each compared tensor (overflow where
REF_FP32 is finite, (3) beyond RATIO_THRESHOLD x (2), a scale fit YOURS = s x
REF_LOW, the first tensor to differ after bit-identical ones, the first
10x jump), each flag naming its rule and number, and the first flagged
tensor in execution order among those compared is the first divergence.
Two files: a tensor outside its tolerance, or non-finite on the lower side
where the higher one is finite, is flagged by the same module's texts.
A tensor in some files only, or whose shapes differ, is listed apart (with
the shape the reference stores it in), fails the run, and is never the first
divergence; with no tensor compared at all, --map rules are suggested from
execution order and shapes (io/tensor_layout.suggest_maps).
"""

from __future__ import annotations

import fnmatch
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import regex  # re with a timeout: a user's --map pattern may backtrack without end

from precisionlab.report.output import Rows
from precisionlab.catalog import formats
from precisionlab.io import inputs, tensor_layout
from precisionlab.numerics import compare as comparison, divergence, metrics
from precisionlab.errors import UsageError
from precisionlab.io.tensorfiles import DTYPE_TO_FORMAT, TensorFile, natural_key, open_tensor_file

LOW_DTYPES = formats.DUMPED  # what --dtypes A,B[,C] can declare: numerics.compare's table covers each
SORTS = ("order", "error")


@dataclass
class CompareTensorsConfig:
    files: list[str]
    maps: list[str] = field(default_factory=list)
    only: list[str] = field(default_factory=list)
    dtypes: list[str | None] = field(default_factory=list)   # per file: the values' format before dumping
    atol: float | None = None
    rtol: float | None = None
    equal_nan: bool = False
    sort: str = "order"
    fail_fast: bool = False
    # YOURS' layout (io/tensor_layout): --layout, --transpose, --reshape, --unshard; sums come in --map
    layouts: list[str] = field(default_factory=list)
    transposes: list[str] = field(default_factory=list)
    reshapes: list[str] = field(default_factory=list)
    unshards: list[str] = field(default_factory=list)


TensorsResult = Rows  # rows, flags (first_divergence), takeaways, any_failed


def labels(n: int) -> list[str]:
    return ["A", "B"] if n == 2 else ["REF_FP32", "REF_LOW", "YOURS"]


# --- options -------------------------------------------------------------------------


MAP_SECONDS = 10.0  # all --map renames of one file's names together: past it, the pattern is refused


def parse_maps(specs: list[str]) -> list[tuple[regex.Pattern, str]]:
    out = []
    for spec in specs:
        pat, eq, rep = spec.partition("=")
        if not eq or not pat:
            raise UsageError(f"--map needs 'REGEX=REPLACEMENT', got {spec!r}")
        try:
            rx = regex.compile(pat)
            rx.sub(rep, "")  # a malformed replacement fails here; a group it names that the pattern lacks, in rename
        except (regex.error, IndexError) as e:
            raise UsageError(f"--map {spec!r}: {e}") from None
        out.append((rx, rep))
    return out


def rename(names: list[str], rules, where: str) -> dict[str, str]:
    """new name -> stored name, each rule applied in turn, within MAP_SECONDS."""
    out: dict[str, str] = {}
    deadline = time.monotonic() + MAP_SECONDS
    for n in names:
        new = n
        for rx, rep in rules:
            try:
                new = rx.sub(rep, new, timeout=max(deadline - time.monotonic(), 1e-3))
            except (regex.error, IndexError) as e:  # a group the replacement names but the pattern lacks
                raise UsageError(f"--map {rx.pattern!r}={rep!r}: {e}") from None
            except TimeoutError:
                raise UsageError(f"--map {rx.pattern!r}: renaming the tensor names of {where} took over "
                                 f"{MAP_SECONDS:g} s (a pattern that backtracks without end, like '(a|aa)+b'?)") \
                    from None
        if new in out:
            raise UsageError(f"--map makes two tensors of {where} one name: {out[new]!r} and {n!r} -> {new!r}")
        out[new] = n
    return out


def _apply_maps(files: list[TensorFile], rules) -> tuple[list[dict[str, str]], str | None]:
    """Each file's names after --map. The rules rename one side: the one on which
    they make more names match (the last file, YOURS or B, on a tie); in three-way
    mode the two references are one side."""
    ident = [{n: n for n in f.names} for f in files]
    if not rules:
        return ident, None
    sides = [[0], [1]] if len(files) == 2 else [[0, 1], [2]]
    best, best_side = None, None
    error = None
    for side in reversed(sides):
        try:
            maps = [rename(f.names, rules, f.path) if i in side else ident[i] for i, f in enumerate(files)]
        except UsageError as e:  # the rules merge names on this side: it is not the side they were meant for
            error = error or e
            continue
        common = len(set.intersection(*(set(m) for m in maps)))
        if best is None or common > best[0]:
            best, best_side = (common, maps), side
    if best is None:
        raise error
    side_label = ", ".join(labels(len(files))[i] for i in best_side)
    return best[1], side_label


def _ordered(files: list[TensorFile], maps: list[dict[str, str]]) -> list[str]:
    """The first file that records an execution order gives it (dumps of this tool,
    .pt and .npz order); names it lacks follow in natural order."""
    union = list(dict.fromkeys(n for m in maps for n in m))
    for f, m in zip(files, maps, strict=True):
        if f.order_recorded:
            back = {stored: new for new, stored in m.items()}
            first = [back[n] for n in f.names if n in back]
            seen = set(first)
            return first + sorted((n for n in union if n not in seen), key=natural_key)
    return sorted(union, key=natural_key)


# --- statistics -------------------------------------------------------------------------


def _precision(fmt_name: str | None) -> float:
    return math.inf if fmt_name is None else formats.get(fmt_name).precision


def percentile(v: np.ndarray, q: int) -> float:
    """numpy's default (linear) percentile of v, computed exactly and rounded once:
    v[lo] + (h - lo) (v[lo + 1] - v[lo]), h = (n - 1) q / 100."""
    h = Fraction((v.size - 1) * q, 100)
    lo = h.numerator // h.denominator
    hi = min(lo + 1, v.size - 1)
    part = np.partition(v, [lo, hi]) if hi != lo else np.partition(v, lo)
    a, b = Fraction(float(part[lo])), Fraction(float(part[hi]))
    return float(a + (h - lo) * (b - a))


def pair_stats(a: np.ndarray, b: np.ndarray, fmt_a: str | None, fmt_b: str | None, cfg) -> dict:
    """Everything one row shows for A against B (float64 arrays, same shape)."""
    low = fmt_a if _precision(fmt_a) <= _precision(fmt_b) else fmt_b
    ref_is_a = _precision(fmt_a) > _precision(fmt_b)
    rtol, atol = comparison.resolve(low, cfg.rtol, cfg.atol)
    ref, other = (a, b) if ref_is_a else (b, a)
    fa, fb = np.isfinite(a), np.isfinite(b)
    all_finite = bool(fa.all() and fb.all())
    n = a.size
    if all_finite:
        both, bad = None, None
        d = np.subtract(a, b, out=np.empty(a.shape))  # an array for 0-d tensors too (subtract gives a scalar)
        np.abs(d, out=d)
        av, bv, dv, rv = a.ravel(), b.ravel(), d.ravel(), ref.ravel()
    else:
        both = fa & fb
        bad = comparison.nonfinite_pairs(a, b, cfg.equal_nan)[1]
        av, bv, rv = a[both], b[both], ref[both]
        dv = np.subtract(av, bv)
        np.abs(dv, out=dv)
    # in place, one temporary: these arrays hold millions of elements
    tol = np.abs(av)
    np.maximum(tol, np.abs(bv), out=tol)
    tol *= rtol
    tol += atol
    n_out = int(np.count_nonzero(dv > tol)) + (0 if bad is None else int(np.count_nonzero(bad)))
    del tol
    if dv.size:
        k = int(np.argmax(dv))
        max_abs = float(dv[k])
        flat = k if both is None else int(np.flatnonzero(both.ravel())[k])
        # exact sums of products, the ratio rounded once: no overflow past
        # 1e154, no underflow below 1e-154, no last-bit drift
        na2, nb2 = metrics.exact_dot(av, av), metrics.exact_dot(bv, bv)
        if na2 > 0 and nb2 > 0:  # undefined for a zero vector
            dot = metrics.exact_dot(av, bv)
            cosine = metrics.sqrt_ratio(dot * dot, na2 * nb2) * (1.0 if dot >= 0 else -1.0)
        else:
            cosine = None
        ulps = max_ulps(dv, rv, formats.get(low)) if low is not None else None
        off = np.abs(rv) > atol  # near 0 the spacing is the smallest subnormal: ulps mean nothing there
        ulps_off = max_ulps(dv[off], rv[off], formats.get(low)) if low is not None and off.any() else None
        p50, p99 = percentile(dv, 50), percentile(dv, 99)
    else:
        k = flat = None
        max_abs = p50 = p99 = 0.0
        cosine, ulps = None, None if low is None else 0.0
        ulps_off = None
    n_bad = 0 if bad is None else int(np.count_nonzero(bad))
    if n_bad:
        flat = int(np.flatnonzero(bad.ravel())[0])  # a non-finite mismatch is the worst there is
    rel = comparison.rel_l2(other, ref, cfg.equal_nan)
    worst = None if flat is None else tuple(int(i) for i in np.unravel_index(flat, a.shape))
    return {
        "n": n, "n_outside": n_out, "passed": n_out == 0, "max_abs_error": max_abs, "rel_l2": rel,
        "rel_l2_against": "A" if ref_is_a else "B", "reference_all_zero": bool(n_bad == 0 and n > 0 and not np.any(rv)),
        "cosine": cosine, "p50_abs_error": p50, "p99_abs_error": p99, "max_ulps": ulps, "max_ulps_off_zero": ulps_off,
        "ulp_format": low,
        "worst_index": None if worst is None else list(worst),
        "worst_a": None if worst is None else float(a[worst]), "worst_b": None if worst is None else float(b[worst]),
        "nonfinite_a": int(n - np.count_nonzero(fa)), "nonfinite_b": int(n - np.count_nonzero(fb)),
        "nonfinite_mismatch": n_bad, "rtol": rtol, "atol": atol, "tolerance_format": low,
    }


def max_ulps(d: np.ndarray, ref: np.ndarray, fmt) -> float:
    """max |d| / spacing(fmt, ref): formats.Format.spacing, in one exponent
    pass (the exponent of |ref| floored at emin; zero has spacing 2^(emin-p+1))."""
    _, e = np.frexp(ref)
    e -= 1
    np.maximum(e, fmt.emin, out=e)
    e[ref == 0] = fmt.emin
    np.subtract(fmt.precision - 1, e, out=e)
    return float(np.max(np.ldexp(d, e)))


# --- the three-way yardstick over finite elements ------------------------------------------



# --- the comparison ----------------------------------------------------------------------


def _fmt(dtype_name: str, declared: str | None) -> str | None:
    if declared is not None:
        return declared
    return DTYPE_TO_FORMAT.get(dtype_name)


DTYPE_OPTIONS = ("--dtypes (A)", "--dtypes (B)", "--dtypes (C)")  # as a refusal names each file's format


def parse_declared(dtypes: list[str | None], n_files: int) -> list[str | None]:
    """Each file's declared format (--dtypes A,B[,C]), canonical, None where not given."""
    declared = list(dtypes) + [None] * (n_files - len(dtypes))
    # as many as were given or as there are files: the options beyond either are not used
    return [None if d is None else formats.parse_one(d, LOW_DTYPES, opt)
            for d, opt in zip(declared, DTYPE_OPTIONS, strict=False)]


def compare(cfg: CompareTensorsConfig, progress_factory=None) -> TensorsResult:
    n_files = len(cfg.files)
    if n_files not in (2, 3):
        raise UsageError(f"compare tensors takes two files (A B) or three (REF_FP32 REF_LOW YOURS), got {n_files}")
    comparison.check_override(cfg.rtol, cfg.atol)
    if cfg.sort not in SORTS:
        raise UsageError(f"--sort must be one of {', '.join(SORTS)} (got {cfg.sort!r})")
    declared = parse_declared(cfg.dtypes, n_files)
    layout, renames = tensor_layout.parse(cfg.maps, cfg.layouts, cfg.transposes, cfg.reshapes, cfg.unshards)
    rules = parse_maps(renames)
    files = [open_tensor_file(p, d) for p, d in zip(cfg.files, declared, strict=False)]  # a third format unused with 2
    maps, mapped_side = _apply_maps(files, rules)
    files, maps, layout_notes = tensor_layout.arrange(files, maps, layout, labels(n_files))
    names = _ordered(files, maps)
    if cfg.only:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, g) for g in cfg.only)]
        if not names:
            raise UsageError(f"--only {' '.join(cfg.only)}: matches no tensor in the files")
    lab = labels(n_files)
    plan = []
    for name in names:
        where = [i for i, m in enumerate(maps) if name in m]
        shapes = [files[i].shapes[maps[i][name]] if i in where else None for i in range(n_files)]
        plan.append((name, where, shapes))
    _check_memory(files, maps, plan)
    with (progress_factory(len(plan)) if progress_factory else nullcontext(lambda k=1: None)) as progress:
        rows, stopped = _compare_all(cfg, files, maps, declared, plan, progress)
    div = _judge(rows)
    _layout_fields(rows, files, maps, layout_notes)
    first = None if div is None else div.name
    for r in rows:
        r.pop("_judged", None)
    missing = _missing(rows, files, maps)
    # --map rules only where they can be read off: no name in common at all, and both orders recorded
    common = any(all(r["name"] in m for m in maps) for r in rows)
    suggested, swaps = _suggest(files, maps) if not common and files[0].order_recorded and files[-1].order_recorded \
        else ([], [])
    if cfg.sort == "error":
        key = "ratio" if n_files == 3 else "rel_l2"
        rows.sort(key=lambda r: (key in r, -(r.get(key) if r.get(key) is not None else 0.0)))
    skipped = [f"{f.path}: {len(f.skipped)} non-tensor entries skipped" for f in files if f.skipped]
    return TensorsResult(
        params={"files": cfg.files, "labels": lab, "mode": "three-way" if n_files == 3 else "two-way",
                "maps": cfg.maps, "mapped_side": mapped_side, **layout.params(), "only": cfg.only, "declared_dtypes": declared,
                "atol": cfg.atol, "rtol": cfg.rtol, "equal_nan": cfg.equal_nan, "sort": cfg.sort,
                "fail_fast": cfg.fail_fast, "ratio_threshold": comparison.RATIO_THRESHOLD,
                "order": "recorded" if any(f.order_recorded for f in files) else "natural",
                "not_compared": None if stopped is None else len(plan) - stopped},
        rows=rows, flags={"first_divergence": first, "first_divergence_rule": None if div is None else div.flag.rule,
                          "first_divergence_reason": None if div is None else div.flag.text,
                          "compared": sum(r["compared"] for r in rows), "missing": missing,
                          "suggested_maps": suggested, "suggested_transposes": swaps},
        takeaways=_takeaways(rows, n_files, div, stopped, len(plan), skipped, missing, suggested, swaps, files),
        any_failed=any(r["flagged"] for r in rows),
    )


def _per_head(row: dict, name: str, vals: list) -> list:
    """A per-head tensor (<attn>.heads, <attn>.probs: docs/dumps-from-your-engine.md), three-way, head by
    head against that head's own yardstick (experiments/layers_heads): which heads depart, the reading, and
    the flag a departing head adds (the rules apply per head)."""
    from precisionlab.experiments import layers_heads

    kind = layers_heads.kind_of(name)
    if kind is None or vals[0].ndim < -layers_heads.HEAD_AXIS[kind]:
        return []
    fmt = row["tolerance_format"]
    heads = layers_heads.per_head(kind, {"three-way": (vals[2], vals[1], vals[0])},
                                  lambda _view: divergence.rounding(fmt))["three-way"]
    p = layers_heads.pattern(heads, None)
    row.update(per_head=heads, heads_departing=p["departing"], heads_pattern=p["pattern"], heads_reading=p["reading"])
    return layers_heads.flags([{"module": name, "per_head": {"three-way": heads}}]).get((name, "three-way"), [])


def _hidden_overflow(row: dict, vals: list, flags: list, upstream: str | None) -> str | None:
    """The overflow that hides as finite values (issue 40, 4): rows of YOURS
    all zero or constant where REF_FP32's vary (an RMSNorm whose sum of squares
    overflowed: x * rsqrt(inf) = 0), flagged as an overflow AT this tensor with
    what explains it: this tensor's values or squares past the low format's
    range, or the latest such tensor upstream. Returns that upstream phrase
    for the next tensor."""
    low = row["tolerance_format"]
    here = divergence.range_excess(vals[0], low)
    rows = divergence.constant_rows(vals[0], vals[2])
    row["hidden_overflow_rows"] = rows[0] + rows[1]
    row["range_excess"] = here
    flag = divergence.hidden_overflow_flag(rows, low, here or upstream, ref="REF_FP32")
    if flag is not None:
        flags.insert(0, flag)
    return f"upstream at {row['name']}: {here}" if here else upstream


def _compare_all(cfg, files, maps, declared, plan, progress) -> tuple[list[dict], int | None]:
    n_files, lab = len(files), labels(len(files))
    rows: list[dict] = []
    stopped = None
    upstream = None  # the last compared tensor's range excess: a norm's input explains its zero rows
    for idx, (name, where, shapes) in enumerate(plan):
        row = {"name": name, "stored_names": [maps[i].get(name) for i in range(n_files)], "shapes":
               [None if s is None else list(s) for s in shapes],
               "dtypes": [files[i].dtypes[maps[i][name]] if i in where else None for i in range(n_files)]}
        if len(where) < n_files:
            status = "only in " + ", ".join(lab[i] for i in where)
            row.update(status=status, passed=False, compared=False, flagged=True, rule="not_compared",
                       reason=f"not compared: {status}", flags=[])
        elif len(set(shapes)) > 1:
            row.update(status="shape mismatch", passed=False, compared=False, flagged=True, rule="not_compared",
                       reason="not compared: shapes " + " vs ".join(tensor_layout.dims(s) for s in shapes), flags=[])
        else:
            row["compared"] = True
            fmts = [_fmt(files[i].dtypes[maps[i][name]], declared[i]) for i in range(n_files)]
            vals = [inputs.as_float64(files[i].get(maps[i][name]), f"{files[i].path}: {maps[i][name]!r}") for i in range(n_files)]
            if n_files == 2:
                row.update(pair_stats(vals[0], vals[1], fmts[0], fmts[1], cfg))
                # overflow: the lower-precision side non-finite where the higher one is finite; on a tie
                # either side where the other is (swapping A and B changes no verdict)
                tie = _precision(fmts[0]) == _precision(fmts[1])
                ref_i = 0 if row["rel_l2_against"] == "A" else 1
                ov = divergence.overflow_split(vals[ref_i], vals[1 - ref_i])
                if tie:
                    back = divergence.overflow_split(vals[1 - ref_i], vals[ref_i])
                    ov = (ov[0] + back[0], ov[1] + back[1])
                row["overflow"] = ov[0] + ov[1]
                flags = divergence.judge_tensor(0.0, 0.0, ratio=0.0, overflow=ov,
                                                ref="the other file" if tie else lab[ref_i])
                if not row["passed"]:
                    flags.append(divergence.tolerance_flag(row["n_outside"], row["n"], row["rtol"], row["atol"]))
                row["_judged"] = divergence.Judged(name, row["rel_l2"], 0.0, flags)  # no yardstick: no order rule
            else:
                y2 = comparison.rel_l2(vals[1], vals[0], cfg.equal_nan)   # (2) ref low vs ref fp32: the yardstick
                row.update(pair_stats(vals[2], vals[1], fmts[2], fmts[1], cfg))  # (3) yours vs ref low
                y3 = row["rel_l2"]
                fin = comparison.finite_yardstick(vals[0], vals[1], vals[2], cfg.equal_nan)
                ratio = comparison.three_way_ratio(y3, fin)
                row.update(yardstick=y2, rel_l2=y3, rel_l2_against="REF_LOW",
                           accumulated=comparison.rel_l2(vals[2], vals[0], cfg.equal_nan), ratio=ratio, **fin)
                scale, z = divergence.scale_fit(vals[2], vals[1], fin["yardstick_finite"])
                ov = divergence.overflow_split(vals[0], vals[2])
                row.update(scale_fit=scale, bias_z=z, overflow=ov[0] + ov[1])
                flags = divergence.judge_tensor(y3, fin["yardstick_finite"], ratio=ratio, scale=(scale, z),
                                                overflow=ov, ref="REF_FP32",
                                                rounding=divergence.rounding(row["tolerance_format"]))
                upstream = _hidden_overflow(row, vals, flags, upstream)
                flags += _per_head(row, name, vals)
                row["_judged"] = divergence.Judged(name, y3, ratio, flags,
                                                   rounding=divergence.rounding(row["tolerance_format"]))
            row["formats"] = fmts
            del vals
        rows.append(row)
        progress(1)
        if cfg.fail_fast:
            _judge(rows)
            if row["flagged"]:
                stopped = idx + 1
                break
    return rows, stopped


def _judge(rows: list[dict]):
    """numerics.divergence over the compared rows so far, in execution order:
    each compared row's flagged/rule/reason/flags, and the first divergence
    (a Divergence, or None). Causal and idempotent: --fail-fast calls it
    after every row."""
    judged = [r["_judged"] for r in rows if r.get("compared")]
    first = divergence.first_divergence(judged)
    for r in rows:
        if r.get("compared"):
            r.update(divergence.row_fields(r["_judged"].flags))
            three = "ratio" in r
            r["status"] = ("flagged" if three else "fail") if r["flagged"] else "ok"
    return first


def _layout_fields(rows, files, maps, notes) -> None:
    """Each row's `layout` (what was done to bring its shapes together) and,
    where they still differ or a shard stands alone, `layout_hint`: the option
    that would bring YOURS (the last file) to the reference's layout."""
    ref_shapes = {n: files[0].shapes[k] for n, k in maps[0].items()}
    our_shapes = {n: files[-1].shapes[k] for n, k in maps[-1].items()}
    for r in rows:
        r["layout"] = notes.get(r["name"], [])
        hint = None
        if r["status"] == "shape mismatch":
            hint = tensor_layout.hint_shapes(r["name"], tuple(r["shapes"][0]), tuple(r["shapes"][-1]))
        elif r["name"] in our_shapes and r["name"] not in ref_shapes:
            hint = tensor_layout.hint_shards(r["name"], our_shapes, ref_shapes)
        r["layout_hint"] = hint


def _check_memory(files, maps, plan) -> None:
    """Peak: one tensor from each file in its stored dtype, its float64 copies,
    the statistics' float64 temporaries (difference, tolerance, ratio, the
    ulps where the reference is off zero) and that mask (a byte an element).
    Measured, two fp32 files: 68 B an element from 2M to 4M elements."""
    peak, what = 0, ""
    for name, where, shapes in plan:
        if len(where) < len(files) or len(set(shapes)) > 1:
            continue
        n = int(np.prod(shapes[0], dtype=np.int64))
        stored = sum(files[i].nbytes(maps[i][name]) for i in where)
        need = stored + n * (8 * (len(files) + 5) + 1)
        if need > peak:
            peak, what = need, name
    if peak:
        inputs.check_memory(peak, f"comparing {what!r}")


def _missing(rows, files, maps) -> list[dict]:
    """The tensors in some files only, listed apart: where each is, and the
    layout (shape, dtype) the first file holding it stores it in."""
    lab = labels(len(files))
    out = []
    for r in rows:
        if not r["status"].startswith("only in"):
            continue
        where = [i for i, m in enumerate(maps) if r["name"] in m]
        i = where[0]
        out.append({"name": r["name"], "only_in": [lab[k] for k in where],
                    "missing_from": [lab[k] for k in range(len(files)) if k not in where],
                    "stored_as": maps[i][r["name"]], "shape": list(files[i].shapes[maps[i][r["name"]]]),
                    "dtype": files[i].dtypes[maps[i][r["name"]]], "stored_in": lab[i]})
    return out


def _suggest(files, maps) -> tuple[list[str], list[str]]:
    """--map rules (and --transpose globs) pairing YOURS' tensors (the last
    file) with the reference's by execution order and shape, for files with no
    name in common."""
    ref, ours = files[0], files[-1]
    return tensor_layout.suggest_maps([(n, tuple(ref.shapes[n])) for n in ref.names],
                                      [(n, tuple(ours.shapes[n])) for n in ours.names])


def _missing_line(missing: list[dict]) -> str:
    shown = "; ".join(f"{m['name']} (only in {', '.join(m['only_in'])}: {tensor_layout.dims(m['shape'])} "
                      f"{m['dtype']})" for m in missing[:4])
    more = f"; and {len(missing) - 4} more" if len(missing) > 4 else ""
    return f"{len(missing)} tensors not compared (in some files only; never a divergence): {shown}{more}."


def _takeaways(rows, n_files, div, stopped, total, skipped, missing, suggested, swaps, files) -> list[str]:
    out = []
    compared = [r for r in rows if r.get("compared")]
    shapes = [r for r in rows if r["status"] == "shape mismatch"]
    one_sided = [r for r in rows if r["status"].startswith("only in")]
    lab = labels(n_files)
    if not compared:
        counts = ", ".join(f"{lab[i]} {len(f.names)}" for i, f in enumerate(files))
        out.append(f"0 of 0 tensors compared: no tensor is in every file with one shape ({counts} tensors).")
        if suggested:
            out.append("pairing the tensors by execution order and shape suggests: "
                       + " ".join([f"--map '{m}'" for m in suggested] + [f"--transpose '{g}'" for g in swaps])
                       + " (check each: the pairing is a guess).")
        elif not any(r["status"] == "shape mismatch" for r in rows):
            out.append("no --map rules suggested (that needs both files' execution order and a pairing by shape): "
                       "rename with --map 'REGEX=REPLACEMENT'.")
    elif n_files == 2:
        n_ok = sum(r["passed"] for r in compared)
        out.append(f"{n_ok} of {len(compared)} compared tensors within tolerance"
                   + (f"; first failing in order: {div.name} ({div.flag.text})." if div else "."))
    else:
        flagged = [r for r in compared if r["flagged"]]
        if flagged:
            by_rule: dict[str, int] = {}
            for r in flagged:
                by_rule[r["rule"]] = by_rule.get(r["rule"], 0) + 1
            out.append(f"{len(flagged)} of {len(compared)} compared tensors flagged ("
                       + ", ".join(f"{k} {v}" for k, v in by_rule.items())
                       + f"); first divergence: {div.name}: {div.flag.text}.")
        else:
            out.append(f"0 of {len(compared)} compared tensors flagged by any rule (overflow, beyond "
                       f"{comparison.RATIO_THRESHOLD:g}x, scale fit, first to differ, first jump): YOURS is as close "
                       "as REF_LOW.")
    headed = [r for r in compared if r.get("heads_departing")]
    if headed:
        reading = headed[0]["heads_reading"]
        out.append(f"inside attention: at {headed[0]['name']}, {reading}{'' if reading.endswith('?') else '.'}")
    over = [r for r in compared if r.get("overflow")]
    if over:
        out.append(f"{len(over)} tensors overflow (non-finite where {lab[0] if n_files == 3 else 'the reference'} "
                   f"is finite; first: {over[0]['name']}, {over[0]['overflow']} elements): an overflow, not rounding.")
    hidden = [r for r in compared if r.get("hidden_overflow_rows")]
    if hidden:
        out.append(f"{len(hidden)} tensors have rows of YOURS all zero or constant where REF_FP32's vary (first: "
                   f"{hidden[0]['name']}, {hidden[0]['hidden_overflow_rows']} rows): an overflow that hides as "
                   "finite values (rsqrt(inf) = 0), not rounding; "
                   + divergence.NORM_HINT.format(fmt=hidden[0]["tolerance_format"]) + ".")
    if n_files == 3:
        overflowed = [r for r in compared if r.get("nonfinite_elements") and not math.isfinite(r["yardstick"])]
        if overflowed:
            r = overflowed[0]
            out.append(f"{len(overflowed)} tensors have a non-finite yardstick (REF_LOW overflowed or is NaN where "
                       f"REF_FP32 is not; first: {r['name']}, {r['nonfinite_elements']} non-finite elements): "
                       "their verdict judges the finite elements by what the low precision costs there.")
    if one_sided and compared:
        out.append(_missing_line(missing))
    if shapes:
        hinted = next((r for r in shapes if r.get("layout_hint")), None)
        out.append(f"{len(shapes)} tensors differ in shape" + (
            f"; {hinted['name']}: {' vs '.join(tensor_layout.dims(s) for s in hinted['shapes'])}, which "
            f"{hinted['layout_hint']} brings to the reference's layout." if hinted else "."))
    shards = next((r for r in one_sided if r.get("layout_hint")), None)
    if shards:
        out.append(f"{shards['name']} looks like a tensor-parallel shard: {shards['layout_hint']} concatenates them.")
    if stopped is not None and stopped < total:
        out.append(f"--fail-fast: stopped after {stopped} of {total} tensors.")
    return out + skipped
