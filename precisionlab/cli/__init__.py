"""The command line: the Typer app (app.py), shared options (options.py), one module a command."""

import os


def main() -> None:
    """The console entry point: app.main, with a Ctrl-C that lands while the
    command line is still being imported (typer, rich and numpy take a second,
    many on a loaded machine) answered as app.main answers one later: one
    line, exit 130, no traceback."""
    try:
        from precisionlab.cli.app import main as run
    except KeyboardInterrupt:
        os.write(2, b"precisionlab: interrupted\n")
        os._exit(130)
    run()


__all__ = ["main"]
