"""compare scores: McNemar's exact p against an independent computation, the
interval, the readers (lm-evaluation-harness samples JSONL as it writes them,
CSV) and their refusals."""

import csv
import json
import math
from fractions import Fraction

import pytest

from helpers import cli, strict_json
from precisionlab.numerics import paired


def _mcnemar_by_likelihood(b: int, c: int) -> Fraction:
    """Two-sided exact p as the sum of every outcome no likelier than the one
    observed (the 'minimum likelihood' definition), Binomial(b + c, 1/2) by
    Pascal's triangle: a different route from the doubled tail."""
    n = b + c
    row = [1]
    for _ in range(n):
        row = [x + y for x, y in zip([0, *row], [*row, 0], strict=True)]
    seen = row[b]
    return Fraction(sum(x for x in row if x <= seen), 2 ** n)


@pytest.mark.parametrize("b, c", [(0, 0), (0, 1), (1, 9), (0, 5), (3, 3), (7, 2), (12, 30),
                                  (480, 560), (1500, 1400), (2000, 2150)])
def test_mcnemar_exact_p_matches_an_independent_computation(b, c):
    want = min(Fraction(1), _mcnemar_by_likelihood(b, c))
    assert paired.mcnemar_exact_p(b, c) == float(want)


def test_mcnemar_known_values():
    assert paired.mcnemar_exact_p(1, 9) == 22 / 1024   # 2 (1 + 10) / 2^10
    assert paired.mcnemar_exact_p(0, 5) == 2 / 32


def test_newcombe_interval_brackets_the_difference_and_narrows_with_n():
    lo, hi = paired.newcombe_paired(40, 10, 4, 46, 0.95)
    assert lo < (4 - 10) / 100 < hi and -1 <= lo and hi <= 1
    lo2, hi2 = paired.newcombe_paired(400, 100, 40, 460, 0.95)
    assert hi2 - lo2 < hi - lo


def test_newcombe_interval_covers_the_truth_about_95_percent():
    """Paired correctness simulated with a known accuracy difference; the band
    (93-97 % of 1000) was fixed before running."""
    import numpy as np

    rng = np.random.default_rng(44)
    probs = np.array([0.60, 0.08, 0.04, 0.28])  # both right, A only, B only, both wrong
    truth = probs[2] - probs[1]
    counts = rng.multinomial(400, probs, size=1000)
    hit = sum(lo <= truth <= hi for lo, hi in (paired.newcombe_paired(*map(int, t), 0.95) for t in counts))
    assert 930 <= hit <= 970, hit


def test_questions_needed_follow_connors_formula():
    # psi = 0.1, D = 0.05: (1.95996 sqrt(.1) + 0.84162 sqrt(.1 - .0025))^2 / .0025
    z, zb = 1.959963984540054, 0.8416212335729143
    want = (z * math.sqrt(0.1) + zb * math.sqrt(0.0975)) ** 2 / 0.0025
    assert paired.questions_needed(0.05, 0.1, 0.95) == pytest.approx(want, rel=1e-9)
    n = paired.questions_needed(0.05, 0.1, 0.95)
    assert paired.detectable_drop(math.ceil(n), 0.1, 0.95) <= 0.05 + 1e-6


# ---------------------------------------------------------------------------
# the command


def _lm_eval(path, right, filters=("strict-match",), metric="exact_match"):
    with open(path, "w") as f:
        for i, r in enumerate(right):
            for flt in filters:
                f.write(json.dumps({"doc_id": i, "doc": {"question": f"q{i}"}, "target": "42",
                                    "arguments": {"gen_args_0": {"arg_0": "q", "arg_1": {}}},
                                    "resps": [["the answer is 42"]], "filtered_resps": ["42"], "filter": flt,
                                    "metrics": [metric], "doc_hash": "0", "prompt_hash": "0", "target_hash": "0",
                                    metric: float(r)}) + "\n")
    return str(path)


def _csv(path, right, ids=None):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question_id", "correct"])
        for i, r in zip(ids or range(len(right)), right, strict=True):
            w.writerow([i, int(r)])
    return str(path)


def _pattern(both, a_only, b_only, neither):
    return ([1] * both + [1] * a_only + [0] * b_only + [0] * neither,
            [1] * both + [0] * a_only + [1] * b_only + [0] * neither)


