"""Overflow that hides as finite values (issue 40, 4): an RMSNorm whose sum
of squares is accumulated in fp16 overflows to inf on rows whose squares pass
65504, and x * rsqrt(inf) = 0 makes those rows finite zeros, so no inf rule
sees them. In a three-way dump the norm is named, as an overflow, at the norm
(not at the MLP after it), with the range excess of its input and the
`compare op rmsnorm --impl` run that checks the kernel."""

import json

import numpy as np

import pytest

from helpers import cli, strict_json
from precisionlab.numerics import divergence as dv

HIDDEN, ROWS, EPS = 256, 8, 1e-6
NAMES = ["layers.0.resid", "layers.0.norm", "layers.0.mlp"]


def _rmsnorm(x32, w, sumsq):
    return x32 / np.sqrt(sumsq / HIDDEN + EPS) * w


def _dumps(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    # rows 0-3 ordinary (|x| ~ 1), rows 4-7 large (|x| ~ 20: the row's sum of squares ~ 1e5, past fp16's 65504)
    scale = np.array([1.0] * 4 + [20.0] * 4)[:, None]
    x = (rng.standard_normal((ROWS, HIDDEN)) * scale).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    W = (rng.standard_normal((HIDDEN, 64)) / 16).astype(np.float32)
    x64 = x.astype(np.float64)

    def mlp(n):
        return np.maximum(n.astype(np.float64) @ W.astype(np.float64), 0)

    ref32 = _rmsnorm(x64, w, (x64 * x64).sum(1, keepdims=True))
    x16 = x.astype(np.float16)
    x16_64 = x16.astype(np.float64)
    low = _rmsnorm(x16_64, w, (x16_64 * x16_64).sum(1, keepdims=True)).astype(np.float16)  # fp32 accumulation
    acc = np.zeros((ROWS, 1), dtype=np.float16)
    with np.errstate(over="ignore"):
        for j in range(HIDDEN):  # the bug: the sum of squares accumulated in fp16
            acc = (acc + x16[:, j:j + 1] * x16[:, j:j + 1]).astype(np.float16)
        inv = (1 / np.sqrt(acc.astype(np.float32) / HIDDEN + EPS)).astype(np.float16)  # rsqrt(inf) = 0
    yours = (x16 * inv * w.astype(np.float16)).astype(np.float16)
    assert np.isinf(acc[4:]).all() and (yours[4:] == 0).all() and np.isfinite(yours).all()
    meta = {"precisionlab.order": json.dumps(NAMES)}
    paths = []
    for tag, tensors in (("ref32", (x, ref32, mlp(ref32))), ("ref16", (x16, low, mlp(low))),
                         ("yours", (x16, yours, mlp(yours)))):
        dt = np.float32 if tag == "ref32" else np.float16
        p = tmp_path / f"{tag}.safetensors"
        save_file({n: np.ascontiguousarray(t, dtype=dt) for n, t in zip(NAMES, tensors, strict=True)}, str(p),
                  metadata=meta)
        paths.append(str(p))
    return paths


def test_an_fp16_overflowing_rmsnorm_is_named_at_the_norm_as_overflow(tmp_path):
    r = cli("compare", "tensors", *_dumps(tmp_path), "--json")
    assert r.code == 1, r.err
    doc = strict_json(r.out)
    assert doc["first_divergence"] == "layers.0.norm" and doc["first_divergence_rule"] == "overflow"
    reason = doc["first_divergence_reason"]
    assert "4 of 8 rows of YOURS are 0" in reason and "rsqrt(inf) = 0" in reason
    assert "compare op rmsnorm --dtypes fp16 --impl" in reason
    assert "upstream at layers.0.resid: REF_FP32's row sum of squares reaches" in reason and "65504" in reason
    rows = {row["name"]: row for row in doc["rows"]}
    assert rows["layers.0.norm"]["hidden_overflow_rows"] == 4 and rows["layers.0.norm"]["overflow"] == 0
    assert not rows["layers.0.resid"]["flagged"]  # the norm's input is YOURS' exactly
    r_text = cli("compare", "tensors", *_dumps(tmp_path))
    assert "an overflow that hides as finite values" in r_text.out + r_text.err


def test_constant_rows_count_only_rows_where_the_reference_varies():
    ref = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [1.0, -1.0, 2.0], [4.0, 5.0, 6.0]])
    yours = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [7.0, 7.0, 7.0], [4.0, 5.0, 6.0]])
    assert dv.constant_rows(ref, yours) == (1, 1, 4)  # row 1 is zero on both sides: no flag
    assert dv.constant_rows(ref, ref) == (0, 0, 4)
    assert dv.hidden_overflow_flag((0, 0, 4), "fp16") is None
    assert dv.constant_rows(ref[:, :1], yours[:, :1]) == (0, 0, 0)  # one element per row: no row to be constant


