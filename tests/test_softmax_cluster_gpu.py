"""softmax version 5 (`cluster`: a long row split over a thread-block cluster,
the CTAs' (max, sum) pairs combined through distributed shared memory):

- bit for bit against emulate_gpu.softmax_cluster_row, an independent fp32
  replay of the kernel's order, on the CPU emulator (make emu-test; a GPU's
  expf is a few ulps from the C library's, so there the float64 tests hold);
- against float64 within the command's tolerances, and every edge case the
  other kernels handle, on a GPU and on the emulator alike;
- batch-invariant (the split depends on cols alone) and deterministic;
- the plan: single_pass takes it for rows past 16384 columns (one CTA of 512
  threads), ragged rows and rows past 16 x 32768 columns fall back.
"""

import ml_dtypes
import numpy as np
import pytest

import emulate_gpu
from test_softmax import NP, check_close, check_non_finite_rows, check_partly_masked, run
from precisionlab import native
from precisionlab.catalog import formats

gpu = pytest.mark.gpu  # every test but the replay's own check needs a device (or the emulator)

ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}
# (cols, dtype): every cluster size and register tier the long rows get
LONG = [(20000, "bf16"),    # C 2, pieces of 1250 vectors: 4 a thread, 320 threads
        (32768, "fp32"),    # C 2, full tier: 8 a thread, 512 threads (two CTAs an SM)
        (32768, "bf16"),    # C 2, full tier: 4 a thread, 512 threads
        (40960, "fp32"),    # C 4, 8 a thread, 320 threads
        (98304, "fp16"),    # C 8, 4 a thread, 384 threads
        (151936, "bf16"),   # C 16 (non-portable), pieces of 1187 vectors: 4 a thread, 320 threads
        (151936, "fp32"),   # C 16, 8 a thread, 320 threads
        (262144, "bf16"),   # C 16, full tier: 4 a thread, 512 threads
        (262144, "fp32"),   # C 16, full tier: 8 a thread, 512 threads
        (270000, "fp32")]   # past 16 x 16384: C 16 at the 1024-thread tiers (8 a thread, 544), last piece short


def plan(rows, cols, dtype, method="cluster"):
    return native.softmax_cuda_plan(rows, cols, formats.get(dtype).code, method, 132)


def bits_equal(y, want_stored, dtype):
    """y (float64 of the stored values) against the emulation's stored values:
    the same value everywhere, NaN where NaN."""
    want = np.asarray(want_stored).astype(np.float64)
    np.testing.assert_array_equal(y, want)
    assert (np.signbit(y) == np.signbit(want))[~np.isnan(want)].all()


def emulated(x_stored, dtype, masked="nan"):
    rows = [emulate_gpu.softmax_cluster_row(r.astype(NP[dtype]), NP[dtype], masked) for r in x_stored]
    return np.stack([r[0] for r in rows]), np.array([r[1] for r in rows], np.float64)


