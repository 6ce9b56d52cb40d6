"""compare op matmul --accumulator (experiments/op_accumulator.py): rows (4)
the model against float64 and (5) yours against the model, on every case and
dtype; bit for bit against an independent emulation (tests/test_accumulators.py's
rationals, one output at a time, ml_dtypes for the storage formats) on odd
sizes; the options shared with tf32 and formats (cli/options.py); and the one
accumulator model type every matmul path takes.

Numbers fixed before running: (5) of a kernel that *is* the model has
identical_share 1.0, rel L2 0 and max error 0; (4)'s rel L2 equals the
rational-arithmetic rel L2 of the emulated model against the exact product
within 1e-9 relative (the command's reference is float64 BLAS, ~1e-16 off);
a kernel accumulating in bf16 is flagged against the fp32 model (ratio > 4)."""

from __future__ import annotations

import math
import typing
from fractions import Fraction

import numpy as np
import pytest
import torch

from precisionlab.experiments import compare, op_inputs
from precisionlab.numerics import accumulators as acc
from helpers import cli
from test_accumulators import emulate

SHAPE = "5x37x3"  # neither a multiple of a group (32, 4, 3) nor of an interval
MODEL = {"name": None}  # the model emulated_kernel emulates, set by the test
_memo: dict = {}


def emulated_kernel(a, b):
    """A user's kernel that is the model: every output emulated in rationals,
    independently of numerics/accumulators.py (memoised per row and column:
    the contracts call it on batches of up to 1024 rows)."""
    name = MODEL["name"]
    a64, b64 = a.double().numpy(), b.double().numpy()
    out = np.empty((a64.shape[0], b64.shape[1]), np.float32)
    cols = [(b64[:, j].tobytes(), [Fraction(v) for v in b64[:, j]]) for j in range(b64.shape[1])]
    for i in range(a64.shape[0]):
        row = a64[i]
        key_a = row.tobytes()
        fa = None
        for j, (key_b, fb) in enumerate(cols):
            key = (name, key_a, key_b)
            if key not in _memo:
                fa = fa or [Fraction(v) for v in row]
                _memo[key] = emulate(name, fa, fb)
            out[i, j] = _memo[key]
    return torch.from_numpy(out).to(a.dtype)  # bf16 inputs: the fp32 accumulator stored in bf16, as (4) rounds it


def run(impl=None, accumulator="fp32", dtypes="fp8_e4m3,bf16", cases="random,cancelling", **kw):
    cfg = compare.CompareOpConfig(op="matmul", shape=SHAPE, dtypes=dtypes, impl=impl, device="cpu", cases=cases,
                                  accumulators=accumulator, **kw)
    return compare.compare_op(cfg)


