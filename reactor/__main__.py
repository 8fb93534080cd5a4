"""``python -m reactor``: the same as the ``reactor`` command."""

from .cli import main

main()
