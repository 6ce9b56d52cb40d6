"""One catalog: the library declares each kernel variant and each format once,
and the CLI's choices, --help, info's JSON, bench and the tests read it.

These tests hold the places that read the catalog to the library's table, and
the table's numbers to ml_dtypes' (an independent implementation)."""

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest

from helpers import cli, strict_json
from precisionlab import native
from precisionlab.catalog import formats
from precisionlab.errors import UsageError
from precisionlab.experiments import accumulate, bench, softmax

FP32 = formats.get("fp32").code  # format codes by name, never literals

OPS_WITH_A_CLI_CHOICE = {"sum": "accumulate", "softmax": "softmax"}


def test_variant_names_are_identifiers_unique_within_their_op():
    seen = set()
    for v in native.catalog():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", v.name), v
        assert (v.op, v.name) not in seen, v
        seen.add((v.op, v.name))
        assert v.kind in ("algorithm", "kernel", "bug") and v.devices and v.summary


def test_every_entry_point_takes_the_ids_of_its_rows_and_refuses_others():
    """The C side validates against the same table: an id no row has is refused."""
    for op in {v.op for v in native.catalog()}:
        ids = {v.id for v in native.variants(op)}
        assert native.variant(op, native.variants(op)[0].name).id in ids
        stray = max(ids) + 1
        with pytest.raises(UsageError, match="unknown|variant"):
            if op == "softmax":
                native._call("pl_softmax_cpu", np.zeros(3, np.float32).ctypes.data, 1, 3, FP32, stray, 0,
                             np.zeros(3, np.float32).ctypes.data, None)
            elif op == "sum":
                native._call("pl_accumulate_cpu", native._dptr(np.ones(3)), 3, FP32, stray, 0,
                             ctypes.byref(ctypes.c_double()), None, None, None)
            elif op == "matmul_acc":  # the CPU entry has one variant; the GPU's is checked before any device
                f32 = np.zeros(4, np.float32).ctypes.data
                native._call("pl_matmul_acc_cuda", f32, f32, 2, 2, 1, FP32,
                             ctypes.byref(native.accumulator("fp32")), f32, stray)
            elif op == "flash_attention":  # as matmul_acc: the GPU entry checks the variant before any device
                f32 = np.zeros(16, np.float32).ctypes.data
                native._call("pl_flash_attention_cuda", f32, f32, f32, 2, 2, 2, 2,
                             ctypes.byref(native.flash_config(2, 2, FP32)), f32, None, stray)
            elif op == "allreduce":
                native._call("pl_allreduce_cpu", native._dptr(np.ones(4)), 2, 2, FP32, stray, 0, 1, -1,
                             native._dptr(np.ones(2)))
            else:  # GPU-only ops: refused before any device is touched
                native._call({"rmsnorm": "pl_rmsnorm_cuda", "matmul": "pl_matmul_workspace_bytes",
                              "blockscale_quantize": "pl_blockscale_quantize_cuda",
                              "blockscale_dequantize": "pl_blockscale_dequantize_cuda"}[op],
                             *_gpu_args(op, stray))


def _gpu_args(op: str, vid: int) -> tuple:
    p = ctypes.c_void_p(8)  # never dereferenced: the variant is checked first
    if op == "rmsnorm":
        return (p, 1, 4, 1, p, ctypes.c_float(1e-6), p, vid)
    if op == "matmul":
        return (4, 4, vid, 1, ctypes.byref(ctypes.c_size_t()))
    if op == "blockscale_quantize":
        return (p, 32, 4, 32, 0, ctypes.c_float(0.0), p, p, ctypes.byref(ctypes.c_float()), vid)
    return (p, p, ctypes.c_float(1.0), 32, 4, 32, p, vid)


def test_the_cpu_refuses_the_gpu_only_rows():
    x = np.zeros((1, 4), np.float32)
    for v in native.variants("softmax"):
        if "cpu" not in v.devices:
            with pytest.raises(UsageError, match="does not run on the CPU"):
                native.softmax_cpu(x, formats.get("fp32").code, v.name)


@pytest.mark.parametrize("op, command", sorted(OPS_WITH_A_CLI_CHOICE.items()))
def test_help_lists_every_variant_of_the_library(op, command):
    r = cli(command, "--help", env={"COLUMNS": "400"})
    assert r.code == 0
    text = " ".join(r.out.split())
    for v in native.variants(op):
        assert re.search(rf"\b{v.name}\b", text), (op, v.name)


