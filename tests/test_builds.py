"""compare builds: the block-bootstrap interval's coverage, the verdicts on
synthetic builds, the JSON and the refusals.

The coverage band (93-97 % of 1,000 replicates for a 95 % interval), the
replicate size (2,000 positions, a short text), the AR(1) coefficient (0.5)
and the seed were fixed before the test was first run."""

import numpy as np
import pytest

from helpers import cli, strict_json, write_logits_file
from precisionlab.numerics import paired

REPLICATES, N, PHI, RESAMPLES, TRUTH = 1000, 2000, 0.5, 500, 0.3
BAND = (0.93, 0.97)


def _ar1(rng, reps, n, phi):
    e = rng.standard_normal((reps, n))
    x = np.empty_like(e)
    x[:, 0] = e[:, 0] / np.sqrt(1 - phi * phi)  # stationary from the first position
    for i in range(1, n):
        x[:, i] = phi * x[:, i - 1] + e[:, i]
    return x


@pytest.mark.parametrize("phi", [0.0, PHI], ids=["independent", "ar1"])
def test_95_interval_covers_a_known_difference_93_to_97_percent(phi):
    x = TRUTH + _ar1(np.random.default_rng(44), REPLICATES, N, phi)
    covered = 0
    for r in range(REPLICATES):
        iv = paired.mean_interval(x[r], 0.95, RESAMPLES, np.random.default_rng([44, r]))
        covered += iv.lo <= TRUTH <= iv.hi
    assert BAND[0] <= covered / REPLICATES <= BAND[1], covered


def test_block_length_follows_the_dependence():
    rng = np.random.default_rng(5)
    assert paired.block_length(rng.standard_normal(4000)) <= 2
    assert paired.block_length(_ar1(rng, 1, 4000, 0.8)[0]) >= 10


def test_same_seed_same_interval_other_seed_other_draws():
    x = _ar1(np.random.default_rng(1), 1, 500, 0.5)[0]
    a = paired.mean_interval(x, 0.95, 300, np.random.default_rng(3))
    b = paired.mean_interval(x, 0.95, 300, np.random.default_rng(3))
    c = paired.mean_interval(x, 0.95, 300, np.random.default_rng(4))
    assert (a.lo, a.hi) == (b.lo, b.hi) and (a.lo, a.hi) != (c.lo, c.hi)


# ---------------------------------------------------------------------------
# the command on synthetic builds: REF, two runs of one build, a worse build

NP, V = 1500, 48


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    d = tmp_path_factory.mktemp("builds")
    rng = np.random.default_rng(12)
    h = np.empty((NP, V))
    h[0] = rng.standard_normal(V)
    for i in range(1, NP):  # a slowly moving context: neighbouring positions correlate
        h[i] = 0.7 * h[i - 1] + 0.7 * rng.standard_normal(V)
    ref = 2.0 * h
    tok = rng.integers(0, V, NP)
    noise = lambda s, seed: ref + s * np.random.default_rng(seed).standard_normal(ref.shape)  # noqa: E731
    f = {"ref": write_logits_file(d / "ref.safetensors", ref, tok),
         "a": write_logits_file(d / "a.safetensors", noise(0.05, 1), tok),
         "a2": write_logits_file(d / "a2.safetensors", noise(0.05, 2), tok),      # the same build run again
         "b": write_logits_file(d / "b.safetensors", noise(0.065, 3), tok)}       # planted: 30 % more logit noise
    nan = noise(0.05, 4)
    nan[700, 3] = np.nan
    f["nan"] = write_logits_file(d / "nan.safetensors", nan, tok)
    other = tok.copy()
    other[321] = (other[321] + 1) % V
    f["tokens"] = write_logits_file(d / "tokens.safetensors", noise(0.05, 5), other)
    # one more logit
    f["vocab"] = write_logits_file(d / "vocab.safetensors", np.pad(noise(0.05, 6), ((0, 0), (0, 1))), tok)
    (d / "empty.safetensors").write_bytes(b"")
    f["empty"] = str(d / "empty.safetensors")
    f["norows"] = write_logits_file(d / "norows.safetensors", np.zeros((0, V)), np.zeros(0))
    return f


