"""compare logprobs --fail-on (issue 40): every diagnosis it can make is
listed in --help and can be a gate; a diagnosis named is exit 1 with a FAIL
line, one not named (or not made) leaves exit 0; a bad list is exit 2."""

from helpers import ROOT, cli, temperature_streams, strict_json

from precisionlab.cli import compare_logprobs as cli_mod
from precisionlab.experiments import logprobs as exp

DATA = ROOT / "docs" / "data" / "logprobs"
TRAINER, TOP_P = str(DATA / "trainer.safetensors"), str(DATA / "rollout-top-p.jsonl")


def test_help_lists_every_diagnosis():
    r = cli("compare", "logprobs", "--help")
    text = " ".join(r.out.split())
    for kind in exp.DIAGNOSES:
        assert kind in cli_mod.DIAGNOSES_HELP and kind in text, kind
    assert "temperature" in text


def test_a_named_diagnosis_exits_1_and_others_do_not():
    r = cli("compare", "logprobs", TRAINER, TOP_P, "--fail-on", "renormalised", "--json")
    assert r.code == 1 and "FAIL diagnosis renormalised" in r.err
    assert strict_json(r.out)["failures"][0].startswith("diagnosis renormalised")
    r = cli("compare", "logprobs", TRAINER, TOP_P, "--fail-on", "temperature,shifted")
    assert r.code == 0 and "FAIL" not in r.err, r.err
    assert cli("compare", "logprobs", TRAINER, TOP_P).code == 0  # no gate: the verdict alone
    r = cli("compare", "logprobs", TRAINER, TOP_P, "--fail-on", "tempreature")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "--fail-on" in r.err


def test_a_temperature_mismatch_can_fail_the_run():
    A, B = temperature_streams(600, 10)
    res = exp.compare_streams(A, B, fail_on=exp.parse_fail_on("temperature"))
    assert res.failures and res.failures[0].startswith("diagnosis temperature")
    assert not exp.compare_streams(A, B, fail_on=exp.parse_fail_on("renormalised")).failures
    assert exp.parse_fail_on("any") == tuple(exp.DIAGNOSES)
