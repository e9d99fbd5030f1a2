"""What the ``malleable`` commands share, so that no command imports another: one-line errors and
quiet libraries (``console``), settings and services that fail as one line (``common``), live
progress lines and tables, and the Ctrl-C / SIGTERM paths (``interrupts``, ``stop_latch``).
"""
