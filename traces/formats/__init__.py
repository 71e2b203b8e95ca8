"""The trace formats: one module per format (or family of formats sharing options), each
declaring its options dataclass and calling :func:`traces.registry.register` at import.
Importing this package imports every module in it, in name order, so a new format is one module
here plus a preset in ``experiments/conf/trace/`` (CONTRIBUTING.md, "Adding a trace format").

Composing a run's config imports every format module (``TraceConfig`` holds their options), so
a format module imports numpy, and anything else heavy, inside the functions that use it."""
from __future__ import annotations

import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
