"""Every command's --json follows one glossary (docs/json.md): one name for a
time in seconds, one for the largest absolute error, `dtype` for a row's
format, and a schema_version first. Each command runs once at a small size."""

import pytest
from helpers import cli, json_glossary_problems, registered_commands, strict_json

from precisionlab.report import jsondoc

# (id, argv): every command and subcommand, small; the files compare tensors and
# compare logits read are written by the runs before them (the fixture below).
COMMANDS = [
    ("accumulate", ["accumulate", "--n", "100", "--device", "all"]),
    ("softmax", ["softmax", "--values", "1,2,3;0,0,0", "--dtypes", "fp32,bf16", "--device", "cpu"]),
    # torch_ops' rows are atomics' with a `refused` (tp's rows have one too, checked in test_tp)
    ("nondeterminism", ["nondeterminism", "--runs", "2", "--n", "10000", "--device", "cpu",
                        "--sections", "atomics,splitk,batch,threads"]),
    ("tf32", ["tf32", "--m", "64", "--n", "64", "--k", "64", "--sweep-mn", "32", "--device", "cpu"]),
    ("info", ["info"]),
    ("bench", ["bench", "--quick", "--device", "cpu", "--cpu-n", "10000"]),
    ("formats", ["formats", "--n", "4096", "--shape", "16x256x16", "--dists", "normal", "--device", "cpu"]),
    ("kvcache", ["kvcache", "--steps", "2", "--dtypes", "fp8_e4m3", "--scales", "unit"]),
    ("attention", ["attention", "--seq", "512", "--rows", "8", "--std", "1"]),
    ("attention-cases", ["attention-cases", "--max-keys", "8192"]),
    ("compare op", ["compare", "op", "matmul", "--shape", "8x64x8", "--device", "cpu", "--accumulator", "hopper-fp8"]),
    ("compare model", ["compare", "model", "--steps", "3"]),
    ("compare metrics", ["compare", "metrics", "--tokens", "128",
                                 "--save-logits", "{tmp}/fp32.safetensors", "--save-logits", "bf16={tmp}/bf16.safetensors"]),
    ("compare layers", ["compare", "layers", "--steps", "3", "--dtypes", "bf16", "--dump", "{tmp}/dump"]),
    ("compare engine-layers", ["compare", "engine-layers", "--engine", "embedded", "--reference", "embedded", "--steps", "3",
                                    "--dtypes", "bf16"]),
    ("compare contracts", ["compare", "contracts", "--steps", "3", "--dtypes", "fp32"]),
    ("compare rollout", ["compare", "rollout", "--trainer", "embedded", "--rollout", "embedded", "--samples", "2",
                                 "--tokens", "8", "--top-p", "0.9"]),
    ("compare engine", ["compare", "engine", "--engine", "embedded", "--tokens", "16", "--steps", "2"]),
    ("compare logits", ["compare", "logits", "{tmp}/fp32.safetensors", "{tmp}/bf16.safetensors"]),
    ("compare pair", ["compare", "pair", "{tmp}/fp32.safetensors", "{tmp}/fp32.safetensors", "--chunk", "7"]),
    ("compare logprobs", ["compare", "logprobs", "docs/data/logprobs/trainer.safetensors",
                          "docs/data/logprobs/rollout-top-p.jsonl"]),
    ("compare tensors", ["compare", "tensors", "{tmp}/dump/fp32.safetensors", "{tmp}/dump/bf16.safetensors",
                         "{tmp}/dump/bf16.safetensors"]),
    ("export", ["export", "embedded", "--to", "hf", "--out", "{tmp}/hf"]),  # hf: transformers, in the dev extra
    ("compare builds", ["compare", "builds", "docs/data/builds/ref.safetensors", "docs/data/builds/f16.safetensors",
                        "docs/data/builds/q8_0.safetensors", "--resamples", "100"]),
    ("compare scores", ["compare", "scores", "docs/data/builds/samples_a.jsonl", "docs/data/builds/samples_b.jsonl",
                        "--filter", "strict-match"]),
    ("compare moved", ["compare", "moved", "{tmp}/dump/fp32.safetensors", "{tmp}/dump/bf16.safetensors",
                       "{tmp}/dump/bf16.safetensors"]),
    ("router", ["router", "--tokens", "64", "--layers", "1", "--experts", "16", "--hidden", "16", "--top-k", "2"]),
    ("compare routing", ["compare", "routing", "docs/data/routing/trainer.npz", "docs/data/routing/rollout.npz",
                         "--a-experts", "docs/data/routing/trainer-experts.npy",
                         "--b-experts", "docs/data/routing/rollout-experts.npy", "--experts", "8"]),
]
# Needs a server of its own: tests/test_endpoint.py holds its JSON to this glossary against a stub server.
ELSEWHERE = {"nondeterminism endpoint"}


