"""compare tensors: loaders, names (--map, --only, flattening, natural order),
one-sided rows, the symmetric two-way verdict, the three-way yardstick, and
bad input."""

import math
import os
import pickle
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch

from helpers import cli, strict_json
from precisionlab.experiments import tensors as exp
from precisionlab.numerics import compare as comparison
from precisionlab.io.tensorfiles import natural_key


def rows_of(r):
    return {row["name"]: row for row in strict_json(r.out)["rows"]}


@pytest.fixture()
def dumps(tmp_path):
    rng = np.random.default_rng(0)
    a = {"logits": rng.standard_normal((4, 8)).astype(np.float32), "h": rng.standard_normal(16).astype(np.float32)}
    np.save(tmp_path / "one.npy", a["logits"])
    np.savez(tmp_path / "many.npz", **a)
    torch.save({k: torch.from_numpy(v) for k, v in a.items()}, tmp_path / "many.pt")
    torch.save(torch.from_numpy(a["logits"]), tmp_path / "one.pt")
    from safetensors.torch import save_file

    save_file({k: torch.from_numpy(v).to(torch.bfloat16) for k, v in a.items()}, str(tmp_path / "many.safetensors"))
    return a, tmp_path


def test_every_format_reads_back(dumps):
    a, tmp = dumps
    for x, y in (("many.npz", "many.pt"), ("one.npy", "one.pt"), ("many.pt", "many.npz")):
        r = cli("compare", "tensors", str(tmp / x), str(tmp / y), "--json")
        assert r.code == 0, r.out + r.err
        assert all(row["passed"] and row["max_abs_error"] == 0 for row in strict_json(r.out)["rows"])
    r = cli("compare", "tensors", str(tmp / "many.safetensors"), str(tmp / "many.npz"), "--json")
    d = strict_json(r.out)
    assert r.code == 0 and all(row["tolerance_format"] == "bf16" for row in d["rows"])


def test_bf16_npy_saved_with_ml_dtypes(tmp_path):
    x = np.linspace(-3, 3, 64).astype(np.float32)
    np.save(tmp_path / "low.npy", x.astype(ml_dtypes.bfloat16))   # stored as raw 2-byte values
    np.save(tmp_path / "ref.npy", x)
    r = cli("compare", "tensors", str(tmp_path / "low.npy"), str(tmp_path / "ref.npy"), "--json")
    row = strict_json(r.out)["rows"][0]
    expect = np.abs(x.astype(ml_dtypes.bfloat16).astype(np.float64) - x.astype(np.float64)).max()
    assert row["dtypes"][0] == "bfloat16" and row["tolerance_format"] == "bf16"
    assert row["max_abs_error"] == expect > 0 and r.code == 0


def test_declared_dtype_sets_tolerances(tmp_path):
    x = np.linspace(1, 2, 50)
    y = x.astype(ml_dtypes.bfloat16).astype(np.float32)   # bf16 values dumped as fp32
    np.save(tmp_path / "y.npy", y)
    np.save(tmp_path / "x.npy", x.astype(np.float32))
    assert cli("compare", "tensors", str(tmp_path / "y.npy"), str(tmp_path / "x.npy")).code == 1  # fp32 tolerances
    r = cli("compare", "tensors", str(tmp_path / "y.npy"), str(tmp_path / "x.npy"), "--dtypes", "bf16,-", "--json")
    assert r.code == 0 and strict_json(r.out)["rows"][0]["rtol"] == comparison.tolerances("bf16")[0]


def test_symmetric_verdict(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000)
    low = (x * (1 + 0.012 * rng.standard_normal(1000))).astype(np.float32).astype(ml_dtypes.bfloat16)
    np.savez(tmp_path / "hi.npz", t=x.astype(np.float32))
    np.savez(tmp_path / "lo.npz", t=low)
    one = cli("compare", "tensors", str(tmp_path / "hi.npz"), str(tmp_path / "lo.npz"), "--json")
    two = cli("compare", "tensors", str(tmp_path / "lo.npz"), str(tmp_path / "hi.npz"), "--json")
    r1, r2 = strict_json(one.out)["rows"][0], strict_json(two.out)["rows"][0]
    assert one.code == two.code
    assert r1["tolerance_format"] == r2["tolerance_format"] == "bf16"
    assert r1["n_outside"] == r2["n_outside"] > 0 and r1["rel_l2"] == r2["rel_l2"]   # both against the fp32 side
    assert r1["rel_l2_against"] == "A" and r2["rel_l2_against"] == "B"


