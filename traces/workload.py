"""Canonical workload table: one row per request.

``WORKLOAD_SCHEMA`` columns:

=====================  ==============  =====================================================
column                 type            meaning
=====================  ==============  =====================================================
request_id             int64           0..N-1, equal to the row index. Rows are ordered so
                                       that every parent precedes its children; roots are in
                                       non-decreasing ``arrival_s`` order.
session_id             int64           session / conversation id (= request_id for
                                       single-shot traces). Weka sub-agent requests keep
                                       their parent session's id.
turn                   int32           0-based index of the request in its chain.
arrival_s              float64         roots (parent == -1): absolute open-loop arrival (s).
                                       Children: recorded/generated arrival, informational.
think_s                float64         children: delay (s) after the parent FINISHES before
                                       this request arrives (closed loop). 0 for roots.
parent_request_id      int64           -1 = open-loop root, else the request whose finish
                                       (+ think_s) releases this one.
input_tokens           int64           prompt length, > 0.
output_tokens          int64           tokens to generate, >= 1.
prefix_ids             list<int64>     content identity of the prompt: prefix-chained,
                                       globally unique ids; equal id at position j => equal
                                       prompt tokens [0, (j+1)*G). Mooncake also lists the
                                       last, partial block (ceil(in/G) ids); Weka and the
                                       synthetic generators list full blocks only
                                       (floor(in/G)). Empty = no identity (Azure, ServeGen).
prefix_block_tokens    int32           G, tokens per prefix id (0 when no identity).
=====================  ==============  =====================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa

__all__ = ["WORKLOAD_SCHEMA", "Workload", "build_table"]

WORKLOAD_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("request_id", pa.int64(), nullable=False),
        pa.field("session_id", pa.int64(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("arrival_s", pa.float64(), nullable=False),
        pa.field("think_s", pa.float64(), nullable=False),
        pa.field("parent_request_id", pa.int64(), nullable=False),
        pa.field("input_tokens", pa.int64(), nullable=False),
        pa.field("output_tokens", pa.int64(), nullable=False),
        pa.field("prefix_ids", pa.list_(pa.field("item", pa.int64(), nullable=False)),
                 nullable=False),
        pa.field("prefix_block_tokens", pa.int32(), nullable=False),
    ]
)


def build_table(
    *,
    session_id: np.ndarray,
    turn: np.ndarray,
    arrival_s: np.ndarray,
    think_s: np.ndarray,
    parent_request_id: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    prefix_offsets: np.ndarray,
    prefix_values: np.ndarray,
    block_tokens: int,
) -> pa.Table:
    """Assemble a table with :data:`WORKLOAD_SCHEMA` (request_id = row index).

    ``prefix_offsets`` (len N+1, starting at 0) and ``prefix_values`` (int64) are wrapped
    without copying the values.
    """
    n = len(session_id)
    offs = np.asarray(prefix_offsets)
    if offs.size and offs[-1] > np.iinfo(np.int32).max:  # pragma: no cover - > 2 G ids
        raise ValueError("more than 2**31 prefix ids; large_list not supported")
    values = pa.array(np.ascontiguousarray(prefix_values, dtype=np.int64))
    lst = pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), values,
                                   type=WORKLOAD_SCHEMA.field("prefix_ids").type)
    cols = [
        pa.array(np.arange(n, dtype=np.int64)),
        pa.array(np.asarray(session_id, dtype=np.int64)),
        pa.array(np.asarray(turn, dtype=np.int32)),
        pa.array(np.asarray(arrival_s, dtype=np.float64)),
        pa.array(np.asarray(think_s, dtype=np.float64)),
        pa.array(np.asarray(parent_request_id, dtype=np.int64)),
        pa.array(np.asarray(input_tokens, dtype=np.int64)),
        pa.array(np.asarray(output_tokens, dtype=np.int64)),
        lst,
        pa.array(np.full(n, block_tokens, dtype=np.int32)),
    ]
    return pa.Table.from_arrays(cols, schema=WORKLOAD_SCHEMA)


def _col(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if col.num_chunks == 1:
        return col.chunk(0).to_numpy(zero_copy_only=True)
    return col.to_numpy()


@dataclass
class Workload:
    """A loaded trace: the request table plus provenance.

    Attributes:
        table: ``pyarrow.Table`` with :data:`WORKLOAD_SCHEMA` (single chunk per column).
        name: preset / trace name.
        source: path string of the file or folder read ("synthetic:<format>" for generators).
        prefix_block_tokens: G, tokens per prefix id (0 = no prefix identity).
        closed_loop: True when some rows have a parent (released by the parent's finish).
        skipped: ``{"count": n, "examples": [message, ...]}`` (first 10) for ``on_error=skip``.
        warnings: human-readable notes about anything changed or assumed while loading.
        notes: loader facts (rows read, load seconds, peak RSS MB, ...).
        extra: optional per-row numpy arrays aligned with the table (e.g. ServeGen
            ``reason_ratio``).
    """

    table: pa.Table
    name: str
    source: str
    prefix_block_tokens: int
    closed_loop: bool
    skipped: dict = field(default_factory=lambda: {"count": 0, "examples": []})
    warnings: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def request_id(self) -> np.ndarray:
        """int64[N], equal to the row index."""
        return _col(self.table, "request_id")

    @property
    def session_id(self) -> np.ndarray:
        """int64[N]."""
        return _col(self.table, "session_id")

    @property
    def turn(self) -> np.ndarray:
        """int32[N]."""
        return _col(self.table, "turn")

    @property
    def arrival_s(self) -> np.ndarray:
        """float64[N], seconds (roots: open-loop arrival; children: informational)."""
        return _col(self.table, "arrival_s")

    @property
    def think_s(self) -> np.ndarray:
        """float64[N], seconds after the parent finishes (0 for roots)."""
        return _col(self.table, "think_s")

    @property
    def parent_request_id(self) -> np.ndarray:
        """int64[N], -1 for roots."""
        return _col(self.table, "parent_request_id")

    @property
    def input_tokens(self) -> np.ndarray:
        """int64[N], > 0."""
        return _col(self.table, "input_tokens")

    @property
    def output_tokens(self) -> np.ndarray:
        """int64[N], >= 1."""
        return _col(self.table, "output_tokens")

    def _prefix_chunk(self) -> pa.ListArray:
        col = self.table.column("prefix_ids")
        if col.num_chunks != 1:
            self.table = self.table.combine_chunks()
            col = self.table.column("prefix_ids")
        return col.chunk(0)

    def prefix_offsets(self) -> np.ndarray:
        """int64[N+1]: request i's ids are ``prefix_values()[off[i]:off[i+1]]``.

        Offsets index into :meth:`prefix_values` (they need not start at 0 after slicing)."""
        return self._prefix_chunk().offsets.to_numpy().astype(np.int64)

    def prefix_values(self) -> np.ndarray:
        """int64 flat prefix ids (zero-copy view of the Arrow buffer)."""
        return self._prefix_chunk().values.to_numpy(zero_copy_only=True)

    def prefix_ids_of(self, i: int) -> np.ndarray:
        """Prefix ids of request ``i`` (int64 view)."""
        off = self._prefix_chunk().offsets
        a, b = off[i].as_py(), off[i + 1].as_py()
        return self.prefix_values()[a:b]

    @property
    def num_sessions(self) -> int:
        return int(np.unique(self.session_id).size) if len(self) else 0

    def summary(self) -> dict:
        """Small dict of headline numbers (rows, sessions, tokens, time span)."""
        n = len(self)
        if n == 0:
            return {"requests": 0}
        arr = self.arrival_s
        roots = self.parent_request_id < 0
        return {
            "requests": n,
            "roots": int(roots.sum()),
            "sessions": self.num_sessions,
            "input_tokens": int(self.input_tokens.sum()),
            "output_tokens": int(self.output_tokens.sum()),
            "prefix_ids": int(len(self.prefix_values())),
            "root_arrival_span_s": float(arr[roots].max() - arr[roots].min()) if roots.any() else 0.0,
        }

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
