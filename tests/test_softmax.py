"""softmax kernels (CPU here, GPU in test_softmax_gpu.py) against float64, the
edge cases, the named bugs, and the command's conventions."""

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import cli, strict_json
from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.experiments import softmax as sm

NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
CORRECT = ["naive", "stable", "online"]
COLS = [1, 2, 31, 32, 33, 1023, 1025, 4097, 151936, 262144]


def run(x, dtype="fp32", method="stable", masked="nan", device="cpu"):
    fmt = formats.get(dtype)
    xs = np.ascontiguousarray(np.atleast_2d(np.asarray(x, dtype=np.float64)).astype(NP[dtype]))
    fn = native.softmax_cpu if device == "cpu" else native.softmax_cuda
    y, lse = fn(xs, fmt.code, method, masked)
    return y.astype(np.float64), lse, xs.astype(np.float64)


def check_close(y, stored, dtype, masked="nan"):
    ref, _ = sm.reference(stored, masked)
    rep = sm.metrics.error_report(y, ref, formats.get(dtype), sm.atol_for(formats.get(dtype), y.shape[1]),
                                  sm.RTOL[dtype])
    assert rep.passed, rep


@pytest.mark.parametrize("method", CORRECT)
def test_ordinary_values(method):
    y, lse, _ = run([1, 2, 3], method=method)
    np.testing.assert_allclose(y[0], [0.0900306, 0.2447285, 0.6652410], atol=1e-6, rtol=0)
    assert lse[0] == pytest.approx(3.40760596, abs=1e-6)


@pytest.mark.parametrize("method", ["stable", "online"])
def test_shift_invariance_is_exact(method):
    a, _, _ = run([1, 2, 3], method=method)
    b, _, _ = run([101, 102, 103], method=method)
    assert np.array_equal(a, b)  # x - max is exact in both: the same bits
    assert np.allclose(run([0, 0, 0], method=method)[0], 1 / 3, atol=1e-7)


def test_naive_overflows_and_underflows_stable_does_not():
    for x in ([1000, 1001, 1002], [-1000, -1001, -1002], [101, 102, 103]):
        assert np.isnan(run(x, method="naive")[0]).all()
        for m in ("stable", "online"):
            y, _, s = run(x, method=m)
            assert np.isfinite(y).all()
            check_close(y, s, "fp32")


def test_naive_log_sum_exp_overflows_stable_does_not():
    assert math.isinf(run([1000, 1001, 1002], method="naive")[1][0])
    assert run([1000, 1001, 1002], method="stable")[1][0] == pytest.approx(1002.40760596, abs=1e-4)


@pytest.mark.parametrize("method", CORRECT + ["bug_zero_start", "bug_no_rescale", "lowp_accum"])
def test_masked_row_policy(method):
    y, lse, _ = run([-np.inf] * 4, method=method, masked="nan")
    assert np.isnan(y).all()
    y, lse, _ = run([-np.inf] * 4, method=method, masked="zero")
    assert (y == 0).all() and lse[0] == -np.inf


@pytest.mark.parametrize("method", CORRECT)
def test_nan_in_a_row_makes_it_nan(method):
    assert np.isnan(run([1, np.nan, 3], method=method)[0]).all()


def test_lowp_accumulation_gives_one_over_256():
    assert (run(np.zeros(512), "bf16", "lowp_accum")[0] == 1 / 256).all()
    assert (run(np.zeros(512), "bf16", "stable")[0] == 1 / 512).all()


def check_no_rescale_bug(device):
    assert np.allclose(run([1, 2, 3], method="bug_no_rescale", device=device)[0], 1 / 3, atol=1e-7)
    # a masked logit adds 0, wherever it falls: the bug shown is the missing rescale alone
    assert np.array_equal(run([1, -np.inf, 2], method="bug_no_rescale", device=device)[0][0], [0.5, 0, 0.5])


def test_fused_running_max_without_rescale_gives_a_third():
    check_no_rescale_bug("cpu")


def check_zero_identity_bug(device):
    """The max's idle slots feed 0: threads past the row's end (cols 3, 1000)
    and the second stage's empty warp slots (cols 32, 992: fewer than 32
    warps). With 1024 busy threads in 32 warps (cols 1024, 2048) it hides."""
    rng = np.random.default_rng(0)
    for cols in (3, 32, 992, 1000):
        assert np.isnan(run(-1000 - rng.random(cols), method="bug_zero_identity", device=device)[0]).all(), cols
    for cols in (1024, 2048):
        y, _, s = run(-1000 - rng.random(cols), method="bug_zero_identity", device=device)
        check_close(y, s, "fp32")
    assert np.isnan(run([-1000, -1001, -1002], method="bug_zero_start", device=device)[0]).all()


