"""torch, imported where it is first needed, never at module level: `--help`
and the CPU paths that need no torch do not pay its import (about a second on
the 2-core dev machine; tests/test_help.py checks it stays unimported)."""


def import_torch(optional: bool = False):
    """The torch module. `optional`: None where torch is not installed, for the
    callers that report its absence themselves (flags, thread counts, tf32's
    modes); otherwise its ImportError goes up as it is."""
    try:
        import torch
    except ImportError:
        if optional:
            return None
        raise
    return torch
