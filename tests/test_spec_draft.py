"""compare contracts --draft SPEC / --draft tokens:FILE (experiments/spec_draft.py):
spec_verify's windows verify a draft's tokens under the verify chunk and under
decoding. A tiny second model (the embedded model's tokenizer, random
weights) and a token stream file as drafts; a verify chunk that decodes row by
row (bit-identical: nothing lost); the planted width-dependent reduction
order in bf16 (rounding) losing acceptance at near ties, equal to the flips
that changed it where the construction forces it; hostile drafts refused in
one line."""

import importlib.util
import json

import pytest
import torch
from helpers import (cli, embedded_gguf, fail_if_a_model_runs, one_line, registered, save_char_qwen, save_tiny_qwen,
                     strict_json)

from test_contracts import NoBatchNoCache
from test_spec_verify import VerifyOrder, _Planted
from precisionlab.engines import registry
from precisionlab.engines.embedded import EmbeddedEngine
from precisionlab.errors import UsageError
from precisionlab.experiments import contracts as exp
from precisionlab.experiments import spec_draft, startup
from precisionlab.io import inputs
from precisionlab.runtime import memory

SMALL = dict(steps=12, batches=(2,), chunks=(7,))
OFFSET = 64.0  # every logit shifted by this inside the LM head's sum: bf16's ulp there is 0.5


def _verify_rows(res, dtype):
    return [r for r in res.rows if r["contract"] == "spec_verify" and r["dtype"] == dtype]


def _head(model, h, parts: int):
    """The tied LM head with OFFSET added as one more column of the sum (h
    gets a 1, each vocabulary row an OFFSET), reduced over d_model + 1 in
    `parts` parts, each part rounded to the model's dtype before the next is
    added: a constant shift of every logit (softmax and argmax unchanged in
    exact arithmetic) that makes bf16's logits coarse, as large logits are."""
    w = model.embed.weight
    h = torch.cat([h, torch.ones(*h.shape[:-1], 1, dtype=h.dtype)], -1)
    w = torch.cat([w, torch.full((w.shape[0], 1), OFFSET, dtype=w.dtype)], -1)
    split = torch.tensor_split(torch.arange(h.shape[-1]), parts)
    out = h[..., split[0]] @ w[:, split[0]].T
    for p in split[1:]:
        out = out + h[..., p] @ w[:, p].T
    return out


class OffsetOrder(_Planted):
    """Every pass through _head: the prefill, a decode step and forward in one
    part, a chunk after the cache in as many parts as it has rows (the
    verify width decides the order, as VerifyOrder's)."""

    def _run(self, model, state, ids, chunk: bool):
        seen = {}
        hook = model.norm.register_forward_hook(lambda m, i, o: seen.update(h=o))
        try:
            with torch.no_grad():
                _, state["cache"] = model(torch.tensor([ids]), state["cache"], state["pos"])
                state["pos"] += len(ids)
                return _head(model, seen["h"][0], len(ids) if chunk else 1)
        finally:
            hook.remove()

    def _feed(self, model, state):
        def feed(ids):
            return self._run(model, state, ids, chunk=state["cache"] is not None and len(ids) > 1)

        feed.model, feed.state = model, state
        return feed

    def chunk(self, model, state, ids):
        return self._run(model, state, ids, chunk=True)

    def forward_batch(self, model, ids, attention_mask=None, position_ids=None):
        seen = {}
        hook = model.norm.register_forward_hook(lambda m, i, o: seen.update(h=o))
        try:
            super().forward_batch(model, ids, attention_mask, position_ids)
        finally:
            hook.remove()
        with torch.no_grad():
            return _head(model, seen["h"], 1)


class VerifyDecodes(_Planted):
    """A verify chunk computed as decoding: its rows one a step on the copied cache (bit-identical by construction)."""

    def chunk(self, model, state, ids):
        plain = EmbeddedEngine._feed(self, model, state)  # the shipped steps, on the chunk's own (copied) state
        return torch.cat([plain([t]) for t in ids])


