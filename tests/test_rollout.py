"""compare model --trainer SPEC --rollout SPEC: sampled on the rollout side,
scored by both, through compare logprobs' statistics; the fp32 LM head and
fp32 rollout changes; seeded sampling; the top-p renormalisation; refusals."""

import math

import numpy as np
import pytest
from helpers import cli, save_tiny_qwen, strict_json

from precisionlab.engines import registry
from precisionlab.errors import UsageError
from precisionlab.experiments import rollout as exp

SMALL = {"samples": 2, "tokens": 12}


def _rows(res) -> dict:
    return {r["comparison"]: r for r in res.rows}


def _kinds(res, comparison: str) -> list[str]:
    return [d["kind"] for d in next(x for x in res.details if x["comparison"] == comparison)["diagnoses"]]


@pytest.fixture(scope="module")
def embedded_top_p():
    """The embedded model, fp32 trainer against bf16 rollout, top-p 0.9."""
    return exp.run(exp.RolloutConfig("embedded", "embedded", samples=4, tokens=32, top_p=0.9))


def test_same_engine_and_dtype_on_both_sides_agree_exactly():
    for dt in ("fp32", "bf16"):
        res = exp.run(exp.RolloutConfig("embedded", "embedded", trainer_dtype=dt, rollout_dtype=dt, **SMALL))
        r = _rows(res)["teacher_forced"]
        assert r["n"] == 24 and r["max_abs_diff"] == 0 and r["mean_diff"] == 0
        assert r["min_ratio"] == 1 and r["max_ratio"] == 1 and r["kl_k3"] == 0
        assert _kinds(res, "teacher_forced") == ["identical"]
    assert res.skipped == []  # bf16 on both sides: every change runs
    # fp32 on both sides: every change would repeat the baseline, so none runs
    fp32 = exp.run(exp.RolloutConfig("embedded", "embedded", rollout_dtype="fp32", **SMALL))
    assert {s["comparison"] for s in fp32.skipped} == set(exp.CHANGES) and fp32.best_change is None


def test_the_whole_rollout_in_fp32_is_the_trainer_and_the_head_change_is_measured(embedded_top_p):
    rows = _rows(embedded_top_p)
    assert rows["rollout_fp32"]["max_abs_diff"] == 0 and rows["rollout_fp32"]["mean_abs_diff_removed"] == 1.0
    base, head = rows["teacher_forced"], rows["rollout_head_fp32"]
    assert base["mean_abs_diff"] > 0
    assert head["mean_abs_diff_removed"] == pytest.approx(1 - head["mean_abs_diff"] / base["mean_abs_diff"], rel=1e-12)
    assert embedded_top_p.best_change == "rollout_fp32"


def test_top_p_renormalisation_is_diagnosed_on_the_renormalised_stream_only(embedded_top_p):
    assert "renormalised" in _kinds(embedded_top_p, "sampler_top_p")
    assert "renormalised" not in _kinds(embedded_top_p, "sampler")
    ren = next(d for d in next(x for x in embedded_top_p.details if x["comparison"] == "sampler_top_p")["diagnoses"]
               if d["kind"] == "renormalised")
    # B (the rollout) renormalised: Δ = log S <= 0, S the kept mass, at least top-p's 0.9 at every position
    assert ren["side"] == "b" and ren["evidence"] == "top_logprobs" and ren["offset_mean"] < 0
    assert math.log(0.9) - 1e-3 <= ren["offset_mean"] and 0.9 - 1e-3 <= ren["kept_mass"] <= 1
    assert "sampler_top_p" not in _rows(exp.run(exp.RolloutConfig("embedded", "embedded", **SMALL)))


def test_top_p_support_is_the_smallest_set_reaching_p():
    lp = np.log(np.array([0.15, 0.5, 0.05, 0.3]))
    for p, want in ((0.4, [1]), (0.7, [1, 3]), (0.85, [1, 3, 0]), (1.0, [1, 3, 0, 2])):
        keep, log_s = exp.top_p_support(lp, p)
        assert keep.tolist() == want
        assert log_s == pytest.approx(math.log(math.fsum(np.exp(lp[want]))), abs=1e-15)


def test_seeded_sampling_is_reproducible():
    runs = [exp.run(exp.RolloutConfig("embedded", "embedded", seed=s, top_p=0.95, temperature=0.8, **SMALL))
            for s in (7, 7, 8)]
    assert runs[0].texts == runs[1].texts and runs[0].rows == runs[1].rows
    assert runs[0].texts != runs[2].texts
    assert len(runs[0].texts) == 2 and all(len(t) == 12 for t in runs[0].texts)  # one character a token


def test_bad_options_and_specs_are_refused_before_anything_loads(monkeypatch):
    def no_load(*a, **kw):
        raise AssertionError("an engine was opened")

    monkeypatch.setattr(registry, "open_engine", no_load)
    bad = [dict(trainer="/nonexistent/model"), dict(rollout="embedded:x"), dict(trainer=""),
           dict(rollout_dtype="fp8"), dict(trainer_dtype="nope"), dict(samples=0), dict(tokens=-1),
           dict(temperature=0.0), dict(temperature=math.inf), dict(top_p=0.0), dict(top_p=1.5), dict(prompt=""),
           dict(samples=10**12)]  # memory: refused from the engine's shape
    for kw in bad:
        cfg = exp.RolloutConfig(**({"trainer": "embedded", "rollout": "embedded"} | kw))
        with pytest.raises(UsageError) as e:
            exp.run(cfg)
        assert "\n" not in str(e.value), kw
    with pytest.raises(UsageError, match="^--trainer "):
        exp.run(exp.RolloutConfig("/nonexistent/model", "embedded"))


