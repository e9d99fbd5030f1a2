"""Secrets hidden wherever they appear in text: store, tracking and checkpoint URLs, whole or
inside a message (a driver's error, a job's output, a log line).

Every URL that is printed or logged goes through ``redact_url`` (tests/test_redaction.py checks
every print and log call of the code base), and any text that may hold one — a message from a
database driver, from user code — through ``redact_text``. Both find URL-like tokens anywhere
(``scheme://…`` up to the next whitespace) and hide, in each:

* the password of its userinfo. Read generously: from the first ``:`` after ``scheme://user`` to
  the *last* ``@`` of the token, so a password holding ``/``, ``#``, ``?``, ``@`` or ``%`` is
  hidden whole. SQLAlchemy reads ``u:p@ss@h`` as password ``p`` on host ``ss@h``; urllib as
  password ``p@ss``: hiding the longer reading hides both. The token is also parsed with
  SQLAlchemy's own URL type (``make_url``) and whatever *it* reads as the password (decoded
  from ``%XX``) is hidden too, where it still shows;
* secret query arguments (``password=``, ``sslpassword=``, ``token=``, ``secret=``,
  ``…_key=``, …), up to the next ``&name=``; the same ``name=value`` forms outside URLs
  (libpq's ``host=h password=p``, ``PGPASSWORD=p``).

Not covered: a password holding raw whitespace (no URL parser reads it as one token; written
``%20`` it is hidden), and a raw query value holding ``&name=``.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

HIDDEN = "***"

# A URL's start: scheme://, the scheme as RFC 3986 and SQLAlchemy's "dialect+driver" spell it.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
# name=value pairs that carry a secret, in a query string or free text.
_SECRET_NAME = r"(?:[A-Za-z_]*pass(?:word|wd|phrase)?|pwd|[A-Za-z_]*token|[A-Za-z_]*secret(?:_?key)?|[A-Za-z_]*(?:api|access|private)_?key|credentials?)"
_SECRET_PAIR = re.compile(rf"(?P<key>(?<![A-Za-z0-9])(?i:{_SECRET_NAME})\s*=)(?P<value>(?:(?!&[A-Za-z_][\w.-]*=)[^\s])+)")
# The quotes a message may wrap a URL in: not part of it.
_TRAILING = "'\"),;]}>"


def _hide_userinfo(token: str) -> str:
    """``token`` (one ``scheme://…`` word) with the userinfo password hidden."""
    head = _SCHEME.match(token)
    if head is None:
        return token
    rest = token[head.end() :]
    at = rest.rfind("@")
    colon = rest.find(":")
    if at < 0 or colon < 0 or colon > at or "/" in rest[:colon]:
        return token  # no userinfo with a password (http://host:5000/x, user@host)
    return token[: head.end()] + rest[: colon + 1] + HIDDEN + rest[at:]


def _library_password(token: str) -> str | None:
    """The password SQLAlchemy reads in ``token`` (decoded), or None."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(token).password
    except Exception:  # noqa: BLE001 - not a database URL: the generic reading stands
        return None


def _redact_token(token: str) -> str:
    core = token.rstrip(_TRAILING)
    tail = token[len(core) :]
    shown = _hide_userinfo(core)
    password = _library_password(core)
    if password and len(password) > 1:
        for form in {password, quote(password, safe=""), quote(password)}:
            shown = shown.replace(form, HIDDEN)
    return shown + tail


def redact_text(text: str | None) -> str:
    """``text`` with every URL's password, every secret query argument and every secret
    ``name=value`` hidden (``***``); anything else unchanged."""
    if text is None:
        return "None"
    text = str(text)
    out = []
    pos = 0
    for m in _SCHEME.finditer(text):
        if m.start() < pos:
            continue
        end = m.end()
        while end < len(text) and not text[end].isspace():
            end += 1
        out.append(text[pos : m.start()])
        out.append(_redact_token(text[m.start() : end]))
        pos = end
    out.append(text[pos:])
    return _SECRET_PAIR.sub(lambda p: f"{p['key']}{HIDDEN}", "".join(out))


def redact_url(url: str | None) -> str:
    """``url`` with its password and secret query arguments replaced by ``***``."""
    return redact_text(url)


def has_secret(url: str | None) -> bool:
    return url is not None and redact_url(url) != str(url)


def decoded_forms(secret: str) -> set[str]:
    """The ways a secret may be spelled in text (itself, ``%XX``-encoded, decoded): for callers
    that know a secret (e.g. the store's password) and scrub it from free text by value."""
    return {s for s in {secret, quote(secret, safe=""), quote(secret), unquote(secret)} if s}