def test_a_real_drop_is_b_worse_and_gates(tmp_path):
    a, b = _pattern(600, 60, 20, 320)
    r = cli("compare", "scores", _lm_eval(tmp_path / "a.jsonl", a), _lm_eval(tmp_path / "b.jsonl", b),
            "--json", "--fail-on-worse", "--drop", "2")
    doc = strict_json(r.out)
    row = doc["rows"][0]
    assert r.code == 1 and doc["verdict"] == "B worse"
    assert (row["a_only"], row["b_only"], row["questions"]) == (60, 20, 1000)
    assert row["diff_pct"] == pytest.approx(-4.0) and row["ci_hi"] < 0
    assert row["p_value"] == float(_mcnemar_by_likelihood(60, 20))
    assert row["questions_needed"] == math.ceil(paired.questions_needed(0.02, 0.08, 0.95))


def test_a_small_difference_is_within_noise_with_the_hidden_drop_stated(tmp_path):
    a, b = _pattern(300, 9, 6, 185)
    r = cli("compare", "scores", _csv(tmp_path / "a.csv", a), _csv(tmp_path / "b.csv", b), "--json")
    doc = strict_json(r.out)
    assert r.code == 0 and doc["verdict"] == "within noise" and doc["rows"][0]["mde"] > 0.6
    assert any("could still hide" in t for t in doc["takeaways"])


def test_lm_eval_with_several_filters_needs_filter(tmp_path):
    a, b = _pattern(50, 3, 1, 46)
    fa = _lm_eval(tmp_path / "a.jsonl", a, ("strict-match", "flexible-extract"))
    fb = _lm_eval(tmp_path / "b.jsonl", b, ("strict-match", "flexible-extract"))
    r = cli("compare", "scores", fa, fb)
    assert r.code == 2 and "--filter" in r.err and "flexible-extract, strict-match" in r.err
    r = cli("compare", "scores", fa, fb, "--filter", "flexible-extract", "--json")
    assert r.code == 0 and strict_json(r.out)["params"]["filter"] == "flexible-extract"


@pytest.mark.parametrize("case, needle", [
    ("different", "only in A"), ("empty", "empty file"), ("graded", "is not a 0/1 correctness"),
    ("nodocid", "no 'doc_id'"), ("dup", "appears twice"), ("nan", "not JSON"),
])
def test_hostile_score_files_are_one_line_exit_2(tmp_path, case, needle):
    a = _csv(tmp_path / "a.csv", [1, 0, 1, 1])
    b = {"different": lambda p: _csv(p, [1, 0, 1, 1], ids=[0, 1, 2, 7]),
         "empty": lambda p: (p.write_text(""), str(p))[1],
         "graded": lambda p: (p.write_text("id,correct\n0,1\n1,0.5\n2,1\n3,1\n"), str(p))[1],
         "nodocid": lambda p: (p.write_text('{"acc": 1}\n'), str(p))[1],
         "dup": lambda p: (p.write_text("id,correct\n0,1\n0,1\n"), str(p))[1],
         "nan": lambda p: (p.write_text('{"doc_id": 0, "acc": NaN}\n'), str(p))[1]}[case](tmp_path / "b.txt")
    r = cli("compare", "scores", a, b)
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_csv_with_a_byte_order_mark_and_an_lm_eval_file_pair_by_id(tmp_path):
    a, b = _pattern(20, 4, 0, 6)
    (tmp_path / "a.csv").write_text("\ufeffquestion_id,correct\n" + "".join(f"{i},{x}\n" for i, x in enumerate(a)),
                                    encoding="utf-8")
    r = cli("compare", "scores", str(tmp_path / "a.csv"), _lm_eval(tmp_path / "b.jsonl", b), "--metric", "correct")
    assert r.code == 2 and "no field 'correct'" in r.err  # B's metric is exact_match: named, not guessed
    r = cli("compare", "scores", str(tmp_path / "a.csv"), _lm_eval(tmp_path / "b.jsonl", b, metric="correct"), "--json")
    row = strict_json(r.out)["rows"][0]
    assert r.code == 0 and (row["questions"], row["a_only"], row["b_only"]) == (30, 4, 0)
    assert row["p_value"] == 0.125  # 2 x (1/2)^4


def test_scores_json_follows_the_glossary(tmp_path):
    from helpers import json_glossary_problems

    a, b = _pattern(50, 5, 2, 43)
    doc = strict_json(cli("compare", "scores", _csv(tmp_path / "a.csv", a), _csv(tmp_path / "b.csv", b),
                          "--json", "--drop", "3").out)
    assert list(doc)[:2] == ["schema_version", "command"] and doc["command"] == "compare scores"
    assert json_glossary_problems(doc) == []