def _run(*args):
    r = cli("compare", "builds", *args, "--json", "--resamples", "500")
    return r, strict_json(r.out) if r.out.strip() else None


def test_two_runs_of_one_build_are_within_noise_with_the_resolvable_effect_stated(builds):
    r, doc = _run(builds["ref"], builds["a"], builds["a2"], "--fail-on-worse")
    assert r.code == 0, r.err
    assert doc["verdict"] == "within noise"
    kld = next(x for x in doc["rows"] if x["statistic"] == "kld")
    assert kld["ci_lo"] < 0 < kld["ci_hi"]
    assert 0 < kld["ci_half_width"] < kld["mde"]
    assert any("could still hide" in t and "kld" in t for t in doc["takeaways"])


def test_a_planted_difference_is_separated_and_gates(builds):
    r, doc = _run(builds["ref"], builds["a"], builds["b"], "--fail-on-worse")
    assert r.code == 1 and "FAIL B is worse than A on kld" in r.err
    kld = next(x for x in doc["rows"] if x["statistic"] == "kld")
    assert doc["verdict"] == "B worse" and kld["ci_lo"] > 0
    # the other way round: A is the better build
    r, doc = _run(builds["ref"], builds["b"], builds["a"], "--fail-on-worse")
    assert r.code == 0 and doc["verdict"] == "B better"


def test_the_mean_difference_is_the_exact_mean_of_the_per_position_kld_difference(builds):
    from precisionlab.numerics import distribution
    from safetensors.numpy import load_file

    ref, a, b = (load_file(builds[k]) for k in ("ref", "a", "b"))
    kl = [distribution.position_stats(ref["logits"], x["logits"], ref["tokens"]).kl for x in (a, b)]
    import math

    want = math.fsum((kl[1] - kl[0]).tolist()) / NP
    _, doc = _run(builds["ref"], builds["a"], builds["b"])
    got = next(x for x in doc["rows"] if x["statistic"] == "kld")["diff"]
    assert got == pytest.approx(want, rel=1e-12)


def test_identical_builds_say_so(builds):
    r, doc = _run(builds["ref"], builds["a"], builds["a"])
    assert r.code == 0 and doc["verdict"] == "identical"


def test_same_seed_reproduces_the_json_rows(builds):
    one = _run(builds["ref"], builds["a"], builds["a2"], "--seed", "9")[1]["rows"]
    two = _run(builds["ref"], builds["a"], builds["a2"], "--seed", "9")[1]["rows"]
    assert one == two


@pytest.mark.parametrize("case, needle", [
    ("tokens", "token ids differ first at position 321"),
    ("vocab", "vocabulary sizes differ"),
    ("nan", "NaN or +inf logits (no distribution) at position 700"),
    ("empty", "not a readable safetensors file"),
    ("norows", "is empty"),
])
def test_hostile_inputs_are_one_line_exit_2(builds, case, needle):
    r = cli("compare", "builds", builds["ref"], builds["a"], builds[case])
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("args, needle", [
    (["--confidence", "1"], "--confidence"), (["--resamples", "5"], "--resamples"), (["--seed", "-1"], "--seed")])
def test_bad_options_exit_2(builds, args, needle):
    r = cli("compare", "builds", builds["ref"], builds["a"], builds["b"], *args)
    assert r.code == 2 and needle in r.err


def test_two_files_are_a_usage_error(builds):
    r = cli("compare", "builds", builds["ref"], builds["a"])
    assert r.code == 2 and "REF A B" in r.err


def test_json_follows_the_glossary(builds):
    from helpers import json_glossary_problems

    from precisionlab.report import jsondoc

    _, doc = _run(builds["ref"], builds["a"], builds["b"])
    assert list(doc)[:2] == ["schema_version", "command"] and doc["schema_version"] == jsondoc.SCHEMA_VERSION
    assert doc["command"] == "compare builds" and json_glossary_problems(doc) == []


@pytest.mark.parametrize("argv", [["compare", "builds", "--help"], ["compare", "scores", "--help"],
                                  ["compare", "moved", "--help"]])
def test_help_never_imports_torch(argv):
    from helpers import cli_in_process

    assert cli_in_process(*argv).stderr.endswith("TORCH=False")