def test_every_registered_command_has_a_run_here():
    # a command cli/app.py registers (helpers.registered_commands) joins the glossary check or fails here
    ran = {" ".join(argv[:2]) if argv[0] == "compare" else argv[0] for _, argv in COMMANDS}
    missing = [c for c in registered_commands("--json") if c not in ran and c not in ELSEWHERE]
    assert not missing, f"give each its cheapest --json run in COMMANDS: {missing}"


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("glossary")
    out = {}
    for name, argv in COMMANDS:
        r = cli(*[a.format(tmp=tmp) for a in argv], "--json")
        assert r.code == 0, (name, r.err)
        out[name] = strict_json(r.out)
    return out


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_every_document_carries_the_schema_version_first(docs, name):
    d = docs[name]
    assert list(d)[:2] == ["schema_version", "command"] and d["schema_version"] == jsondoc.SCHEMA_VERSION
    assert isinstance(d["rows"], list) and d["rows"]


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_command_names_the_verb(docs, name):
    assert docs[name]["command"] == name  # the two-model layers document keeps its own name


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS])
def test_no_document_uses_a_synonym(docs, name):
    assert json_glossary_problems(docs[name]) == []


def test_the_glossary_names_are_the_ones_in_use(docs):
    """The chosen names really occur, so the test above is not vacuous."""
    rows = {name: d["rows"] for name, d in docs.items()}
    assert all("time_s" in r for r in rows["bench"]) and any("time_s" in r for r in rows["tf32"])
    assert all("time_s" in r for r in rows["accumulate"]) and "load_s" in docs["compare model"]["timing"]
    for name in ("softmax", "tf32", "compare op", "compare model", "compare tensors"):
        assert all("max_abs_error" in r for r in rows[name]), name
    assert all(isinstance(r["dtype"], str) for r in rows["accumulate"]) and "dtypes" in docs["softmax"]["params"]


def test_the_checker_finds_each_kind_of_synonym():
    bad = {"schema_version": 2, "rows": [{"time_ms": 1.0, "max_abs": 0.5, "p99_abs": 0.1, "storage": "bf16",
                                          "dtype": ["fp32"], "nested": {"rel_l2_mean": 1.0, "elapsed": 2},
                                          "method": "kahan", "kernel": "tree"}]}
    found = json_glossary_problems(bad)
    for key in ("time_ms", "max_abs", "p99_abs", "storage", "dtype", "rel_l2_mean", "elapsed", "method", "kernel"):
        assert any(f".{key}:" in p for p in found), key
    ok = {"rows": [{"time_s": 1.0, "max_abs_error": 0.5, "max_abs_diff": 0.0, "p99_abs_error": 0.1, "abs_sum": 3.0,
                    "dtype": "bf16", "dtypes": ["bf16"], "ns_per_element": 1.0, "max_abs_diff_vs_ws1": 0.0}]}
    assert json_glossary_problems(ok) == []
