"""`precisionlab kvcache`: the embedded model with an fp8 KV cache. The
stored values are checked against the dtype registry's rounding, saturation is
counted exactly, and the done-when facts: K and V scaled by 1000 in a
unit-scale e4m3 cache saturate and are flagged; dynamic scales bring the error
back to fp8's own cost."""

import numpy as np
import pytest
from helpers import cli, strict_json

from precisionlab import formats
from precisionlab.experiments import kvcache as exp

torch = pytest.importorskip("torch")


def test_unit_scale_store_is_the_saturating_fp8_rounding_and_counts_saturation():
    x = torch.tensor([[[[500.0, 460.0, 470.0, 448.0, -1000.0, 0.3, -1e-3, 17.0]]]])
    store = exp.KVStore("fp8_e4m3", "unit", 1.0)
    k, _ = store(x, x)
    e4m3 = formats.get("fp8_e4m3")
    want = e4m3.round(np.clip(x.double().numpy(), -448, 448))
    assert np.array_equal(k.double().numpy(), want)
    # past 448 + 32/2 = 464 a range-free rounding would exceed 448: 470, 500, -1000 (in K and in V)
    assert store.saturated == 2 * 3 and store.entries == 2 * 8


def test_dynamic_scale_is_per_head_and_token_and_never_saturates():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 9, 32, generator=g) * torch.logspace(-3, 4, 9).view(1, 1, 9, 1)
    store = exp.KVStore("fp8_e4m3", "dynamic", 1.0)
    k, _ = store(x, x)
    assert store.saturated == 0
    rel = ((k - x).abs().amax(-1) / x.abs().amax(-1))  # per (head, token): within fp8's half ulp of the vector's amax
    assert float(rel.max()) <= 2 ** -4


@pytest.fixture(scope="module")
def scaled_run():
    return exp.run(exp.KVCacheConfig(dtypes="fp8_e4m3", activation_scale=1000.0, steps=8))


def test_activations_x1000_saturate_a_unit_scale_cache_and_dynamic_scales_recover(scaled_run):
    rows = {(r["cache"], r["scale"]): r for r in scaled_run.rows}
    unit, dyn, cal = rows[("fp8_e4m3", "unit")], rows[("fp8_e4m3", "dynamic")], rows[("fp8_e4m3", "calibrated")]
    assert unit["flag"] == "saturating" and unit["saturated"] > unit["entries"] // 10
    assert dyn["flag"] == "" and dyn["saturated"] == 0 and cal["saturated"] == 0
    assert unit["mean_rel_l2"] > 10 * dyn["mean_rel_l2"]
    # e4m3 keeps 4 significand bits to bf16's 8: 16x the unit roundoff; dynamic scales cost about that, no more
    assert dyn["vs_bf16"] < 32
    assert rows[("fp32", None)]["mean_rel_l2"] < 1e-6  # x1000 then /1000 in fp32: rounding only
    assert any("saturates" in t for t in scaled_run.takeaways)


def test_cli_json_and_usage_errors():
    r = cli("kvcache", "--dtypes", "fp8_e5m2", "--scales", "dynamic", "--steps", "3", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert [(x["cache"], x["scale"]) for x in doc["rows"]] == [("fp32", None), ("bf16", None),
                                                                ("fp8_e5m2", "dynamic")]
    for args, text in ((["--activation-scale", "0"], "activation-scale"), (["--dtypes", "fp8_e3m4"], "KV cache dtype"),
                       (["--scales", "static"], "KV scale"), (["--steps", "0"], "--steps"),
                       (["--prompt", "\u00e9"], "--prompt")):
        r = cli("kvcache", *args)
        assert r.code == 2 and text in r.err and "Traceback" not in r.err, (args, r.err)