def exact_rel_l2(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """||c - A B||_2 / ||A B||_2 with A B exact (rationals)."""
    num = den = Fraction(0)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            ref = sum((Fraction(x) * Fraction(y) for x, y in zip(a[i], b[:, j], strict=True)), Fraction(0))
            num += (Fraction(float(c[i, j])) - ref) ** 2
            den += ref ** 2
    return math.sqrt(num / den)


def case_inputs(case: str, dtype: str):
    """The inputs the harness gives the matmul: make_inputs, the case's build, the dtype's rounding or cast."""
    from precisionlab.catalog import formats
    from precisionlab.experiments import op_harness

    shape = compare.parse_shape("matmul", SHAPE)
    base = compare.make_inputs("matmul", shape, 0, "cpu")
    args = next(c for c in op_harness.select("matmul", case) if c.name == case).build(base, shape, 0)
    return args if dtype == "fp32" else op_inputs.low_args(args, formats.get(dtype))


@pytest.mark.parametrize("model,bits,rounding", [("hopper-fp8:group=4", 10, "rne"), ("promote:7:group=3", None, None),
                                                 ("exact", None, None), ("fp32-pairwise:order=reverse", None, None)])
def test_a_kernel_that_is_the_model_is_its_bits(model, bits, rounding, monkeypatch):
    name = acc.parse_list(model, bits, rounding)[0].name
    monkeypatch.setitem(MODEL, "name", name)
    res = run(impl="test_compare_accumulator:emulated_kernel", accumulator=model, acc_bits=bits, acc_rounding=rounding)
    assert res.params["accumulators"] == [name]
    seen = set()
    for r in res.rows:
        if r["comparison"] not in (4, 5):
            continue
        seen.add((r["comparison"], r["case"], r["dtype"]))
        assert r["accumulator"] == name and r["acc_kind"] == acc.parse(name).kind
        assert r["acc_bits"] == (acc.parse(name).bits if r["acc_kind"] in ("hopper-fp8", "promote") else None)
        if r["comparison"] == 5:
            assert (r["identical_share"], r["rel_l2"], r["max_abs_error"], r["flagged"]) == (1.0, 0.0, 0.0, False), r
        else:
            a, b = (t.double().numpy() for t in case_inputs(r["case"], r["dtype"]))
            c = np.array([[emulate(name, [Fraction(v) for v in a[i]], [Fraction(v) for v in b[:, j]])
                           for j in range(b.shape[1])] for i in range(a.shape[0])], np.float64)
            if r["dtype"] == "bf16":  # stored in the output's dtype: one rounding of the fp32 value
                c = torch.from_numpy(c.astype(np.float32)).to(torch.bfloat16).double().numpy()
            assert r["rel_l2"] == pytest.approx(exact_rel_l2(c, a, b), rel=1e-9), r
    assert seen == {(i, case, d) for i in (4, 5) for case in ("random", "cancelling")
                    for d in ("fp32", "fp8_e4m3", "bf16")}
    # (1)-(3) judge the same kernel against torch: a 10-bit accumulator is rightly flagged there, not here
    assert not any(r["flagged"] for r in res.rows if r["comparison"] in (4, 5))


def test_this_projects_kernel_share_of_the_models_bits():
    """The project's own matmul (no --impl) against fp32's sequential chain:
    identical_share counted independently here, output by output."""
    from precisionlab.numerics import torch_ops

    res = run(accumulator="fp32", cases="random")
    for r in (r for r in res.rows if r["comparison"] == 5):
        a, b = case_inputs("random", r["dtype"])
        yours = torch_ops.matmul(a, b).float().numpy()
        a64, b64 = a.double().numpy(), b.double().numpy()
        want = np.array([[emulate("fp32", [Fraction(v) for v in a64[i]], [Fraction(v) for v in b64[:, j]])
                          for j in range(b64.shape[1])] for i in range(a64.shape[0])], np.float32)
        want = torch.from_numpy(want).to(a.dtype).float().numpy()
        same = np.count_nonzero(yours.view(np.uint32) == want.view(np.uint32)) / want.size
        assert r["identical_share"] == same, (r["dtype"], r["identical_share"], same)


def test_a_kernel_accumulating_in_bf16_is_flagged_against_fp32(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    res = compare.compare_op(compare.CompareOpConfig(op="matmul", shape="16x1024x16", dtypes="bf16", device="cpu",
                                                     impl="impls.kernels:matmul_accumulates_in_input_dtype",
                                                     cases="random", accumulators="fp32"))
    five = next(r for r in res.rows if r["comparison"] == 5 and r["dtype"] == "bf16")
    assert five["flagged"] and five["ratio"] > 4 and "loses more than fp32" in five["verdict"]
    assert res.any_failed
    assert any("bf16 random: fp32 costs" in t for t in res.takeaways)


def test_non_finite_inputs_get_no_model_rows(tmp_path):
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    a[1, 2] = np.inf
    path = tmp_path / "ab.npz"
    np.savez(path, a=a, b=np.ones((8, 3), np.float32))
    res = compare.compare_op(compare.CompareOpConfig(op="matmul", dtypes="bf16", device="cpu", cases="file",
                                                     from_file=str(path), accumulators="exact"))
    assert not [r for r in res.rows if r["comparison"] in (4, 5)]
    assert any("no model rows for file" in t for t in res.takeaways)


def test_json_rows_carry_every_parameter(run):
    from helpers import json_glossary_problems, strict_json

    r = run("compare", "op", "matmul", "--shape", SHAPE, "--dtypes", "bf16", "--cases", "random", "--device", "cpu",
            "--accumulator", "promote:16:bits=12:rounding=rne,exact", "--json")
    d = strict_json(r.out)
    # exit 1 exactly when a row is flagged (fp32 against exact, one rounding, flags any fp32 kernel not
    # correctly rounded: the project's is 5.9x here)
    assert r.code == (1 if any(x["flagged"] for x in d["rows"]) else 0) and r.err == "", (r.code, r.err)
    assert json_glossary_problems(d) == []
    assert d["params"]["accumulators"] == ["promote:16:bits=12:rounding=rne", "exact"]
    rows = [x for x in d["rows"] if x["comparison"] in (4, 5)]
    assert len(rows) == 2 * 2 * 2  # (4) and (5), two models, fp32 and bf16
    promote = [x for x in rows if x["acc_kind"] == "promote"]
    assert all((x["acc_bits"], x["acc_group"], x["acc_rounding"], x["acc_interval"], x["acc_order"])
               == (12, 32, "rne", 16, "forward") for x in promote)
    assert all(x["acc_bits"] is None and x["acc_interval"] is None for x in rows if x["acc_kind"] == "exact")
    assert all((x["identical_share"] is None) == (x["comparison"] == 4) for x in rows)


@pytest.mark.parametrize("args,said", [
    (["compare", "op", "softmax", "--accumulator", "fp32"], "compare op softmax has no accumulator models"),
    (["compare", "op", "matmul", "--acc-bits", "10"], "--acc-bits and --acc-rounding go with --accumulator"),
    (["compare", "op", "matmul", "--accumulator", "tensorcore"], "--accumulator: unknown accumulator"),
    (["compare", "op", "matmul", "--accumulator", "exact", "--acc-bits", "10"], "--acc-bits set the limited"),
    (["compare", "op", "matmul", "--accumulator", "hopper-fp8", "--acc-bits", "0"], "--acc-bits 0: between 1"),
    (["compare", "op", "matmul", "--accumulator", "hopper-fp8", "--acc-rounding", "up"], "--acc-rounding 'up'"),
    (["tf32", "--acc-rounding", "rne"], "--acc-bits and --acc-rounding go with --accumulator"),
    (["tf32", "--accumulator", "promote:8", "--acc-bits", "41"], "--acc-bits 41: between 1 and 40"),
    (["formats", "--acc-bits", "10"], "--acc-bits and --acc-rounding go with --accumulator"),
    (["formats", "--accumulator", "fp32", "--acc-rounding", "rne"], "--acc-rounding set the limited"),
])
def test_accumulator_option_errors_on_every_command(run, args, said):
    # --acc-bits/--acc-rounding are old spellings folded into the models (cli/aliases.py): the same refusals
    r = run(*args)
    assert r.code == 2 and said in r.err and len(r.err.strip().splitlines()) == 1, (args, r.code, r.err)


def test_acc_bits_reach_the_tf32_and_formats_rows(run):
    from helpers import strict_json

    from precisionlab.catalog import formats

    r = run("tf32", "--accumulator", "hopper-fp8:bits=10:rounding=rne,promote:32:bits=10:rounding=rne,fp32",
            "--k", "100", "--json")
    assert r.code == 0 and r.err == "", r.err
    rows = {x["accumulator"]: x for x in strict_json(r.out)["rows"]}
    assert set(rows) == {"hopper-fp8:bits=10:rounding=rne", "promote:32:bits=10:rounding=rne", "fp32"}
    fmt = formats.get("fp8_e4m3")
    rng = np.random.default_rng([0, 100])  # tf32's draw for seed 0, K = 100
    a, b = fmt.round(rng.standard_normal((64, 100))), fmt.round(rng.standard_normal((100, 64)))
    ref = a @ b
    for name, x in rows.items():
        assert (x["acc_bits"], x["acc_rounding"]) == ((10, "rne") if name != "fp32" else (None, None))
        c = acc.parse(name).matmul(a, b).astype(np.float64)
        assert x["max_rel_error"] == float(np.max(np.abs(c - ref)) / np.max(np.abs(ref)))
    r = run("formats", "--formats", "mxfp8_e4m3", "--rules", "floor", "--blocks", "32", "--dists", "normal",
            "--no-baselines", "--n", "1024", "--shape", "8x64x8", "--accumulator", "hopper-fp8:bits=8",
            "--json")
    assert r.code == 0 and r.err == "", r.err
    (row,) = strict_json(r.out)["rows"]
    assert (row["accumulator"], row["acc_bits"], row["acc_rounding"]) == ("hopper-fp8:bits=8", 8, "trunc")


def test_the_accumulator_help_lists_every_published_kind_and_field():
    # the library's names (pl_accumulator_*_info), not a copy: align= and out= were missing from the old one
    from precisionlab import native

    text = acc.spellings_help()
    for kind in native.accumulator_kinds():
        assert kind in text
    for field in ("bits=", "group=", "align=", "out=", "order="):
        assert field in text
    assert "|".join(native.accumulator_roundings()) in text and "|".join(native.accumulator_aligns()) in text
    r = cli("tf32", "--help", env={"COLUMNS": "400"})
    assert r.code == 0 and ":align=product|value" in r.out, r.out[-2000:]


def test_every_matmul_path_takes_the_one_model_type(monkeypatch):
    """tf32, formats, compare op matmul and the attention emulator parse the
    same spelling into numerics.accumulators.Accumulator, the CLI's options
    (router's and attention's too) are cli/options.py's, and attention's P.V
    runs Accumulator.accumulate itself."""
    from precisionlab.cli import (attention as cli_attention, compare_op as cli_compare, formats as cli_formats,
                                  router as cli_router, tf32 as cli_tf32)
    from precisionlab.experiments import formats as exp_formats, op_accumulator, tf32 as exp_tf32
    from precisionlab.numerics import flash_attention as fa

    spelled = "promote:16:bits=12"
    want = acc.parse(spelled)
    got = [exp_tf32.accumulator_rows_plan(exp_tf32.Tf32Config(accumulators=[spelled]))[0][0],
           exp_formats.parse_accumulators(spelled)[0], op_accumulator.plan("matmul", spelled, None, None)[0],
           fa.model(spelled)]
    assert all(type(g) is acc.Accumulator and g == want for g in got), got
    for cmd, options in ((cli_tf32, ("accumulator",)), (cli_formats, ("accumulator",)),
                         (cli_compare, ("accumulator",)), (cli_router, ("accumulator",)),
                         (cli_attention, ("pv_accumulator", "qk_accumulator"))):
        hints = typing.get_type_hints(cmd.command, include_extras=True)
        for option in options:
            assert acc.spellings_help() in hints[option].__metadata__[0].help, (cmd.__name__, option)
        assert not {"acc_bits", "acc_rounding"} & set(hints)  # spelled on the model: MODEL:bits=B:rounding=R
    calls = []
    real = acc.Accumulator.accumulate
    monkeypatch.setattr(acc.Accumulator, "accumulate",
                        lambda self, c, a, b, **kw: calls.append(self.name) or real(self, c, a, b, **kw))
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 8)), rng.standard_normal((20, 8)), rng.standard_normal((20, 4))
    fa.attention(q, k, v, fa.FlashConfig(block_c=8, pv_accumulator=spelled, qk_accumulator="exact"), track=False)
    assert calls.count(spelled) == 3 and calls.count("exact") == 3  # one call a tile each: 20 keys in tiles of 8


