"""Numbers the commands print, against independent exact references computed
here in rationals (fractions) and mpmath, never through the project's own
reference code. Each test names the case that once printed a wrong number."""

from fractions import Fraction

import pytest

from helpers import cli


def rnd(q: Fraction, p: int, emin: int) -> Fraction:
    """q rounded to nearest even with p significand bits and smallest normal
    exponent emin (no overflow handling: the cases here stay in range)."""
    if q == 0:
        return q
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    quantum = Fraction(2) ** (max(e, emin) - p + 1)
    r = a / quantum
    fl = r.numerator // r.denominator
    rem = r - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2):
        fl += 1
    return (fl * quantum) if q > 0 else -(fl * quantum)


def binade_spacing(q: Fraction, p: int, emin: int) -> Fraction:
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    return Fraction(2) ** (max(e, emin) - p + 1)


FMT = {"fp64": (53, -1022), "fp32": (24, -126), "fp16": (11, -14), "bf16": (8, -126)}


@pytest.mark.parametrize("values", ["1,1e-30", "6.045301223363671e-09,-257,0.0", "1,-3e-17,2e-17"])
def test_accumulate_errors_are_against_the_exact_sum_not_its_double(values):
    # 1 + 1e-30 in fp64: the result 1.0 is the exact sum's double, but 1e-30
    # away from the exact sum; abs_error once printed 0.0 (and rel_error, ulps 0).
    doc = cli("accumulate", "--dtype", "fp64", "--values", values, "--variants", "sequential,pairwise",
              "--accumulators", "fp64,fp32,bf16", "--device", "cpu", "--json").json()
    xs = [Fraction(float(v)) for v in values.split(",")]
    exact = sum(xs, Fraction(0))
    checked = 0
    for row in doc["rows"]:
        p, emin = FMT[row["accumulator"]]
        s = Fraction(0)
        for x in xs:  # sequential: each addition rounded once; pairwise of <= 3 values: ((x0 + x1) + x2)
            s = rnd(s + x, p, emin)
        assert row["result"] == float(s)
        err = abs(s - exact)
        assert row["abs_error"] == float(err)
        assert row["rel_error"] == float(err / abs(exact))
        assert row["ulps"] == float(err / binade_spacing(exact, p, emin))
        checked += 1
    assert checked == 6


def _softmax_rows(values: str, *extra: str) -> list[dict]:
    doc = cli("softmax", f"--values={values}", "--variants", "stable,online", "--device", "cpu", *extra, "--json")
    assert doc.code == 0, doc.err
    return doc.json()["rows"]


def test_softmax_row_sum_error_is_the_exact_sums_distance_from_one():
    # fp32 softmax of [20, -20] sums to 1 - 4.2e-18 exactly: the sum's double is
    # 1.0, and row_sum_error once printed 0.0.
    for row in _softmax_rows("20,-20"):
        total = sum((Fraction(p) for p in row["output"]), Fraction(0))
        assert total != 1
        assert row["row_sum_error"] == float(abs(total - 1))


def test_softmax_lse_error_against_an_accurate_log_sum_exp():
    # lse of [-104, 0] is log(1 + e^-104) = 6.8e-46; the kernel's fp32 lse is 0,
    # and a float64 m + log(s) reference is 0 too, so the error printed 0.0.
    import mpmath as mp

    mp.mp.prec = 200
    true_lse = mp.log(1 + mp.exp(-104))
    for row in _softmax_rows("-104,0"):
        assert row["lse"] == 0.0
        # the reference is float64 (exp and log1p each within an ulp): 1e-12 relative
        assert row["lse_max_abs_error"] == pytest.approx(float(abs(mp.mpf(row["lse"]) - true_lse)), rel=1e-12, abs=0)


def test_softmax_masked_row_under_zero_policy_has_lse_error_zero():
    # --masked zero: an all -inf row has log-sum-exp -inf, and the kernel's -inf
    # is exactly that: error 0, not NaN (-inf minus -inf).
    for row in _softmax_rows("-inf,-inf,-inf", "--masked", "zero"):
        assert row["lse"] == "-inf"
        assert row["lse_max_abs_error"] == 0.0


