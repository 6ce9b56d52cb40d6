"""Reading a Hugging Face model or tokenizer folder safely, for the hf
engine and every other command that reads one (compare rollout's
--tokenizer, the exporters): a folder that could make transformers import
code from it is refused before transformers is asked anything, and nothing
the library prints reaches stdout or reads stdin. No adapter lives here, so
an experiment may import it."""

from __future__ import annotations

import os
from contextlib import contextmanager

from precisionlab.errors import UsageError

# The files of a model folder that can name custom code for transformers to import.
_CODE_MAPS = ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json",
              "generation_config.json")


def refuse_foreign_code(folder) -> None:
    """Refuse (exit 2) a model folder that could make transformers import code
    from it: a config with auto_map (custom classes in the folder's .py files).
    trust_remote_code=False would refuse them too; this says why in one line,
    before transformers is asked anything. Entries that are not regular files
    or folders (FIFOs, devices) are refused as well: reading one would hang;
    so is a file this user may not read."""
    import json
    import stat

    for entry in sorted(folder.iterdir()):
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # a dangling link: transformers reports it if it needs the file
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise UsageError(f"--model {str(folder)!r}: {entry.name!r} is not a regular file (a FIFO, device or "
                             "socket); refused")
        if stat.S_ISREG(mode):  # readable: safetensors says "No such file" of a file it may not open
            try:
                os.close(os.open(entry, os.O_RDONLY | os.O_CLOEXEC))
            except OSError as e:
                raise UsageError(f"--model {str(folder)!r}: cannot read {entry.name!r} ({e.strerror or e})") from None
    for name in _CODE_MAPS:
        f = folder / name
        if not f.is_file():
            continue
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            continue  # unreadable: transformers gives the error
        if isinstance(doc, dict) and doc.get("auto_map"):
            raise UsageError(f"--model {str(folder)!r}: {name} maps to custom code (auto_map); "
                             "precisionlab never runs code from a model folder")


@contextmanager
def quiet_library():
    """Nothing transformers prints reaches stdout (under --json stdout is the
    JSON alone), its progress bars and notices go away, and stdin is closed to
    it: no prompt can wait for, or read, an answer."""
    import contextlib
    import io
    import sys

    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # an older transformers without these switches
        pass
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO("")  # input() gets EOF at once
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdin = saved_stdin
