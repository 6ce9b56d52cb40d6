"""Secrets in URLs, masked wherever a URL is shown or written: the one helper.

A URL may carry credentials (`https://user:password@host/v1`, or a token as
the user name). precisionlab sends the URL as given, but every line, table
and JSON document shows it as `https://***@host/v1`: errors end up in logs
and issue reports, JSON in result archives.
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
