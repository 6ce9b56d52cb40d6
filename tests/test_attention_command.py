"""precisionlab attention (experiments/attention.py): what each row reports,
against facts known before running: the bf16 path is the bf16 defaults
themselves (difference exactly 0); FP8 P saturates only where the knobs let
it pass 448 (2^(max_offset + threshold) > 448); unscaled e4m3 P flushes and
rows lose mass; the jump is reported at the tile boundary where inputs planted
to saturate begin; every knob is in every --json row."""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np

from precisionlab.experiments import attention as exp
from precisionlab.numerics import flash_attention as fa


def run_exp(seq=512, rows=8, dim=32, stds=(1.0,), **knobs):
    return exp.run(exp.AttentionConfig(seq=seq, rows=rows, dim=dim, stds=stds, flash=fa.FlashConfig(**knobs)))


def test_bf16_defaults_are_the_bf16_path():
    (r,) = run_exp(block_c=64).rows
    assert r["rel_l2_vs_bf16"] == 0.0 and r["max_abs_diff_vs_bf16"] == 0.0
    assert r["bf16_rel_l2"] == r["rel_l2"]
    assert 1e-4 < r["rel_l2"] < 1e-2  # bf16 P (8 bits) in a weighted average over 512 keys
    assert r["min_mass_kept"] > 0.99 and r["p_saturated"] == 0
    assert r["p_entries"] == 8 * 512 and r["tile_ends"] == [64 * (i + 1) for i in range(8)]


def test_fp8_p_saturates_only_when_the_knobs_let_it_pass_448():
    wide = run_exp(stds=(2.0,), p_dtype="fp8_e4m3", max_offset=8.0, rescale_threshold=4.0)
    assert wide.rows[0]["p_saturated"] > 0  # P up to 2^12 under the lazy threshold
    assert any("saturated at fp8_e4m3's max" in t for t in wide.takeaways)
    safe = run_exp(stds=(0.5, 2.0, 8.0), p_dtype="fp8_e4m3", max_offset=4.0, rescale_threshold=4.0)
    assert [r["p_saturated"] for r in safe.rows] == [0, 0, 0]  # at most 2^8 = 256 < 448, at any spread


def test_unscaled_e4m3_p_flushes_and_rows_lose_mass():
    res = run_exp(stds=(4.0,), p_dtype="fp8_e4m3")  # logits std 4: most P below e4m3's 2^-9
    r = res.rows[0]
    assert r["p_flushed"] > 0 and r["min_mass_kept"] < 0.99 and 0 < r["mean_mass_kept"] <= 1
    assert any("probability mass" in t for t in res.takeaways)


def test_jump_is_reported_where_the_planted_keys_begin(monkeypatch):
    """One query row; keys 0-1023 give logits of std 0.25, keys 1024-2047
    about 3 log2 units above the first half's max: within the lazy threshold
    4, so no rescale, and P = 2^(8 + 3) saturates e4m3 in every tile from key
    1024 on. The running error, e4m3's rounding until then, jumps there."""
    s, d, half = 2048, 64, 1024
    rng = np.random.default_rng(7)
    q = 0.25 * rng.standard_normal((1, d))
    k = rng.standard_normal((s, d))
    v = rng.standard_normal((s, d))
    u = q[0] / np.linalg.norm(q[0])
    first_max = float(np.max(k[:half] @ q[0])) / np.sqrt(d)  # natural-log units
    target = first_max + 3.0 / np.log2(np.e)  # 3 log2 units above
    k[half:] = 0.05 * k[half:] + (target * np.sqrt(d) / np.linalg.norm(q[0])) * u
    monkeypatch.setattr(exp, "draw", lambda cfg, i, std: (q, k, v))
    res = run_exp(seq=s, rows=1, dim=d, p_dtype="fp8_e4m3", max_offset=8.0, rescale_threshold=4.0, block_c=128)
    r = res.rows[0]
    assert r["p_saturated"] >= half * 0.9  # (nearly) every planted key
    assert r["jump_position"] == half, (r["jump_position"], r["running_rel_l2"])
    assert any(f"key {half}" in t for t in res.takeaways)


def test_json_rows_carry_every_knob(run):
    from helpers import json_glossary_problems, strict_json

    r = run("attention", "--seq", "300", "--rows", "5", "--dim", "16", "--std", "1,2", "--block-r", "4",
            "--block-c", "32", "--max-offset", "4", "--rescale-threshold", "2", "--p-dtype", "e5m2", "--p-scale", "2",
            "--input-dtype", "fp8_e4m3", "--splits", "3", "--combine-order", "reverse", "--pv-accumulator",
            "promote:3:bits=12", "--qk-accumulator", "fp32-pairwise", "--promote-tiles", "2", "--causal",
            "--out-dtype", "bf16", "--json")
    assert r.code == 0, r.err
    d = strict_json(r.out)
    assert json_glossary_problems(d) == []
    want = {"block_r": 4, "block_c": 32, "max_offset": 4.0, "rescale_threshold": 2.0, "p_dtype": "fp8_e5m2",
            "p_scale": 2.0, "input_dtype": "fp8_e4m3", "splits": 3, "combine_order": "reverse",
            "pv_accumulator": "promote:3:bits=12", "qk_accumulator": "fp32-pairwise", "promote_tiles": 2,
            "causal": True, "out_dtype": "bf16"}
    knobs = {f.name for f in fields(fa.FlashConfig)}
    assert len(d["rows"]) == 2
    for row in d["rows"]:
        assert knobs <= set(row), knobs - set(row)
        assert {key: row[key] for key in want} == want
        assert (row["seq"], row["rows"], row["dim"]) == (300, 5, 16)
    assert set(asdict(fa.FlashConfig())) == knobs
