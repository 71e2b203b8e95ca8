"""Importance scores recorded from a real model, read from Parquet (:class:`RecordedImportance`):
the other importance source of the score-ranking policies (``importance_source: recorded``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np


class RecordedImportance:
    """Per-token importance scores recorded from a real model, read from Parquet.

    Schema (one row per (request, group, position[, step])):
      ``request_id`` int64, ``group`` int32, ``position`` int64, ``score`` float32, optional ``step``
      int64 (decode step the score was taken at; when present, ``scores(..., step=t)`` uses, per
      position, the row with the largest recorded step <= t, or the smallest step if none <= t).
    A file with a single group (group 0) is broadcast to any ``num_groups``; otherwise the file must
    hold groups 0..num_groups-1.

    Raises (at construction) FileNotFoundError if the file is missing, ValueError naming the file and
    column when a required column is missing or has a non-numeric type, naming the first row
    of a null in any column, of a NaN or infinite score, of a score beyond float32's range, of a
    negative request_id, group, position or step, or of a key beyond int64 (an unsigned 2**63
    or more),
    and naming the rows of a repeated (request_id, group, position[, step]) key (one score per
    key: the file does not say which of two is meant); (at query) KeyError naming
    the file, request and group / first missing positions when they are not recorded.
    """

    REQUIRED = ("request_id", "group", "position", "score")

    def __init__(self, path):
        import pyarrow.parquet as pq
        import pyarrow.types as pat

        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"importance file {self.path} does not exist")
        table = pq.read_table(self.path)
        names = table.schema.names
        for col in self.REQUIRED:
            if col not in names:
                raise ValueError(f"importance file {self.path}: missing column {col!r} "
                                 f"(required: {', '.join(self.REQUIRED)}; optional: step); has {names}")
        cols = list(self.REQUIRED) + (["step"] if "step" in names else [])
        for col in cols:
            t = table.schema.field(col).type
            ok = pat.is_floating(t) or pat.is_integer(t) if col == "score" else pat.is_integer(t)
            if not ok:
                raise ValueError(f"importance file {self.path}: column {col!r} has type {t}, "
                                 f"expected {'float' if col == 'score' else 'integer'}")
        for col in cols:
            nulls = table.column(col).null_count
            if nulls:
                k = int(np.flatnonzero(table.column(col).is_null().to_numpy(
                    zero_copy_only=False))[0])
                raise ValueError(f"importance file {self.path}: row {k}: column {col!r} is null "
                                 f"(null rows: {nulls}), expected "
                                 f"{'a finite score' if col == 'score' else 'an integer'}")
        score64 = table.column("score").to_numpy(zero_copy_only=False).astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(score64))
        if bad.size:
            k = int(bad[0])
            raise ValueError(f"importance file {self.path}: row {k}: score "
                             f"{table.column('score')[k].as_py()} (request_id "
                             f"{table.column('request_id')[k].as_py()}, position "
                             f"{table.column('position')[k].as_py()}), expected finite scores "
                             f"(rows that are not: {bad.size})")
        for col in cols[:3] + cols[4:]:  # the keys: request_id, group, position[, step]
            t = table.column(col).type
            v = table.column(col).to_numpy()
            # (an unsigned value >= 2**63 would wrap to a negative int64; a negative id, group,
            # position or step names nothing the simulator asks for)
            low = np.flatnonzero(v < 0) if pat.is_signed_integer(t) else np.zeros(0, np.int64)
            high = (np.flatnonzero(v > np.iinfo(np.int64).max) if pat.is_unsigned_integer(t)
                    else np.zeros(0, np.int64))
            if low.size:
                k = int(low[0])
                raise ValueError(f"importance file {self.path}: row {k}: {col} {int(v[k])}, "
                                 f"expected >= 0 (rows below 0: {low.size})")
            if high.size:
                k = int(high[0])
                raise ValueError(f"importance file {self.path}: row {k}: {col} {int(v[k])}, "
                                 f"expected at most 2**63 - 1 (an int64; rows above it: "
                                 f"{high.size})")
        rid = table.column("request_id").to_numpy().astype(np.int64)
        grp = table.column("group").to_numpy().astype(np.int64)
        pos = table.column("position").to_numpy().astype(np.int64)
        with np.errstate(over="ignore"):
            sc = score64.astype(np.float32)
        big = np.flatnonzero(~np.isfinite(sc))
        if big.size:  # (a float64 score beyond float32's range would be read as +-inf)
            k = int(big[0])
            raise ValueError(f"importance file {self.path}: row {k}: score {float(score64[k])!r} "
                             f"(request_id {int(rid[k])}, position {int(pos[k])}) is beyond "
                             f"float32's range (|score| <= {float(np.finfo(np.float32).max):.4g}; "
                             f"rows beyond it: {big.size}), expected scores that fit float32")
        self.has_step = "step" in names
        stp = table.column("step").to_numpy().astype(np.int64) if self.has_step else np.zeros_like(pos)
        order = np.lexsort((stp, pos, grp, rid))
        rid, grp, pos, sc, stp = rid[order], grp[order], pos[order], sc[order], stp[order]
        if rid.size > 1:
            # one score per key: a repeated key would be read as whichever row sorted last
            same = ((rid[1:] == rid[:-1]) & (grp[1:] == grp[:-1]) & (pos[1:] == pos[:-1])
                    & (stp[1:] == stp[:-1]))
            dup = np.flatnonzero(same)
            if dup.size:
                i = int(dup[0])
                rows = sorted(int(order[j]) for j in np.flatnonzero(
                    (rid == rid[i]) & (grp == grp[i]) & (pos == pos[i]) & (stp == stp[i])))
                key = (f"request_id {int(rid[i])}, group {int(grp[i])}, position {int(pos[i])}"
                       + (f", step {int(stp[i])}" if self.has_step else ""))
                raise ValueError(f"importance file {self.path}: rows {rows[:8]} repeat the key "
                                 f"({key}); expected one score per (request_id, group, position"
                                 f"{', step' if self.has_step else ''}) (rows repeating a key: {dup.size})")
        self._index = {}
        if rid.size:
            keys = np.stack([rid, grp], axis=1)
            cut = np.flatnonzero((np.diff(keys, axis=0) != 0).any(axis=1)) + 1
            for a, b in zip(np.r_[0, cut], np.r_[cut, rid.size]):
                self._index[(int(rid[a]), int(grp[a]))] = (pos[a:b], sc[a:b], stp[a:b])
        self.groups = {}
        for (r, g) in self._index:
            self.groups.setdefault(r, set()).add(g)

    def request_ids(self) -> list:
        """Recorded request ids."""
        return sorted(self.groups)

    def _lookup(self, request_key: int, group: int, pos: np.ndarray, step: int) -> np.ndarray:
        p, s, t = self._index[(request_key, group)]
        if self.has_step:
            # per position: last row with step <= requested, else first row of the position
            lo = np.searchsorted(p, pos, side="left")
            hi = np.searchsorted(p, pos, side="right")
            missing = hi == lo
            if missing.any():
                raise KeyError(f"importance file {self.path}: request {request_key} group {group} has no "
                               f"score for positions {pos[missing][:8].tolist()}")
            out = np.empty(pos.size, dtype=np.float32)
            for i, (a, b) in enumerate(zip(lo, hi)):
                k = a + np.searchsorted(t[a:b], step, side="right") - 1
                out[i] = s[max(k, a)]
            return out
        idx = np.searchsorted(p, pos)
        idx_c = np.minimum(idx, p.size - 1)
        missing = (idx >= p.size) | (p[idx_c] != pos)
        if missing.any():
            raise KeyError(f"importance file {self.path}: request {request_key} group {group} has no "
                           f"score for positions {pos[missing][:8].tolist()}")
        return s[idx_c]

    def scores(self, request_key: int, positions, num_groups: int, step: int = 0,
               seq_len: Optional[int] = None) -> np.ndarray:
        """Recorded scores ``float32[num_groups, len(positions)]`` (same signature as ImportanceModel).

        Raises KeyError (naming file, request, group, positions) if anything is not recorded.
        """
        pos = np.asarray(positions, dtype=np.int64).ravel()
        if request_key not in self.groups:
            raise KeyError(f"importance file {self.path}: request {request_key} not recorded "
                           f"(has {self.request_ids()[:8]}...)")
        gs = self.groups[request_key]
        out = np.empty((num_groups, pos.size), dtype=np.float32)
        if gs == {0} and num_groups > 1:
            out[:] = self._lookup(request_key, 0, pos, step)[None, :]
            return out
        for g in range(num_groups):
            if g not in gs:
                raise KeyError(f"importance file {self.path}: request {request_key} has no group {g} "
                               f"(recorded groups {sorted(gs)}, asked for {num_groups})")
            out[g] = self._lookup(request_key, g, pos, step)
        return out