def test_a_run_on_files_never_imports_torch(builds):
    from helpers import cli_in_process

    p = cli_in_process("compare", "builds", builds["ref"], builds["a"], builds["b"], "--resamples", "100")
    assert "B worse" in p.stdout and p.stderr.endswith("TORCH=False")


def test_an_infinite_kld_gives_no_interval_and_says_why(builds, tmp_path):
    from safetensors.numpy import load_file

    d = load_file(builds["b"])
    logits = d["logits"].copy()
    logits[5, :] = -np.inf  # B gives all its mass to token 0 at position 5: KL from REF is inf there
    logits[5, 0] = 0.0
    r, doc = _run(builds["ref"], builds["a"], write_logits_file(tmp_path / "inf.safetensors", logits, d["tokens"]))
    kld = next(x for x in doc["rows"] if x["statistic"] == "kld")
    assert r.code == 0 and kld["verdict"] == "undefined" and kld["ci_lo"] == "nan" and doc["verdict"] == "undefined"
    assert any(t.startswith("kld: not finite") for t in doc["takeaways"])
    table = cli("compare", "builds", builds["ref"], builds["a"], str(tmp_path / "inf.safetensors"),
                "--resamples", "100").out
    assert "[nan, nan]" in table  # shown, not swallowed as markup


def test_plot_is_written(builds, tmp_path):
    pytest.importorskip("matplotlib")
    r = cli("compare", "builds", builds["ref"], builds["a"], builds["b"], "--resamples", "100",
            "--plot", str(tmp_path / "d.png"))
    assert r.code == 0 and (tmp_path / "d.png").stat().st_size > 1000


def test_integer_valued_differences_resample_exactly():
    """Top-1 agreement's per-position difference is 0 or +-100: every resample
    mean is then an exact multiple of 100/n, and one whose flips cancel is 0,
    not a rounding of it (an edge at -2e-16 would decide a verdict)."""
    rng = np.random.default_rng(8)
    d = rng.choice([-100.0, 0.0, 0.0, 0.0, 100.0], size=777)
    means = paired.bootstrap_means(d, 3, 400, np.random.default_rng(1))
    totals = np.round(means * d.size)
    assert np.array_equal(totals % 100, np.zeros(400))
    assert np.array_equal(means, totals / d.size)  # the exact total, divided once


def test_a_resample_draws_at_most_max_blocks_blocks():
    x = np.random.default_rng(2).standard_normal(3 * paired.MAX_BLOCKS + 1)
    assert paired.mean_interval(x, 0.95, 100, np.random.default_rng(0)).block == 4  # ceil(n / MAX_BLOCKS)


@pytest.mark.parametrize("bad", ["DIR/x.txt", "DIR", "DIR/missing/x.png", "REF"])
def test_a_bad_plot_path_exits_2_and_writes_nothing(builds, tmp_path, bad):
    pytest.importorskip("matplotlib")
    path = builds["ref"] if bad == "REF" else (str(tmp_path) if bad == "DIR" else bad.replace("DIR", str(tmp_path)))
    before = set(tmp_path.iterdir())
    r = cli("compare", "builds", builds["ref"], builds["a"], builds["b"], "--plot", path)
    assert r.code == 2 and "--plot" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert set(tmp_path.iterdir()) == before


def test_q8_0_and_f16_in_llama_cpp_are_separated_with_non_overlapping_intervals():
    """docs/data/builds: the embedded model's gguf exports run in llama.cpp
    (scripts/builds_example.py), 512 positions against the fp32 export."""
    from helpers import ROOT

    d = ROOT / "docs/data/builds"
    _, doc = _run(str(d / "ref.safetensors"), str(d / "f16.safetensors"), str(d / "q8_0.safetensors"))
    kld = next(x for x in doc["rows"] if x["statistic"] == "kld")
    assert doc["verdict"] == "B worse" and kld["ci_lo"] > 0
    assert kld["a_ci_hi"] < kld["b_ci_lo"] and kld["sides_overlap"] is False
    # the same f16 file run again (1 thread instead of 2): llama.cpp's CPU path gives the same bits
    _, doc = _run(str(d / "ref.safetensors"), str(d / "f16.safetensors"), str(d / "f16-t1.safetensors"))
    assert doc["verdict"] == "identical"
