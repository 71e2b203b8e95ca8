"""Error type raised by every trace loader, and the collector used by ``on_error``."""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["TraceError", "ErrorSink"]


class TraceError(ValueError):
    """A trace file (or trace configuration) that cannot be turned into a :class:`Workload`.

    Carries where the problem is and what was found versus expected, and prints as e.g.::

        /path/conversation_trace.jsonl line 17, field 'hash_ids': found 3 ids, expected ceil(2000/512)=4

    Attributes:
        path: file (or folder) the problem is in, or None for configuration errors.
        where: location inside the file: ``"line 17"`` (1-based file line, CSV header = line 1),
            ``"window '21600'"`` (ServeGen dataset.json), or None.
        field: field / column name, or None.
        found: what was found (already rendered as text).
        expected: what was expected (text).
        hint: optional extra sentence (e.g. how to set ``trace.path``).
    """

    def __init__(
        self,
        message: Optional[str] = None,
        *,
        path: Optional[str] = None,
        where: Optional[str] = None,
        field: Optional[str] = None,
        found: Any = None,
        expected: Any = None,
        hint: Optional[str] = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.where = where
        self.field = field
        self.found = found
        self.expected = expected
        self.hint = hint
        self.message = message
        super().__init__(self._render())

    def _render(self) -> str:
        head = []
        if self.path:
            head.append(self.path)
        if self.where:
            head.append(self.where)
        loc = " ".join(head)
        if self.field:
            loc = f"{loc}, field '{self.field}'" if loc else f"field '{self.field}'"
        parts = []
        if self.message:
            parts.append(self.message)
        if self.found is not None:
            parts.append(f"found {self.found}")
        if self.expected is not None:
            parts.append(f"expected {self.expected}")
        body = ", ".join(parts)
        text = f"{loc}: {body}" if loc else body
        if self.hint:
            text = f"{text}. {self.hint}"
        return text


class ErrorSink:
    """Applies the ``on_error`` policy to bad rows.

    ``fail``: re-raise the first error. ``skip``: count the row, keep the first ``keep`` messages.
    """

    def __init__(self, mode: str, keep: int = 10) -> None:
        if mode not in ("fail", "skip"):
            raise TraceError(field="on_error", found=repr(mode), expected="'fail' or 'skip'")
        self.mode = mode
        self.keep = keep
        self.count = 0
        self.examples: list[str] = []

    def bad(self, err: TraceError) -> None:
        """Report one bad row: raises in ``fail`` mode, records it in ``skip`` mode."""
        if self.mode == "fail":
            raise err
        self.count += 1
        if len(self.examples) < self.keep:
            self.examples.append(str(err))

    def as_dict(self) -> dict:
        return {"count": self.count, "examples": list(self.examples)}

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
