"""One way to show a URL that may carry a secret: every store, tracking or checkpoint URL that is
printed or logged goes through ``redact_url`` (tests/test_redaction.py checks every print and
log call of the code base for a URL that does not)."""

from __future__ import annotations

import re

# scheme://user:password@host… — the password runs to the last "@" before the path, as
# SQLAlchemy and urllib read it (a password may itself hold an "@").
_USERINFO = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/:@?#]*:)(?P<secret>[^/?#]*)(?P<at>@)")
# …?password=…&sslpassword=…: query parameters that carry a secret (SQLAlchemy, psycopg, fsspec).
_SECRET_PARAM = re.compile(r"(?P<key>[?&;](?:[A-Za-z_]*password|passwd|pwd|token|secret|[A-Za-z_]*secret_key|access_key)=)(?P<value>[^&;#]*)", re.IGNORECASE)
HIDDEN = "***"


def redact_url(url: str | None) -> str:
    """``url`` with its password and secret query parameters replaced by ``***``; anything else unchanged."""
    if url is None:
        return "None"
    text = _USERINFO.sub(lambda m: f"{m['head']}{HIDDEN}{m['at']}", str(url), count=1)
    return _SECRET_PARAM.sub(lambda m: f"{m['key']}{HIDDEN}", text)


def has_secret(url: str | None) -> bool:
    return url is not None and redact_url(url) != str(url)
