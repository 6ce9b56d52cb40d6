"""router's options and reports the other router tests leave alone (issue 42's review): --ties highest,
--no-normalize, the routed-weight mass moved (weight_l1_*) on a dump, kernels planted with a dropped bias or a
wrong group mask, and the memory refusal for synthetic and dump inputs. Every expected value is recomputed
here, in float64 with math.fsum and ml_dtypes rounding, never read back from the tool."""

import json
import math
import os
import re
import resource
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from helpers import ROOT, cli, loaded_timeout, strict_json

KERNELS = "tests.impls.router_kernels"


def _doc(*args, code=0):
    r = cli("router", *args, "--json")
    assert r.code == code, (r.code, r.err)
    return strict_json(r.out)


def _impl(kernel, *args, code=0):
    """router --impl's rows by case name; 64 experts, top-8 (the command's default)."""
    doc = _doc("--impl", f"{KERNELS}:{kernel}", "--experts", "64", *args, code=code)
    return {r["case"]: r for r in doc["rows"]}


def _first_difference(row):
    """(token, expected ids, expected weights, got ids, got weights) from a failed case's first_difference."""
    m = re.fullmatch(r"token (\d+): expected experts (\[.*?\]) weights (\[.*?\]), got (\[.*?\]) (\[.*?\])",
                     row["first_difference"])
    assert m, row["first_difference"]
    return (int(m[1]), *(np.array(json.loads(g), float) for g in m.groups()[1:]))


def _save(tmp_path, logits):
    path = tmp_path / "logits.npy"
    np.save(path, logits)
    return str(path)