def _compare_files(tmp_path, a, b, ext="npy"):
    import numpy as np

    if ext == "npy":
        np.save(tmp_path / "a.npy", a)
        np.save(tmp_path / "b.npy", b)
    else:
        from safetensors.numpy import save_file

        save_file({"t": a}, str(tmp_path / "a.safetensors"))
        save_file({"t": b}, str(tmp_path / "b.safetensors"))
    r = cli("compare", "tensors", str(tmp_path / f"a.{ext}"), str(tmp_path / f"b.{ext}"), "--json")
    assert r.code in (0, 1), r.err
    return r.json()["rows"][0]


def _mp_stats(a, b):
    """rel-L2 against b and cosine, in 300-bit mpmath from exact rationals."""
    import mpmath as mp

    mp.mp.prec = 300
    A = [Fraction(float(x)) for x in a.ravel()]
    B = [Fraction(float(x)) for x in b.ravel()]
    q = lambda f: mp.mpf(f.numerator) / f.denominator  # noqa: E731
    num = sum(((x - y) ** 2 for x, y in zip(A, B, strict=True)), Fraction(0))
    den = sum((y * y for y in B), Fraction(0))
    dot = sum((x * y for x, y in zip(A, B, strict=True)), Fraction(0))
    na = sum((x * x for x in A), Fraction(0))
    return float(mp.sqrt(q(num) / q(den))), float(q(dot) / mp.sqrt(q(na) * q(den)))


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_compare_tensors_rel_l2_and_cosine_of_huge_and_tiny_fp64(tmp_path, scale):
    # fp64 dumps of 1e200-sized values: the squares overflow a float64 norm, and
    # rel_l2 and cosine printed NaN (1e-200: the reference norm underflowed to 0).
    import numpy as np

    rng = np.random.default_rng(0)
    b = rng.standard_normal(20) * scale
    a = b * (1 + 1e-9 * rng.standard_normal(20))
    row = _compare_files(tmp_path, a, b)
    rel, cos = _mp_stats(a, b)
    assert row["rel_l2"] == rel
    assert row["cosine"] == cos


def test_compare_tensors_cosine_and_p99_to_the_last_bit(tmp_path):
    # a = -b: the cosine is exactly -1 (printed -0.9999999999999998); p99 is
    # numpy's linear interpolation of the sorted |a - b|, rounded once.
    import numpy as np

    b = np.array([1e-45, 3.0, 0.1, 7.5, 2.0**-20, 11.0, 0.3], dtype=np.float32)
    row = _compare_files(tmp_path, -b, b)
    assert row["cosine"] == -1.0
    d = sorted(abs(Fraction(float(x)) * 2) for x in b)
    h = Fraction((len(d) - 1) * 99, 100)
    lo = int(h)
    assert row["p99_abs_error"] == float(d[lo] + (h - lo) * (d[lo + 1] - d[lo]))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2"])
def test_compare_tensors_reads_fp8_safetensors(tmp_path, fmt):
    # safetensors' numpy side has no fp8: an F8_E4M3 / F8_E5M2 file could not be
    # read at all ("module 'numpy' has no attribute 'float8_e4m3fn'").
    import ml_dtypes
    import numpy as np

    dt = getattr(ml_dtypes, fmt)
    b = np.array([0.5, -3.0, 0.1, 12.0, 2.0**-9, 100.0], dtype=np.float32)
    a = b.astype(dt)
    row = _compare_files(tmp_path, a, b, ext="safetensors")
    # the fp8 values from their bit patterns, decoded here by hand
    ebits, mbits, bias = (4, 3, 7) if fmt == "float8_e4m3fn" else (5, 2, 15)
    vals = []
    for code in a.view(np.uint8).tolist():
        e, m = (code >> mbits) & ((1 << ebits) - 1), code & ((1 << mbits) - 1)
        v = Fraction(m, 1 << mbits) * Fraction(2) ** (1 - bias) if e == 0 else \
            (1 + Fraction(m, 1 << mbits)) * Fraction(2) ** (e - bias)
        vals.append(-v if code >> 7 else v)
    assert row["dtypes"] == [fmt, "float32"]
    assert row["max_abs_error"] == float(max(abs(v - Fraction(float(x))) for v, x in zip(vals, b, strict=True)))


