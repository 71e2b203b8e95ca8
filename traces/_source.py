"""The source of each ``traces`` module as it was imported (the parsed-trace cache's code
fingerprint, :mod:`traces.cache`)."""
from __future__ import annotations

import xxhash

# module name -> xxh3-128 of its source file read when the module was (last) imported: a
# module reloaded after an edit records the new source, an edited file not yet reloaded keeps
# the recorded one, so the fingerprint follows the code that runs
IMPORTED: dict[str, str] = {}


def note_source(name: str, file: str) -> None:
    """Record the xxh3-128 of module ``name``'s source file ``file`` (call it at import)."""
    with open(file, "rb") as f:
        IMPORTED[name] = xxhash.xxh3_128_hexdigest(f.read())