def test_one_sided_names_and_shapes_are_rows(dumps):
    a, tmp = dumps
    b = dict(a)
    b["logits"] = a["logits"] + 1e-2
    b["extra"] = np.zeros(3, np.float32)
    b["h"] = np.zeros(17, np.float32)
    np.savez(tmp / "other.npz", **b)
    for extra in ([], ["--json"]):  # the table never crashes on rows without numbers
        r = cli("compare", "tensors", str(tmp / "many.npz"), str(tmp / "other.npz"), *extra)
        assert r.code == 1 and "Traceback" not in r.err and "internal error" not in r.err
    rows = rows_of(r)
    assert rows["logits"]["status"] == "fail" and rows["logits"]["max_abs_error"] == pytest.approx(1e-2, rel=1e-3)
    assert rows["h"]["status"] == "shape mismatch" and rows["extra"]["status"] == "only in B"
    r = cli("compare", "tensors", str(tmp / "one.npy"), str(tmp / "many.npz"))  # one .npy against a named dump
    assert r.code == 1 and "only in A" in r.out and "only in B" in r.out


def test_map_renames_one_side(dumps):
    a, tmp = dumps
    np.savez(tmp / "engine.npz", **{f"engine.{k}": v for k, v in a.items()})
    r = cli("compare", "tensors", str(tmp / "many.npz"), str(tmp / "engine.npz"), "--map", r"^engine\.=", "--json")
    d = strict_json(r.out)
    assert r.code == 0 and {row["name"] for row in d["rows"]} == {"logits", "h"}
    assert d["params"]["mapped_side"] == "B"
    # the same rule also works with the files the other way round
    r = cli("compare", "tensors", str(tmp / "engine.npz"), str(tmp / "many.npz"), "--map", r"^engine\.=", "--json")
    assert r.code == 0 and strict_json(r.out)["params"]["mapped_side"] == "A"
    r = cli("compare", "tensors", str(tmp / "one.npy"), str(tmp / "many.npz"), "--map", "tensor=logits", "--only",
            "logits", "--json")
    assert r.code == 0 and [row["name"] for row in strict_json(r.out)["rows"]] == ["logits"]


def test_only_globs(dumps):
    a, tmp = dumps
    np.savez(tmp / "l.npz", **{f"layers.{i}.mlp": np.ones(2) for i in range(3)}, **{"layers.0.attn": np.ones(2)})
    r = cli("compare", "tensors", str(tmp / "l.npz"), str(tmp / "l.npz"), "--only", "*.mlp", "--only", "*.0.attn",
            "--json")
    assert r.code == 0
    assert [row["name"] for row in strict_json(r.out)["rows"]] == ["layers.0.mlp", "layers.1.mlp", "layers.2.mlp",
                                                                   "layers.0.attn"]
    assert cli("compare", "tensors", str(tmp / "l.npz"), str(tmp / "l.npz"), "--only", "nothing*").code == 2


def test_natural_order_without_a_recorded_one(tmp_path):
    from safetensors.numpy import save_file

    names = [f"model.layers.{i}.mlp" for i in (10, 2, 11, 0, 1)]
    save_file({n: np.ones(2, np.float32) for n in names}, str(tmp_path / "x.safetensors"))
    r = cli("compare", "tensors", str(tmp_path / "x.safetensors"), str(tmp_path / "x.safetensors"), "--json")
    assert [row["name"] for row in strict_json(r.out)["rows"]] == [f"model.layers.{i}.mlp" for i in (0, 1, 2, 10, 11)]
    assert sorted(["a10", "a2", "a1b", "a1a"], key=natural_key) == ["a1a", "a1b", "a2", "a10"]


def test_recorded_order_kept(tmp_path):
    order = {"z": np.ones(1), "layers.10": np.ones(1), "a": np.ones(1), "layers.2": np.ones(1)}
    np.savez(tmp_path / "o.npz", **order)
    r = cli("compare", "tensors", str(tmp_path / "o.npz"), str(tmp_path / "o.npz"), "--json")
    assert [row["name"] for row in strict_json(r.out)["rows"]] == list(order)