@pytest.fixture
def planted():
    yield from registered({"offsetorder": OffsetOrder, "verifyorder": VerifyOrder, "verifydecodes": VerifyDecodes,
                           "bare": NoBatchNoCache})


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    """A second model with the embedded model's character tokenizer: 2 layers, hidden 32, random weights."""
    pytest.importorskip("transformers")
    return save_char_qwen(tmp_path_factory.mktemp("draft") / "hf", hidden=32, positions=128, seed=3)


def _decoded_stream(spec: str, dtype: str, steps: int) -> list[int]:
    """The target's own greedy choice at each position after the prompt, decoding the
    fp32 greedy sequence one token a step in `dtype` (id i: position prompt + i)."""
    from precisionlab.engines.protocol import greedy

    eng = registry.open_engine(spec, "cpu")
    prompt = eng.prompt_ids(exp.ContractsConfig().prompt, steps)
    tokens, _ = greedy(eng, eng.model("fp32"), prompt, steps)
    feed = eng.session(eng.model(dtype))
    feed(prompt)
    rows = [feed([t])[-1] for t in tokens[:-1]]
    return [tokens[0]] + [int(r.double().argmax()) for r in rows]


def test_a_tiny_second_model_as_the_draft(tiny_draft):
    res = exp.run(exp.ContractsConfig(dtypes="fp32", draft=spec_draft.DraftOptions(f"hf:{tiny_draft}"), **SMALL))
    assert res.params["draft_from"] == "--draft" and res.params["draft_spec"] == f"hf:{tiny_draft}"
    assert res.params["draft_token_check"] == "identical"
    rows = _verify_rows(res, "fp32")
    assert [r["draft"] for r in rows] == [1, 2, 4, 8]
    # random weights: the draft's own tokens are mostly not the target's, which decoding says, not numerics
    assert sum(r["draft_rejected"] for r in rows) > 0
    for r in rows:
        assert r["draft_rejected"] == r["drafts"] - r["accepted_decode"]
        assert r["acceptance_rate_decode"] == r["accepted_decode"] / r["drafts"]
        assert abs(r["acceptance_lost"]) <= r["draft"] * r["acceptance_flips"] <= r["draft"] * r["greedy_flips"], r
    assert any(t.startswith(f"fp32 spec_verify, --draft hf:{tiny_draft} as the draft: k=1: ") for t in res.takeaways)


@pytest.fixture(scope="module")
def q4_draft(tmp_path_factory):
    """The embedded model's Q4_0 GGUF export (llama.cpp reads it): the same model, quantised."""
    return embedded_gguf(tmp_path_factory, "draft-q4_0", "q4_0")


def _check_rows(rows):
    assert [r["draft"] for r in rows] == [1, 2, 4, 8] and all(r["supported"] for r in rows)
    for r in rows:
        assert 0 <= r["accepted_decode"] <= r["drafts"] and 0 <= r["accepted_verify"] <= r["drafts"], r
        assert abs(r["acceptance_lost"]) <= r["draft"] * r["acceptance_flips"] <= r["draft"] * r["greedy_flips"], r


def test_a_quantised_export_as_the_draft(q4_draft):
    res = exp.run(exp.ContractsConfig(dtypes="fp32", draft=spec_draft.DraftOptions(f"llamacpp:{q4_draft}"), **SMALL))
    assert res.params["draft_token_check"] == "identical"
    _check_rows(_verify_rows(res, "fp32"))


def test_llamacpp_as_the_target_with_a_draft(q4_draft):
    res = exp.run(exp.ContractsConfig(model=f"llamacpp:{q4_draft}", dtypes="fp32",
                                      draft=spec_draft.DraftOptions("embedded"), **SMALL))
    rows = _verify_rows(res, "fp32")
    _check_rows(rows)
    assert all(r["verdict"] in ("holds", "unresolved") for r in rows), rows  # no fp64 in llama.cpp


