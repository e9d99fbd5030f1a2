"""malleable: elastic deep-learning training — policies, a simulator, elastic ranks, a scheduler
service and the ``malleable`` CLI.

The Python API a script may rely on across releases is ``malleable.api`` (docs/api.md); every
other module is the implementation and may move (a module that moved keeps answering under its
old name for a while, with a DeprecationWarning: ``allocator.MOVED``).
"""