def test_nested_pt_is_flattened(tmp_path):
    t = [torch.arange(3.0), (torch.ones(2), {"k": torch.zeros(2)})]
    torch.save({"out": t, "step": 3}, tmp_path / "n.pt")
    np.savez(tmp_path / "n.npz", **{"out.0": np.arange(3.0), "out.1.0": np.ones(2), "out.1.1.k": np.zeros(2)})
    r = cli("compare", "tensors", str(tmp_path / "n.pt"), str(tmp_path / "n.npz"), "--json")
    d = strict_json(r.out)
    assert r.code == 0, r.out + r.err
    assert [row["name"] for row in d["rows"]] == ["out.0", "out.1.0", "out.1.1.k"]


def test_infinities_nan_and_zero_reference(tmp_path):
    masked = np.array([-np.inf, 1.0, -np.inf, 2.0], np.float32)
    np.save(tmp_path / "m.npy", masked)
    assert cli("compare", "tensors", str(tmp_path / "m.npy"), str(tmp_path / "m.npy")).code == 0  # same infinities agree
    nan = np.array([np.nan, 1.0], np.float32)
    np.save(tmp_path / "n.npy", nan)
    assert cli("compare", "tensors", str(tmp_path / "n.npy"), str(tmp_path / "n.npy")).code == 1  # NaN never agrees
    assert cli("compare", "tensors", str(tmp_path / "n.npy"), str(tmp_path / "n.npy"), "--equal-nan").code == 0
    np.save(tmp_path / "z.npy", np.zeros(4, np.float32))
    np.save(tmp_path / "s.npy", np.full(4, 1e-3, np.float32))
    r = cli("compare", "tensors", str(tmp_path / "s.npy"), str(tmp_path / "z.npy"), "--json")
    row = strict_json(r.out)["rows"][0]
    assert r.code == 1 and row["rel_l2"] == "inf" and row["reference_all_zero"] and row["cosine"] is None
    r = cli("compare", "tensors", str(tmp_path / "s.npy"), str(tmp_path / "z.npy"))
    assert r.code == 1 and "inf" in r.out  # the compact table: rel L2
    r = cli("compare", "tensors", str(tmp_path / "s.npy"), str(tmp_path / "z.npy"), "--wide")
    assert r.code == 1 and "inf" in r.out and "undefined" in r.out  # every column: the cosine too


def test_stats_against_numpy():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((7, 5))
    cfg = exp.CompareTensorsConfig(files=[])
    s = exp.pair_stats(a, b, "fp32", "fp32", cfg)
    d = np.abs(a - b)
    assert s["max_abs_error"] == d.max() and s["worst_index"] == list(np.unravel_index(np.argmax(d), d.shape))
    assert s["worst_a"] == a[tuple(s["worst_index"])] and s["worst_b"] == b[tuple(s["worst_index"])]
    assert s["rel_l2"] == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-14)
    assert s["cosine"] == pytest.approx(float(np.sum(a * b) / np.linalg.norm(a) / np.linalg.norm(b)), rel=1e-14)
    # numpy's linear percentile, computed exactly and rounded once (np.percentile's own
    # arithmetic can be an ulp off: 0.0003784179687500002 for 0.00037841796875)
    from fractions import Fraction
    v = np.sort(d.ravel())
    for q, key in ((50, "p50_abs_error"), (99, "p99_abs_error")):
        h = Fraction((v.size - 1) * q, 100)
        lo = int(h)
        want = Fraction(v[lo]) + (h - lo) * (Fraction(v[min(lo + 1, v.size - 1)]) - Fraction(v[lo]))
        assert s[key] == float(want) == pytest.approx(np.percentile(d, q), rel=1e-15)


