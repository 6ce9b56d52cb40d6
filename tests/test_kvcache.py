"""`precisionlab kvcache`: the embedded model, and a tiny Hugging Face Qwen3
(--model DIR), with an fp8 KV cache. The stored values are checked against the
dtype registry's rounding, saturation is counted exactly, and the done-when
facts on both models: K and V scaled by 1000 in a unit-scale e4m3 cache
saturate and are flagged; dynamic scales bring the error back to fp8's own
cost. The distribution statistics are compare model --metrics' own."""

import numpy as np
import pytest
from helpers import cli, save_tiny_qwen, strict_json

from precisionlab.catalog import formats
from precisionlab.engines import hf
from precisionlab.engines.protocol import greedy
from precisionlab.engines.registry import open_engine
from precisionlab.errors import RunError, UsageError
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
    for args, text in ((["--activation-scale", "0"], "activation-scale"), (["--dtypes", "fp8_e3m4"], "--dtypes"),
                       (["--scales", "static"], "KV scale"), (["--steps", "0"], "--steps"),
                       (["--prompt", "\u00e9"], "--prompt")):
        r = cli("kvcache", *args)
        assert r.code == 2 and text in r.err and "Traceback" not in r.err, (args, r.err)


def test_the_distribution_statistics_are_compare_model_metrics_own(scaled_run):
    from precisionlab.numerics import distribution

    for r in scaled_run.rows:
        d = r["distribution"]
        assert set(d) >= {"kld_mean", "kld_p99", "top1_agree_pct", "dp_rms", "ln_ppl_ratio", "flips_by_margin"}
        assert d["positions"] == 8 and r["kld_mean"] == d["kld_mean"]
        assert r["distribution_vs_bf16_cache"]["positions"] == 8
    rows = {(r["cache"], r["scale"]): r for r in scaled_run.rows}
    assert rows[("bf16", None)]["distribution_vs_bf16_cache"]["kld_max"] == 0  # the bf16 cache against itself
    assert rows[("fp8_e4m3", "unit")]["kld_mean"] > 100 * rows[("fp8_e4m3", "dynamic")]["kld_mean"]
    assert distribution.summarize.__module__ == "precisionlab.numerics.distribution"


# ---------------------------------------------------------------------------
# --model DIR: a Hugging Face model, its cache a transformers DynamicCache that rounds in update()


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    """A random 2-layer Qwen3 (GQA: 4 query heads, 2 key/value heads) with a word-level tokenizer."""
    pytest.importorskip("transformers")
    return save_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen3"))


def _hf_cfg(folder, **kw):
    return exp.KVCacheConfig(model=str(folder), prompt="the cat sat", **({"steps": 12} | kw))


@pytest.fixture(scope="module")
def hf_scaled_run(tiny_qwen):
    return exp.run(_hf_cfg(tiny_qwen, activation_scale=1000.0))


def test_hf_model_every_scale_mode_runs(hf_scaled_run):
    rows = {(r["cache"], r["scale"]): r for r in hf_scaled_run.rows}
    assert list(rows) == [("fp32", None), ("bf16", None)] + [(d, s) for d in exp.FP8 for s in exp.SCALES]
    # 2 layers x (K, V) x 2 key/value heads x (3 prompt + 12 steps - 1) positions x head_dim 8
    assert {r["entries"] for r in rows.values()} == {2 * 2 * 2 * 14 * 8}
    assert all(np.isfinite(r["mean_rel_l2"]) and np.isfinite(r["kld_mean"]) for r in rows.values())
    info = hf_scaled_run.model_info
    assert info["architecture"] == "Qwen3ForCausalLM" and info["cache_layers"] == 2 and info["kv_heads"] == 2


