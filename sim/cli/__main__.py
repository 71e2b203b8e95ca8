"""``python -m sim.cli``: the ``kvsim`` command."""

from .entry import main

main()