@pytest.mark.parametrize("command", ["softmax", "accumulate", "formats"])
def test_help_without_the_library_says_so_once(command):
    # --help works without the library, and each option says once where its names come from
    r = cli(command, "--help", env={"COLUMNS": "400", "PRECISIONLAB_LIB": "/nonexistent/libprecisionlab.so"})
    assert r.code == 0, r.err
    lines = [ln for ln in r.out.splitlines() if "make lib" in ln]  # 400 columns: an option a line
    assert lines and all(ln.count("make lib") == 1 for ln in lines), r.out


def test_cli_choices_are_the_catalog():
    assert accumulate.ALL_METHODS == [v.name for v in native.variants("sum")]
    assert softmax.METHODS == [v.name for v in native.variants("softmax")]
    assert set(softmax.BUGS) == {v.name for v in native.variants("softmax", kind="bug")}
    assert set(softmax.BUG_CASES) == set(softmax.BUGS)  # every bug has the case that shows it
    assert set(bench.SOFTMAX_KERNELS) <= {v.name for v in native.variants("softmax", "cuda")}
    assert bench.SUM_KERNELS == [v.name for v in native.variants("sum", "cuda")]
    r = cli("softmax", "--variants", "no_such_kernel")
    assert r.code == 2 and all(v.name in r.err for v in native.variants("softmax"))


