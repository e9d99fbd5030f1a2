"""One module per ``malleable`` command (``flows/commands/cli.py`` names them and imports one lazily).

A command module never imports another: what two commands share lives in ``shared/`` (console,
settings, live lines, tables, signals) or beside them in ``flows/`` (``idle_replay``) —
``tests/test_cli_lazy.py`` checks it from the sources.
"""
