"""attention-cases: the exact values, every planted kernel bug flagged by its
case, a correct kernel passing every case, and the refusals.

The planted kernels are tests/impls/attention.py, written from the calling
convention, never from the emulator. Expected values below are worked out by
hand (stated in each test), not taken from numerics/attention_exact.py."""

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
from helpers import cli, one_line, strict_json

from precisionlab.experiments import attention_cases as ac
from precisionlab.io import inputs
from precisionlab.numerics import attention_exact as ax

ROOT = Path(__file__).resolve().parents[1]
IMPLS_ENV = {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
# each planted bug and the case named after it
PLANTED = [("sink_twice", "sink_splits"), ("sink_dropped", "sink"), ("empty_split_nan", "empty_split"),
           ("bf16_denominator", "denominator"), ("bf16_rope_table", "rope_phases"),
           ("softcap_after_max", "softcap")]


@pytest.fixture()
def impls_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))


def run(impl=None, **kw):
    return ac.run(ac.CasesConfig(impl=impl and f"impls.attention:{impl}", **kw))


def status(res, case, dtype):
    return next(r for r in res.rows if r["case"] == case and r["dtype"] == dtype)["status"]


# ---- the exact values


def test_bf16_positions():
    # bf16 keeps 8 significant bits: 15962 = 0b11111001011010 lies between 15936 and 16000 (spacing 64), nearer
    # 15936; 4095 is halfway between 4080 and 4096 (spacing 16), a tie to the even significand 4096
    assert ax.stored_position(15962, "bf16") == 15936
    assert ax.stored_position(4095, "bf16") == 4096
    assert round(math.cos(15962), 3) == -0.908 and round(math.cos(15936), 3) == -0.268
    assert ax.stored_position(70000, "fp16") == math.inf  # past fp16's 65504


def test_sink_share():
    assert ax.sink_share(1, 0.0) == 0.5  # 1 / (1 + e^0)
    assert ax.sink_share(0, 3.0) == 0.0  # no key: all mass on the sink, which has no value
    assert ax.sink_share(3, math.log(3.0)) == pytest.approx(0.5, rel=1e-15)
    # e^s past float64's range: n e^-s / (1 + n e^-s)
    assert ax.sink_share(64, 701.0) == pytest.approx(64 * math.exp(-701.0), rel=1e-12)


def test_sink_case_gives_n_over_n_plus_e_s(impls_on_path):
    res = run("correct", cases=("sink",), dtypes=("fp32",))
    row = res.rows[0]
    assert row["status"] == "pass"
    # the worst call is one of 128 / (128 + e^5) = 0.46307... and 3 / (3 + 1) = 0.75
    assert row["expected"] in (pytest.approx(128 / (128 + math.exp(5.0)), rel=1e-15), 0.75)
    assert row["observed"] == pytest.approx(row["expected"], rel=1e-6)


def test_window_moments():
    mean, sq = ax.range_moments(3, 7)
    assert (mean, sq) == (Fraction(5), Fraction(9 + 16 + 25 + 36 + 49, 5))
    assert ax.range_from_moments(5.0, float(sq)) == pytest.approx((3.0, 7.0))
    assert ax.window(5, 128) == (0, 5) and ax.window(300, 128) == (172, 300)


def test_denominator_lengths():
    # bf16 spacing at 2^15 is 256: adding a tile sum of 128 there is a tie that rounds back to 32768, so the held
    # sum stays 32768; the error passes 1 % past 32768 x 1.01 = 33095.68 keys, at the next tile: 33152
    assert ax.first_denominator_failure("bf16", 0.01, 1 << 20) == math.ceil(32768 * 1.01 / 128) * 128 == 33152
    # fp16: every sum up to 65408 is exact (spacing 64 there), and 65408 + 128 rounds past 65504 to inf
    assert ax.first_denominator_failure("fp16", 0.01, 1 << 20) == 65536
    assert ax.first_denominator_failure("fp32", 0.01, 1 << 20) is None


def test_rope_table_positions():
    # bf16 holds integers exactly to 256; 257 becomes 256 and cos(257) - cos(256) is about 0.05
    assert ax.first_bad_position("bf16", 0.01, 1 << 20) == 257
    assert ax.first_bad_position("fp16", 0.01, 1 << 20) == 2049  # fp16 holds integers exactly to 2048
    assert ax.first_bad_position("fp32", 0.01, 1 << 20) is None  # exact to 2^24 at theta 1


# ---- kernels


def test_correct_kernel_passes_every_case(impls_on_path):
    res = run("correct", dtypes=("fp32", "bf16", "fp16"), max_keys=65536)
    assert not res.any_failed, [(r["case"], r["dtype"], r["note"]) for r in res.rows if r["status"] == "fail"]
    assert {r["status"] for r in res.rows} <= {"pass", "invisible"}
    # the zero-initialised sink moves the output by ~1e-4: seen in fp32, below bf16's and fp16's resolution
    assert [status(res, "sink_zero_init", d) for d in ("fp32", "bf16", "fp16")] == ["pass", "invisible", "invisible"]