def test_every_cpu_variant_runs_from_the_cli():
    r = cli("softmax", "--variants", ",".join(v.name for v in native.variants("softmax", "cpu")), "--device", "cpu",
            "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert {row["variant"] for row in doc["rows"]} == {v.name for v in native.variants("softmax", "cpu")}


def test_info_json_carries_the_librarys_table():
    r = cli("info", "--json")
    assert r.code == 0, r.err
    cat = strict_json(r.out)["catalog"]
    assert cat["variants"] == [v.to_json() for v in native.catalog()]
    assert [f["name"] for f in cat["formats"]] == list(formats.FORMATS)
    assert [b["name"] for b in cat["block_formats"]] == list(native.block_formats())


@pytest.mark.parametrize("name", ["fp64", "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp6_e2m3",
                                  "fp6_e3m2"])
def test_library_format_facts_agree_with_ml_dtypes(name):
    f = formats.get(name)
    fi = ml_dtypes.finfo(f.dtype)
    assert f.bits == fi.bits
    assert f.precision == fi.nmant + 1
    assert (f.emin, f.emax) == (fi.minexp, fi.maxexp - 1)
    assert f.max == float(fi.max)
    # inf: does the numpy twin hold one? NaN likewise.
    with np.errstate(over="ignore", invalid="ignore"):
        assert f.has_inf == bool(np.isinf(np.array(np.inf).astype(f.dtype)))
        assert f.has_nan == bool(np.isnan(np.array(np.nan).astype(f.dtype).astype(np.float64)))


def test_the_arithmetic_formats_are_the_librarys_codes():
    table = {d.name: d for d in native.format_table()}
    for f in formats.FORMATS.values():
        if f.code is not None:
            assert table[f.name].code == f.code and table[f.name].bits == f.bits
        else:  # storage-only: the element formats of the block formats, bits not bytes
            assert f.name not in table and f.bits < 8
    assert "tf32" in table and table["tf32"].precision == 11  # a compute mode: no numpy twin, not a storage format


def test_rows_name_their_variant_by_identifier_not_by_label():
    """Display labels are never identifiers: a row's variant is a catalog name
    (or "torch" for torch's own op), and its text is a separate label."""
    from precisionlab.experiments import nondeterminism as nd

    res = nd.run(nd.NondetConfig(runs=3, n=1000, device="cpu", sections="atomics,splitk,batch,threads"))
    ops = {v.op for v in native.catalog()}
    for r in res.rows:
        assert re.fullmatch(r"[a-z][a-z0-9_]*", r["variant"]), r["variant"]
        if r["op"] in ops and r["variant"] != "torch":
            assert native.variant(r["op"], r["variant"]), r
    assert {r["variant"] for r in res.rows if r["section"] == "batch" and r["op"] != "matmul"} == {
        "stable", "stable_adaptive", "block", "adaptive"}


def test_torch_and_numpy_twins_round_trip_bit_for_bit():
    """The one dtype map also moves tensors: bf16 and fp8 through their bits."""
    torch = pytest.importorskip("torch")
    for f in formats.FORMATS.values():
        if f.torch_name is None:
            continue
        x = (torch.randn(9) * 3).to(f.torch_dtype)
        a = formats.torch_to_numpy(x)
        assert a.dtype == f.dtype and formats.from_numpy(a.dtype) is f and formats.from_torch(x.dtype) is f
        back = formats.numpy_to_torch(a)
        assert back.dtype == x.dtype and torch.equal(back.view(torch.uint8), x.view(torch.uint8))
        assert np.array_equal(a.astype(np.float64), x.double().numpy(), equal_nan=True)


@pytest.mark.parametrize("code", [-1, 99, 1 << 20])
def test_every_cpu_entry_point_refuses_a_format_code_no_format_has(code):
    """A stray format code is an invalid argument naming the function, never taken
    for fp16 (the host loads and stores, common.cuh's pl_load_host / pl_store_host,
    refuse one too, behind these checks)."""
    f32 = np.zeros(64, np.float32).ctypes.data
    d = native._dptr(np.zeros(64))
    res = ctypes.byref(ctypes.c_double())
    calls = {
        "pl_round": (d, 8, code, d),
        "pl_accumulate_cpu": (d, 8, code, native.variant("sum", "sequential").id, 0, res, None, None, None),
        "pl_allreduce_cpu": (d, 2, 4, code, native.variant("allreduce", "tree").id, 0, 4, -1, d),
        "pl_softmax_cpu": (f32, 1, 8, code, native.variant("softmax", "stable").id, 0, f32, None),
        "pl_softmax_cpu_lanes": (f32, 1, 8, code, f32, 32),
        "pl_rmsnorm_cpu": (f32, 1, 8, code, None, ctypes.c_float(1e-6), f32),
        "pl_rmsnorm_cpu_lanes": (f32, 1, 8, code, None, ctypes.c_float(1e-6), f32, 32),
        "pl_layernorm_cpu": (f32, 1, 8, code, None, None, ctypes.c_float(1e-6), f32),
        "pl_swiglu_cpu": (f32, f32, 8, code, f32),
        "pl_matmul_cpu": (f32, f32, 2, 2, 2, code, f32),
        "pl_rope_cpu": (f32, 1, 8, code, np.zeros(1, np.int64).ctypes.data, ctypes.c_float(1e4), FP32, f32),
        "pl_attention_cpu": (f32, f32, f32, 1, 1, 1, 2, 2, code, 0, None, ctypes.c_float(1.0), f32),
        "pl_matmul_acc_cpu": (f32, f32, 2, 2, 2, code, ctypes.byref(native.accumulator("fp32")), f32),
        "pl_format_info": (code, ctypes.byref(native._FormatDesc())),
    }
    lib = native._load()
    for name, args in calls.items():
        assert getattr(lib, name)(*args) == native.INVALID_ARGUMENT, name
        message = lib.pl_last_error().decode()
        said = rf"{name}: .*(unknown (accumulator )?format|must be fp32, bf16 or fp16 \(got) {code}\b"
        assert re.match(said, message), message


def test_every_alias_names_one_format_and_can_be_typed():
    """CANONICAL is a dict: an alias given to two formats would silently go to
    the later one. An alias not in the lookup's normal form could never match."""
    listed = [a for name, (_, _, aliases) in formats.TWINS.items() for a in (name, *aliases)]
    assert len(listed) == len(set(listed)) == len(formats.CANONICAL)
    assert all(formats._key(a) == a for a in listed)


def test_the_subsets_agree_with_the_librarys_table():
    """The named subsets are plain names (help needs no library); these are
    the library's facts they restate."""
    lib = formats.FORMATS
    assert list(formats.ALL) == list(lib)
    assert set(formats.STORAGE_ONLY) == {f.name for f in lib.values() if f.storage_only}
    assert set(formats.ACCUMULATORS) == {f.name for f in lib.values() if f.code is not None}
    assert set(formats.FP8) == {f.name for f in lib.values() if f.bits == 8 and not f.storage_only}
    assert set(formats.STORAGE) == set(formats.FP8) | set(formats.STORAGE_ONLY)
    for subset in (formats.COMPUTE, formats.LOW_COMPUTE, formats.FP8):
        assert all(lib[n].torch_name for n in subset), subset  # torch holds them
    assert set(formats.LOW_COMPUTE) < set(formats.COMPUTE) and "fp32" in formats.COMPUTE
    for subset in (formats.DEFAULT_ACCUMULATORS, formats.GPU_ACCUMULATORS, formats.STOCHASTIC_ACCUMULATORS):
        assert set(subset) <= set(formats.ACCUMULATORS)
    with pytest.raises(ValueError):
        formats.Subset(("fp32", "tf32"), "a mode")  # tf32 is a compute mode, not a format values are held in