def test_one_estimate_for_both_models_before_either_loads(monkeypatch, tiny_draft):
    seen = []

    def stop(need, what):
        seen.append((need, what))
        raise UsageError("stopped at the estimate")

    monkeypatch.setattr(inputs, "check_memory", stop)
    fail_if_a_model_runs(monkeypatch)  # neither model may load before the estimate
    for spec in (None, f"hf:{tiny_draft}"):
        with pytest.raises(UsageError, match="stopped at the estimate"):
            exp.run(exp.ContractsConfig(dtypes="fp32", draft=spec_draft.DraftOptions(spec), **SMALL))
    (alone, _), (both, what) = seen
    loads = [startup.Load(f"hf:{tiny_draft}", "cpu", SMALL["steps"] + exp.PADS, exp.ContractsConfig().prompt)]
    (shape,) = startup.shapes(loads)
    assert both - alone == memory.contracts_draft(shape, weights=True, fixed=True) > 0
    assert f"--draft hf:{tiny_draft}" in what


def test_a_draft_that_fails_to_load_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.gguf").write_bytes(b"")
    one_line(cli("compare", "contracts", "--steps", "12", "--draft", f"hf:{tmp_path / 'empty'}"), 2, "--draft")
    if importlib.util.find_spec("llama_cpp") is not None:
        one_line(cli("compare", "contracts", "--steps", "12", "--draft", f"llamacpp:{tmp_path / 'empty.gguf'}"), 2,
                 "empty.gguf")


def test_a_bit_identical_verify_loses_nothing(planted, tiny_draft):
    res = exp.run(exp.ContractsConfig(model="verifydecodes:x", dtypes="fp32",
                                      draft=spec_draft.DraftOptions(f"hf:{tiny_draft}"), **SMALL))
    for r in _verify_rows(res, "fp32"):
        assert r["verdict"] == "holds" and r["bit_identical_share"] == 1.0, r
        assert r["acceptance_lost"] == 0 and r["acceptance_flips"] == 0 and r["accepted_verify"] == r["accepted_decode"]
    assert sum(r["draft_rejected"] for r in _verify_rows(res, "fp32")) > 0  # the draft's own, reported apart


def test_the_draft_model_is_the_target_itself():
    res = exp.run(exp.ContractsConfig(dtypes="fp32", draft=spec_draft.DraftOptions("embedded"), **SMALL))
    assert res.params["draft_token_check"] == "identical (the target's own engine)"
    for r in _verify_rows(res, "fp32"):  # its fp32 greedy tokens after the sequence's prefix: the stream's own
        assert r["draft_rejected"] == 0, r


def test_a_planted_order_in_bf16_loses_acceptance_at_near_ties(planted):
    """The equality's construction: k = 1 (one draft a window, so a flip that
    changes acceptance moves it by exactly one) and the draft the target's own
    bf16 decoding (decoding accepts every draft, so each such flip is a loss)."""
    steps = 60
    stream = _decoded_stream("offsetorder:x", "bf16", steps)
    res = exp.run(exp.ContractsConfig(model="offsetorder:x", dtypes="bf16", steps=steps, batches=(2,), chunks=(7,),
                                      draft_widths=(1,),
                                      draft=spec_draft.DraftOptions(tokens=stream, tokens_file="own.txt")))
    (r,) = _verify_rows(res, "bf16")
    assert r["verdict"] == "rounding" and r["exact_max_abs_diff"] < 1e-11, r
    assert r["draft_rejected"] == 0, r
    assert r["acceptance_lost"] > 0, r
    assert r["acceptance_lost"] == r["acceptance_flips"] == r["acceptance_flips_near_tie"], r


def test_the_bound_holds_for_every_width(planted):
    res = exp.run(exp.ContractsConfig(model="offsetorder:x", dtypes="bf16", steps=40, batches=(2,), chunks=(7,)))
    rows = _verify_rows(res, "bf16")
    assert rows and sum(r["greedy_flips"] for r in rows) > 0
    for r in rows:
        assert r["verdict"] == "rounding", r
        assert r["acceptance_flips_near_tie"] <= r["acceptance_flips"] <= r["greedy_flips"], r
        assert abs(r["acceptance_lost"]) <= r["draft"] * r["acceptance_flips"], r


# --- the CLI: a token stream file, and hostile drafts -------------------------------------------------


