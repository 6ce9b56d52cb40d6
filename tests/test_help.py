"""Every command's --help, rendered as a user's terminal shows it: nothing the
help texts say is lost or garbled on the way through typer and Rich.

The expectations come from the source, not from the rendered page: the
Annotated help= texts and docstrings of each command module (the strings an
author wrote), compared with what CliRunner prints at a fixed width."""

from __future__ import annotations

import importlib
import inspect
import re
import typing

import pytest
import typer
from typer.models import ParameterInfo
from typer.testing import CliRunner

cli_app = importlib.import_module("precisionlab.cli.app")  # the module: precisionlab.cli.app is also the Typer app

WIDTHS = (100, 80)
BOX = re.compile(r"[│╭╮╰╯─┃━]")


def _pages() -> list[tuple[list[str], list[str], str]]:
    """(argv, the source help strings of its options, its docstring) for the
    root, each group and each command."""
    pages = [([], [], cli_app.app.info.help),
             *([[g], [], cli_app.GROUPS[g].info.help] for g in cli_app.GROUPS
               if (None, g) not in {(grp, name) for grp, name, _ in cli_app.COMMANDS})]  # else its own page below
    for group, name, module in cli_app.COMMANDS:
        fn = importlib.import_module(f"precisionlab.cli.{module}").command
        helps = [m.help for h in typing.get_type_hints(fn, include_extras=True).values()
                 for m in getattr(h, "__metadata__", ()) if isinstance(m, ParameterInfo)]
        pages.append(([group, name] if group else [name], helps, inspect.getdoc(fn)))
    return pages


PAGES = _pages()


def _render(argv: list[str], width: int) -> str:
    r = CliRunner().invoke(cli_app.app, [*argv, "--help"], env={"COLUMNS": str(width), "TERM": "dumb"},
                           prog_name="precisionlab")
    assert r.exit_code == 0, (argv, r.output)
    return r.output


def _flat(text: str) -> str:
    """The page's words in order: box drawing gone, every run of whitespace
    (a wrapped line's break included) one space."""
    return " ".join(BOX.sub(" ", text).split())


def _first_paragraph(doc: str) -> str:
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("argv,helps,doc", PAGES, ids=[" ".join(argv) or "precisionlab" for argv, _, _ in PAGES])
def test_help_page_keeps_what_the_source_says(argv, helps, doc, width):
    page = _render(argv, width)
    flat = _flat(page)
    usage = [line for line in page.splitlines() if "Usage:" in line]
    assert usage, page
    for line in usage:  # typer writes a required argument as {name}: a metavar placeholder, not usage
        assert "{" not in line and "}" not in line, line
    # Rich markup takes [word] for a style tag and drops it (precisionlab[hf]);
    # every bracketed text an author wrote must reach the page.
    # Compared without whitespace: a token longer than the help column is
    # folded mid-word, which moves no character.
    solid = "".join(flat.split())
    for text in [*helps, doc]:
        for bracketed in re.findall(r"\[[^\[\]]*\]", text or ""):
            assert "".join(bracketed.split()) in solid, (argv, bracketed)
    for line in page.splitlines():  # a default split over two lines (a '\n' in it) reads as two values
        for opened in re.finditer(r"\[default: ", line):
            assert "]" in line[opened.end():], (argv, line)
    assert _first_paragraph(doc) in flat, (argv, _first_paragraph(doc))
    if not any("…" in text for text in [*helps, doc]):  # Rich cuts a word wider than its column with …
        assert "…" not in page, (argv, [line for line in page.splitlines() if "…" in line])


def _commands():
    root = typer.main.get_command(cli_app.app)
    for name, cmd in root.commands.items():
        for sub_name, sub in getattr(cmd, "commands", {name: cmd}).items():
            yield (f"{name} {sub_name}" if sub is not cmd else name), sub


@pytest.mark.parametrize("name,cmd", list(_commands()), ids=lambda v: v if isinstance(v, str) else None)
def test_every_parameter_has_help(name, cmd):
    for p in cmd.params:
        assert (getattr(p, "help", None) or "").strip(), (name, p.name)


@pytest.mark.parametrize("width", WIDTHS)
def test_group_lists_each_command_by_its_first_paragraph(width):
    for group in (None, *cli_app.GROUPS):
        flat = _flat(_render([group] if group else [], width))
        for g, name, module in cli_app.COMMANDS:
            if g == group:
                doc = inspect.getdoc(importlib.import_module(f"precisionlab.cli.{module}").command)
                assert _first_paragraph(doc) in flat, (group, name)


def test_a_default_with_a_newline_is_shown_escaped():
    flat = _flat(_render(["compare", "model"], 100))
    assert "[default: ('ROMEO:\\n')]" in flat
