"""Every option that takes a format accepts every name the catalog lists for
each format of the option's subset, and the run is the run of the canonical
name: the same exit code and the same JSON (timings, keys ending in _s, aside).

The spellings come from the catalog (formats.CANONICAL, built from TWINS), so a
new alias is tested here without an edit. Every option parses every spelling
through the parse step its experiment runs; where a run is cheap (a tenth of a
second in process) every spelling also runs through the CLI, where it is not
(compare model, kvcache, tf32 --accumulator, compare tensors' second and third
files) one alias does. The runs are in process (typer's CliRunner on the app)
to keep the module fast; one refusal runs as a user meets it, in a process of
its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from helpers import cli
from typer.testing import CliRunner

from precisionlab.catalog import formats
from precisionlab.cli.app import app
from precisionlab.engines import inject
from precisionlab.errors import RunError, UsageError
from precisionlab.io import logits_file
from precisionlab.experiments import (accumulate, attention_cases, compare, contracts, kvcache, logits, model, pair,
                                      rollout, router, softmax, tensors, tf32)
from precisionlab.numerics import flash_attention as fa


def spellings(name: str) -> list[str]:
    """Every name the catalog maps to `name` but `name` itself, plus its case
    rule: the canonical name upper-cased, '_' written '-'."""
    out = [alias for alias, canonical in formats.CANONICAL.items() if canonical == name and alias != name]
    return out + [name.upper().replace("_", "-")]


def _timeless(doc):
    if isinstance(doc, dict):
        return {k: _timeless(v) for k, v in doc.items() if not k.endswith("_s")}
    if isinstance(doc, list):
        return [_timeless(v) for v in doc]
    return doc


def invoke(*args: str):
    """(exit code, JSON document without timings, the run's own error) of one
    in-process run. A failed run (exit 1, e.g. compare op's contract check on
    --out-dtype) is a result too; a usage error or a crash is not."""
    res = CliRunner().invoke(app, [*args, "--json"])
    err = None if res.exception is None or isinstance(res.exception, SystemExit) else res.exception
    assert err is None or isinstance(err, RunError), (args, repr(err))
    return res.exit_code, _timeless(json.loads(res.output)), str(err)


@dataclass
class Opt:
    argv: tuple[str, ...]   # the cheapest run of the command, without the option
    option: str
    subset: formats.Subset  # the experiment's own subset object
    every_spelling_by_cli: bool = True  # else one spelling (the first alias of the first format)
    single: bool = False    # one format, not a comma list
    form: str = "{}"        # how the format sits in the option's value

    def run(self, text: str):
        return invoke(*self.argv, self.option, self.form.format(text))

    def parse(self, text: str) -> list[str]:
        """The parse step the experiment runs on the option's text."""
        if self.option == "--inject":
            return [inject.parse(self.form.format(text)).params["rope"]]
        if self.single:
            return [formats.parse_one(text, self.subset, self.option)]
        return formats.parse_list(text, self.subset, self.option)

    def __str__(self) -> str:
        return f"{' '.join(self.argv[:2])} {self.option}"


ACC = ("accumulate", "--n", "10", "--device", "cpu", "--variants", "sequential")
OP = ("compare", "op", "softmax", "--shape", "2x8", "--cases", "random", "--device", "cpu")
MODEL = ("compare", "model", "--steps", "2")
LAYERS = ("compare", "layers", "--steps", "2")
PAIR = ("compare", "engine-layers", "--engine", "embedded", "--reference", "embedded", "--steps", "2")
KV = ("kvcache", "--steps", "2", "--scales", "unit")
METRICS = ("compare", "metrics", "--tokens", "16")
CONTRACTS = ("compare", "contracts", "--steps", "2", "--batches", "3")
ROLLOUT = ("compare", "rollout", "--trainer", "embedded", "--rollout", "embedded", "--samples", "1", "--tokens", "4")
ROUTER = ("router", "--tokens", "64", "--layers", "1", "--experts", "16", "--hidden", "16", "--top-k", "2",
          "--bias", "0:1")
ATTN = ("attention", "--seq", "64", "--rows", "4", "--dim", "8", "--std", "1", "--block-c", "16")
CASES = ("attention-cases", "--cases", "random", "--max-keys", "4096")


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("dumps")
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    for i, name in enumerate("abc"):
        np.savez(d / f"{name}.npz", x=x + np.float32(i * 1e-3))
    return [str(d / f"{n}.npz") for n in "abc"]


def options(dumps) -> list[Opt]:
    three = ("compare", "tensors", *dumps)
    return [
        Opt(ACC, "--dtype", accumulate.STORAGE_DTYPES, single=True),
        Opt(("compare", "pair", "docs/data/pairs/clean-whole-fp32.safetensors",
             "docs/data/pairs/clean-chunked-fp32.safetensors"), "--dtype", pair.DTYPES, single=True),
        Opt(ACC, "--acc-dtypes", accumulate.ACCUMULATORS),
        Opt(("softmax", "--values", "1,2", "--device", "cpu"), "--dtypes", softmax.DTYPES),
        Opt(OP, "--dtypes", compare.LOW_DTYPES),
        Opt(OP, "--out-dtype", compare.OUT_DTYPES, single=True),
        Opt(three, "--dtypes", tensors.LOW_DTYPES, single=True, form="{},-,-"),  # one file's format, '-' as stored
        Opt(three, "--dtypes", tensors.LOW_DTYPES, every_spelling_by_cli=False, single=True, form="-,{},-"),
        Opt(three, "--dtypes", tensors.LOW_DTYPES, every_spelling_by_cli=False, single=True, form="-,-,{}"),
        Opt(MODEL, "--dtypes", model.LOW_DTYPES, every_spelling_by_cli=False),
        Opt(LAYERS, "--dtypes", model.LOW_DTYPES, every_spelling_by_cli=False),
        Opt(PAIR, "--dtypes", model.LOW_DTYPES, every_spelling_by_cli=False),
        Opt(LAYERS, "--inject", inject.ROPE_DTYPES, every_spelling_by_cli=False, form="rope:rope={}"),
        Opt(METRICS, "--dtypes", logits.DTYPES, every_spelling_by_cli=False),
        Opt(CONTRACTS, "--dtypes", contracts.DTYPES, every_spelling_by_cli=False),
        Opt(KV, "--dtypes", kvcache.FP8, every_spelling_by_cli=False),
        Opt(ROLLOUT, "--trainer-dtype", rollout.DTYPES, every_spelling_by_cli=False, single=True),
        Opt(ROLLOUT, "--rollout-dtype", rollout.DTYPES, every_spelling_by_cli=False, single=True),
        Opt(("tf32", "--accumulator", "fp32", "--k", "64"), "--dtypes", tf32.ACC_DTYPES, every_spelling_by_cli=False),
        Opt(ATTN, "--p-dtype", fa.P_DTYPES, every_spelling_by_cli=False, single=True),
        Opt(ATTN, "--input-dtype", fa.INPUT_DTYPES, every_spelling_by_cli=False, single=True),
        Opt(ATTN, "--out-dtype", fa.OUT_DTYPES, every_spelling_by_cli=False, single=True),
        Opt(CASES, "--dtypes", attention_cases.DTYPES, every_spelling_by_cli=False),
        Opt(ROUTER, "--gate-dtypes", router.DTYPES),
        Opt(ROUTER, "--logit-dtypes", router.DTYPES),
        Opt(ROUTER, "--bias-dtypes", router.DTYPES),
    ]


def _cli_cases(dumps):
    for opt in options(dumps):
        for name in opt.subset if opt.every_spelling_by_cli else opt.subset[:1]:
            for s in spellings(name) if opt.every_spelling_by_cli else spellings(name)[:1]:
                yield opt, name, s


def test_every_alias_of_every_option_runs_as_its_canonical_name(dumps):
    """A real run per spelling (one spelling per option where the run is
    slow), each against its canonical name's run. Among them the runs that
    exited 2 before there was one parser: compare model --dtypes bfloat16
    and kvcache --dtypes e4m3."""
    canonical_runs = {}
    checked = set()
    for opt, name, spelling in _cli_cases(dumps):
        key = (str(opt), opt.argv, opt.form, name)  # compare tensors --dtypes: one Opt per file, by form
        if key not in canonical_runs:
            canonical_runs[key] = opt.run(name)
            assert canonical_runs[key][0] in (0, 1), (str(opt), name)  # 1: a run that flags or fails
        assert opt.run(spelling) == canonical_runs[key], (str(opt), spelling, name)
        checked.add((opt.argv, opt.option, spelling))
    assert {(MODEL, "--dtypes", "bfloat16"), (KV, "--dtypes", "e4m3")} <= checked


def test_every_alias_of_every_option_parses_to_its_canonical_name(dumps):
    """Every option, every spelling, through the parse step its experiment
    runs: the canonical name, once (an alias is its format: no repeated rows)."""
    for opt in options(dumps):
        for name in opt.subset:
            for s in spellings(name):
                assert opt.parse(s) == [name], (str(opt), s)
                if not opt.single and opt.option != "--inject":
                    assert opt.parse(f"{s},{name}, {s.lower()}") == [name], (str(opt), s)


def test_save_logits_takes_every_alias(tmp_path):
    """--save-logits DTYPE=FILE: DTYPE by any of its names; a name outside the
    subset stays part of the file name, as before."""
    lows = list(logits.DTYPES)
    for name in logits.DTYPES:
        for s in spellings(name):
            path = str(tmp_path / f"{name}.safetensors")
            assert logits.parse_save([f"{s}={path}"], lows) == {name: path}
    odd = str(tmp_path / "fp8_e4m3=x.safetensors")
    assert logits.parse_save([odd], lows) == {"fp32": odd}


def test_save_logits_alias_through_the_cli(tmp_path):
    path = tmp_path / "bf16.safetensors"

    def written():
        f = logits_file.open_file(str(path), "--save-logits")
        return f.metadata, f.tokens.tolist(), f.rows(0, f.positions).tolist()

    alias = invoke(*METRICS, "--dtypes", "bf16", "--save-logits", f"BFloat16={path}")
    first = written()
    assert alias[0] == 0 and alias == invoke(*METRICS, "--dtypes", "bf16", "--save-logits", f"bf16={path}")
    assert written() == first


def test_every_format_option_of_the_cli_is_covered(dumps):
    """A new option named --*dtype(s) or --accumulators must join the table above."""
    import typer.main

    covered = {(opt.argv[0] if opt.argv[0] != "compare" else f"compare {opt.argv[1]}", opt.option)
               for opt in options(dumps)}
    group = typer.main.get_group(app)
    found = set()
    for name, cmd in group.commands.items():
        subs = cmd.commands.items() if hasattr(cmd, "commands") else [(None, cmd)]
        for sub, c in subs:
            for p in c.params:
                for o in getattr(p, "opts", []):
                    if o.endswith(("dtype", "dtypes")) or o == "--acc-dtypes":
                        found.add((name if sub is None else f"{name} {sub}", o))
    assert found and found <= covered, found - covered


@pytest.mark.parametrize("text,subset,words", [
    ("", formats.FP8, ["--opt", "empty", "fp8_e4m3, fp8_e5m2"]),
    (" , ", formats.FP8, ["--opt", "empty"]),
    ("fp32", formats.FP8, ["--opt", "fp32 is not an fp8 format", "fp8_e4m3, fp8_e5m2"]),
    ("e4m3,nope", formats.FP8, ["--opt", "unknown format 'nope'", "fp8_e4m3, fp8_e5m2"]),
    ("fp4", formats.ACCUMULATORS, ["--opt", "fp4_e2m1 is not an accumulator format"]),
])
def test_refusals_name_the_option_and_the_subset(text, subset, words):
    with pytest.raises(UsageError) as e:
        formats.parse_list(text, subset, "--opt")
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_refusal_is_one_line_and_exit_2():
    r = cli("kvcache", "--dtypes", "fp32", "--steps", "2")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "--dtypes: fp32 is not an fp8 format; choose from fp8_e4m3, fp8_e5m2" in r.err


def test_parse_one_takes_one_format():
    assert formats.parse_one(" Float8-E4M3FN ", formats.FP8, "--x") == "fp8_e4m3"
    for bad in ("", "bf16,fp16", "bf16"):
        with pytest.raises(UsageError, match="--x"):
            formats.parse_one(bad, formats.FP8, "--x")


def test_not_given_is_the_default_or_the_whole_subset():
    assert formats.parse_list(None, formats.FP8, "--x") == list(formats.FP8)
    assert formats.parse_list(None, formats.ACCUMULATORS, "--x", formats.DEFAULT_ACCUMULATORS) == list(
        formats.DEFAULT_ACCUMULATORS)
    storage, accs = accumulate.parse_formats(accumulate.AccumulateConfig(dtype="half", accumulators="double,f32"))
    assert storage.name == "fp16" and [a.name for a in accs] == ["fp64", "fp32"]
