"""vLLM's echo streams (issue 41): a /v1/completions answer with echo=true
has a null log-prob at each sequence's first token (nothing precedes it). A
planted stub in vLLM's answer form, no vLLM needed: the null position is left
out of both streams and every sequence keeps its per-sequence statistics; a
null anywhere else is still a NaN, counted and never averaged."""

import json
import math

import numpy as np
import pytest
from helpers import cli, strict_json

from precisionlab.experiments import logprobs as exp
from precisionlab.io import logprob_streams as ls

# Three echoed sequences of 4, 5 and 3 tokens; A and B differ by known amounts after the first token.
A = [[-1.0, -2.0, -0.5], [-0.25, -3.0, -1.5, -0.75], [-2.5, -0.125]]
D = [[0.01, -0.02, 0.0], [0.0, 0.03, 0.0, -0.01], [0.02, 0.0]]  # A - B


def echo_answer(seqs, first_null=True):
    """vLLM's answer form: one choice per sequence, tokens as token_id:N (return_tokens_as_token_ids)."""
    choices = []
    for i, lps in enumerate(seqs):
        toks = [f"token_id:{10 * i + j}" for j in range(len(lps) + 1)]
        choices.append({"index": i, "text": "", "logprobs": {
            "tokens": toks, "token_logprobs": ([None] if first_null else [-9.0]) + list(lps),
            "top_logprobs": [None] + [{t: v} for t, v in zip(toks[1:], lps, strict=True)]}})
    return {"object": "text_completion", "model": "tiny", "choices": choices}


@pytest.fixture
def files(tmp_path):
    b = [[x - d for x, d in zip(xs, ds, strict=True)] for xs, ds in zip(A, D, strict=True)]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(echo_answer(A)))
    pb.write_text(json.dumps(echo_answer(b)))
    return pa, pb


def test_a_null_first_token_is_unscored_not_nan(files):
    st = ls.read(str(files[0]), "A")
    assert st.n == 12 and st.sequences == 3
    assert st.unscored.tolist() == [True, False, False, False, True, False, False, False, False, True, False, False]


def test_every_sequence_keeps_its_statistics(files):
    res = exp.run(exp.LogprobsConfig(a=str(files[0]), b=str(files[1])))
    row = res.rows[0]
    assert row["seq_n"] == 3 and row["seq_excluded"] == 0
    assert res.params["unscored_first_tokens"] == 3
    assert "null log-prob" in res.takeaways[0]
    # exact references: each sequence's log ratio is the sum of its differences, the mean |Δ| over all 9 tokens
    want = sorted(math.fsum(d) for d in D)
    got = sorted(s["log_ratio"] for s in res.worst_sequences)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-15)
    worst = max(res.worst_positions, key=lambda p: abs(p["diff"]))
    assert (worst["sequence"], worst["position"]) == (1, 2)  # D[1][1], the file's position 2 (null at 0)
    assert math.isclose(abs(worst["diff"]), 0.03, rel_tol=1e-12)


def test_a_null_past_the_first_token_is_still_a_nan(tmp_path):
    doc = echo_answer(A)
    doc["choices"][1]["logprobs"]["token_logprobs"][2] = None
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(doc))
    pb.write_text(json.dumps(echo_answer(A)))
    row = exp.run(exp.LogprobsConfig(a=str(pa), b=str(pb))).rows[0]
    assert row["seq_excluded"] == 1 and row["seq_n"] == 2


def test_without_nulls_nothing_is_dropped(tmp_path):
    pa = tmp_path / "a.json"
    pa.write_text(json.dumps(echo_answer(A, first_null=False)))
    st = ls.read(str(pa), "A")
    assert st.unscored is None
    a, b, shift = ls.drop_unscored(st, st)
    assert a is st and shift.tolist() == [0, 0, 0]


def test_the_cli_reports_full_sequence_statistics(files):
    r = cli("compare", "logprobs", str(files[0]), str(files[1]), "--json")
    assert r.code == 0, r.err
    doc = strict_json(r.out)
    assert doc["params"]["unscored_first_tokens"] == 3 and doc["rows"][0]["seq_n"] == 3
