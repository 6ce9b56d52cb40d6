"""Secrets in URLs, masked wherever a URL is shown or written: the one helper.

A URL may carry credentials (`https://user:password@host/v1`, or a token as
the user name). precisionlab sends the URL as given, but every line, table
and JSON document shows it as `https://***@host/v1`, and every file it writes
records it so (masked, recorded): errors end up in logs and issue reports,
JSON, dumps, logits files and plots in result archives.
"""

from __future__ import annotations

import re

# scheme://USERINFO@ : the userinfo (user, user:password, a token) up to the first @ before the path
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")


def mask_secrets(text: str) -> str:
    """`text` with the userinfo of every URL in it replaced by ***."""
    if "@" not in text:  # the common case, without a regex
        return text
    return _USERINFO.sub(r"\1***@", text)


def masked(obj):
    """obj (a string, or dicts, lists and tuples of them, any other value as is) with every string's
    URL secrets masked: what a file the tool writes records (a model's spec or name in a dump's or a
    logits file's metadata, a cached reference's info). Those files are shared like the JSON is."""
    if isinstance(obj, str):
        return mask_secrets(obj)
    if isinstance(obj, dict):
        return {masked(k): masked(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [masked(v) for v in obj]  # as JSON writes either
    return obj


def recorded(metadata: dict) -> dict[str, str]:
    """A file's string metadata (safetensors) as written: every value a string, URL secrets masked.
    Every writer of metadata that names a model or a file goes through here (tests/test_hostile_round4b)."""
    return masked({str(k): str(v) for k, v in metadata.items()})