def test_three_way_names_first_flagged(tmp_path):
    rng = np.random.default_rng(2)
    ref = {f"layers.{i}": rng.standard_normal(4096) for i in range(12)}
    low = {k: v.astype(ml_dtypes.bfloat16) for k, v in ref.items()}
    yours = {k: (v.astype(np.float64) * (1.2 if k in ("layers.3", "layers.7") else 1.0)).astype(ml_dtypes.bfloat16)
             for k, v in low.items()}
    np.savez(tmp_path / "r32.npz", **{k: v.astype(np.float32) for k, v in ref.items()})
    np.savez(tmp_path / "rlo.npz", **low)
    np.savez(tmp_path / "y.npz", **{"eng." + k: v for k, v in yours.items()})
    args = [str(tmp_path / f) for f in ("r32.npz", "rlo.npz", "y.npz")]
    r = cli("compare", "tensors", *args, "--map", r"^eng\.=", "--json")
    d = strict_json(r.out)
    assert r.code == 1 and d["first_divergence"] == "layers.3"
    flagged = [row["name"] for row in d["rows"] if row["flagged"]]
    assert flagged == ["layers.3", "layers.7"]
    r = cli("compare", "tensors", *args, "--map", r"^eng\.=", "--json", "--fail-fast")
    assert [row["name"] for row in strict_json(r.out)["rows"]] == [f"layers.{i}" for i in range(4)]
    r = cli("compare", "tensors", *args, "--map", r"^eng\.=", "--sort", "error", "--json")
    assert [row["name"] for row in strict_json(r.out)["rows"]][:2] in (["layers.3", "layers.7"], ["layers.7", "layers.3"])


@pytest.mark.parametrize("tol", ["nan", "inf", "-1e-3"])
def test_bad_tolerances_exit_2(dumps, tol):
    a, tmp = dumps
    r = cli("compare", "tensors", str(tmp / "many.npz"), str(tmp / "many.npz"), "--tol", f"0,{tol}")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "ATOL" in r.err
    r = cli("compare", "tensors", str(tmp / "many.npz"), str(tmp / "many.npz"), "--tol", f"{tol},0")
    assert r.code == 2 and "RTOL" in r.err


def test_fifo_refused_at_once(tmp_path, dumps):
    a, tmp = dumps
    fifo = tmp_path / "pipe.npy"
    os.mkfifo(fifo)
    r = cli("compare", "tensors", str(fifo), str(tmp / "one.npy"), timeout=60)
    assert r.code == 2 and "not a regular file" in r.err


def test_npz_bomb_refused_before_decompressing(tmp_path, dumps):
    a, tmp = dumps
    path = tmp_path / "bomb.npz"
    n = 200_000_000  # 1.6 GB of float64 zeros, a few MB compressed
    header = {"descr": "<f8", "fortran_order": False, "shape": (n,)}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("x.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, header)
        chunk = bytes(1 << 24)
        for _ in range(n * 8 // len(chunk)):
            f.write(chunk)
    assert path.stat().st_size < 5e6
    import subprocess
    import sys

    code = ("import resource,sys; resource.setrlimit(resource.RLIMIT_AS,(1<<30,1<<30)); "
            "sys.argv=['precisionlab','compare','tensors',sys.argv[1],sys.argv[1]]; "
            "from precisionlab.cli import main; main()")
    from helpers import ROOT

    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 2 and "memory" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_markup_and_control_characters_in_names(tmp_path):
    names = {"[/]": np.ones(2), "[bold]x": np.ones(2), "evil\x1b]0;title\x07": np.ones(2)}
    np.savez(tmp_path / "w.npz", **names)
    r = cli("compare", "tensors", str(tmp_path / "w.npz"), str(tmp_path / "w.npz"))
    assert r.code == 0, r.err
    assert "\x1b" not in r.out and "\x07" not in r.out and "[/]" in r.out and "[bold]x" in r.out
    assert "\\x1b" in r.out


def test_bad_tensor_files(dumps):
    a, tmp = dumps
    corrupt = tmp / "bad.pt"
    corrupt.write_bytes(b"\x80\x04not really a pickle")
    evil = tmp / "evil.pt"

    class Payload:
        def __reduce__(self):
            return (print, ("pwned",))

    evil.write_bytes(pickle.dumps({"x": Payload()}))
    obj = tmp / "obj.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp / "x.txt").write_text("hi")
    for bad in (corrupt, evil, obj, tmp / "missing.npz", tmp, tmp / "x.txt"):
        r = cli("compare", "tensors", str(bad), str(tmp / "many.npz"))
        assert r.code == 2, (bad, r.err)
        assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err and "pwned" not in r.out
    assert cli("compare", "tensors", str(tmp / "many.npz")).code == 2   # one file is not a comparison
    assert math.isinf(comparison.ratio(1e-3, 0.0)) and comparison.ratio(0.0, 0.0) == 0.0
