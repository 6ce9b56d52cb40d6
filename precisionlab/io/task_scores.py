"""Per-question correctness of one build on a task: lm-evaluation-harness's
per-sample log, or a plain CSV.

lm-evaluation-harness (`--log_samples`) writes `samples_<task>_<time>.jsonl`:
one JSON object a line, with `doc_id`, the document, the arguments and
responses, `filter` (the answer-extraction filter: gsm8k writes each document
once per filter, e.g. `strict-match` and `flexible-extract`), `metrics` (the
names of the metrics computed) and each metric's value at top level
(`"acc": 1.0`, `"exact_match": 0.0`). Only `doc_id`, `filter`, `metrics` and
the chosen metric are read; the rest of a line is never interpreted.

A CSV has a header; the question id is the first column named `doc_id`, `id`
or `question_id` (else the first column), the correctness the column named by
--metric, else the first named `correct`, `acc` or `exact_match`; values 0/1
or true/false.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass

from precisionlab.errors import UsageError
from precisionlab.io import inputs

PREFERRED_METRICS = ("acc", "exact_match", "correct")
ID_COLUMNS = ("doc_id", "id", "question_id")
# JSONL lines are held as parsed objects one at a time; the scores as (id, 0/1)
BYTES_PER_QUESTION = 200


@dataclass
class Scores:
    path: str
    kind: str                 # "lm-eval samples" or "csv"
    metric: str
    filter: str | None
    correct: dict[str, int]   # question id (as text) -> 0 or 1


def _bit(v, where: str) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v in (0, 1):
        return int(v)
    if isinstance(v, str) and v.strip().lower() in ("0", "1", "true", "false", "0.0", "1.0"):
        return int(v.strip().lower() in ("1", "true", "1.0"))
    raise UsageError(f"{where}: {v!r} is not a 0/1 correctness (compare scores pairs right/wrong per question; "
                     f"a graded metric such as f1 is not one)")


def read(path: str, what: str, metric: str | None = None, filter_: str | None = None) -> Scores:
    p = inputs.check_regular_file(path, what)
    inputs.check_memory(4 * p.stat().st_size, f"{what} {path!r}")
    try:
        with open(p, encoding="utf-8-sig", newline="") as f:  # a spreadsheet's BOM is no part of the header
            head = f.read(4096).lstrip()
            f.seek(0)
            if not head:
                raise UsageError(f"{what} {path!r}: empty file")
            if head.startswith("{"):
                return _read_jsonl(f, path, what, metric, filter_)
            if filter_ is not None:
                raise UsageError(f"--filter: {what} {path!r} is a CSV, which has no filters")
            return _read_csv(f, path, what, metric)
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path!r}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"{what} {path!r}: cannot read ({e.strerror})") from None


def _no_nan(token: str):
    raise ValueError(f"{token} is not a JSON number")


def _choose_metric(rec: dict, where: str) -> str:
    named = [m for m in rec.get("metrics", []) if isinstance(m, str)] if isinstance(rec.get("metrics"), list) else []
    for m in (*PREFERRED_METRICS, *named):
        if m in rec:
            return m
    raise UsageError(f"{where}: no correctness field (looked for {', '.join(PREFERRED_METRICS)} and the "
                     f"line's 'metrics'); name one with --metric")


def _read_jsonl(f, path: str, what: str, metric: str | None, filter_: str | None) -> Scores:
    by_filter: dict[str | None, dict[str, int]] = {}
    for i, line in enumerate(f, 1):
        if not line.strip():
            continue
        where = f"{what} {path!r} line {i}"
        try:
            rec = json.loads(line, parse_constant=_no_nan)
        except ValueError as e:
            raise UsageError(f"{where}: not JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(rec, dict) or "doc_id" not in rec:
            raise UsageError(f"{where}: no 'doc_id' (an lm-evaluation-harness samples_*.jsonl line has one)")
        metric = metric or _choose_metric(rec, where)
        if metric not in rec:
            raise UsageError(f"{where}: no field {metric!r} (--metric)")
        flt = rec.get("filter")
        flt = flt if isinstance(flt, str) else None
        seen = by_filter.setdefault(flt, {})
        key = json.dumps(rec["doc_id"]) if not isinstance(rec["doc_id"], str) else rec["doc_id"]
        if key in seen:
            raise UsageError(f"{where}: doc_id {key} appears twice" + (f" under filter {flt!r}" if flt else ""))
        seen[key] = _bit(rec[metric], f"{where} {metric!r}")
    if not by_filter:
        raise UsageError(f"{what} {path!r}: no samples")
    if filter_ is None and len(by_filter) > 1:
        names = ", ".join(sorted(str(k) for k in by_filter))
        raise UsageError(f"{what} {path!r} scores each question under several filters ({names}); pick one with "
                         f"--filter")
    if filter_ is not None and filter_ not in by_filter:
        names = ", ".join(sorted(str(k) for k in by_filter))
        raise UsageError(f"--filter {filter_!r}: {what} {path!r} has filters {names}")
    flt = filter_ if filter_ is not None else next(iter(by_filter))
    return Scores(path, "lm-eval samples", metric, flt, by_filter[flt])


def _read_csv(f, path: str, what: str, metric: str | None) -> Scores:
    try:
        rows = csv.reader(f)
        header = next(rows, None)
        if not header:
            raise UsageError(f"{what} {path!r}: no header line")
        cols = [h.strip() for h in header]
        id_col = next((cols.index(c) for c in ID_COLUMNS if c in cols), 0)
        wanted = (metric,) if metric else (*PREFERRED_METRICS,)
        ok_col = next((cols.index(c) for c in wanted if c in cols), None)
        if ok_col is None or ok_col == id_col:
            raise UsageError(f"{what} {path!r}: no column {' or '.join(repr(c) for c in wanted)} (the header has "
                             f"{', '.join(repr(c) for c in cols)})")
        out: dict[str, int] = {}
        for i, row in enumerate(rows, 2):
            if not any(c.strip() for c in row):
                continue
            where = f"{what} {path!r} line {i}"
            if len(row) <= max(id_col, ok_col):
                raise UsageError(f"{where}: {len(row)} fields, the header has {len(cols)}")
            key = row[id_col].strip()
            if key in out:
                raise UsageError(f"{where}: question {key!r} appears twice")
            out[key] = _bit(row[ok_col], f"{where} {cols[ok_col]!r}")
    except csv.Error as e:
        raise UsageError(f"{what} {path!r}: not a CSV ({e})") from None
    if not out:
        raise UsageError(f"{what} {path!r}: no questions")
    return Scores(path, "csv", cols[ok_col], None, out)


def pair(a: Scores, b: Scores) -> list[tuple[int, int]]:
    """(A's, B's) correctness per question, in A's order; both must hold the same questions."""
    only_a = [k for k in a.correct if k not in b.correct]
    only_b = [k for k in b.correct if k not in a.correct]
    if only_a or only_b:
        side, first = ("A", only_a[0]) if only_a else ("B", only_b[0])
        raise UsageError(f"A has {len(a.correct)} questions, B {len(b.correct)}; {len(only_a) + len(only_b)} are "
                         f"in one only (first: {first!r}, only in {side}): a paired test needs the same questions")
    return [(a.correct[k], b.correct[k]) for k in a.correct]