def test_hf_activations_x1000_saturate_a_unit_scale_cache_and_dynamic_scales_recover(hf_scaled_run):
    rows = {(r["cache"], r["scale"]): r for r in hf_scaled_run.rows}
    unit, dyn = rows[("fp8_e4m3", "unit")], rows[("fp8_e4m3", "dynamic")]
    assert unit["flag"] == "saturating" and unit["saturated"] > unit["entries"] // 10
    assert dyn["flag"] == "" and dyn["saturated"] == 0
    assert unit["mean_rel_l2"] > 10 * dyn["mean_rel_l2"]
    # Set before looking: e4m3 keeps 4 significand bits to bf16's 8, so its relative rounding of each K and V
    # entry is 16x bf16's, and the logit error, linear in small perturbations, about 16x the bf16 cache's. A
    # factor 2 either way covers the spread of 14 positions; below 4x the cache would not be read quantized.
    assert 16 / 4 < dyn["vs_bf16"] < 16 * 2
    assert rows[("fp32", None)]["mean_rel_l2"] < 1e-6  # x1000 then /1000 in fp32: rounding only
    assert any("saturates" in t for t in hf_scaled_run.takeaways)


def test_hf_distribution_statistics_agree_with_distribution_py_on_the_same_logits(tiny_qwen, hf_scaled_run):
    """The dynamic e4m3 row's statistics, recomputed here from logits got
    through compare model's own runner (the reference) and a fresh cache."""
    from precisionlab.numerics import distribution

    cfg = _hf_cfg(tiny_qwen, activation_scale=1000.0)
    m = open_engine(cfg.model, "cpu")
    prompt = m.prompt_ids(cfg.prompt, cfg.steps)
    with torch.no_grad():
        tokens, _ = greedy(m, m.base, prompt, cfg.steps)
        path = prompt + tokens
        ref = m.forward(m.base, torch.tensor([path[:-1]]))[0].double().numpy()[len(prompt) - 1:]
        cal = exp.Stores(lambda i: exp.KVStore(None, None, 1000.0))
        m.calibrate(m.base, cal, m.encode(exp.calibration_text()))
        dyn = exp._forced(m, exp.Stores(lambda i: exp.KVStore("fp8_e4m3", "dynamic", 1000.0)), path, len(prompt))
    want = distribution.summarize(distribution.position_stats(ref, dyn, np.asarray(tokens)))
    row = next(r for r in hf_scaled_run.rows if (r["cache"], r["scale"]) == ("fp8_e4m3", "dynamic"))
    assert row["distribution"] == want


def test_hf_attention_reads_the_quantized_cache_its_own_token_included(tiny_qwen, monkeypatch):
    """What update() returns, which attention reads, is on the e4m3 grid and
    holds the current token; decoding token by token gives the one-pass
    logits; a cache that stores fp32 changes nothing."""
    e4m3 = formats.get("fp8_e4m3")
    m = open_engine(str(tiny_qwen), "cpu")
    prompt = m.prompt_ids("the cat sat", 12)
    cls = hf.stored_cache_class()
    seen = []
    real = cls.update

    def spy(self, k, v, layer_idx, *a, **kw):
        out = real(self, k, v, layer_idx, *a, **kw)
        seen.append((k.shape[-2], out[0].shape[-2], out[0].double().numpy(), out[1].double().numpy(),
                     self.get_seq_length(layer_idx)))
        return out

    monkeypatch.setattr(cls, "update", spy)
    path = prompt + [1, 2, 3, 4, 5, 6]
    unit = lambda: exp.Stores(lambda i: exp.KVStore("fp8_e4m3", "unit", 1.0))  # noqa: E731
    with torch.no_grad():
        feed = m.session(m.base, unit())
        steps = [feed(prompt)[-1]] + [feed([t])[-1] for t in path[len(prompt):-1]]
    for _new, returned, k, v, held in seen:
        assert returned == held  # the whole cache, this call's tokens included
        for x in (k, v):
            assert np.array_equal(e4m3.round(np.clip(x, -448, 448)), x)
    assert seen[-1][0] == 1 and seen[-1][1] == len(path) - 1
    with torch.no_grad():
        one_pass = exp._forced(m, unit(), path, len(prompt))
        plain = m.forward(m.base, torch.tensor([path[:-1]]))[0].double().numpy()[len(prompt) - 1:]
        fp32 = exp._forced(m, exp.Stores(lambda i: exp.KVStore(None, None, 1.0)), path, len(prompt))
    stepwise = torch.stack(steps).double().numpy()
    assert np.array_equal(fp32, plain)
    gap = np.abs(one_pass - plain).max()
    assert gap > 1e-4 and np.abs(stepwise - one_pass).max() < 1e-3 * gap