def test_zero_identity_shows_wherever_the_block_has_idle_slots():
    assert native.softmax_lanes(3) == 32 and native.softmax_lanes(1024) == 1024
    check_zero_identity_bug("cpu")


SHIFTED = ["stable", "online"]  # the methods that subtract the max (GPU adds single_pass, online_vec)


def partly_masked_rows(cols: int, seed: int) -> np.ndarray:
    """Rows with some logits -inf (causal and padding masks), each with at
    least one finite logit: ordinary rows, which must come out right."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, cols)) * 3
    x[0, : cols // 2] = -np.inf  # a leading masked block, as a lane or leaf may see first
    x[1, rng.random(cols) < 0.5] = -np.inf
    x[2, 1:] = -np.inf
    x[3, :-1] = -np.inf
    x[1, cols // 2] = 0.5
    return x


def check_partly_masked(method, device, cols, dtype="fp32"):
    y, lse, s = run(partly_masked_rows(cols, cols), dtype, method, device=device)
    check_close(y, s, dtype)
    _, ref_lse = sm.reference(s, "nan")
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def check_non_finite_rows(method, device):
    """A NaN logit makes its row NaN under either masked policy (fmax would
    drop it and, with the rest -inf, zero the row); so does +inf in a shifted
    method (inf - inf). A masked row under the nan policy has a NaN lse too."""
    for masked in ("nan", "zero"):
        for x in ([np.nan], [-np.inf, np.nan, -np.inf], [1, np.nan, 3], [1, np.inf, 2], [np.inf]):
            y, lse, _ = run(x, method=method, masked=masked, device=device)
            assert np.isnan(y).all() and np.isnan(lse).all(), (x, masked)
    y, lse, _ = run([-np.inf] * 4, method=method, masked="nan", device=device)
    assert np.isnan(y).all() and np.isnan(lse).all()


@pytest.mark.parametrize("cols", [2, 31, 64, 65, 100, 1025, 4097])
@pytest.mark.parametrize("method", SHIFTED + ["naive"])
def test_partly_masked_rows_are_ordinary(method, cols):
    check_partly_masked(method, "cpu", cols)


@pytest.mark.parametrize("method", SHIFTED)
def test_non_finite_rows(method):
    check_non_finite_rows(method, "cpu")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cols=st.sampled_from(COLS), dtype=st.sampled_from(["fp32", "bf16", "fp16"]),
       method=st.sampled_from(CORRECT), scale=st.sampled_from([0.1, 1.0, 5.0, 20.0]), seed=st.integers(0, 2**31))
def test_cpu_kernels_against_float64(cols, dtype, method, scale, seed):
    rows = 2 if cols < 100_000 else 1
    x = np.random.default_rng(seed).standard_normal((rows, cols)) * scale
    if method == "naive":
        x = np.clip(x, -80, 80)  # naive is only defined where exp does not overflow
    y, lse, s = run(x, dtype, method)
    check_close(y, s, dtype)
    assert ((y >= 0) & (y <= 1)).all()
    sums = np.array([math.fsum(r) for r in y.tolist()])
    assert np.all(np.abs(sums - 1) <= sm.RTOL[dtype] * 10 + cols * float(formats.get(dtype).finfo.smallest_subnormal))
    _, ref_lse = sm.reference(s, "nan")
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(["fp32", "bf16", "fp16"]), seed=st.integers(0, 2**31))
def test_shift_by_100_is_invariant(dtype, seed):
    # integer logits: x + 100 stays exact in every format, so stable and online
    # give the very same bits
    x = np.random.default_rng(seed).integers(-8, 9, (3, 33)).astype(np.float64)
    for m in ("stable", "online"):
        assert np.array_equal(run(x, dtype, m)[0], run(x + 100, dtype, m)[0])


def test_c_side_validates():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(sm.UsageError, match="softmax dtype"):
        native.softmax_cpu(x, formats.get("fp64").code, "stable")
    for v in native.variants("softmax"):  # every GPU-only row of the catalog is refused on the CPU
        if "cpu" not in v.devices:
            with pytest.raises(sm.UsageError, match=f"{v.name} does not run on the CPU"):
                native.softmax_cpu(x, formats.get("fp32").code, v.name)
    lib = native._load()
    assert lib.pl_softmax_cpu(None, 2, 3, 1, 1, 0, x.ctypes.data, None) == native.NULL_POINTER
    assert lib.pl_softmax_cpu(x.ctypes.data, 0, 3, 1, 1, 0, x.ctypes.data, None) == native.INVALID_ARGUMENT
    assert lib.pl_softmax_cpu(x.ctypes.data, 2**40, 2**40, 1, 1, 0, x.ctypes.data, None) == native.SIZE_OVERFLOW
    assert lib.pl_softmax_cpu(x.ctypes.data, 2, 3, 1, 1, 7, x.ctypes.data, None) == native.INVALID_ARGUMENT


# --- the command -------------------------------------------------------------


def test_default_run_json():
    r = cli("softmax", "--json")
    assert r.code == 0
    d = strict_json(r.out)
    rows = d["rows"]
    for key in ("case", "variant", "device", "dtype", "finite", "max_abs_error", "rel_l2", "row_sum_error"):
        assert all(key in row for row in rows)
    cases = {row["case"] for row in rows}
    assert {"ordinary", "equal", "shifted", "large", "very_negative", "masked", "nan", "vocab"} <= cases
    naive_large = [x for x in rows if x["case"] == "large" and x["variant"] == "naive" and x["device"] == "cpu"]
    assert naive_large and not naive_large[0]["finite"]
    bugs = {x["bug"] for x in rows if x["kind"] == "bug"}
    assert bugs == set(sm.BUGS)
    assert d["params"]["masked"] == "nan"


def test_table_names_the_policy():
    r = cli("softmax", "--masked", "zero", "--device", "cpu")
    assert r.code == 0 and "masked rows: zero" in r.out and "policy 'zero' is in force" in r.out


def test_values_and_random_matrix():
    d = strict_json(cli("softmax", "--values", "1,2,3;4,5,6", "--methods", "stable", "--device", "cpu", "--json").out)
    assert len(d["rows"]) == 1 and d["rows"][0]["shape"] == [2, 3] and d["rows"][0]["passed"]
    d = strict_json(cli("softmax", "--rows", "4", "--cols", "1025", "--scale", "4", "--dtype", "bf16",
                        "--device", "cpu", "--json").out)
    assert all(r["passed"] for r in d["rows"])


@pytest.mark.parametrize("values", ["nan,1", "-inf,-inf;1,2"])
def test_a_non_finite_reference_is_the_inputs_not_an_overflow(run, values):
    """A NaN logit or an all -inf row (policy nan) makes the float64 reference
    itself NaN: the stable variants' NaN there is no exp overflow, and the
    takeaways do not say it is; naive's overflow on large logits still is."""
    r = run("softmax", "--device", "cpu", f"--values={values}", "--variants", "stable,online", "--json")
    d = strict_json(r.out)
    assert all(row["unexpected_nonfinite"] == 0 for row in d["rows"])
    assert not any("overflows" in t for t in d["takeaways"]), d["takeaways"]
    r = run("softmax", "--device", "cpu", "--values=100,1", "--variants", "naive", "--json")
    d = strict_json(r.out)
    # exp(100) is inf in fp32: inf / inf is NaN, e / inf a finite 0
    assert d["rows"][0]["unexpected_nonfinite"] == 1 and any("naive gives non-finite" in t for t in d["takeaways"])