def test_the_models_take_the_rows_format_where_the_inputs_hold_it():
    """An fp8 row's inputs are e4m3 values held in fp32: under align=product a
    subnormal factor (2^-9) aligns at e4m3's emin, 2^-6, as the hardware's
    operand would, so with B = 10 the 2^-18 product beside it is cut away; a
    row whose inputs are not all values of its format is emulated as fp32."""
    from precisionlab.experiments import op_accumulator

    model = acc.parse("hopper-fp8:bits=10")
    a = torch.tensor([[2.0**-9, 2.0**-9]])
    b = torch.tensor([[1.0], [2.0**-9]])
    seen = []

    def row(idx, label, got, want, atol, rtol):
        seen.append(float(got[0, 0]))
        return {"flagged": False, "rel_l2": 0.0, "verdict": ""}

    for fmt, want in (("fp8_e4m3", 2.0**-9), ("fp32", 2.0**-9 + 2.0**-18), ("bf16", 2.0**-9 + 2.0**-18)):
        seen.clear()
        op_accumulator.rows([model], (a, b), None, torch.float32, row, (0.0, 0.0), fmt)
        assert seen == [want], fmt
    # 3 x 2^-10 is no e4m3 value: the row's inputs are emulated as fp32's, aligned at 2^-9 (u = 2^-18, so the
    # 3 x 2^-19 product keeps 2^-18); at e4m3's emin (u = 2^-15) it would be cut away
    seen.clear()
    op_accumulator.rows([model], (a * 3 / 2, b), None, torch.float32, row, (0.0, 0.0), "fp8_e4m3")
    assert seen == [3 * 2.0**-10 + 2.0**-18]