def test_hf_memory_is_checked_before_anything_loads(tiny_qwen, monkeypatch):
    import transformers

    from precisionlab.io import inputs

    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        monkeypatch.setattr(cls, "from_pretrained", lambda *a, **k: calls.append(a) or None)
    monkeypatch.setattr(inputs, "memory_limit", lambda: 1 << 20)
    with pytest.raises(UsageError, match=r"kvcache --model .* needs about \d+ MiB of memory"):
        exp.run(_hf_cfg(tiny_qwen))
    assert calls == []


def test_hf_cache_api_changes_fail_in_one_line(tiny_qwen, monkeypatch):
    import transformers

    hf.stored_cache_class.cache_clear()
    monkeypatch.setattr(transformers.DynamicCache, "update", lambda self, keys, values, idx=0, **kw: (keys, values))
    try:
        with pytest.raises(RunError, match=r"DynamicCache.update is not update\(key_states"):
            exp.run(_hf_cfg(tiny_qwen, steps=2))
    finally:
        hf.stored_cache_class.cache_clear()
    monkeypatch.undo()
    monkeypatch.setattr(hf, "cache_keyword", lambda module, command: "kv_cache_by_another_name")
    with pytest.raises(RunError, match=r"never called its KV cache's update\(\)"):
        exp.run(_hf_cfg(tiny_qwen, steps=2))


def test_hf_cli_json_and_usage_errors(tiny_qwen):
    r = cli("kvcache", "--model", str(tiny_qwen), "--prompt", "the cat", "--dtypes", "fp8_e4m3", "--scales",
            "dynamic", "--steps", "3", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["model"] == str(tiny_qwen) and doc["model"]["transformers"]
    assert [(x["cache"], x["scale"]) for x in doc["rows"]] == [("fp32", None), ("bf16", None),
                                                                ("fp8_e4m3", "dynamic")]
    assert all("kld_mean" in x["distribution"] and "flips_by_margin" in x["distribution_vs_bf16_cache"]
               for x in doc["rows"])
    for args, text in ((["--model", "/nonexistent/model"], "--model"), (["--steps", "100"], "exceeds")):
        r = cli("kvcache", "--model", str(tiny_qwen), "--prompt", "the cat", *args)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and text in r.err, (args, r.err)


def test_the_cache_keyword_follows_transformers_and_fails_in_one_line():
    # transformers 5.x takes cache=, earlier versions (and 5.x until 5.40,
    # deprecated) past_key_values=: compare model and kvcache ask forward()
    class New:
        def forward(self, input_ids=None, cache=None, past_key_values=None, use_cache=None):
            pass

    class Old:
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            pass

    class Neither:
        def forward(self, input_ids=None):
            pass

    assert hf.cache_keyword(New(), "x") == "cache" and hf.cache_keyword(Old(), "x") == "past_key_values"
    with pytest.raises(RunError, match=r"Neither.forward takes neither cache= nor past_key_values=; kvcache"):
        hf.cache_keyword(Neither(), "kvcache --model")
    out = type("Out", (), {"past_key_values": "c"})()
    assert hf.returned_cache(out) == "c"
    with pytest.raises(RunError, match="returned no cache"):
        hf.returned_cache(object())