def _invoke(*args: str):
    """An in-process run of the CLI (no interpreter to start): its exit code, output and exception."""
    from typer.testing import CliRunner

    from precisionlab.cli.app import app

    return CliRunner().invoke(app, ["compare", "rollout", *args])


@pytest.mark.parametrize("args", [
    ["--trainer", "embedded"],                                    # one side only
    ["--rollout", "embedded"],
    ["--trainer", "embedded", "--rollout", "/nonexistent/model"],
    ["--trainer", "embedded", "--rollout", "embedded", "--rollout-dtype", "fp8"],
    ["--trainer", "embedded", "--rollout", "embedded", "--top-p", "0"],
    ["--trainer", "embedded", "--rollout", "embedded", "--tokens", "5000"],  # past the model's positions
    ["--samples", "4"],                                             # its option without the two sides
    ["--top-p", "0.9"],
])
def test_cli_usage_errors(args):
    res = _invoke(*args)
    assert isinstance(res.exception, UsageError) and "\n" not in str(res.exception), (res.exception, res.output)


@pytest.mark.parametrize("option", [["--metrics"], ["--steps", "5"], ["--model", "embedded:x"]])
def test_another_verbs_option_is_no_option_here(option):
    res = _invoke("--trainer", "embedded", "--rollout", "embedded", *option)
    assert res.exit_code == 2 and f"No such option: {option[0]}" in res.output, res.output


def test_a_usage_error_is_one_line_and_exit_2_as_a_user_meets_it():
    r = cli("compare", "rollout", "--trainer", "embedded", "--rollout", "/nonexistent/model")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err
    assert r.err.startswith("precisionlab: --rollout "), r.err


def test_cli_json():
    res = _invoke("--trainer", "embedded", "--rollout", "embedded", "--samples", "2", "--tokens", "8", "--top-p",
                  "0.9", "--json")
    assert res.exit_code == 0, res.exception
    d = strict_json(res.output)
    assert d["command"] == "compare rollout"
    assert [x["comparison"] for x in d["rows"]] == ["sampler", "sampler_top_p", "teacher_forced",
                                                    "rollout_head_fp32", "rollout_fp32"]
    assert [x["comparison"] for x in d["details"]] == [x["comparison"] for x in d["rows"]]
    assert d["models"]["rollout"]["dtype"] == "bf16" and d["params"]["top_p"] == 0.9 and len(d["texts"]) == 2
    assert d["skipped"] == [{"comparison": "trainer_head_fp32", "reason": "the trainer already computes in fp32"}]
    assert d["best_change"] == "rollout_fp32"


# ---------------------------------------------------------------------------
# a tiny Hugging Face Qwen3 whose logits share a large offset, as real models' do


def _shared_offset(model):
    """Every vocabulary row of the LM head weighs hidden unit 0 by 40: each
    position's logits share an offset of about 40 (where bf16's spacing is
    0.25), which cancels in the log-softmax; the bf16 rounding of each logit
    does not."""
    import torch

    with torch.no_grad():
        model.lm_head.weight[:, 0] = 40.0


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    pytest.importorskip("transformers")
    return str(save_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen3-offset"), edit=_shared_offset))


@pytest.fixture(scope="module")
def hf_run(tiny_qwen):
    return exp.run(exp.RolloutConfig(tiny_qwen, tiny_qwen, samples=4, tokens=32, prompt="the cat sat"))


def test_hf_bf16_rollout_mismatch_falls_with_the_rollout_lm_head_in_fp32(hf_run):
    rows = _rows(hf_run)
    outside = {k: r["outside_clip"][0] for k, r in rows.items()}
    assert outside["teacher_forced"]["clip"] == 1.1
    assert outside["teacher_forced"]["frac_outside"] > 0
    assert outside["rollout_head_fp32"]["frac_outside"] < outside["teacher_forced"]["frac_outside"]
    # the logits' rounding is most of it: the head in fp32 removes more than half of mean |Δ|
    assert rows["rollout_head_fp32"]["mean_abs_diff_removed"] > 0.5
    assert rows["rollout_fp32"]["max_abs_diff"] == 0  # the same engine in fp32 is the trainer


def test_hf_forward_head_dtype(tiny_qwen):
    import torch

    eng = registry.open_engine(tiny_qwen, "cpu")
    x = torch.tensor([eng.encode("the cat sat on a mat")])
    head = eng.base.get_output_embeddings()
    assert torch.equal(eng.forward(eng.base, x, head_dtype="fp32"), eng.forward(eng.base, x))  # the same op
    low = eng.model("bf16")
    out = eng.forward(low, x, head_dtype="fp32")
    assert out.dtype == torch.float32 and eng.forward(low, x).dtype == torch.bfloat16
    # an independent head: the model's bf16 final hidden states, cast up, times the fp32 weights, in float64
    h = low.model(input_ids=x, use_cache=False).last_hidden_state.double()
    ref = h @ low.lm_head.weight.double().T
    assert torch.allclose(out.double(), ref, rtol=1.3e-6, atol=1e-5)
    assert "forward" not in vars(low.get_output_embeddings()) and "forward" not in vars(head)


def test_embedded_forward_head_dtype():
    import torch

    eng = registry.open_engine("embedded", "cpu")
    x = torch.tensor([eng.encode("ROMEO:\nWhat")])
    low = eng.model("bf16")
    out = eng.forward(low, x, head_dtype="fp32")
    assert out.dtype == torch.float32 and torch.equal(eng.forward(eng.base, x, head_dtype="fp32"),
                                                      eng.forward(eng.base, x))
    assert not torch.equal(out, eng.forward(low, x).float())  # bf16 logits are rounded, fp32 ones not
