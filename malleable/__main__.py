"""``python -m malleable``: the ``malleable`` command, where its script is not on PATH."""

from flows.commands.cli import main

if __name__ == "__main__":
    main()
