"""compare model --contracts: the embedded model and a tiny Hugging Face Qwen3
run clean (every break they show is rounding, explained by the fp64 re-run),
and bugs planted through throwaway engines registered at test time are named:
pads that update the state (the attention mask ignored) persist in fp64 and
are called algorithmic; a reduction order that depends on the batch size
vanishes in fp64 and is called rounding."""

import math

import numpy as np
import pytest
import torch
from helpers import cli, registered, json_glossary_problems, save_tiny_qwen, strict_json

from test_engines import FakeEngine  # an adapter with the protocol's abstract calls alone
from precisionlab.engines import registry
from precisionlab.engines.embedded import EmbeddedEngine
from precisionlab.experiments import contracts as exp

# A clean fp32 break is a few dozen roundings deep: |Δ logprob| stays far below 1e-3 nats
# (the embedded model's logits are O(10), fp32's u = 6e-8); its fp64 re-run at fp64's
# scale, below 1e-11 (u = 1.1e-16, the same depth). Chosen before running.
FP32_BOUND, FP64_BOUND = 1e-3, 1e-11
SMALL = dict(steps=12, batches=(2, 16), chunks=(7, 64))  # the defaults' shapes, fewer of them: the file's time


def _rows(res, **match):
    return [r for r in res.rows if all(r[k] == v for k, v in match.items())]


def _check_clean(res, dtype="fp32"):
    rows = _rows(res, dtype=dtype)
    assert {r["contract"] for r in rows} == set(exp.CONTRACTS)
    for r in rows:
        assert r["supported"], r
        if r["verdict"] == "holds":
            assert r["bit_identical_share"] == 1.0 and r["max_abs_diff"] == 0.0 and r["first_diff_position"] is None
        else:  # every clean break is rounding, and its sizes say so
            assert r["verdict"] == "rounding", r
            assert 0 < r["max_abs_diff"] < FP32_BOUND and r["exact_max_abs_diff"] < FP64_BOUND, r
            assert r["first_diff_position"] is not None and r["margin_at_first_diff"] >= 0
    # causality: a prefix's log-probs never depend on what follows it
    assert _rows(res, dtype=dtype, contract="shared_prefix")[0]["verdict"] == "holds"
    return rows


@pytest.fixture(scope="module")
def embedded():
    return exp.run(exp.ContractsConfig(dtypes="fp32,bf16", **SMALL))


def test_embedded_contracts_are_bit_identical_or_rounding(embedded):
    rows = _check_clean(embedded)
    assert [r["chunk"] for r in _rows(embedded, dtype="fp32", contract="chunked")] == [7, 64]
    by = {r["label"]: r for r in rows}
    assert not _rows(embedded, contract="chunked", chunk=1)
    # a sequence fed in one chunk at least as long as itself is the one-pass forward: bit-identical
    assert by["chunks of 64"]["verdict"] == "holds"
    assert by["decode 1 token a step"]["positions"] == embedded.params["positions"] == 7 + 12
    # bf16 rows are reported too (all supported, never called algorithmic)
    assert all(r["supported"] and r["verdict"] != "algorithmic" for r in _rows(embedded, dtype="bf16"))


def test_measure_against_float64_by_hand():
    ref = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.25, 4.0]])
    got = ref.clone()
    got[1, 2] = 4.0 + 2 ** -21  # two fp32 ulps at 4
    m = exp.measure(ref, got, "fp32", 5)
    assert m["bit_identical_share"] == 0.5 and m["first_diff_position"] == 6
    row = np.array([0.5, 0.25, 4.0])
    lse = lambda x: max(x) + math.log(math.fsum(math.exp(v - max(x)) for v in x))
    want = max(abs((a - lse(row)) - (b - lse(row + np.array([0, 0, 2 ** -21])))) for a, b in
               zip(row, row + np.array([0, 0, 2 ** -21]), strict=True))
    assert m["max_abs_diff"] == pytest.approx(want, rel=1e-6)
    assert m["margin_at_first_diff"] == pytest.approx(3.5) and m["greedy_flips"] == 0
    nan = ref.clone()
    nan[0, 0] = float("nan")
    n = exp.measure(nan, nan.clone(), "fp32", 0)
    assert n["bit_identical_share"] == 0.5 and n["max_abs_diff"] == math.inf  # two NaNs never agree


def test_the_rounding_line_sits_between_the_two_kinds():
    r = exp.rounding_ratio("fp32", "fp64")
    assert 2 ** -53 / 2 ** -24 < r < 1e-3  # rounding shrinks by u64/u32 = 2^-29; a bug by ~1


# --- planted bugs: throwaway engines over the embedded model ---------------------------------------


class PlantedEngine(EmbeddedEngine):
    """The embedded model under a registry name of its own: a planted bug overrides one step (test_spec_verify too)."""

    @classmethod
    def check(cls, arg):
        pass

    def __init__(self, arg, device):
        super().__init__(None, device)


