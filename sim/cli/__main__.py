"""``python -m sim.cli``: the ``kvsim`` command."""

from . import main

main()