def test_error_report_rel_l2_and_mean_are_exact():
    # the report behind softmax, compare op, tf32 and compare model: rel_l2 was a
    # ratio of float64 norms (NaN for 1e200-sized values, whose squares overflow),
    # mean_abs_error numpy's mean of rounded differences.
    import mpmath as mp
    import numpy as np

    from precisionlab.numerics import metrics

    mp.mp.prec = 300
    rng = np.random.default_rng(1)
    for scale in (1e200, 1e-200, 1.0):
        r = rng.standard_normal(33) * scale
        a = (r * (1 + 1e-7 * rng.standard_normal(33))).astype(np.float32).astype(np.float64) if scale == 1.0 \
            else r * (1 + 1e-7 * rng.standard_normal(33))
        rep = metrics.error_report(a, r, None, 0.0, 0.0)
        A, R = [Fraction(x) for x in a], [Fraction(x) for x in r]
        q = lambda f: mp.mpf(f.numerator) / f.denominator  # noqa: E731
        num = sum(((x - y) ** 2 for x, y in zip(A, R, strict=True)), Fraction(0))
        den = sum((y * y for y in R), Fraction(0))
        assert rep.rel_l2 == float(mp.sqrt(q(num) / q(den)))
        assert rep.mean_abs_error == float(sum((abs(x - y) for x, y in zip(A, R, strict=True)), Fraction(0)) / len(A))


def _mxfp4_floor(x, block=32):
    """OCP MX v1.0 MXFP4 with the FLOOR scale, in rationals: X = 2^(floor(log2
    amax) - 2), each x / X rounded to nearest even in e2m1 (0, 0.5, 1, 1.5, 2,
    3, 4, 6), saturating at 6."""
    out = []
    for i in range(0, len(x), block):
        blk = [Fraction(float(v)) for v in x[i:i + block]]
        amax = max(abs(v) for v in blk)
        e = amax.numerator.bit_length() - amax.denominator.bit_length()
        if Fraction(2) ** e > amax:
            e -= 1
        X = Fraction(2) ** (e - 2)
        for v in blk:
            out.append(max(min(rnd(v / X, 2, 0), Fraction(6)), Fraction(-6)) * X)
    return out


def test_formats_rel_l2_to_the_last_bit():
    # rel_l2 (once rel_rmse) was sqrt(fsum of rounded squares / fsum), two more roundings:
    # 0.12054942890436372 where the exact value rounds to 0.12054942890436371.
    import mpmath as mp
    import numpy as np

    mp.mp.prec = 200
    n = 1000
    doc = cli("formats", "--formats", "mxfp4", "--rules", "floor", "--blocks", "32", "--dists", "normal",
              "--n", str(n), "--shape", "4x64x4", "--no-baselines", "--device", "cpu", "--seed", "1", "--json").json()
    (row,) = doc["rows"]
    x = np.random.default_rng([1, 0, 32]).standard_normal((1, n)).astype(np.float32)[0]  # formats' data, seed 1
    y = _mxfp4_floor(x)
    X = [Fraction(float(v)) for v in x]
    num = sum(((b - a) ** 2 for a, b in zip(X, y, strict=True)), Fraction(0))
    den = sum((a * a for a in X), Fraction(0))
    q = lambda f: mp.mpf(f.numerator) / f.denominator  # noqa: E731
    assert row["rel_l2"] == float(mp.sqrt(q(num) / q(den)))
    assert row["flush_share"] == sum(1 for a, b in zip(X, y, strict=True) if a != 0 and b == 0) / n