def _bf16(x):
    """One rounding to bf16 (ml_dtypes: round to nearest even), back in float64."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _topk(x, k, tie="lowest"):
    """(T, k) ids of the k largest per row, an exact tie by `tie`: a lexsort on (value, index), so the tie rule
    is the secondary key itself rather than a reversed stable sort (the router's own trick)."""
    idx = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    return np.stack([np.lexsort((i if tie == "lowest" else -i, -row))[:k] for row, i in zip(x, idx, strict=True)])


def _flip_share(ref_ids, ids):
    return float(np.mean([set(a) != set(b) for a, b in zip(ref_ids, ids, strict=True)]))


# ---------------------------------------------------------------------------
# --ties highest


def _near_tied_dump(rng, tokens):
    """(tokens, 16) fp32 logits, top-4: the 4th and 5th best are 1 + 2^-12 and 1 - 2^-12, apart in fp32 and both
    1.0 in bf16 (its spacing is 2^-7 above 1 and 2^-8 below), in random places; every other logit a multiple of
    0.25, exact in bf16 and far from the pair. In bf16 the 4th place is an exact tie that the tie rule alone
    decides, and it agrees with fp64 only when the rule points at the larger fp32 logit."""
    values = np.array([3.0, 2.5, 2.0, 1 + 2**-12, 1 - 2**-12] + [-0.25 * j for j in range(11)], np.float32)
    return np.stack([rng.permutation(values) for _ in range(tokens)])


@pytest.mark.parametrize("tie", ["lowest", "highest"])
def test_ties_decide_a_bf16_tie_as_an_independent_recomputation_does(tmp_path, tie):
    dump = _near_tied_dump(np.random.default_rng(11), 400)
    doc = _doc("--inputs", _save(tmp_path, dump), "--logit-dtypes", "bf16", "--top-k", "4", "--ties", tie)
    assert doc["params"]["ties"] == tie
    row = [r for r in doc["rows"] if r["layer"] == 0][0]
    ref = _topk(dump.astype(np.float64), 4)  # no ties in fp64: the rule does not matter there
    want = {t: _flip_share(ref, _topk(_bf16(dump), 4, t)) for t in ("lowest", "highest")}
    assert row["flip_share"] == want[tie]
    # each token flips under exactly one rule: the one that points at the smaller of the pair
    assert want["lowest"] + want["highest"] == 1.0
    assert 0.35 < want[tie] < 0.65  # the pair's order is a fair coin per token: 6 standard errors of 400
    # the flips vanish in fp64, at the pair's margin: 2^-11 against bf16's 2^-7 spacing at 1 + 2^-12
    assert row["verdict"] == "vanishes in fp64: rounding"
    assert row["median_flip_margin_ulps"] == 2**-11 / 2**-7


def test_ties_highest_sets_the_reference_a_kernel_is_held_to():
    # the exact_ties case (logits from {0, 1, 2, 3}) is the only one where the tie rule decides: a kernel breaking
    # ties toward the lowest index passes it under --ties lowest and fails it under --ties highest, and a kernel
    # breaking them toward the highest index the other way round; neither fails any other case
    for kernel, good in (("correct", "lowest"), ("ties_to_highest", "highest")):
        for tie in ("lowest", "highest"):
            rows = _impl(kernel, "--ties", tie, code=0 if tie == good else 1)
            assert all(r["passed"] for name, r in rows.items() if name != "exact_ties"), (kernel, tie)
            ties = rows["exact_ties"]
            assert ties["passed"] == (tie == good), (kernel, tie)
            if tie != good:
                assert ties["verdict"] == "persists in fp64: algorithmic"
                _, want, want_w, got, got_w = _first_difference(ties)
                # the same tied scores, other indices: which side of the tie each rule took shows in the ids
                assert sorted(want_w) == sorted(got_w) and set(want) != set(got)
                only_want, only_got = set(want) - set(got), set(got) - set(want)
                assert (min(only_want) > max(only_got)) if tie == "highest" else (max(only_want) < min(only_got))


# ---------------------------------------------------------------------------
# --no-normalize and the mass moved


def _routed_weights(x, k, normalize, rnd):
    """(T, E) dense top-k weights of softmax routing, every step rounded by `rnd` (identity: float64; else
    to fp32, where +, - and / in float64 rounded once give fp32's own results, and exp and the sums are
    correctly rounded once, as routing.py's path documents). Sums by math.fsum."""
    x = rnd(x)
    e = rnd(np.exp(rnd(x - x.max(axis=1, keepdims=True))))
    sc = rnd(e / rnd(np.array([[math.fsum(r)] for r in e])))
    ids = _topk(sc, k)
    w = np.take_along_axis(sc, ids, axis=1)
    if normalize:
        w = rnd(w / rnd(np.array([[math.fsum(r)] for r in w])))
    out = np.zeros_like(sc)
    np.put_along_axis(out, ids, w, axis=1)
    return out


def _fp32(a):
    return np.asarray(a, np.float64).astype(np.float32).astype(np.float64)


def _mass_moved(layer, k, normalize):
    """The weight_l1 fields, recomputed: per token fsum |w_fp64 - w_bf16| over the experts, then the mean,
    the 0.99 quantile (linear between the order statistics either side, as numpy's default) and the max."""
    ref = _routed_weights(layer.astype(np.float64), k, normalize, lambda a: a)
    low = _routed_weights(_bf16(layer), k, normalize, _fp32)
    l1 = sorted(math.fsum(np.abs(a - b)) for a, b in zip(ref, low, strict=True))
    pos = 0.99 * (len(l1) - 1)
    lo = int(pos)
    p99 = l1[lo] + (pos - lo) * (l1[lo + 1] - l1[lo])
    return {"weight_l1_mean": math.fsum(l1) / len(l1), "weight_l1_p99": p99, "weight_l1_max": l1[-1]}


@pytest.mark.parametrize("normalize", [True, False])
def test_mass_moved_on_a_dump_equals_an_independent_recomputation(tmp_path, normalize):
    dump = np.random.default_rng(3).standard_normal((2, 1000, 32)).astype(np.float32)
    flag = "--normalize" if normalize else "--no-normalize"
    doc = _doc("--inputs", _save(tmp_path, dump), "--logit-dtypes", "bf16", "--top-k", "4", flag)
    assert doc["params"]["normalize"] is normalize
    for layer in range(2):
        row = [r for r in doc["rows"] if r["layer"] == layer][0]
        want = _mass_moved(dump[layer], 4, normalize)
        other = _mass_moved(dump[layer], 4, not normalize)
        for key, v in want.items():
            # equal to the last bits here; the freedom left is a float64 sum (or exp) rounded to fp32 landing an
            # fp32 ulp (at most 2^-24 for a weight below 1) from fsum's on another CPU: two such, no more
            assert row[key] == pytest.approx(v, rel=0, abs=2**-23), (layer, key)
            assert abs(row[key] - other[key]) > 1e-4, (layer, key)  # the option changes what is measured


def test_no_normalize_holds_a_kernel_to_the_raw_scores():
    # a kernel that divides by the sum whatever the model says fails every case under --no-normalize, with the
    # right experts (no flips) and the wrong weights: the expected ones are the raw softmax scores, summing to
    # less than 1 (8 of 64 experts), its own sum to 1; under --normalize it passes, and the correct kernel both
    rows = _impl("always_normalized", "--no-normalize", code=1)
    assert all(not r["passed"] and r["flips"] == 0 and r["verdict"] == "persists in fp64: algorithmic"
               for r in rows.values())
    _, want, want_w, got, got_w = _first_difference(rows["random"])
    assert set(want) == set(got)
    assert math.fsum(want_w) < 0.9 and math.fsum(got_w) == pytest.approx(1, abs=1e-5)  # 6 printed digits each
    assert all(r["passed"] for r in _impl("always_normalized", "--normalize").values())
    assert all(r["passed"] for r in _impl("correct", "--no-normalize").values())


# ---------------------------------------------------------------------------
# planted kernels: a dropped bias, a wrong group mask


BIASED = ("--scoring", "sigmoid", "--bias", "0:0.5")


def test_a_dropped_bias_is_flagged_on_the_dominating_bias_case():
    rows = _impl("drops_bias", *BIASED, code=1)
    case = rows["dominating_bias"]
    assert not case["passed"] and case["verdict"] == "persists in fp64: algorithmic"
    # the case puts +100 on expert 3: the reference always chooses it, a kernel without the bias only where its
    # sigmoid score alone makes the top-8
    _, want, _, got, _ = _first_difference(case)
    assert 3 in want and 3 not in got
    # with no bias to drop the same kernel is right: the failure is the bias's
    assert all(r["passed"] for r in _impl("drops_bias", "--scoring", "sigmoid").values())


def _groups_of(ids, experts=64, groups=8):
    return {int(i) // (experts // groups) for i in ids}


@pytest.mark.parametrize("kernel", ["groups_by_max", "masks_kept_groups"])
def test_a_wrong_group_mask_is_flagged_persisting_in_fp64(kernel):
    rows = _impl(kernel, *BIASED, "--groups", "8:4", code=1)
    for name in ("random", "equal_group_maxima"):
        case = rows[name]
        assert not case["passed"] and case["verdict"] == "persists in fp64: algorithmic", name
        _, want, _, got, _ = _first_difference(case)
        # a wrong mask keeps other groups: had both kept the same ones, the top-8 among them would be the same
        assert _groups_of(want) != _groups_of(got), name
        assert len(_groups_of(want)) <= 4 and len(_groups_of(got)) <= 4
        if kernel == "masks_kept_groups":  # it chooses from the 4 groups the reference masks
            assert not _groups_of(want) & _groups_of(got), name
    # without groups the same kernel is right: the failure is the group step's
    assert all(r["passed"] for r in _impl(kernel, *BIASED).values())


def test_the_correct_kernel_passes_where_the_planted_ones_fail():
    for extra in ((), ("--groups", "8:4")):
        rows = _impl("correct", *BIASED, *extra)
        assert all(r["passed"] for r in rows.values()), [(n, r["first_difference"]) for n, r in rows.items()]


# ---------------------------------------------------------------------------
# memory: refused before anything is built


LIMIT = 2 << 30  # the child's address space: a run refused under it, rather than failing to allocate


def _run_limited(*args):
    """router in a child whose address space is capped at LIMIT: were the estimate missing, the first large
    allocation would fail there at once (exit 1, MemoryError) rather than swap the machine."""
    env = {k: v for k, v in os.environ.items() if k != "PRECISIONLAB_DEBUG"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "precisionlab", "router", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=loaded_timeout(120),
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT)))


