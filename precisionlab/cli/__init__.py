"""The command line: the Typer app (app.py), shared options (options.py), one module a command."""

from precisionlab.cli.app import app, main

__all__ = ["app", "main"]
