"""Every old spelling of this release (cli/aliases.ALIASES) still works: it
prints exactly one notice line naming the new spelling, then gives what the
new spelling gives (exit code, and the JSON document apart from timings).
The cases are derived from the alias table: an alias added there is tested here."""

import shutil

import pytest

from precisionlab.cli import aliases
from precisionlab.cli.app import command_facts

CASES = [*aliases.ALIASES, aliases.DEVICE_AUTO]
VARYING = {"timing", "seconds", "elapsed"}  # with every key ending in _s: what differs between two identical runs


def _argv(alias, tmp_path) -> list[str]:
    return [*alias.command, *(a.replace("{tmp}", str(tmp_path)) for a in alias.example)]


def _steady(doc):
    if isinstance(doc, dict):
        return {k: _steady(v) for k, v in doc.items() if k not in VARYING and not k.endswith("_s")}
    if isinstance(doc, list):
        return [_steady(v) for v in doc]
    return doc


@pytest.mark.parametrize("alias", CASES, ids=lambda a: a.old)
def test_old_spelling_notice_and_same_result(alias, run, tmp_path):
    old = _argv(alias, tmp_path)
    new, notices = aliases.rewrite(old, *command_facts())
    assert new != old and len(notices) == 1 and alias.new in notices[0] and alias.old in notices[0]
    r_old = run(*old, "--json")
    shutil.rmtree(tmp_path / "dump", ignore_errors=True)  # --dump writes a folder: the second run writes it anew
    r_new = run(*new, "--json")
    lines = r_old.err.strip().splitlines()
    notice = f"precisionlab: {notices[0]}"
    assert lines[0] == notice and notice not in r_new.err, (r_old.err, r_new.err)
    assert r_old.code == r_new.code, (r_old.err, r_new.err)
    if r_new.code == 0:
        d_old, d_new = r_old.json(), r_new.json()
        assert d_new["command"] == " ".join(new[:len(alias.verb)] if alias.verb else new[:len(alias.command) or 1])
        assert _steady(d_old) == _steady(d_new)
    else:
        assert lines[1:] == r_new.err.strip().splitlines()


def test_every_verb_alias_names_a_registered_command():
    from precisionlab.cli.app import COMMANDS

    registered = {(g, n) if g else (n,) for g, n, _ in COMMANDS}
    registered = {c if len(c) == 2 else c for c in registered}
    for a in aliases.ALIASES:
        if a.kind == "verb":
            assert (a.verb[0], a.verb[1]) in registered, a


@pytest.mark.parametrize("argv, want", [
    (["compare", "model", "--prompt", "--metrics", "--steps", "3"], ["compare", "model", "--prompt", "--metrics",
                                                                    "--steps", "3"]),  # a value, not the mode
    (["compare", "model", "--layers", "--engine", "x"], ["compare", "engine-layers", "--engine", "x"]),  # two steps
    (["compare", "layers", "--model", "hf:a", "--reference", "hf:b"],
     ["compare", "engine-layers", "--engine", "hf:a", "--reference", "hf:b"]),
    (["compare", "layers", "--model=hf:a", "--reference", "hf:b"],
     ["compare", "engine-layers", "--engine=hf:a", "--reference", "hf:b"]),
    (["compare", "layers", "--reference", "hf:b", "--steps", "3"],
     ["compare", "engine-layers", "--reference", "hf:b", "--steps", "3", "--engine", "embedded"]),
    (["compare", "layers", "--steps", "3"], ["compare", "layers", "--steps", "3"]),  # one model: no alias
    (["compare", "contracts", "--draft-tokens", "f.txt", "--steps", "3"],
     ["compare", "contracts", "--steps", "3", "--draft", "tokens:f.txt"]),
    (["compare", "model", "--layers", "--dump", "D"], ["compare", "layers", "--dump", "D"]),
    (["nondeterminism", "--endpoint=http://h:1", "--mix"], ["nondeterminism", "endpoint", "http://h:1", "--mix"]),
    (["softmax", "--values", "1", "--", "--dtype"], ["softmax", "--values", "1", "--", "--dtype"]),
    (["accumulate", "--device=auto"], ["accumulate", "--device=all"]),
    (["compare", "model", "--steps", "2"], ["compare", "model", "--steps", "2"]),
    (["kvcache", "--device", "auto"], ["kvcache", "--device", "all"]),
    (["compare", "metrics", "--device", "auto"], ["compare", "metrics", "--device", "auto"]),  # a model command's auto
])
def test_rewrite(argv, want):
    assert aliases.rewrite(argv, *command_facts())[0] == want


def test_old_layers_pair_with_both_yours_is_refused(run):
    r = run("compare", "layers", "--model", "embedded", "--engine", "embedded", "--reference", "embedded")
    assert r.code == 2 and r.err.count("\n") == 1 and "not both" in r.err


def test_old_draft_tokens_with_draft_is_refused(run):
    r = run("compare", "contracts", "--draft", "embedded", "--draft-tokens", "f.txt")
    assert r.code == 2 and r.err.count("\n") == 1 and "give one" in r.err


def test_two_modes_are_refused(run):
    r = run("compare", "model", "--metrics", "--contracts")
    assert r.code == 2 and r.err.count("\n") == 1 and "separate runs" in r.err
