"""nondeterminism's tp section: a row-parallel linear layer over real gloo
processes, and the all-reduce order replayed by the library (allreduce.cu),
checked against an independent step-by-step emulation."""

import itertools
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction

import numpy as np
import pytest

from emulate import round_exact
from helpers import ROOT, json_glossary_problems, loaded_timeout
from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.errors import RunError, UsageError
from precisionlab.experiments import tp

pytest.importorskip("torch.distributed")


# ---------------------------------------------------------------------------
# the replay kernel against an independent emulation


def _add(a: float, b: float, fmt: str) -> float:
    """One addition, the exact sum rounded once (tests/emulate.py); IEEE for
    the non-finite cases, which Fraction cannot hold."""
    if not (np.isfinite(a) and np.isfinite(b)):
        with np.errstate(invalid="ignore"):
            return float(np.float64(a) + np.float64(b))
    return round_exact(Fraction(a) + Fraction(b), fmt)


def _emulate_ring(parts: np.ndarray, fmt: str, offset: int, chunk: int, step: int) -> np.ndarray:
    ranks, n = parts.shape
    out = np.empty(n)
    for i in range(n):
        c = (offset + i) // chunk
        order = [(c + j * step) % ranks for j in range(1, ranks + 1)]  # ends at the chunk's owner, c
        acc = parts[order[0], i]
        for r in order[1:]:
            acc = _add(acc, parts[r, i], fmt)
        out[i] = acc
    return out


def _emulate_tree(parts: np.ndarray, fmt: str) -> np.ndarray:
    out = np.empty(parts.shape[1])
    for i in range(parts.shape[1]):
        level = list(parts[:, i])
        while len(level) > 1:
            nxt = [_add(level[j], level[j + 1], fmt) for j in range(0, len(level) - 1, 2)]
            level = nxt + ([level[-1]] if len(level) % 2 else [])
        out[i] = level[0]
    return out


