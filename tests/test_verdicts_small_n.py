"""Statistics that hold at small n (issue 40, 6): three-way compare logits at
256 positions. A tail percentile that is one of a handful of positions is
shown, never judged (its minimum n is stated); each judged statistic carries
the interval its verdict rests on; a clean engine's statistics lie well inside
the 4x line; a 242x-scale mean KL whose per-position KL is heavy-tailed (the
paired z stays under 3) is flagged; a ratio carried by one token is not."""

import math

import numpy as np
import pytest

from helpers import cli, reference_logits, strict_json, write_logits_file
from precisionlab.numerics import small_n

N, V = 256, 41


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("small_n")
    rng, ref, tok = reference_logits(40, N, V)

    def noisy(scale_per_position):
        return ref + (np.asarray(scale_per_position)[:, None] * rng.standard_normal(ref.shape)).astype(np.float32)

    low = noisy(np.full(N, 0.02))                      # the rounding's cost
    clean = noisy(np.full(N, 0.02))                    # another correct engine
    # heavy-tailed: the noise's size log-normal over positions (KL ~ size^2: log-normal with sigma 3); mean ~ 230x
    heavy = noisy(0.02 * 2.2 * np.exp(1.5 * rng.standard_normal(N)))
    one = clean.copy()                                 # a correct engine, and one token far off
    one[17] += (3.0 * rng.standard_normal(V)).astype(np.float32)
    return {name: write_logits_file(d / f"{name}.safetensors", x, tok, window=64)
            for name, x in (("ref", ref), ("low", low), ("clean", clean), ("heavy", heavy), ("one", one))}


def _three(files, yours):
    r = cli("compare", "logits", files["ref"], files["low"], files[yours], "--json")
    return r, {y["statistic"]: y for y in strict_json(r.out)["yardstick"]}


def test_minimum_positions_per_percentile():
    assert [small_n.min_positions(q) for q in (0.5, 0.9, 0.99, 0.999)] == [20, 100, 1000, 10000]


def test_a_clean_engine_stays_well_inside_its_line_at_256_positions(files):
    r, ys = _three(files, "clean")
    assert r.code == 0, r.err
    assert not any(y["flagged"] for y in ys.values())
    for key in ("kld_p99", "kld_p99_9", "kld_max"):  # a handful of positions, or one: shown, not judged
        assert not ys[key]["judged"] and ys[key]["not_judged"]
    assert ys["kld_p99_9"]["min_positions"] == 10000 and "at least 10000" in ys["kld_p99_9"]["not_judged"]
    for key in ("kld_mean", "kld_median", "kld_p90"):  # judged, and the whole interval under half the line
        y = ys[key]
        assert y["judged"] and y["ratio_lo"] <= y["ratio"] <= y["ratio_hi"] < 2, (key, y)
    t = cli("compare", "logits", files["ref"], files["low"], files["clean"])
    assert "(n): shown, not judged at this n" in t.out and "kld_p99_9" in t.out


def test_a_heavy_tailed_242x_mean_kl_is_flagged(files):
    r, ys = _three(files, "heavy")
    y = ys["kld_mean"]
    assert y["ratio"] > 100, y                    # hundreds of times the yardstick's mean KL ...
    assert y["z"] < 3, y                          # ... which the paired z alone would let pass
    assert y["flagged"] and y["ratio_lo"] > 4     # its interval lies wholly past 1 (and past the 4x line)
    assert r.code == 1 and "departs from the yardstick" in r.err


def test_a_ratio_carried_by_one_token_is_no_verdict(files):
    r, ys = _three(files, "one")
    y = ys["kld_mean"]
    assert y["ratio"] > 4, y                      # the point ratio is past the line ...
    assert y["ratio_lo"] < 1 and not y["flagged"]  # ... but leaving that token out of a resample brings it back
    assert ys["kld_max"]["ratio"] > 4 and not ys["kld_max"]["judged"] and not ys["kld_max"]["flagged"]
    assert r.code == 0, r.err


def test_ratio_of_means_interval_is_paired_and_seeded():
    rng = np.random.default_rng(1)
    low = rng.exponential(1.0, 500)
    y = 3.0 * low  # exactly 3x at every position: every paired resample gives 3
    lo, hi, _ = small_n.ratio_of_means(y, low)
    assert lo == pytest.approx(3.0, rel=1e-12) and hi == pytest.approx(3.0, rel=1e-12)
    y2 = rng.exponential(3.0, 500)
    assert small_n.ratio_of_means(y2, low) == small_n.ratio_of_means(y2, low)
    assert math.isnan(small_n.ratio_of_means(np.array([1.0, math.inf]), np.array([1.0, 1.0]))[0])