def _refused(r, *words) -> float:
    """Exit 2, nothing on stdout, one line on stderr holding `words`: the bytes it says the run needs."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and not r.stdout, (r.returncode, r.stderr[-800:])
    assert lines[0].startswith("precisionlab: ") and "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    m = re.search(r"needs about (\d+(?:\.\d+)?) (GiB|MiB) of memory", lines[0])
    assert m, lines[0]
    return float(m[1]) * (2**30 if m[2] == "GiB" else 2**20)


@pytest.mark.parametrize("kind", ["gate", "logits"])
def test_a_synthetic_run_that_cannot_fit_is_refused_before_it_builds(kind):
    tokens, experts, hidden = 10**8, 256, 512
    r = _run_limited("--inputs", kind, "--tokens", str(tokens), "--experts", str(experts), "--hidden", str(hidden),
                     "--layers", "2")
    need = _refused(r, f"router {tokens} tokens x {experts} experts x 2 layers")
    # at least what one layer must hold: its float64 logits, and with a gate GEMM its float64 hidden states
    assert need + 0.05 * 2**30 >= 8 * tokens * (experts + (hidden if kind == "gate" else 0))  # shown to 0.1 GiB


def test_a_dump_that_cannot_fit_is_refused_from_its_header(tmp_path):
    # a header declaring 2^31 float64 logits, the file sparse to their size (a header declaring more than the file
    # holds is refused as such): only the header may be read before the refusal
    path = tmp_path / "huge.npy"
    shape = (2, 1 << 20, 1 << 10)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": shape})
        f.truncate(f.tell() + 8 * math.prod(shape))
    need = _refused(_run_limited("--inputs", str(path)), "--inputs", str(path))
    assert need + 0.05 * 2**30 >= 8 * math.prod(shape)  # at least the logits themselves, in float64
