"""compare moved: the first module where B's error against REF exceeds A's.

A real model: the embedded char-level decoder run three times on one text,
REF in float64, A in float32 (an honest build: rounding only), B in float32
with the RoPE base planted at 10500 instead of 10000. Every module's output is
dumped in execution order (forward hooks); the command must name the first
attention module (its output projection, the first module RoPE reaches) and
nothing before it."""

import dataclasses

import numpy as np
import pytest

from helpers import cli, strict_json


def _dump(path, dtype, theta=None):
    import torch

    from precisionlab.engines import charlm
    from precisionlab.runtime import torch_flags

    model, tok = charlm.load_default(dtype)
    if theta is not None:
        model.rope_cos, model.rope_sin = charlm.rope_tables(dataclasses.replace(model.cfg, rope_theta=theta))
    out = {}

    def keep(name):
        def hook(mod, args, y):  # returns None: the output goes on unchanged
            out.setdefault(name, (y[0] if isinstance(y, tuple) else y).detach().double().numpy())
        return hook

    hooks = [m.register_forward_hook(keep(name)) for name, m in model.named_modules() if name]
    ids = torch.tensor([tok.encode("To be, or not to be, that is the question: whether 'tis nobler")])
    with torch_flags.ieee_fp32(), torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    np.savez(path, **out)  # members in the order the hooks fired: execution order
    return str(path), list(out)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    pytest.importorskip("torch")
    d = tmp_path_factory.mktemp("moved")
    ref, order = _dump(d / "ref.npz", __import__("torch").float64)
    a, _ = _dump(d / "a.npz", __import__("torch").float32)
    a2, _ = _dump(d / "a2.npz", __import__("torch").float32)
    b, _ = _dump(d / "b.npz", __import__("torch").float32, theta=10500.0)
    return ref, a, a2, b, order


def test_a_planted_rope_base_is_localised_to_the_first_attention_module(dumps):
    ref, a, _, b, order = dumps
    r = cli("compare", "moved", ref, a, b, "--json")
    assert r.code == 1 and "FAIL B moved at layers.0.attn.wo" in r.err, r.err
    doc = strict_json(r.out)
    fd = doc["first_divergence"]
    assert fd["name"] == "layers.0.attn.wo", fd
    rows = {x["name"]: x for x in doc["rows"]}
    assert rows[fd["name"]]["ratio"] > 1 and rows[fd["name"]]["diff_ba"] > 0
    before = order[:order.index("layers.0.attn.wo")]
    assert before and all(not rows[n]["flagged"] for n in before)
    assert all(rows[n]["diff_ba"] == 0 for n in before)  # RoPE has not acted yet: B is A bit for bit


def test_the_same_build_twice_moves_nowhere(dumps):
    ref, a, a2, _, _ = dumps
    r = cli("compare", "moved", ref, a, a2, "--json")
    doc = strict_json(r.out)
    assert r.code == 0 and doc["first_divergence"] is None
    assert all(x["diff_ba"] == 0 for x in doc["rows"])  # A and A2: the same float32 run, bit for bit


def test_dumps_sharing_no_tensor_are_refused(tmp_path):
    np.savez(tmp_path / "r.npz", x=np.ones(3))
    np.savez(tmp_path / "y.npz", y=np.ones(3))
    r = cli("compare", "moved", str(tmp_path / "r.npz"), str(tmp_path / "y.npz"), str(tmp_path / "y.npz"))
    assert r.code == 2 and "no tensor is in all of REF, A and B" in r.err


def test_a_planted_scale_is_named_with_its_rule_and_number(tmp_path):
    rng = np.random.default_rng(3)
    ref = {f"layers.{i}.{m}": rng.standard_normal((4, 64)) for i in range(3) for m in ("attn", "mlp")}
    a = {k: v + 1e-3 * rng.standard_normal(v.shape) for k, v in ref.items()}
    b = dict(a)
    b["layers.1.mlp"] = a["layers.1.mlp"] * 1.01  # 1 % scale: ratio about 10x A's error
    b["layers.2.attn"] = a["layers.2.attn"] * 1.01
    for name, d in (("r", ref), ("a", a), ("b", b)):
        np.savez(tmp_path / f"{name}.npz", **d)
    r = cli("compare", "moved", *(str(tmp_path / f"{x}.npz") for x in "rab"), "--json")
    fd = strict_json(r.out)["first_divergence"]
    assert r.code == 1 and fd["name"] == "layers.1.mlp" and fd["rule"] == "ratio" and fd["text"].startswith("beyond 4x")


def test_moved_json_follows_the_glossary(dumps):
    from helpers import json_glossary_problems

    ref, a, _, b, _ = dumps
    doc = strict_json(cli("compare", "moved", ref, a, b, "--json").out)
    assert doc["command"] == "compare moved" and json_glossary_problems(doc) == []
