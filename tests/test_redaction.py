"""Secrets in URLs: one helper (``service.redaction.redact_url``) hides them, and every print and
log call of the code base that shows a store, tracking or checkpoint URL goes through it.

The scan reads the source (``ast``) of every module of the product: each call that prints,
logs, says, warns or fails is inspected, and every value it formats whose expression names a
URL (``store_url``, ``job_store``, ``tracking_uri``, ``….url``, …) must be an argument of
``redact_url`` (or of ``redact``, the store's name for it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from service.redaction import has_secret, redact_url

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("allocator", "elastic_tasks", "flows", "service", "deploy")
# Calls that put text in front of a person or into a log (Prefect's log_prints turns print into a log).
_OUTPUT = re.compile(r"^(print|say|warn|fail|echo|_say|_notify|_warn|_off|notify|log\.\w+|logger\.\w+|logging\.\w+|console\.print|typer\.echo|self\.say|self\._say|self\._notify|self\._warn|[a-z_]+\.(warning|info|error|debug|exception))$")
# An expression that holds a URL that may carry a password.
_URLISH = re.compile(r"(store_url|job_store|tracking_uri|resolved_tracking_uri|resolved_job_store|\burl\b|\.url\b|_url\b|\buri\b|checkpoint_dir\b|checkpoint_root\b)")
_REDACTORS = {"redact_url", "redact"}
# Builders of an error line that redact the URL they are given themselves (tests/test_store_failures.py
# checks that their lines hold no password).
_REDACTING_BUILDERS = {"store_failure"}


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://malleable:p@ss@db.internal:5432/malleable", "postgresql+psycopg://malleable:***@db.internal:5432/malleable"),
        ("http://alice:hunter2@mlflow.internal:5000", "http://alice:***@mlflow.internal:5000"),
        ("s3://AKIAKEY:wJalrSECRET@bucket/malleable", "s3://AKIAKEY:***@bucket/malleable"),
        ("postgresql+psycopg://u@db/x?password=hunter2&sslmode=require", "postgresql+psycopg://u@db/x?password=***&sslmode=require"),
        ("https://mlflow.internal/?token=abc123", "https://mlflow.internal/?token=***"),
        ("postgresql+psycopg://malleable@db.internal/malleable", "postgresql+psycopg://malleable@db.internal/malleable"),
        ("sqlite:////srv/malleable/jobs.db", "sqlite:////srv/malleable/jobs.db"),
        ("http://mlflow.malleable.svc:5000", "http://mlflow.malleable.svc:5000"),
    ],
)
def test_redact_url_hides_passwords_and_secret_parameters_only(url, shown):
    assert redact_url(url) == shown
    assert has_secret(url) == (url != shown)


def _call_name(node: ast.Call) -> str:
    return ast.unparse(node.func)


def _unredacted(expr: ast.AST) -> list[str]:
    """Sub-expressions of ``expr`` that name a URL and are not inside a redacting call."""
    if isinstance(expr, ast.Call):
        name = _call_name(expr).split(".")[-1]
        if name in ("str", "repr", "format"):
            return [x for a in expr.args for x in _unredacted(a)]
        return []  # redact_url(url), or a function of a URL (Path(url).name): not the URL itself
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Call):
        return [ast.unparse(expr)] if _URLISH.search("." + expr.attr) else []
    if isinstance(expr, (ast.Name, ast.Attribute, ast.Subscript)):
        text = ast.unparse(expr)
        return [text] if _URLISH.search(text) else []
    return [x for child in ast.iter_child_nodes(expr) for x in _unredacted(child)]


def _formatted(arg: ast.AST) -> list[ast.AST]:
    """The values an argument formats into the text (f-string fields, %/+ operands, the value itself)."""
    if isinstance(arg, ast.JoinedStr):
        return [v.value for v in arg.values if isinstance(v, ast.FormattedValue)]
    if isinstance(arg, ast.BinOp):
        return _formatted(arg.left) + _formatted(arg.right)
    if isinstance(arg, ast.Constant):
        return []
    return [arg]


def output_leaks(source: str) -> list[tuple[int, str]]:
    """(line, expression) for every URL an output call shows unredacted."""
    leaks = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _OUTPUT.match(_call_name(node)):
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                for value in _formatted(arg):
                    leaks += [(node.lineno, text) for text in _unredacted(value)]
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            # An error's message is printed by the CLI and logged by Prefect.
            for call in [n for n in ast.walk(node.exc) if isinstance(n, ast.Call)][:1]:
                if _call_name(call).split(".")[-1] in _REDACTING_BUILDERS:
                    continue
                for arg in call.args:
                    for value in _formatted(arg):
                        leaks += [(node.lineno, text) for text in _unredacted(value)]
    return sorted(leaks)


def test_the_scan_finds_what_it_claims():
    leaky = (
        "def f(store_url, settings):\n"
        "    print(f'submitted to the service at {store_url}')\n"
        "    log.warning('tracking at %s', settings.tracking_uri)\n"
        "    raise StoreError(f'job store URL {url!r}: bad')\n"
        "    say(f'serving {redact(self.store.url)}')\n"
        "    print(f'ok at {redact_url(store_url)}: {Path(store_url).name}')\n"
    )
    assert [line for line, _ in output_leaks(leaky)] == [2, 3, 4]


def test_no_print_or_log_shows_an_unredacted_url():
    leaks = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            leaks += [f"{path.relative_to(ROOT)}:{line}: {expr}" for line, expr in output_leaks(path.read_text(encoding="utf-8"))]
    assert leaks == []


# --- any password, any URL form, anywhere in a message (issue 37.1, 35.1) -------------------
from urllib.parse import quote  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from service.redaction import redact_text  # noqa: E402

# Printable ASCII but whitespace (a raw space ends a URL for every parser; written %20 it is
# covered by the encoded forms). The distinctive prefix keeps a short password from being, by
# chance, a substring of the host or the message around it: a false leak, not a real one.
_RAW = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=24)
_ANY = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=24)
_MARK = "Zq7"
_SCHEMES = ("postgresql+psycopg", "postgresql", "sqlite", "mysql+pymysql", "http", "https", "s3", "gs")
_AROUND = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="Zq"), max_size=30)


def _forms(password: str, encoded: str) -> list[tuple[str, str]]:
    """(URL, the password as the URL spells it) in every supported form."""
    return [
        ("{s}://alice:" + password + "@db.internal:5432/malleable", password),  # raw userinfo (no whitespace)
        ("{s}://alice:" + encoded + "@db.internal/malleable", encoded),  # %XX-encoded userinfo
        ("{s}://alice@db.internal/malleable?password=" + encoded + "&sslmode=require", encoded),
        ("{s}://db.internal/x?sslmode=require&token=" + encoded, encoded),
        ("{s}://alice:" + encoded + "@db.internal/x?sslpassword=" + encoded, encoded),
    ]


@settings(max_examples=300, deadline=None)
@given(raw=_RAW, anything=_ANY, scheme=st.sampled_from(_SCHEMES), before=_AROUND, after=_AROUND, quoted=st.sampled_from(["{}", "'{}'", '"{}"', "({})", "<{}>", "{}:", "{},"]))
def test_no_password_survives_redaction_anywhere_in_a_message(raw, anything, scheme, before, after, quoted):
    for password in (_MARK + raw, _MARK + anything):
        encoded = quote(password, safe="")
        for template, spelled in _forms(password, encoded):
            if " " in spelled:
                continue  # raw whitespace: not a URL (its %20 form is covered)
            url = template.replace("{s}", scheme, 1)
            message = f"{before} {quoted.replace('{}', url)} {after}"
            shown = redact_text(message)
            for secret in {password, encoded, spelled}:
                assert secret not in shown, (message, shown)
            assert "db.internal" in shown  # the host stays: the rest of the message is still useful


def test_a_url_mid_sentence_is_redacted_and_the_sentence_kept():
    message = "cannot connect to postgresql+psycopg://svc:s3cr/t#?@x@db:5432/jobs (timeout) after 10 s; retry"
    assert redact_text(message) == "cannot connect to postgresql+psycopg://svc:***@db:5432/jobs (timeout) after 10 s; retry"
    assert redact_text("env: PGPASSWORD=hunter2 MALLEABLE_X=1") == "env: PGPASSWORD=*** MALLEABLE_X=1"
    assert redact_text("http://mlflow:5000 by alice@vm") == "http://mlflow:5000 by alice@vm"
