"""compare tensors on dumps laid out as real engines lay them out: a missing
batch dimension (squeezed, and said), heads-first attention, transposed
logits, the residual in two parts, two tensor-parallel shards. Each compares
correctly after the right option, and without it is refused with a line that
names the option; bad specs are usage errors before any file is read."""

import pytest
import torch
from safetensors.torch import save_file

from helpers import cli, strict_json
from precisionlab.errors import UsageError
from precisionlab.experiments import tensors as exp
from precisionlab.numerics import compare as comparison

T, H, DH, V = 6, 4, 8, 12  # tokens, heads, head dim, vocab
D = H * DH


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """REF_FP32 and REF_LOW (bf16) in the reference layout [1, T, ...]; YOURS:
    REF_LOW's very values, stored as an engine does. So after the right option
    (3) YOURS vs REF_LOW is exactly 0, and a wrong one cannot pass by chance."""
    tmp = tmp_path_factory.mktemp("layouts")
    g = torch.Generator().manual_seed(0)
    ref = {"embed": torch.randn(1, T, D, generator=g), "attn": torch.randn(1, T, D, generator=g),
           "block": torch.randn(1, T, D, generator=g), "mlp": torch.randn(1, T, D, generator=g),
           "lm_head": torch.randn(1, T, V, generator=g)}
    low = {k: v.to(torch.bfloat16) for k, v in ref.items()}
    half = low["block"].float() * 0.25  # the residual in two parts: 1/4 and 3/4 of it, both exact in bf16's range
    ours = {
        "embed": low["embed"][0].clone(),                                          # no batch dimension
        "attn": low["attn"][0].reshape(T, H, DH).permute(1, 0, 2).contiguous(),   # heads first [H, T, DH]
        "lm_head": low["lm_head"][0].T.contiguous(),                               # [V, T]
        "block.hidden": half.to(torch.bfloat16), "block.residual": (low["block"].float() - half),  # fp32 part
        "mlp.shard0": low["mlp"][..., :D // 2].contiguous(), "mlp.shard1": low["mlp"][..., D // 2:].contiguous(),
    }
    paths = [tmp / "fp32.safetensors", tmp / "bf16.safetensors", tmp / "engine.safetensors"]
    for p, tensors in zip(paths, (ref, low, ours), strict=True):
        save_file(tensors, str(p))
    return [str(p) for p in paths], ref, low, ours


def _rows(files, **kw):
    res = exp.compare(exp.CompareTensorsConfig(files=files, **kw))
    return {r["name"]: r for r in res.rows}, res


def test_without_options_each_layout_is_refused_with_the_option_that_fits(dumps):
    files, *_ = dumps
    rows, res = _rows(files)
    # the missing batch dimension needs no option: squeezed on the side that has it, and said
    assert rows["embed"]["status"] == "ok" and rows["embed"]["rel_l2"] == 0
    assert rows["embed"]["layout"] == [f"REF_FP32, REF_LOW: squeezed [1,{T},{D}] -> [{T},{D}]"]
    assert rows["attn"]["status"] == "shape mismatch" and rows["attn"]["flagged"]
    assert rows["attn"]["layout_hint"] == f"--layout 'attn=1,0,2' --reshape 'attn=1,{T},{D}'"
    assert rows["lm_head"]["status"] == "shape mismatch" and rows["lm_head"]["layout_hint"] == "--transpose 'lm_head'"
    assert rows["block"]["status"] == "only in REF_FP32, REF_LOW"
    assert rows["mlp.shard0"]["status"] == "only in YOURS" and rows["mlp.shard0"]["layout_hint"] == "--unshard 'mlp:2'"
    assert res.any_failed
    text = " ".join(res.takeaways)
    assert "--layout 'attn=1,0,2'" in text and "--unshard 'mlp:2'" in text


def test_with_the_right_options_every_tensor_is_yours_exactly(dumps):
    files, ref, low, ours = dumps
    rows, res = _rows(files, layouts=["attn=1,0,2"], reshapes=[f"attn=1,{T},{D}"], transposes=["lm_head"],
                      maps=["block=block.hidden+block.residual"], unshards=["mlp:-1"])
    assert set(rows) == set(ref) and not res.any_failed
    for name in ("embed", "attn", "lm_head", "mlp"):
        assert rows[name]["status"] == "ok" and rows[name]["rel_l2"] == 0, rows[name]
        # the yardstick is REF_LOW vs REF_FP32 at that tensor, untouched by YOURS' layout
        assert rows[name]["yardstick"] == comparison.rel_l2(low[name].double().numpy(), ref[name].double().numpy())
    assert rows["attn"]["layout"] == [f"YOURS: permuted 1,0,2: [{H},{T},{DH}] -> [{T},{H},{DH}]",
                                      f"YOURS: reshaped [{T},{H},{DH}] -> [1,{T},{D}]"]
    assert rows["lm_head"]["layout"] == [f"YOURS: transposed [{V},{T}] -> [{T},{V}]",
                                         f"REF_FP32, REF_LOW: squeezed [1,{T},{V}] -> [{T},{V}]"]
    assert rows["mlp"]["layout"] == [f"YOURS: 2 shards mlp.shard0, mlp.shard1 concatenated along dim -1 -> [1,{T},{D}]"]
    assert rows["mlp"]["stored_names"][2] == "mlp.shard0, mlp.shard1"
    # the sum, in float64: against an independent float64 sum of the stored parts
    parts = ours["block.hidden"].double() + ours["block.residual"].double()
    assert rows["block"]["rel_l2"] == comparison.rel_l2(parts.numpy(), low["block"].double().numpy())
    assert rows["block"]["stored_names"][2] == "block.hidden + block.residual"
    assert rows["block"]["formats"][2] == "fp32"  # the wider part's format gives the tolerances


def test_a_wrong_layout_does_not_pass(dumps):
    """A reshape alone makes heads-first values the right shape in the wrong places: flagged, not hidden."""
    files, *_ = dumps
    rows, _ = _rows(files, reshapes=[f"attn=1,{T},{D}"], only=["attn"])
    assert rows["attn"]["flagged"] and rows["attn"]["ratio"] > 4


def test_sum_rule_binds_stars_in_every_term(tmp_path):
    g = torch.Generator().manual_seed(1)
    ref = {f"layers.{i}": torch.randn(3, 5, generator=g) for i in range(3)}
    ours = {}
    for k, v in ref.items():
        ours[f"{k}.h"], ours[f"{k}.r"] = v * 0.5, v * 0.5  # halves: exact, so the float64 sum is the tensor
    save_file(ref, str(tmp_path / "a.safetensors"))
    save_file(ours, str(tmp_path / "b.safetensors"))
    rows, res = _rows([str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")],
                      maps=["layers.*=layers.*.h+layers.*.r"])
    assert set(rows) == set(ref) and all(r["max_abs_error"] == 0 for r in rows.values()) and not res.any_failed


@pytest.mark.parametrize("opt, spec, words", [
    ("--layout", "attn=0,0,2", "not a permutation"), ("--layout", "attn", "GLOB=PERM"),
    ("--layout", "attn=a,b", "not a comma list"), ("--reshape", "attn=-1,-1", "at most one -1"),
    ("--reshape", "attn", "GLOB=SHAPE"), ("--unshard", "mlp", "GLOB:DIM"), ("--unshard", "mlp:x", "not an integer"),
    ("--map", "block=block.hidden+", "NAME=PART+PART"), ("--map", "b.*=b.*.h+b.r", "as many"),
    ("--transpose", "a=b", "a GLOB"), ("--map", "z=layer.1.y+layer.1.y", "named twice"),
    ("--map", "*=*+*", "named twice"),
])
def test_bad_specs_are_one_line_before_any_file_is_read(opt, spec, words):
    r = cli("compare", "tensors", "/nonexistent/a.safetensors", "/nonexistent/b.safetensors", opt, spec)
    assert r.code == 2 and words in r.err and "no such file" not in r.err and len(r.err.strip().splitlines()) == 1, \
        r.err


@pytest.mark.parametrize("kw, words", [
    (dict(layouts=["attn=1,0"]), [f"'attn' is [{H},{T},{DH}]", "[1,0]"]),
    (dict(reshapes=["attn=5,5"]), [f"'attn' is [{H},{T},{DH}]", "[5,5] holds 25"]),
    (dict(reshapes=["attn=-1,7"]), [f"'attn' is [{H},{T},{DH}]", "[-1,7] cannot hold"]),
    (dict(transposes=["nothing*"]), ["--transpose nothing*: matches no tensor of YOURS"]),
    (dict(unshards=["mlp:3"]), ["out of range", f"[1,{T},{D // 2}]"]),
    (dict(unshards=["attn:0"]), ["named like attn.shard0"]),
    (dict(maps=["x=y.a+y.b"]), ["named like 'y.a'"]),
])
def test_specs_that_do_not_fit_a_tensor_name_it_and_both_shapes(dumps, kw, words):
    files, *_ = dumps
    with pytest.raises(UsageError) as e:
        exp.compare(exp.CompareTensorsConfig(files=files, **kw))
    assert all(w in str(e.value) for w in words), str(e.value)


def test_cli_json_says_the_layout_and_exits_by_the_verdict(dumps):
    files, *_ = dumps
    base = ["compare", "tensors", *files, "--json"]
    fixed = ["--layout", "attn=1,0,2", "--reshape", f"attn=1,{T},{D}", "--transpose", "lm_*", "--map",
             "block=block.hidden+block.residual", "--unshard", "mlp:2"]
    r = cli(*base, *fixed)
    d = strict_json(r.out)
    assert r.code == 0, r.err
    assert d["params"]["layout"] == ["attn=1,0,2"] and d["params"]["unshard"] == ["mlp:2"]
    assert d["params"]["sums"] == ["block=block.hidden+block.residual"]
    assert all("layout" in row and "layout_hint" in row for row in d["rows"])
    r = cli(*base)
    assert r.code == 1
    t = cli("compare", "tensors", *files, *fixed)
    assert t.code == 0 and "transposed" in t.out and "squeezed" in t.out


# --- scripts/dump_hooks.py: any torch model's dump, read by compare tensors -----------------


def _hook_script():
    import importlib.util

    from helpers import ROOT

    spec = importlib.util.spec_from_file_location("dump_hooks", ROOT / "scripts" / "dump_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Tiny(torch.nn.Module):
    """An embedding, two residual MLP blocks, a head: the smallest model with an execution order worth keeping."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 32)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                                              torch.nn.Linear(64, 32)) for _ in range(2))
        self.head = torch.nn.Linear(32, 16)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def test_the_hook_script_dumps_any_model_for_compare_tensors(tmp_path):
    from precisionlab.io.tensorfiles import ORDER_KEY, open_tensor_file

    hooks = _hook_script()
    assert hooks.ORDER_KEY == ORDER_KEY  # the script stands alone: its key must be the one compare tensors reads
    torch.manual_seed(0)
    model = _Tiny()
    ids = torch.tensor([[1, 5, 7, 2, 9, 3]])
    include = ["embed", "blocks.*", "lm_head"]
    paths = {}
    for label, dtype, scale in (("fp32", torch.float32, None), ("bf16", torch.bfloat16, None),
                                ("clean", torch.bfloat16, None), ("bug", torch.bfloat16, 1.1)):
        m = _Tiny().to(dtype)
        m.load_state_dict(model.state_dict())
        if scale is not None:  # an engine's bug in the second block's MLP
            m.blocks[1][2].register_forward_hook(lambda _m, _a, y, scale=scale: y * scale)
        with torch.no_grad(), hooks.DumpHooks(m, include) as dump:
            m(ids)
        paths[label] = str(tmp_path / f"{label}.safetensors")
        dump.save(paths[label])
    f = open_tensor_file(paths["bf16"])
    # names are the modules', in the order they ran (a block after its layers), the model itself as lm_head
    assert f.order_recorded and f.names[0] == "embed" and f.names[-1] == "lm_head"
    assert f.names.index("blocks.0.2") < f.names.index("blocks.0") < f.names.index("blocks.1.0")
    assert f.shapes["blocks.1"] == (1, 6, 32) and f.dtypes["blocks.1"] == "bfloat16"
    clean = cli("compare", "tensors", paths["fp32"], paths["bf16"], paths["clean"], "--json")
    assert clean.code == 0 and not any(r["flagged"] for r in strict_json(clean.out)["rows"])
    bug = cli("compare", "tensors", paths["fp32"], paths["bf16"], paths["bug"], "--json")
    d = strict_json(bug.out)
    assert bug.code == 1 and d["first_divergence"] == "blocks.1.2", d["first_divergence"]


def test_sum_globs_bind_as_a_lazy_regex_would_in_linear_time():
    """A sum's stars are matched by leftmost placement, not by '(.+?)' per
    star: the same groups as that regex on every small case, and a glob of
    13 stars against a 62-character name (a regex backtracks through ~62^12
    splits there) answers at once."""
    import random
    import re

    from precisionlab.io.tensor_layout import _wild_groups

    def lazy(pattern, name):
        m = re.compile("(.+?)".join(re.escape(p) for p in pattern.split("*"))).fullmatch(name)
        return None if m is None else list(m.groups())

    rng = random.Random(0)
    for _ in range(20000):
        pattern = "".join(rng.choice("ab*.") for _ in range(rng.randint(0, 7)))
        name = "".join(rng.choice("ab.") for _ in range(rng.randint(0, 9)))
        assert _wild_groups(pattern, name) == lazy(pattern, name), (pattern, name)
    assert _wild_groups("*a" * 12 + "*b", "x" + "a" * 60 + "c") is None
    assert _wild_groups("*a" * 12 + "*b", "x" + "a" * 60 + "b") == ["x"] + ["a"] * 11 + ["a" * 37]


def test_map_patterns_are_refused_one_line_when_they_backtrack_or_name_a_missing_group(dumps, monkeypatch):
    """A --map the names cannot run through: a replacement naming a group the
    pattern lacks, and a pattern that backtracks without end on a name
    ('(a|aa)+b' on a run of a's), each one usage line, exit 2."""
    files, *_ = dumps
    r = cli("compare", "tensors", *files[:2], "--map", "x=\\g<foo>")
    assert r.code == 2 and "unknown group" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    monkeypatch.setattr(exp, "MAP_SECONDS", 0.2)  # the budget, not the answer: this pattern never ends
    with pytest.raises(UsageError, match="backtracks without end"):
        exp.rename(["attn", "a" * 40 + "c"], exp.parse_maps(["(a|aa)+b=x"]), "yours.safetensors")
