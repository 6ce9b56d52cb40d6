"""Each fact has one owner: the list of formats and its named subsets (the
catalog), the default prompt and how a model is opened (the engine registry
and its adapters). These tests read the package's source, so a second copy
fails CI the day it is written. The comparison rules and the torch flags have
their own (tests/test_comparison_rules.py, tests/test_torch_flags.py)."""

import ast
from pathlib import Path

from precisionlab.catalog import formats

PKG = Path(__file__).resolve().parent.parent / "precisionlab"


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        yield path.relative_to(PKG).as_posix(), ast.parse(path.read_text(encoding="utf-8"), str(path))


def _spellings() -> set[str]:
    """Every name the catalog answers to, aliases included."""
    names = set()
    for name, fmt in formats.FORMATS.items():
        names.add(name)
        names.update(getattr(fmt, "aliases", ()) or ())
    return {n for n in names if formats.find(n) is not None}


def format_lists(tree) -> list[tuple[int, list[str]]]:
    """Literal tuples, lists and sets of two or more strings that are all
    format names, and strings that are a comma list of two or more (an
    option's default as --dtypes spells it): a subset of the catalog written
    out again."""
    spell = _spellings()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                values = [e.value for e in node.elts]
                if all(v in spell for v in values):
                    found.append((node.lineno, values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "," in node.value:
            values = [v.strip() for v in node.value.split(",")]
            if all(v in spell for v in values):
                found.append((node.lineno, values))
    return found


def test_format_lists_are_written_only_in_the_catalog():
    stray = {f"{mod}:{line}": values for mod, tree in _modules() if mod != "catalog/formats.py"
             for line, values in format_lists(tree)}
    assert not stray, f"subsets of the formats written outside catalog/formats.py: {stray}"


def test_the_format_list_check_can_fail():
    tree = ast.parse('LOW = ("bf16", "fp16")\nMIXED = ("bf16", "tf32")\nONE = ("fp8_e4m3",)\n'
                     'JOINED = "fp32,bf16"\nSPACED = "bf16, fp16"\nTEXT = "fp32, then bf16"\n')
    # a mode (tf32), a single name or a sentence naming formats is not a subset
    assert format_lists(tree) == [(1, ["bf16", "fp16"]), (4, ["fp32", "bf16"]), (5, ["bf16", "fp16"])]


def _string_constants(tree):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_the_default_prompt_is_declared_once():
    from precisionlab.engines.registry import DEFAULT_PROMPT

    where = [f"{mod}:{n.lineno}" for mod, tree in _modules() for n in _string_constants(tree)
             if n.value == DEFAULT_PROMPT]
    assert where == [w for w in where if w.startswith("engines/registry.py:")] and len(where) == 1, where


def _calls(tree, attr: str):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attr]


def test_models_are_opened_only_by_the_engines():
    """A causal LM is loaded by engines/hf.py and the embedded model by
    engines/embedded.py (the exporters read them to convert them): every
    command reaches them through the registry."""
    loads = {}
    for mod, tree in _modules():
        for call in _calls(tree, "from_pretrained"):
            owner = call.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "?")
            if name != "AutoTokenizer":  # a tokenizer alone (compare logprobs --tokenizer) is not a model
                loads.setdefault(mod, []).append(name)
        if _calls(tree, "load_default") or _calls(tree, "load"):
            if any(getattr(c.func.value, "id", None) == "charlm" for c in _calls(tree, "load_default") + _calls(tree, "load")):
                loads.setdefault(mod, []).append("charlm")
    assert all(m in ("engines/hf.py", "engines/embedded.py") or m.startswith("engines/export") for m in loads), loads
    assert "AutoModelForCausalLM" in loads.get("engines/hf.py", []) and "charlm" in loads.get("engines/embedded.py", [])


def _escapers(tree) -> list[int]:
    """Lines that decide by themselves whether a character is shown as is:
    a call of str.isprintable() or an encode to 'unicode_escape'."""
    return sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr == "isprintable")
        or any(isinstance(a, ast.Constant) and a.value == "unicode_escape" for a in n.args)))


def test_strings_from_outside_are_escaped_by_one_rule():
    # cli/app.py asks isprintable() only to choose repr() for a default shown in --help
    stray = {mod: lines for mod, tree in _modules() if mod not in ("report/console.py", "cli/app.py")
             for lines in [_escapers(tree)] if lines}
    assert not stray, f"escaping written outside report/console.printable: {stray}"


def test_the_escaper_check_can_fail():
    tree = ast.parse('a = "".join(c if c.isprintable() else "?" for c in s)\nb = s.encode("unicode_escape")\n')
    assert _escapers(tree) == [1, 2]


def test_torch_is_imported_lazily_by_one_helper():
    lazy = {mod for mod, tree in _modules() for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name in ("_torch", "torch", "import_torch")}
    assert lazy == {"runtime/torch_import.py"}
