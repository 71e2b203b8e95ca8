"""Which parsed rows a trace's slice keeps (``start_s``, ``duration_s``, ``max_requests``), in
the loader's canonical order (:func:`kept_rows`)."""
from __future__ import annotations

import numpy as np

from .config import TraceConfig


def _roots_of(parent: np.ndarray) -> np.ndarray:
    """Index of each row's chain root (parents precede children)."""
    root = np.arange(parent.size, dtype=np.int64)
    kids = np.flatnonzero(parent >= 0)
    if kids.size:
        par = parent.tolist()
        r = root.tolist()
        for i in kids.tolist():
            r[i] = r[par[i]]
        root = np.asarray(r, dtype=np.int64)
    return root


def kept_rows(parent: np.ndarray, arr: np.ndarray, cfg: TraceConfig) -> np.ndarray:
    """The parsed rows the slicing keeps, in canonical order (int64 row indices): roots
    non-decreasing in arrival, each root's chain after it; roots (with their chains) arriving
    in ``[start_s, start_s + duration_s)`` on the trace clock; the first ``max_requests``.
    ``parent``: each row's parent row or -1 (parents precede children); ``arr``: arrivals (s)."""
    n = parent.size
    root = _roots_of(parent)
    order = None
    ra = arr[parent < 0]
    if ra.size > 1 and np.any(np.diff(ra) < 0):
        order = np.lexsort((np.arange(n), root, arr[root]))
    hi = np.inf if cfg.duration_s is None else cfg.start_s + cfg.duration_s
    keep_root = (arr[root] >= cfg.start_s) & (arr[root] < hi)
    idx = np.arange(n) if order is None else order
    idx = idx[keep_root[idx]]
    if cfg.max_requests is not None:
        idx = idx[: cfg.max_requests]
    return idx


from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