@pytest.mark.parametrize("bug,case", PLANTED)
def test_planted_bug_is_flagged_by_its_case(impls_on_path, bug, case):
    dtype = "bf16" if bug == "bf16_denominator" else "fp32"
    res = run(bug, dtypes=(dtype,), max_keys=65536)
    assert res.any_failed
    assert status(res, case, dtype) == "fail"
    assert any(t.startswith(f"impls.attention:{bug} fails {case} in {dtype}") for t in res.takeaways)


def test_softcap_seeded_wrongly_in_split_paths_only(impls_on_path):
    res = run("softcap_split_seed", cases=("softcap", "softcap_splits"), dtypes=("fp32",))
    assert [status(res, c, "fp32") for c in ("softcap", "softcap_splits")] == ["pass", "fail"]


def test_dropped_sink_passes_in_bf16_only_where_invisible(impls_on_path):
    res = run("sink_dropped", cases=("sink_zero_init",), dtypes=("fp32", "bf16"))
    assert [status(res, "sink_zero_init", d) for d in ("fp32", "bf16")] == ["fail", "invisible"]


def test_bf16_denominator_bisected_to_the_formats_length(impls_on_path):
    # the kernel holds l in bf16 between tiles of 128 (as the model in attention_exact): its first failing length,
    # bisected on the kernel itself, is the model's 33152
    res = run("bf16_denominator", cases=("denominator",), dtypes=("bf16",), max_keys=65536)
    row = res.rows[0]
    assert row["first_failing_keys"] == 33152
    assert [p["rel_error"] for p in res.flags["sweep"]] == [0.0, 0.0, 0.0, 0.0, 1.0]  # 4096 ... 65536: 65536 / 32768


def test_builtin_kernels_pass_what_they_support():
    res = run(max_keys=8192)
    assert not res.any_failed
    ran = {(r["variant"], r["case"]) for r in res.rows if r["status"] == "pass"}
    for variant in ("emulator", "native"):
        assert {(variant, c) for c in ("random", "empty_split", "varlen_verify", "denominator")} <= ran
    assert status(res, "sink", "fp32") == "not supported"


def test_kernel_without_features_is_not_failed(impls_on_path):
    res = run("no_sinks", dtypes=("fp32",))
    assert not res.any_failed
    assert status(res, "sink", "fp32") == "not supported" and status(res, "masked_split", "fp32") == "pass"


def test_kernel_that_raises_fails_with_its_message(impls_on_path):
    res = run("raises", cases=("random",), dtypes=("fp32",))
    row = res.rows[0]
    assert row["status"] == "fail" and "RuntimeError: kernel launch failed" in row["note"]


# ---- the command


def test_cli_names_the_failed_case_and_exits_1():
    r = cli("attention-cases", "--impl", "impls.attention:bf16_rope_table", "--cases", "rope_phases,random",
            "--dtypes", "fp32", "--json", env=IMPLS_ENV)
    assert r.code == 1, r.err
    doc = strict_json(r.out)
    rows = {row["case"]: row for row in doc["rows"]}
    assert rows["rope_phases"]["status"] == "fail" and rows["random"]["status"] == "pass"
    # the worst position is one the bf16 table moves: expected and observed both given
    assert rows["rope_phases"]["expected"] != pytest.approx(rows["rope_phases"]["observed"], abs=1e-3)
    assert any("fails rope_phases in fp32" in t for t in doc["takeaways"])


def test_cli_prints_of_the_kernel_stay_off_stdout():
    r = cli("attention-cases", "--impl", "impls.attention:prints", "--cases", "random", "--dtypes", "fp32", "--json",
            env=IMPLS_ENV)
    assert r.code == 0, r.err
    assert json.loads(r.out)["rows"][0]["status"] == "pass"
    assert "debug output from the kernel" in r.err


@pytest.mark.parametrize("args,words", [
    (["--max-keys", str(1 << 30)], ["--max-keys"]),
    (["--max-keys", "100"], ["--max-keys"]),
    (["--cases", "nope"], ["--cases", "nope"]),
    (["--dtypes", "fp8_e4m3"], ["--dtypes"]),
    (["--bound", "2"], ["--bound"]),
    (["--impl", "nomodule"], ["--impl"]),
    (["--impl", ""], ["--impl"]),
])
def test_refusals_are_one_line(args, words):
    one_line(cli("attention-cases", *args), 2, *words)


def test_memory_checked_before_the_long_rows(monkeypatch):
    monkeypatch.setattr(inputs, "memory_limit", lambda: 1 << 20)
    with pytest.raises(Exception) as e:
        run(max_keys=1 << 20, cases=("denominator",))
    assert "--max-keys" in str(e.value) and "memory" in str(e.value)


def test_plot_of_the_denominator_sweep(tmp_path):
    out = tmp_path / "den.png"
    r = cli("attention-cases", "--cases", "denominator", "--max-keys", "8192", "--plot", str(out))
    assert r.code == 0, r.err
    assert out.read_bytes()[:4] == b"\x89PNG" and "plot written" in r.err
