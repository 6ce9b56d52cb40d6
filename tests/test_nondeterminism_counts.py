"""nondeterminism's batch rows: every column counts over the same rows (the
first 64, each alone vs in every batch that holds it), recomputed here from
the kernels themselves, and the table's headers say what each counts."""

import numpy as np

from helpers import cli
from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.experiments import nondeterminism as nd

FP32 = formats.get("fp32").code  # format codes by name, never literals


def _batch_rows():
    res = nd.run(nd.NondetConfig(runs=2, n=1000, device="cpu", sections="batch"))
    return [r for r in res.rows if r["section"] == "batch"]


def test_every_batch_row_counts_over_the_same_rows():
    rows = _batch_rows()
    assert len(rows) == 6  # torch fp32, torch bf16, softmax x2, rmsnorm x2
    pairs = sum(min(bs, nd.CHECK_ROWS) for bs in nd.BATCH_SIZES)
    for r in rows:
        assert r["rows_compared"] == nd.CHECK_ROWS and r["pairs_compared"] == pairs, r["label"]
        changed = r["rows_changed"] > 0
        # one row changed somewhere <=> some row took two results <=> some batch differs
        assert changed == (r["distinct_per_row_max"] > 1) == bool(r["differs_at"]) == (r["pairs_changed"] > 0)
        assert r["rows_changed"] <= r["pairs_changed"] <= r["pairs_compared"]


def test_batch_counts_match_an_independent_recount():
    # softmax with the batch-dependent launch, recounted from the kernel here
    big = nd._batch_inputs(0, nd.BATCH_COLS)
    lanes = lambda bs: native.adaptive_lanes(bs, nd.BATCH_COLS, nd.H200_SMS)
    alone = [native.softmax_cpu_lanes(big[i:i + 1], FP32, lanes(1))[0] for i in range(nd.CHECK_ROWS)]
    outs = {bs: native.softmax_cpu_lanes(big[:bs], FP32, lanes(bs)) for bs in nd.BATCH_SIZES}
    seen = [{alone[i].tobytes()} | {outs[bs][i].tobytes() for bs in outs if bs > i} for i in range(nd.CHECK_ROWS)]
    changed_rows = sum(len(s) > 1 for s in seen)
    pairs = sum(not np.array_equal(outs[bs][i], alone[i]) for bs in outs for i in range(min(bs, nd.CHECK_ROWS)))
    (r,) = [r for r in _batch_rows() if (r["op"], r["variant"]) == ("softmax", "stable_adaptive")]
    assert changed_rows > 0
    assert (r["rows_changed"], r["pairs_changed"], r["distinct_per_row_max"]) == \
        (changed_rows, pairs, max(len(s) for s in seen))


def test_batch_table_names_what_each_column_counts():
    r = cli("nondeterminism", "--sections", "batch", "--n", "1000", "--runs", "2", "--device", "cpu",
            env={"COLUMNS": "250"})
    assert r.code == 0, r.err
    for header in ("rows changed", "pairs changed", "most distinct"):
        assert header in r.out
    assert "of 64" in r.out and "of 245" in r.out
    text = " ".join(r.out.split())
    assert "pairs changed: (row, batch size) pairs that differ" in text
    assert "most distinct: the most different results one row took" in text