def test_a_token_stream_file(tmp_path):
    stream = _decoded_stream("embedded", "fp32", 12)
    f = tmp_path / "draft.json"
    f.write_text(json.dumps(stream))
    r = cli("compare", "contracts", "--steps", "12", "--batches", "2", "--chunks", "7", "--dtypes", "fp32",
            "--draft", f"tokens:{f}", "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["draft_from"] == "--draft tokens:" and doc["params"]["draft_spec"] == str(f)
    rows = [x for x in doc["rows"] if x["contract"] == "spec_verify"]
    assert len(rows) == 4 and all(x["draft_rejected"] == 0 for x in rows)  # the target's own decoded choices


@pytest.mark.parametrize("content, words", [
    ("", ["--draft tokens:", "holds no token ids"]),
    (json.dumps([1] * 11 + [99999]), ["--draft tokens:", "99999", "vocabulary"]),
    ("[1, 2, 3]", ["--draft tokens:", "holds 3 ids", "--steps 12"]),
    ("[1, -2]", ["--draft tokens:", "negative"]),
])
def test_a_bad_stream_is_one_line(tmp_path, content, words):
    f = tmp_path / "draft.txt"
    f.write_text(content)
    one_line(cli("compare", "contracts", "--steps", "12", "--draft", f"tokens:{f}"), 2, *words)


@pytest.mark.parametrize("spec, words", [
    ("hf:/nonexistent/draft", ["/nonexistent/draft"]),
    ("nosuch:x", ["--draft", "no engine 'nosuch'"]),
    ("llamacpp:/nonexistent.gguf", ["/nonexistent.gguf"]),
])
def test_a_draft_that_cannot_be_opened_is_one_line(spec, words):
    one_line(cli("compare", "contracts", "--steps", "12", "--draft", spec), 2, *words)


def test_a_draft_with_another_tokenizer_is_one_line(tmp_path):
    pytest.importorskip("transformers")
    d = save_tiny_qwen(tmp_path / "words")
    one_line(cli("compare", "contracts", "--steps", "12", "--dtypes", "fp32", "--draft", f"hf:{d}"), 2,
             "--draft", "tokenizer differs")


def test_a_window_that_fits(tmp_path):
    one_line(cli("compare", "contracts", "--steps", "1", "--draft", f"tokens:{tmp_path}/none.txt"), 2)
    one_line(cli("compare", "contracts", "--steps", "1", "--draft", "embedded"), 2, "--steps 1", "k + 1")


def test_a_target_that_cannot_fork_is_refused(planted):
    with pytest.raises(UsageError) as e:
        exp.run(exp.ContractsConfig(model="bare:x", dtypes="fp32", draft=spec_draft.DraftOptions("embedded"),
                                    **SMALL))
    assert "\n" not in str(e.value) and "--draft" in str(e.value) and "copying a KV cache" in str(e.value)


def test_named_widths_on_a_target_that_cannot_fork_are_refused(planted):
    """Widths asked for by name on an engine without fork() are refused in one line (issue 43); the default
    widths on it are reported 'not supported' while the other contracts run (issue 40)."""
    with pytest.raises(UsageError) as e:
        exp.run(exp.ContractsConfig(model="bare:x", dtypes="fp32", draft_widths=(1, 2), **SMALL))
    assert "\n" not in str(e.value) and "--draft-widths" in str(e.value) and "copying a KV cache" in str(e.value)
    rows = exp.run(exp.ContractsConfig(model="bare:x", dtypes="fp32", **SMALL)).rows
    verify = [r for r in rows if r["contract"] == "spec_verify"]
    assert verify and all(r["verdict"] == "not supported" for r in verify)
    assert any(r["verdict"] != "not supported" for r in rows)


def test_a_draft_shorter_than_the_sequence_is_refused(tiny_draft):
    with pytest.raises(UsageError, match="takes 128 positions; the prompt and --steps need 137") as e:
        exp.run(exp.ContractsConfig(dtypes="fp32", steps=130, batches=(2,), chunks=(7,),
                                    draft=spec_draft.DraftOptions(f"hf:{tiny_draft}")))
    assert "\n" not in str(e.value)


def test_a_named_width_that_does_not_fit_is_refused_not_dropped():
    """--draft-widths 64 under --steps 12 ran every other contract and left spec_verify out without a word:
    a width the user named is run or refused (the default widths run where they fit, as documented)."""
    one_line(cli("compare", "contracts", "--steps", "12", "--draft-widths", "64"), 2, "--draft-widths 64",
             "--steps 65")