def _logits_stats(tmp_path, ref, low, tokens):
    import numpy as np
    from safetensors.numpy import save_file

    for name, x in (("r", ref), ("l", low)):
        save_file({"logits": np.asarray(x), "tokens": np.asarray(tokens, np.int64)}, str(tmp_path / f"{name}.safetensors"))
    r = cli("compare", "logits", str(tmp_path / "r.safetensors"), str(tmp_path / "l.safetensors"), "--json")
    assert r.code == 0, r.err
    return r.json()["rows"][0]


def _mp_logits(ref, low, tokens):
    import mpmath as mp

    mp.mp.prec = 300

    def lsm(row):
        row = [mp.mpf(float(v)) for v in row]
        lse = mp.log(mp.fsum(mp.exp(v) for v in row))
        return [v - lse for v in row]

    kls, dnll, dp = [], [], []
    for r, l, t in zip(ref, low, tokens, strict=True):
        lp, lq = lsm(r), lsm(l)
        kls.append(mp.fsum(mp.exp(a) * (a - b) for a, b in zip(lp, lq, strict=True)))
        dnll.append(lp[t] - lq[t])
        dp.append(mp.exp(lq[t]) - mp.exp(lp[t]))
    n = len(tokens)
    return {"kld_mean": float(mp.fsum(kls) / n), "ln_ppl_ratio": float(mp.fsum(dnll) / n),
            "dp_mean": float(mp.fsum(dp) / n)}


def test_compare_logits_near_one_hot_rows(tmp_path):
    # logits [100, 0, 0, 0] vs [99.9, 0, 0, 0]: the top token's log-probability is
    # -1.1e-43, which a float64 log(sum exp) rounds to 0, so ln_ppl_ratio and
    # dp_mean printed 0.0 (true 1.17e-44 and -1.17e-44).
    import numpy as np

    ref = np.zeros((2, 4), np.float32)
    ref[:, 0] = 100
    low = ref.copy()
    low[:, 0] = 99.9
    row = _logits_stats(tmp_path, ref, low, [0, 0])
    want = _mp_logits(ref, low, [0, 0])
    for k, v in want.items():
        assert v != 0 and row[k] == pytest.approx(v, rel=1e-14, abs=0), k


def test_compare_logits_rows_differing_by_rounding(tmp_path):
    # float64 logits that differ from the reference by a shift (softmax-invariant)
    # rounded per element: KL is 1e-33 and lq - lp, a difference of two
    # log-probabilities near -1.3, lost it (KL printed 1.2e-32, ln_ppl_ratio 0.0).
    import numpy as np

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 5))
    low = ref + 1e-6
    row = _logits_stats(tmp_path, ref, low, [0, 1, 2])
    want = _mp_logits(ref, low, [0, 1, 2])
    for k, v in want.items():
        assert v != 0 and row[k] == pytest.approx(v, rel=1e-12, abs=0), k


def test_compare_op_worst_index_is_an_index_of_the_output(tmp_path):
    # worst_index was an index into the flattened elements left after dropping
    # the agreeing NaNs: [13] for element [2, 5] of a 4x8 output whose row 0 is
    # masked. The implementation here is torch's softmax, wrong at [2, 5] only.
    import numpy as np

    from helpers import ROOT

    (tmp_path / "oracle_impl.py").write_text(
        "import torch\n"
        "def softmax(x):\n"
        "    y = torch.softmax(x, dim=-1).clone()\n"
        "    if tuple(y.shape) == (4, 8):  # the compared call (the contracts call it at other batch sizes)\n"
        "        y[2, 5] = y[2, 5] + 0.25\n"
        "    return y\n")
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    x[0] = -np.inf
    np.save(tmp_path / "x.npy", x)
    r = cli("compare", "op", "softmax", "--from", str(tmp_path / "x.npy"), "--impl", "oracle_impl:softmax",
            "--dtype", "bf16", "--device", "cpu", "--json", env={"PYTHONPATH": f"{ROOT}:{tmp_path}"})
    rows = [row for row in r.json()["rows"] if row["comparison"] in (1, 3) and row["case"] == "file"]
    assert len(rows) == 2
    for row in rows:
        assert row["worst_index"] == [2, 5]
        assert row["n"] == 24  # the 8 NaNs of the masked row agree and are left out