def edge_rows(cols: int, seed: int) -> np.ndarray:
    """Ordinary, masked, partly masked, NaN and +inf rows of `cols` logits."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((12, cols)) * 4.0
    x[1] = -np.inf                                     # masked
    x[2, : cols // 2] = -np.inf                        # partly: a leading masked half (whole CTAs of -inf)
    x[3, rng.random(cols) < 0.7] = -np.inf             # partly: scattered
    x[3, -1] = 1.5
    x[4, 1:] = -np.inf                                 # one finite logit, first
    x[5, :-1] = -np.inf                                # one finite logit, last
    x[6] = -np.inf
    x[6, cols // 2] = np.nan                           # NaN among -inf: NaN under both policies
    x[7, cols // 3] = np.nan                           # NaN among finite
    x[8, cols - 1] = np.inf                            # +inf: NaN (inf - inf), as the float64 reference
    x[9] = -1000.0 - rng.random(cols)                  # very negative: the shift matters
    x[10] = 80.0 + rng.random(cols)                    # large: exp(x) alone would overflow fp16/fp32 sums
    x[11] = 0.0                                        # equal logits
    return x


@gpu
@pytest.mark.emulator
@pytest.mark.parametrize("cols,dtype", LONG)
def test_long_rows_bit_for_bit_against_the_step_by_step_emulation(cols, dtype):
    x = np.random.default_rng(cols).standard_normal((2, cols)) * 4.0
    x[1, : cols // 3] = -np.inf  # partly masked: the first CTAs see only -inf
    y, lse, s = run(x, dtype, "cluster", device="cuda")
    want_y, want_lse = emulated(s, dtype)
    bits_equal(y, want_y, dtype)
    np.testing.assert_array_equal(lse, want_lse)
    # single_pass takes the same launch for these rows: the same bits
    ys, lses, _ = run(x, dtype, "single_pass", device="cuda")
    np.testing.assert_array_equal(ys, y)
    np.testing.assert_array_equal(lses, lse)


@gpu
@pytest.mark.emulator
@pytest.mark.parametrize("masked", ["nan", "zero"])
@pytest.mark.parametrize("cols,dtype", [(4, "fp32"), (8, "fp32"), (8, "bf16"), (8, "fp16"), (64, "fp32"),
                                        (64, "bf16"), (40960, "fp32"), (40960, "bf16"), (40960, "fp16")])
def test_edge_cases_bit_for_bit_against_the_step_by_step_emulation(cols, dtype, masked):
    # 4 fp32 columns: one vector, so rank 1's piece is empty; 8: a vector or two each
    x = edge_rows(cols, cols)
    y, lse, s = run(x, dtype, "cluster", masked=masked, device="cuda")
    want_y, want_lse = emulated(s, dtype, masked)
    bits_equal(y, want_y, dtype)
    np.testing.assert_array_equal(lse, want_lse)


def test_the_emulation_is_the_documented_semantics():
    # the replay itself against float64 (no device needed): ordinary rows
    # within tolerance, the edge cases as the other kernels give them
    for cols, dtype in [(40960, "fp32"), (151936, "bf16")]:
        x = edge_rows(cols, 3).astype(NP[dtype]).astype(np.float64)
        for masked in ("nan", "zero"):
            y, lse = emulated(x, dtype, masked)
            check_close(y[[0, 2, 3, 4, 5, 9, 10, 11]], x[[0, 2, 3, 4, 5, 9, 10, 11]], dtype)
            assert np.isnan(y[[6, 7, 8]]).all() and np.isnan(lse[[6, 7, 8]]).all()
            if masked == "nan":
                assert np.isnan(y[1]).all() and np.isnan(lse[1])
            else:
                assert (y[1] == 0).all() and lse[1] == -np.inf
    assert emulate_gpu.softmax_cluster_plan(151936, 2) == (16, 1187, 4, 320)
    assert emulate_gpu.softmax_cluster_plan(262144, 4) == (16, 4096, 8, 512)
    assert emulate_gpu.softmax_cluster_plan(32768, 2) == (2, 2048, 4, 512)
    assert emulate_gpu.softmax_cluster_plan(270000, 4) == (16, 4219, 8, 544)
    assert emulate_gpu.softmax_cluster_plan(40962, 4) is None


@gpu
@pytest.mark.parametrize("cols,dtype", LONG)
def test_long_rows_against_float64(cols, dtype):
    x = np.random.default_rng(cols + 7).standard_normal((2, cols)) * 4.0
    for method in ("cluster", "single_pass"):
        y, lse, s = run(x, dtype, method, device="cuda")
        check_close(y, s, dtype)
        assert ((y >= 0) & (y <= 1)).all()


@gpu
@pytest.mark.parametrize("cols", [8, 40960, 151936])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_edge_cases_as_the_other_kernels(cols, dtype):
    x = edge_rows(cols, cols + 1)
    ordinary = [0, 2, 3, 4, 5, 9, 10, 11]
    for masked in ("nan", "zero"):
        y, lse, s = run(x, dtype, "cluster", masked=masked, device="cuda")
        check_close(y[ordinary], s[ordinary], dtype)
        yo, lseo, _ = run(x, dtype, "online_vec", masked=masked, device="cuda")  # two reads, one CTA a row
        np.testing.assert_array_equal(np.isnan(y), np.isnan(yo))
        np.testing.assert_array_equal(np.isnan(lse), np.isnan(lseo))
        assert (y[[2, 4, 5]] == yo[[2, 4, 5]])[~np.isnan(yo[[2, 4, 5]])].any()
        assert (y[x == -np.inf][~np.isnan(y[x == -np.inf])] == 0).all()  # a masked logit gets exactly 0
        if masked == "zero":
            assert (y[1] == 0).all() and lse[1] == -np.inf
        else:
            assert np.isnan(y[1]).all() and np.isnan(lse[1])
        assert np.isnan(y[[6, 7, 8]]).all() and np.isnan(lse[[6, 7, 8]]).all()


@gpu
def test_non_finite_and_partly_masked_rows():
    check_non_finite_rows("cluster", "cuda")
    for cols in (2, 64, 65, 4097, 40960):
        check_partly_masked("cluster", "cuda", cols)


@gpu
def test_batch_invariant_and_deterministic():
    # the split depends on cols alone: a row's bits are the same alone or in a
    # batch, and from run to run (the emulator runs blocks and the cluster's
    # CTAs in a different order every time)
    x = np.random.default_rng(5).standard_normal((5, 151936)) * 4.0
    y, lse, _ = run(x, "bf16", "cluster", device="cuda")
    for r in (0, 3):
        y1, lse1, _ = run(x[r:r + 1], "bf16", "cluster", device="cuda")
        np.testing.assert_array_equal(y1[0], y[r])
        assert lse1[0] == lse[r]
    y2, lse2, _ = run(x, "bf16", "cluster", device="cuda")
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(lse2, lse)
    assert plan(1, 151936, "bf16") == plan(100_000, 151936, "bf16")


@gpu
def test_plan():
    # single_pass takes version 5 past one CTA's tiers (16384 columns in 512
    # threads); the cluster is the smallest whose pieces fit those tiers
    assert plan(8, 16384, "fp32", "single_pass")["kernel"] == 2
    assert plan(8, 16384 + 4, "fp32", "single_pass")["kernel"] == 5
    for cols, dtype in LONG:
        p = plan(64, cols, dtype, "single_pass")
        c, _, vpt, threads = emulate_gpu.softmax_cluster_plan(cols, ELEM[dtype])
        assert p == {"variant": "cluster", "kernel": 5, "vpt": vpt, "threads": threads, "rows_per_block": 1,
                     "cluster": c}, (cols, dtype)
        assert plan(64, cols, dtype) == p
    assert plan(512, 151936, "bf16")["cluster"] == 16 and plan(64, 262144, "fp32")["cluster"] == 16
    # up to 16 x 16384 columns every CTA has at most 512 threads: two an SM
    assert all(plan(64, c, d)["threads"] <= 512 for c, d in LONG if c <= 262144)
    # ragged rows fall back as single_pass does: the scalar online kernel
    assert plan(8, 40962, "fp32")["variant"] == "online"
    assert plan(8, 40964, "bf16", "single_pass")["variant"] == "online"
    # past 16 pieces of 32768 columns: two reads
    assert plan(8, 524292, "fp32", "single_pass")["variant"] == "online_vec"
    assert plan(8, 524292, "fp32")["variant"] == "online_vec"
    # short rows asked of `cluster` still run it (a cluster of 2)
    assert plan(8, 8, "fp32")["cluster"] == 2


@gpu
@pytest.mark.parametrize("cols,dtype,variant", [(40962, "fp32", "online"), (40964, "bf16", "online"),
                                                (524292, "fp32", "online_vec")])
def test_fallbacks_are_right(cols, dtype, variant):
    assert plan(1, cols, dtype, "single_pass")["variant"] == variant
    x = np.random.default_rng(cols).standard_normal((1, cols)) * 4.0
    for method in ("cluster", "single_pass"):
        y, lse, s = run(x, dtype, method, device="cuda")
        check_close(y, s, dtype)


@gpu
def test_bf16_storage_rounding_is_the_formats():
    # the emulation's stores round as ml_dtypes does: a sanity check of the replay's last step
    assert np.float32(ml_dtypes.bfloat16(np.float32(1 + 2 ** -8))) == 1.0


FALLBACK_CHILD = """
import json, sys
import numpy as np
sys.path.insert(0, "tests")
import emulate_gpu
from test_softmax import NP, run
from precisionlab import native
from precisionlab.catalog import formats