class PadsUpdateState(PlantedEngine):
    """The attention mask dropped: every query attends to the pads before it."""

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        return super().forward_batch(model, ids, None, position_ids)


class BatchOrder(PlantedEngine):
    """The LM head reduces over d_model in as many chunks as the batch has rows:
    the sum's order depends on the batch size, the arithmetic does not."""

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        seen = {}
        hook = model.norm.register_forward_hook(lambda m, i, o: seen.update(h=o))
        try:
            logits = super().forward_batch(model, ids, attention_mask, position_ids)
        finally:
            hook.remove()
        if ids.shape[0] == 1:
            return logits
        h, w = seen["h"], model.embed.weight
        parts = torch.tensor_split(torch.arange(h.shape[-1]), min(ids.shape[0], h.shape[-1]))
        out = h[..., parts[0]] @ w[:, parts[0]].T
        for p in parts[1:]:
            out = out + h[..., p] @ w[:, p].T
        return out


class NoBatchNoCache(FakeEngine):
    """An engine with only the abstract calls (test_engines' adapter): no mask, no cache copy."""

    @classmethod
    def check(cls, arg):
        pass


@pytest.fixture
def planted():
    yield from registered({"padstate": PadsUpdateState, "batchorder": BatchOrder, "bare": NoBatchNoCache})


def test_pads_that_update_state_are_algorithmic(planted):
    res = exp.run(exp.ContractsConfig(model="padstate:x", dtypes="fp32", **SMALL))
    for r in _rows(res, contract="padding"):
        assert r["verdict"] == "algorithmic" and r["exact_max_abs_diff"] > 1e-3, r
        assert r["note"].startswith("algorithmic: persists in fp64")
    assert all(r["verdict"] != "algorithmic" for r in res.rows if r["contract"] != "padding")


def test_a_batch_dependent_order_is_rounding(planted):
    res = exp.run(exp.ContractsConfig(model="batchorder:x", dtypes="fp32", steps=12, batches=(8,), chunks=()))
    broken = [r for r in res.rows if r["contract"] == "batch"]
    assert broken and all(r["verdict"] == "rounding" and r["bit_identical_share"] < 1 for r in broken), broken
    for r in broken:
        assert r["note"].startswith("rounding: vanishes in fp64") and r["exact_max_abs_diff"] < FP64_BOUND
    assert _rows(res, label="8 pads, batch of 1")[0]["verdict"] == "holds"  # batch 1: the plain order


def test_an_engine_without_the_calls_reports_not_supported(planted):
    res = exp.run(exp.ContractsConfig(model="bare:x", dtypes="fp32", **SMALL))
    unsupported = {r["contract"] for r in res.rows if not r["supported"]}
    assert unsupported == {"padding", "prefix_cache", "spec_verify"}  # spec_verify copies the cache too
    assert all(r["note"].startswith("not supported by this engine") for r in res.rows if not r["supported"])
    assert any("not supported by this engine" in t for t in res.takeaways)


# --- a tiny Hugging Face Qwen3 -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    return str(save_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen3-contracts")))


def test_hugging_face_contracts_are_bit_identical_or_rounding(tiny):
    res = exp.run(exp.ContractsConfig(model=tiny, prompt="the cat sat", dtypes="fp32", **SMALL))
    _check_clean(res)


class HFPadsUpdateState:
    """Built at test time over HFEngine: the attention mask and the position ids dropped."""

    @staticmethod
    def make():
        from precisionlab.engines.hf import HFEngine

        class Planted(HFEngine):
            # Both dropped: transformers reads restarting position ids as packed sequences and
            # masks across them, so only without either do the pads reach the state.
            def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
                return super().forward_batch(model, ids, None, None)

        return Planted


def test_hugging_face_pads_that_update_state_are_algorithmic(tiny):
    registry.register("hfpadstate", HFPadsUpdateState.make())
    try:
        res = exp.run(exp.ContractsConfig(model="hfpadstate:" + tiny, prompt="the cat sat", dtypes="fp32", **SMALL))
    finally:
        registry.unregister("hfpadstate")
    assert all(r["verdict"] == "algorithmic" for r in _rows(res, contract="padding"))


# --- the command ----------------------------------------------------------------------------------


def test_cli_json_and_usage_errors():
    r = cli("compare", "contracts", "--steps", "4", "--batches", "3", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert d["command"] == "compare contracts" and d["params"]["dtypes"] == ["fp32", "bf16"]
    assert d["params"]["batches"] == [2, 3, 4, 16, 64] and json_glossary_problems(d) == []
    assert d["flags"]["torch.backends.cuda.matmul.allow_tf32"] is False
    for args, needle in ((["model", "--contracts", "--metrics"], "separate runs"),
                         (["contracts", "--plot", "x.png"], "No such option: --plot"),
                         (["model", "--chunks", "3"], "No such option: --chunks"),
                         (["contracts", "--chunks", "0"], "positive")):
        r = cli("compare", *args)
        lines = r.err.strip().splitlines()
        assert r.code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in r.err, (args, r.err)