def test_range_excess_names_values_then_squares():
    assert dv.range_excess(np.full((2, 4), 7e4), "fp16").startswith("REF_FP32 reaches 7e+04, past fp16's max 65504")
    assert "row sum of squares reaches 1.6e+05" in dv.range_excess(np.full((2, 4), 200.0), "fp16")
    assert dv.range_excess(np.full((2, 4), 200.0), "bf16") is None
    assert dv.range_excess(np.full((2, 4), 200.0), None) is None


# --- compare layers --reference: YOURS' norm sums its squares in the input dtype ---------------------


def _norm_sums_squares_in_input_dtype(model):
    """Layer 1's post-attention RMSNorm with its sum of squares in x's dtype: exact enough in fp32, and in
    fp16 the sum of a row whose squares pass 65504 rounds to inf, so x * rsqrt(inf) = 0 (a finite row)."""
    import types

    import torch

    def forward(self, x):
        ss = (x * x).sum(-1, keepdim=True)  # x's dtype: inf in fp16 past 65504
        return self.weight * (x * torch.rsqrt(ss / x.shape[-1] + self.variance_epsilon))

    norm = model.model.layers[1].post_attention_layernorm
    norm.forward = types.MethodType(forward, norm)  # a bound method: the fp16 copy binds its own module


def test_an_fp16_overflowing_rmsnorm_in_compare_layers_is_named_at_the_norm(run, tmp_path):
    pytest.importorskip("transformers")
    import torch

    from helpers import save_tiny_qwen
    from precisionlab.engines import registry
    from precisionlab.engines.hf import HFEngine

    def big_embeddings(model):  # a residual stream of |x| ~ 60 at width 32: row sums of squares ~ 1e5
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(3000.0)

    base = save_tiny_qwen(tmp_path / "big", hidden=32, layers=3, edit=big_embeddings)

    class Buggy(HFEngine):
        def __init__(self, arg, device):
            super().__init__(arg, device)
            _norm_sums_squares_in_input_dtype(self.base)

    registry.register("planted", Buggy)
    try:
        r = run("compare", "engine-layers", "--engine", f"planted:{base}", "--reference", f"hf:{base}", "--dtypes", "fp16",
                "--prompt", "the cat sat", "--steps", "12", "--json")
    finally:
        registry.unregister("planted")
    assert r.code == 1, r.err
    doc = strict_json(r.out)
    norm = "model.layers.1.post_attention_layernorm"
    assert doc["first_divergence_by_view"]["fp16"] == norm  # at the norm, not the MLP after it
    f = next(f for f in doc["flags"] if f["view"] == "fp16")
    assert f["module"] == norm and f["rule"] == "overflow" and "rsqrt(inf) = 0" in f["text"]
    assert "compare op rmsnorm --dtypes fp16 --impl" in f["text"]
    assert "upstream at model.layers." in f["text"] and "REF fp32's row sum of squares reaches" in f["text"]
    row = next(x for x in doc["rows"] if x["module"] == norm)
    assert row["views"]["fp16"]["overflow"] == [0, 0]  # no inf anywhere: only the flat rows tell
    assert row["views"]["fp16"]["hidden_overflow_rows"][0] > 0
    assert doc["first_divergence_by_view"]["fp32"] is None  # in fp32 the same kernel is rounding only

