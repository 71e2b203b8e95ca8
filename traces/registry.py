"""The trace formats kvsim reads: ``trace.format`` -> :class:`TraceFormat` (:data:`FORMATS`).

Each module of the :mod:`traces.formats` package declares its options (a dataclass whose fields,
with their defaults, become ``trace.<field>`` options) and calls :func:`register` at import;
importing :mod:`traces.formats` imports every module in it. :mod:`traces.config` builds
``TraceConfig`` (Hydra's schema of the ``trace`` group) from the common fields and the options of
every registered format, and :func:`traces.loader.load_workload` calls the format's ``load``.
CONTRIBUTING.md ("Adding a trace format") has the recipe.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["TraceFormat", "FORMATS", "register", "all_formats", "session_arrival_of", "readers_of"]

#: Kinds of input a format reads from ``trace.path`` (the word used in "not found" messages).
INPUTS = ("trace file", "trace folder", "trace file or folder", "generated")


@dataclass(frozen=True)
class TraceFormat:
    """One trace format.

    Attributes:
        name: the value of ``trace.format`` that selects it.
        options: a dataclass whose fields (each with a default) are the format's own
            ``trace.<field>`` options; its docstring documents them. Two formats may declare the
            same field only with the same type and default (:func:`register` checks).
        load: ``load(path, cfg, rng, sink, seed) -> traces._common.Parsed``: ``path`` the
            resolved input (None for a generated format), ``cfg`` the validated ``TraceConfig``,
            ``rng`` a generator seeded from the run's seed, ``sink`` the
            :class:`~traces.errors.ErrorSink` of ``trace.on_error``, ``seed`` the run's seed.
            Raises :class:`~traces.errors.TraceError` naming file, line and field.
        input: what ``trace.path`` names, one of :data:`INPUTS` (``generated``: nothing is read,
            ``trace.path`` and the parsed-trace cache are not used).
        path_hint: how to point ``trace.path`` at the input (the end of a "not found" message).
        default_path: the input's place under :func:`traces.config.traces_dir` when
            ``trace.name`` is the format's name and ``trace.path`` is null.
        check: ``check(cfg)``, the format's own checks of a ``TraceConfig`` that selects it
            (raises TraceError naming the field); run by ``traces.config.coerce_config``.
        recorded_clock: ``recorded_clock(cfg) -> bool``, whether the arrivals are recorded
            timestamps (``trace.rebase_to_first_arrival`` applies); None: never.
        session_arrival_default: ``trace.session_arrival`` when it is null (formats of
            sessions; :func:`session_arrival_of`).
        seed_keyed: the loader reads ``seed`` itself, so its cache entries are per seed; False:
            it draws only from ``rng`` and the cache keeps one entry for every seed when it drew
            nothing.
        input_files: ``input_files(path) -> [(name, file), ...] | None``: the files the loader
            reads from ``path`` (the cache's input fingerprint); None: ``path`` itself when it
            is a regular file.
        infinite: fields of ``options`` where ``inf`` is a value (others must be finite).
    """

    name: str
    options: type
    load: Callable[..., Any]
    input: str = "trace file"
    path_hint: str = ("Point trace.path at the file (e.g. `trace.path=/data/traces/x.jsonl` on "
                      "the Hydra command line)")
    default_path: Optional[str] = None
    check: Optional[Callable[[Any], None]] = None
    recorded_clock: Optional[Callable[[Any], bool]] = None
    session_arrival_default: Optional[str] = None
    seed_keyed: bool = False
    input_files: Optional[Callable[[Path], Optional[list]]] = None
    infinite: tuple[str, ...] = ()

    @property
    def generated(self) -> bool:
        """Whether the format is generated from its options (no input is read)."""
        return self.input == "generated"


#: ``trace.format`` -> its :class:`TraceFormat`, in registration order.
FORMATS: dict[str, TraceFormat] = {}
_MODULE: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def option_fields(options: type) -> dict[str, tuple[Any, dataclasses.Field]]:
    """``{name: (type, field)}`` of the dataclass ``options``, types resolved (cached per class:
    do not change the result)."""
    hints = typing.get_type_hints(options)
    return {f.name: (hints[f.name], f) for f in dataclasses.fields(options)}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def register(fmt: TraceFormat, module: str) -> TraceFormat:
    """Add ``fmt`` to :data:`FORMATS` (call at the import of ``module``, the format's module;
    importing it again, as ``importlib.reload`` does, replaces its entry).

    Raises:
        ValueError: ``fmt.name`` registered by another module; ``fmt.input`` not one of
            :data:`INPUTS`; ``fmt.options`` not a dataclass, a field without a default, or a
            field another format declares with another type or default.
    """
    if fmt.name in FORMATS and _MODULE[fmt.name] != module:
        raise ValueError(f"trace format {fmt.name!r} of {module} is registered by "
                         f"{_MODULE[fmt.name]} already")
    if fmt.input not in INPUTS:
        raise ValueError(f"trace format {fmt.name!r}: input={fmt.input!r}, expected one of "
                         f"{list(INPUTS)}")
    if not dataclasses.is_dataclass(fmt.options):
        raise ValueError(f"trace format {fmt.name!r}: options {fmt.options!r} is not a dataclass")
    mine = option_fields(fmt.options)
    for name, (typ, f) in mine.items():
        if _default(f) is dataclasses.MISSING:
            raise ValueError(f"trace format {fmt.name!r}: option {name} has no default")
        for other in FORMATS.values():
            if other.name == fmt.name:
                continue
            theirs = option_fields(other.options).get(name)
            if theirs is not None and (theirs[0] != typ or _default(theirs[1]) != _default(f)):
                raise ValueError(
                    f"trace format {fmt.name!r}: option {name}: {typ} = {_default(f)!r}, but "
                    f"format {other.name!r} declares {theirs[0]} = {_default(theirs[1])!r} (one "
                    f"trace.{name} serves both: give it the same type and default, or another "
                    f"name)")
    for name in fmt.infinite:
        if name not in mine:
            raise ValueError(f"trace format {fmt.name!r}: infinite names {name}, not an option")
    FORMATS[fmt.name] = fmt
    _MODULE[fmt.name] = module
    return fmt


def all_formats() -> dict[str, TraceFormat]:
    """:data:`FORMATS` with every module of :mod:`traces.formats` imported (registered)."""
    import traces.formats  # noqa: F401

    return FORMATS


def session_arrival_of(c: Any) -> str:
    """``c.session_arrival``, or, when it is null, the default of ``c``'s format
    (:attr:`TraceFormat.session_arrival_default`; ``poisson`` for a format without one)."""
    fmt = FORMATS.get(c.format)
    return c.session_arrival or (fmt and fmt.session_arrival_default) or "poisson"


def readers_of(field: str) -> list[str]:
    """The formats that read ``trace.<field>``, in registration order: those whose options
    declare it; for ``rebase_to_first_arrival``, those with a recorded clock. An empty list
    for the other common fields and unknown names."""
    formats = all_formats()
    if field == "rebase_to_first_arrival":
        return [n for n, f in formats.items() if f.recorded_clock is not None]
    return [n for n, f in formats.items() if field in option_fields(f.options)]


from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
