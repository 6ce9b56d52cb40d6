"""The Typer app: commands parse options, call an experiment, hand the result to
the report. No maths here.

Exit codes: 0 ok, 1 failed run, 2 usage error, 3 --device cuda without a GPU.
Errors are one line on stderr; PRECISIONLAB_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated, Optional

import typer

try:  # typer >= 0.20 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # older typer depends on click
    from click.exceptions import ClickException

from typer.core import TyperArgument, TyperCommand, TyperGroup

from precisionlab.errors import PrecisionLabError


class _PlainHelp:
    """Help texts here are plain text, never Rich markup: typer renders them
    through Rich, which would take `precisionlab[hf]` for a style tag and drop
    it. So, once, for every command and group: brackets are escaped, a
    paragraph's line breaks (a docstring's) become spaces (Rich would keep
    them in a group's list of commands), an argument's metavar is its name in
    capitals (NAME, FILES...) as click writes it, and a default with a newline
    in it ('ROMEO:\\n') is shown escaped, on one line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import inspect
        from rich.markup import escape

        rich = getattr(self, "rich_markup_mode", None) == "rich"

        def plain(text: str) -> str:
            paragraphs = inspect.cleandoc(text).split("\n\n")
            text = "\n\n".join(" ".join(p.split()) for p in paragraphs)
            return escape(text) if rich else text

        self.help = self.help and plain(self.help)
        self.short_help = self.short_help and plain(self.short_help)
        for p in self.params:
            p.help = getattr(p, "help", None) and plain(p.help)
            if isinstance(p, TyperArgument) and p.metavar is None:
                p.metavar = p.name.upper() + ("..." if p.nargs != 1 else "")
            shown = getattr(p, "show_default", None)  # False: hidden; a str: the command's own wording
            if isinstance(p.default, str) and not p.default.isprintable() and shown is not False \
                    and not isinstance(shown, str):
                p.show_default = repr(p.default)

    def collect_usage_pieces(self, ctx):
        """`[OPTIONS] NAME` and `[SECTION]`, where typer writes `{name}`."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if isinstance(p, TyperArgument):
                pieces.append(p.metavar if p.required else f"[{p.metavar}]")
            else:
                pieces.extend(p.get_usage_pieces(ctx))
        if isinstance(self, TyperGroup):
            pieces.append(self.subcommand_metavar)
        return pieces


class _Command(_PlainHelp, TyperCommand):
    pass


class _Group(_PlainHelp, TyperGroup):
    pass


app = typer.Typer(
    cls=_Group,
    name="precisionlab",
    help="A command-line lab for numerical precision: floating-point formats and reduction orders, "
    "shown, measured and explained.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (typer's, no torch)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


compare_app = typer.Typer(cls=_Group, no_args_is_help=True,
                          help="Error reports: the three comparisons for an op, tensor dumps, a whole model.")
app.add_typer(compare_app, name="compare")


def _version(value: bool) -> None:
    if value:
        from precisionlab.runtime import version
        from precisionlab.report.version import version_lines

        version_lines(version.collect())
        raise typer.Exit()


@app.callback()
def _root(
    _v: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                               help="The package, the library's ABI and build, and exit.")] = None,
) -> None:
    """A command-line lab for numerical precision: floating-point formats and reduction orders,
    shown, measured and explained. Every command takes --json, --device and --seed."""


# Every command, registered once: (group, name, module of precisionlab.cli).
# A command module defines `command`; its help is that function's docstring.
COMMANDS = (
    (None, 'accumulate', 'accumulate'),
    (None, 'softmax', 'softmax'),
    ('compare', 'model', 'compare_model'),
    ('compare', 'metrics', 'compare_metrics'),
    ('compare', 'layers', 'compare_layers'),
    ('compare', 'engine-layers', 'compare_engine_layers'),
    ('compare', 'contracts', 'compare_contracts'),
    ('compare', 'rollout', 'compare_rollout'),
    ('compare', 'engine', 'compare_engine'),
    (None, 'nondeterminism', 'nondeterminism'),
    ('nondeterminism', 'endpoint', 'nondeterminism_endpoint'),
    (None, 'tf32', 'tf32'),
    (None, 'info', 'info'),
    ('compare', 'op', 'compare_op'),
    ('compare', 'logits', 'compare_logits'),
    ('compare', 'pair', 'compare_pair'),
    ('compare', 'builds', 'compare_builds'),
    ('compare', 'scores', 'compare_scores'),
    ('compare', 'moved', 'compare_moved'),
    ('compare', 'logprobs', 'compare_logprobs'),
    ('compare', 'tensors', 'compare_tensors'),
    (None, 'bench', 'bench'),
    (None, 'formats', 'formats'),
    (None, 'kvcache', 'kvcache'),
    (None, 'attention', 'attention'),
    (None, 'attention-cases', 'attention_cases'),
    (None, 'export', 'export'),
    (None, 'router', 'router'),
    ('compare', 'routing', 'compare_routing'),
)
# nondeterminism is a group whose own run (no verb given) is the sections: its
# COMMANDS line registers that run as the group's callback, and `endpoint` is its verb.
nondeterminism_app = typer.Typer(cls=_Group, no_args_is_help=False)
app.add_typer(nondeterminism_app, name="nondeterminism")
GROUPS = {"compare": compare_app, "nondeterminism": nondeterminism_app}


def _register() -> None:
    import importlib

    for group, name, module in COMMANDS:
        fn = importlib.import_module(f"precisionlab.cli.{module}").command
        if group is None and name in GROUPS:  # the group's own run
            GROUPS[name].callback(invoke_without_command=True)(fn)
        else:
            (app if group is None else GROUPS[group]).command(name, cls=_Command)(fn)


_register()


def main() -> None:
    """Entry point: run the app, turning every failure into one line and an exit code.

    The command runs in a worker thread while the main thread waits on it:
    Python delivers Ctrl-C to the main thread only between bytecodes, and a
    long ctypes call (a big matmul or sum) holds the worker for seconds, so
    the main thread answers at once, removes half-written files and exits 130
    without waiting for the kernel."""
    import threading

    if sys.stderr is None:  # started with fd 2 closed: nowhere to say anything
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:  # started with fd 1 closed (`precisionlab ... >&-`): no output can be shown
        sys.stderr.write("precisionlab: stdout is closed; redirect it instead (>/dev/null discards the output)\n")
        sys.exit(1)
    from precisionlab.report import console

    console.tolerate_unencodable()
    if len(sys.argv) <= 1:  # no arguments: the help, on stdout, and the usage exit code
        app(["--help"], prog_name="precisionlab", standalone_mode=False)
        sys.exit(2)
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["code"] = _run()
        except BaseException as e:  # SystemExit from _fail, or a traceback asked for by PRECISIONLAB_DEBUG
            outcome["exc"] = e

    worker = threading.Thread(target=work, name="precisionlab-command", daemon=True)
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.05)
    except KeyboardInterrupt:
        _interrupted()
    if "exc" in outcome:
        raise outcome["exc"]
    sys.exit(outcome.get("code", 0))


def _interrupted() -> None:
    """Ctrl-C: one line, no partial file, exit 130 now (the worker may be inside a kernel)."""
    from precisionlab.runtime import interrupt
    from precisionlab.io import outputs

    interrupt.run_all()  # child processes and the like, owned by the worker's command
    outputs.remove_pending()
    try:
        sys.stdout.flush()
    except Exception:  # a closed pipe: nothing more to say there
        pass
    os.write(2, b"precisionlab: interrupted\n")
    os._exit(130)


def _run() -> int:
    """The app, every failure turned into one stderr line and an exit code."""
    debug = os.environ.get("PRECISIONLAB_DEBUG") == "1"
    if not debug:
        import warnings

        # numpy's floating-point warnings (overflow, invalid value) are what a run measures and counts itself
        # (non-finite outputs, saturation, flushes); as stray stderr lines they read like failures
        warnings.filterwarnings("ignore", category=RuntimeWarning)
    if "--install-completion" in sys.argv[1:]:
        _check_completion_shell()
    try:
        args = _new_spelling(sys.argv[1:])
        # the command's name, also under `python -m`: shell completion is for `precisionlab`
        rc = app(args=args, standalone_mode=False, prog_name="precisionlab")
    except PrecisionLabError as e:
        if debug:
            raise
        _fail(str(e), e.exit_code)
    except typer.Exit as e:
        if e.exit_code == 130 and isinstance(e.__cause__, KeyboardInterrupt):  # typer's own Ctrl-C answer
            _fail("interrupted", 130)
        sys.exit(e.exit_code)
    except typer.Abort:
        _fail("aborted", 130)
    except ClickException as e:  # option parsing: a usage error
        if debug:
            raise
        if not e.format_message().strip():  # a group without a command: its help is already printed
            sys.exit(2)
        _fail(e.format_message(), 2)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as e:  # a bug: still one line, unless debugging
        if debug:
            raise
        if _out_of_memory(e):  # the estimate fit, the allocation failed anyway: a failed run
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            _fail(f"out of memory: {first[:200]} (the memory estimate made before the run fit; free memory or "
                  "choose smaller sizes)", 1)
        if isinstance(e, OSError) and "--install-completion" in sys.argv[1:]:  # typer writes the shell's rc file
            _fail(f"--install-completion: cannot write {e.filename or 'the shell configuration'} "
                  f"({e.strerror or e}); --show-completion prints what to add there yourself", 1)
        if isinstance(e, OSError) and e.errno in _SYSTEM_ERRNOS:  # the system refused, not a bug
            _fail(f"{e.strerror}{f': {e.filename}' if e.filename else ''}", 1)
        _fail(f"internal error: {type(e).__name__}: {e} (PRECISIONLAB_DEBUG=1 shows the traceback)", 1)
    return rc if isinstance(rc, int) else 0


def _new_spelling(argv: list[str]) -> list[str]:
    """argv with this release's old spellings rewritten (cli/aliases.py), one notice line each on stderr."""
    from precisionlab.cli import aliases

    flags, kernel = command_facts()
    args, notices = aliases.rewrite(argv, flags, kernel)
    for line in notices:
        sys.stderr.write(f"precisionlab: {line}\n")
    return args


def command_facts() -> tuple[set[str], set[tuple[str, ...]]]:
    """(every option of the app that takes no value, the commands whose --device
    defaults to all), read from the registered commands: what the alias
    rewriting needs to know, never a copy of it."""
    flags: set[str] = {"--help", "-h"}
    kernel: set[tuple[str, ...]] = set()

    def walk(cmd, path: tuple[str, ...]) -> None:
        for p in cmd.params:
            if getattr(p, "is_flag", False) or getattr(p, "count", False):  # typer may vendor its own click
                flags.update(p.opts + p.secondary_opts)
            if p.name == "device" and p.default == "all":
                kernel.add(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return flags, kernel


# What a write to a full disk, a failing device or past a size limit raises
# (`precisionlab ... > /dev/full`): a failed run, said as the system says it.
# A permission refused mid-run (a folder's mode changed after the checks made
# before the run, a file of the system's) is the system's answer too.
_SYSTEM_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


def _out_of_memory(e: BaseException) -> bool:
    """MemoryError, torch's OutOfMemoryError, or torch's CPU allocator refusing."""
    if isinstance(e, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(e, oom):
        return True
    return isinstance(e, RuntimeError) and "can't allocate memory" in str(e)


def _check_completion_shell() -> None:
    """typer finds the shell from the process tree (shellingham), and for one it
    cannot serve (sh, dash, a script's parent) prints 'not supported' on stdout
    and exits 1: said here first, as a usage error on stderr."""
    if os.environ.get("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION"):  # then the shell is the option's value
        return
    from typer import _completion_shared as shared

    name = shared._get_shell_name()
    if name not in {s.value for s in shared.Shells}:
        found = f"the shell running this is {name!r}" if name else "the shell running this cannot be told"
        _fail(f"--install-completion: {found}, and completion is written for "
              f"{', '.join(s.value for s in shared.Shells)}; run it from one of those, or add what "
              "--show-completion prints to your shell's configuration yourself", 2)


def _fail(message: str, code: int) -> None:
    from precisionlab.report.console import error_line

    error_line(message)
    sys.exit(code)