def test_from_file(tmp_path):
    f = tmp_path / "logits.npy"
    np.save(f, np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32))
    d = strict_json(cli("softmax", "--from", str(f), "--device", "cpu", "--json").out)
    assert d["rows"][0]["shape"] == [3, 50]


@pytest.mark.parametrize("args", [
    ["--values", "1,2;3"],            # ragged
    ["--values", ""],
    ["--cols", "0"],
    ["--rows", "0", "--cols", "4"],
    ["--rows", "100000000", "--cols", "100000000"],  # too big for memory
    ["--dtypes", "fp64"],
    ["--methods", "magic"],
    ["--masked", "maybe"],
    ["--dist", "cauchy", "--rows", "2", "--cols", "2"],
    ["--values", "1,2,3", "--scale", "2"],  # --scale and --dist shape random logits only: never ignored
    ["--dist", "uniform"],
])
def test_bad_input_exits_2(args):
    r = cli("softmax", *args)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_bad_files_exit_2(tmp_path):
    one_d = tmp_path / "v.npy"
    np.save(one_d, np.zeros(4))
    three_d = tmp_path / "t.npy"
    np.save(three_d, np.zeros((2, 2, 2)))
    for f in (one_d, three_d, tmp_path / "missing.npy"):
        r = cli("softmax", "--from", str(f))
        assert r.code == 2 and "Traceback" not in r.err