@pytest.mark.parametrize("values", ["0,-40", "1,2,3", "0,0,0"])
def test_softmax_errors_against_the_true_softmax(values):
    # The reference was a float64 softmax: for [0, -40] the fp32 output 1.0 is
    # 4.2e-18 from the true 1 - 4.2e-18, which float64 rounds to 1.0, so the
    # error printed 0-ish figures for the wrong element; for [0, 0, 0], rel_l2
    # is exactly 2^-25 (3 fp32(1/3) - 1) and printed 2.9802322443206464e-08.
    import mpmath as mp

    mp.mp.prec = 300
    xs = [mp.mpf(float(v)) for v in values.split(",")]
    m = max(xs)
    es = [mp.exp(v - m) for v in xs]
    s = mp.fsum(es)
    p = [e / s for e in es]
    for row in _softmax_rows(values):
        d = [abs(mp.mpf(y) - q) for y, q in zip(row["output"], p, strict=True)]
        assert row["max_abs_error"] == float(max(d))
        # rel_l2: within an ulp (the double-double reference is good to ~1e-32)
        want = float(mp.sqrt(mp.fsum(x * x for x in d) / mp.fsum(q * q for q in p)))
        assert row["rel_l2"] == pytest.approx(want, rel=3e-16, abs=0)


def test_kvcache_saturation_count_at_the_rounding_midpoint():
    # An entry counts as saturated when rounding without a range limit would pass
    # max. e4m3: 464 is the midpoint of 448 (14 * 32, even) and 480, so it rounds
    # to 448, clamp or no clamp; it was counted. e5m2: 61440, the midpoint of
    # 57344 (7 * 8192, odd) and 65536, rounds up past max: counted.
    import torch

    from precisionlab.experiments.kvcache import KVStore

    for fmt, top, step, tie_up in (("fp8_e4m3", 448, 32, False), ("fp8_e5m2", 57344, 8192, True)):
        # RNE of the midpoint in an unbounded format: up iff max / step is odd
        assert ((top // step) % 2 == 1) == tie_up
        store = KVStore(fmt, "unit", 1.0)
        mid = top + step / 2
        x = torch.tensor([[[[mid, -mid, top, mid + 1.0]]]])
        store(x, x)
        want_per_tensor = (2 if tie_up else 0) + 1  # mid + 1 is past the midpoint either way
        assert store.saturated == 2 * want_per_tensor


@pytest.mark.parametrize("container", ["npy", "npz"])
def test_compare_tensors_reads_fp8_e5m2_npy(tmp_path, container):
    # np.save writes ml_dtypes' float8_e5m2 with the descriptor '<f1', which
    # numpy cannot read back: the file was refused even with --dtypes fp8_e5m2,-.
    import ml_dtypes
    import numpy as np

    b = np.array([0.5, -3.0, 0.1, 12.0, 2.0**-16, 100.0], dtype=np.float32)
    a = b.astype(ml_dtypes.float8_e5m2)
    if container == "npy":
        np.save(tmp_path / "a.npy", a)
        np.save(tmp_path / "b.npy", b)
    else:
        np.savez(tmp_path / "a.npz", t=a)
        np.savez(tmp_path / "b.npz", t=b)
    r = cli("compare", "tensors", str(tmp_path / f"a.{container}"), str(tmp_path / f"b.{container}"),
            "--dtypes", "fp8_e5m2,-", "--json")
    assert r.code in (0, 1), r.err
    row = r.json()["rows"][0]
    vals = []
    for code in a.view(np.uint8).tolist():  # e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits
        e, m = (code >> 2) & 31, code & 3
        v = Fraction(m, 4) * Fraction(2) ** -14 if e == 0 else (1 + Fraction(m, 4)) * Fraction(2) ** (e - 15)
        vals.append(-v if code >> 7 else v)
    assert row["max_abs_error"] == float(max(abs(v - Fraction(float(x))) for v, x in zip(vals, b, strict=True)))