out = {}
for cols, dtype in ((151936, "bf16"), (262144, "fp32")):
    plan = native.softmax_cuda_plan(2, cols, formats.get(dtype).code, "single_pass", 132)
    x = np.random.default_rng(cols).standard_normal((2, cols)) * 4.0
    x[1, : cols // 3] = -np.inf
    y, lse, s = run(x, dtype, "single_pass", device="cuda")
    want = [emulate_gpu.softmax_cluster_row(r.astype(NP[dtype]), NP[dtype], "nan", max_cluster=8) for r in s]
    same = all(np.array_equal(y[i], want[i][0].astype(np.float64)) and np.float32(lse[i]) == want[i][1]
               for i in range(2))
    out[f"{cols} {dtype}"] = {"plan": plan, "bits_equal": bool(same)}
print(json.dumps(out))
"""


@gpu
@pytest.mark.emulator
def test_a_device_without_clusters_of_16_falls_back_to_8_at_1024_threads():
    # where cudaOccupancyMaxActiveClusters says no cluster of 16 fits (the
    # emulator plays such a device under PL_EMU_MAX_CLUSTER=8), long rows take
    # clusters of 8 at the 1024-thread tiers, bit for bit as the replay says
    import json
    import os
    import subprocess
    import sys

    from helpers import ROOT

    env = dict(os.environ, PL_EMU_MAX_CLUSTER="8", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", FALLBACK_CHILD], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for key, (c, vpt, threads) in {"151936 bf16": (8, 4, 608), "262144 fp32": (8, 8, 1024)}.items():
        assert got[key]["plan"] == {"variant": "cluster", "kernel": 5, "vpt": vpt, "threads": threads,
                                    "rows_per_block": 1, "cluster": c}, got
        assert got[key]["bits_equal"], key