def _random_partials(rng, ranks: int, n: int, fmt: str) -> np.ndarray:
    # magnitudes over many binades, so sums cancel and round in every way
    x = rng.standard_normal((ranks, n)) * np.exp2(rng.integers(-30, 30, (ranks, n)))
    return formats.get(fmt).round(x)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.array_equal(a.view(np.uint64), b.view(np.uint64))


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5, 7, 8])
def test_replay_matches_emulation(fmt, ranks):
    rng = np.random.default_rng(ranks * 10 + len(fmt))
    n = 97  # odd, not a multiple of any chunk
    parts = _random_partials(rng, ranks, n, fmt)
    code = formats.get(fmt).code
    for step in (-1, 1):
        chunk = int(rng.integers(1, n + 1))
        offset = int(rng.integers(0, chunk * ranks - n + 1)) if chunk * ranks >= n else None
        if offset is None:
            chunk = -(-n // ranks)
            offset = 0
        got = native.allreduce_cpu(parts, code, "ring", offset, chunk, step)
        assert _same_bits(got, _emulate_ring(parts, fmt, offset, chunk, step)), (fmt, ranks, step, chunk, offset)
    assert _same_bits(native.allreduce_cpu(parts, code, "tree"), _emulate_tree(parts, fmt))


def test_replay_special_values():
    """Overflow to inf, inf - inf, NaN and bf16 subnormals go through every step."""
    bf = formats.get("bf16")
    big = bf.max
    tiny = float(bf.round(2.0 ** -130))  # a bf16 subnormal
    parts = np.array([[big, np.inf, np.nan, tiny, 1.0],
                      [big, -np.inf, 1.0, tiny, -1.0],
                      [-big, 1.0, 1.0, -tiny, 2.0 ** -9]])
    for order in ("ring", "tree"):
        got = native.allreduce_cpu(parts, bf.code, order, 0, 2, -1)
        want = (_emulate_ring(parts, "bf16", 0, 2, -1) if order == "ring" else _emulate_tree(parts, "bf16"))
        assert np.array_equal(got, want, equal_nan=True), order
    ring = native.allreduce_cpu(parts, bf.code, "ring", 0, 2, -1)
    assert np.isnan(ring[1]) and np.isnan(ring[2])


def test_replay_orders_differ_where_they_should():
    """Two ranks: every order is a + b. Three or more: ring and tree differ."""
    rng = np.random.default_rng(5)
    code = formats.get("fp32").code
    two = _random_partials(rng, 2, 1000, "fp32")
    assert _same_bits(native.allreduce_cpu(two, code, "ring", 0, 500, -1), native.allreduce_cpu(two, code, "tree"))
    four = _random_partials(rng, 4, 1000, "fp32")
    assert not _same_bits(native.allreduce_cpu(four, code, "ring", 0, 250, -1),
                          native.allreduce_cpu(four, code, "tree"))


@pytest.mark.parametrize("kw, parts", [
    ({"order": "ring", "offset": 0, "chunk": 1, "step": -1}, np.array([[1.0, 2.0]])),  # 2 chunks, 1 rank
    ({"order": "ring", "offset": -1, "chunk": 4, "step": -1}, np.ones((2, 3))),
    ({"order": "ring", "offset": 0, "chunk": 0, "step": -1}, np.ones((2, 3))),
    ({"order": "ring", "offset": 0, "chunk": 4, "step": 2}, np.ones((2, 3))),
    ({"order": "tree", "offset": 0, "chunk": 1, "step": -1}, np.full((2, 3), 1.0 + 2.0 ** -20)),  # not bf16
])
def test_replay_rejects_bad_arguments(kw, parts):
    with pytest.raises(UsageError, match="pl_allreduce_cpu"):
        native.allreduce_cpu(parts, formats.get("bf16").code, **kw)


def test_replay_rejects_too_many_ranks():
    with pytest.raises(UsageError, match="ranks"):
        native.allreduce_cpu(np.ones((257, 1)), formats.get("fp32").code, "tree")


@pytest.mark.parametrize("elements, size, ranks", [(16384, 4, 2), (16384, 2, 8), (3 * (1 << 20) + 4099, 4, 4),
                                                   (7, 2, 8), (1, 4, 3)])
def test_gloo_layout_covers_the_buffer(elements, size, ranks):
    for layout in (tp.gloo_ring_layout, tp.gloo_ring_layout_2018):
        lay = layout(elements, size, ranks)
        assert lay["segments"] % ranks == 0 and lay["segments"] >= 2 * ranks
        assert lay["segment_bytes"] % size == 0
        assert lay["segments"] * lay["segment_bytes"] >= elements * size
        assert lay["chunk"] * ranks >= elements


# ---------------------------------------------------------------------------
# the real thing: gloo over 1, 2, 4 and 8 processes


@pytest.fixture(scope="module")
def rows():
    return tp.run(tp.TpConfig(runs=3))


def _by(rows, dtype):
    return {r["world_size"]: r for r in rows if r["backend"] == "gloo" and r["dtype"] == dtype}


def test_fp32_changes_with_world_size_but_not_for_the_worse(rows):
    d = _by(rows, "fp32")
    assert d[2]["differs_from_ws1"] > 0  # another order of the same sums: other bits
    # ... and no worse: within 2x of the unsplit matmul's error against float64
    assert d[2]["mean_abs_error"] <= 2 * d[1]["mean_abs_error"]
    assert d[2]["max_abs_error"] <= 2 * d[1]["max_abs_error"]


def test_bf16_error_grows_with_world_size(rows):
    d = _by(rows, "bf16")
    errs = [d[p]["mean_abs_error"] for p in tp.WORLD_SIZES]
    assert all(a < b for a, b in itertools.pairwise(errs)), errs
    assert d[8]["max_abs_error"] > d[1]["max_abs_error"]


def test_repeated_runs_give_identical_bits(rows):
    for r in rows:
        if r["backend"] == "gloo":
            assert r["runs"] == 3 and r["distinct"] == 1 and r["repeat_identical"] and r["max_abs_diff"] == 0, r
            assert r["all_ranks_agree"], r


def test_replay_matches_gloo_bit_for_bit(rows):
    for r in rows:
        if r["backend"] == "gloo":
            assert r["replay_matches"] and r["replay_mismatches"] == 0, r["label"]
            assert r["big_replay_matches"], r["label"]
            want = {1: "copy (size 1)", 2: "ring = tree"}
            assert r["algorithm"] == want.get(r["world_size"], "ring"), r["label"]
    # the larger buffer tells gloo's current segmenting from the 2018 one (fp32, 4 ranks)
    assert not _by(rows, "fp32")[4]["big_replay_2018_matches"]


def test_message_size_changes_bits_beyond_two_ranks(rows):
    for dtype in tp.DTYPES:
        d = _by(rows, dtype)
        assert d[1]["big_same_bits"] and d[2]["big_same_bits"]  # a + b in any order
        assert not d[8]["big_same_bits"] and d[8]["big_differs"] > 0
        assert d[2]["tree_differs_from_ring"] == 0 and d[8]["tree_differs_from_ring"] > 0


def test_rows_are_flat_and_nccl_says_why_absent(rows):
    for r in rows:
        assert r["section"] == "tp"
        assert all(v is None or isinstance(v, (bool, int, float, str)) for v in r.values()), r
    nccl = [r for r in rows if r["backend"] == "nccl"]
    assert nccl and all("GPU" in r["refused"] for r in nccl)


def test_rows_follow_the_json_glossary(rows):
    """tests/test_json_glossary.py checks nondeterminism's other sections; tp's
    rows, run here anyway, are checked here (docs/json.md)."""
    assert json_glossary_problems(rows) == []


# ---------------------------------------------------------------------------
# failures and teardown


def _rank_pids(parent: int) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"precisionlab.experiments.tp_rank" in cmd:
            pids.append(int(d))
    return pids


def test_failed_rank_is_one_line_naming_it():
    """Rank 2 fails; ranks 0, 1 and 3 then fail in their all_reduce. The line
    names rank 2, the first to fail, not the lowest."""
    with pytest.raises(RunError) as e:
        tp.launch(tp.TpConfig(world_sizes=(1, 2, 4), fail_rank=2, timeout_s=60))
    msg = str(e.value)
    assert "rank 2 of 4 failed" in msg and "injected failure" in msg and "\n" not in msg, msg
    assert _rank_pids(os.getpid()) == []


def test_hung_rank_times_out_and_is_stopped():
    t0 = time.monotonic()
    with pytest.raises(RunError, match=r"rank.* 1 of 2 did not finish within 3 s"):
        tp.launch(tp.TpConfig(world_sizes=(1, 2), hang_rank=1, timeout_s=3))
    assert time.monotonic() - t0 < 30
    assert _rank_pids(os.getpid()) == []


def test_ctrl_c_leaves_no_ranks():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PRECISIONLAB_DEBUG", None)
    p = subprocess.Popen([sys.executable, "-m", "precisionlab", "nondeterminism", "--sections", "tp", "--device",
                          "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        # Ready when every rank is running. The parent imports torch before it
        # starts them, which on a loaded machine (a load of 10 on 2 cores) took
        # more than the minute this test used to allow: wait for readiness as
        # long as the parent lives, up to tp's own rank timeout stretched by the load.
        limit = loaded_timeout(tp.TIMEOUT_S)
        deadline = time.monotonic() + limit
        seen: list[int] = []
        while time.monotonic() < deadline and len(seen) < max(tp.WORLD_SIZES) and p.poll() is None:
            seen = _rank_pids(p.pid)
            time.sleep(0.05)
        if p.poll() is not None:
            out, err = p.communicate()
            pytest.fail(f"the run ended (exit {p.returncode}) before all its ranks were seen running: {err[-2000:]}")
        assert len(seen) == max(tp.WORLD_SIZES), f"the ranks did not all start within {limit:.0f} s"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)  # Ctrl-C answers at once; the ranks are killed and reaped (_stop)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err  # typer turns Ctrl-C into a quiet exit 130
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
    for pid in seen:
        assert not os.path.exists(f"/proc/{pid}"), f"rank process {pid} survived Ctrl-C"


@pytest.mark.parametrize("kw", [{"seed": -1}, {"runs": 0}, {"runs": tp.MAX_RUNS + 1}])
def test_bad_config_is_a_usage_error(kw):
    with pytest.raises(UsageError):
        tp.run(tp.TpConfig(**kw))
