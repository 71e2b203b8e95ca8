"""Trace configuration (Hydra structured-config schema of group ``trace``: the common options
and every registered format's, :mod:`traces.registry`) and path resolution."""
from __future__ import annotations

import dataclasses
import inspect
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from ._common import check_choice
from .errors import TraceError
from .registry import FORMATS, option_fields, session_arrival_of

__all__ = [
    "TraceConfig",
    "TRACE_FORMATS",
    "PRESET_PATHS",
    "BUNDLED_PRESET",
    "traces_dir",
    "resolve_path",
    "coerce_config",
    "recorded_clock",
    "session_arrival_of",
]

#: The preset shipped inside the package (default trace).
BUNDLED_PRESET = "mooncake_conversation_10min"
BUNDLED_FILE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_10min.jsonl"
#: Every slice shipped in ``traces/data`` (see traces/data/NOTICE.md), by preset name.
BUNDLED_FILES: dict[str, Path] = {
    BUNDLED_PRESET: BUNDLED_FILE,
    "weka_agentic_slice": Path(__file__).resolve().parent / "data" / "weka_agentic_trace_0002.jsonl.xz",
    "claude_code": Path(__file__).resolve().parent / "data" / "claude_code_sample.jsonl.xz",
}

#: Default location of each preset's data, relative to :func:`traces_dir` (``path: null``).
PRESET_PATHS: dict[str, str] = {
    "mooncake_conversation": "mooncake/conversation_trace.jsonl",
    "mooncake_synthetic": "mooncake/synthetic_trace.jsonl",
    "azure_conv": "azure2023/AzureLLMInferenceTrace_conv.csv",
    "azure_code": "azure2023/AzureLLMInferenceTrace_code.csv",
    "weka_agentic": "weka_agentic/weka_traces.jsonl.xz",
    "servegen_r1": "servegen_deepseek_r1",
}


@dataclass
class CommonOptions:
    """What trace to load and how to slice it: the options every format reads.

    Attributes:
        name: preset name (``experiments/conf/trace/<name>.yaml``); used to find the default path.
        format: one of :data:`TRACE_FORMATS` (:data:`traces.registry.FORMATS`).
        path: trace file or folder; None = preset default (bundled slice for
            ``mooncake_conversation_10min``, else ``<traces_dir>/<PRESET_PATHS[name]>``, else,
            when ``name`` is the format's name, the format's ``default_path``;
            ``traces_dir`` = env ``KVSIM_TRACES_DIR`` or ``<repo>/../shared/traces``).
            Generated formats do not read it.
        time_scale: factor (> 0) applied to every ``arrival_s`` after slicing (0.5 = twice the load).
            ``think_s`` is not scaled.
        max_requests: keep only the first N rows (canonical order) after time slicing.
        start_s, duration_s: keep roots with ``start_s <= arrival < start_s + duration_s`` on the
            trace clock (before ``time_scale``) plus their descendants; arrivals are rebased so
            ``start_s`` becomes 0 (then, with ``rebase_to_first_arrival``, the first kept arrival).
        on_error: ``fail`` (raise on the first bad row) | ``skip`` (skip, count, keep 10 examples).
        zero_output: rows whose recorded output length is 0: ``as_one`` (load with
            output_tokens = 1, i.e. prefill plus the one sampled token; counted in ``warnings``
            and ``notes['zero_output_rows']``) | ``error`` (treat as a bad row).
        cache: keep the parsed trace on disk and reuse it when the file, the options the loader
            reads, the seed and the loader code are the same (``traces.cache``; results are the
            same bit for bit).
        cache_dir: where (None = ``$KVSIM_CACHE_DIR/traces``, else ``~/.cache/kvsim/traces``).
        rebase_to_first_arrival: traces of recorded timestamps (Mooncake, Azure; Weka, Claude
            Code and OpenAI logs with ``session_arrival=absolute``: :func:`recorded_clock`):
            count arrivals from the first kept request's arrival instead of ``start_s`` (a slice
            of a trace whose clock does not start at 0, such as Mooncake's arXiv trace at
            1,178,625 ms, then starts at 0 s; the shift is ``Workload.notes['rebase_s']``, named
            in ``warnings`` and in summary.json's ``trace_rebase_s``). ``false``: the trace clock
            minus ``start_s``. Generated traces and ServeGen's sampled arrivals keep their clock.
    """

    name: str = BUNDLED_PRESET
    format: str = "mooncake"
    path: Optional[str] = None
    time_scale: float = 1.0
    max_requests: Optional[int] = None
    start_s: float = 0.0
    duration_s: Optional[float] = None
    on_error: str = "fail"
    zero_output: str = "as_one"
    cache: bool = True
    cache_dir: Optional[str] = None
    rebase_to_first_arrival: bool = True


def _build_trace_config() -> type:
    """``TraceConfig``: a dataclass of :class:`CommonOptions`' fields, then every registered
    format's options (a field two formats share once), each with its type and default; its
    docstring is CommonOptions' followed by the docstring of each format's options class and
    of the dataclasses it derives from."""
    import traces.formats  # noqa: F401  (each format module registers itself)

    specs, shown = [], {CommonOptions}
    docs = [(CommonOptions.__doc__ or "").rstrip(), "",
            "    Each format's own options (``trace.format`` selects the format; the others' "
            "options are not read):"]
    for options in [CommonOptions] + [f.options for f in FORMATS.values()]:
        for cls in reversed([b for b in options.__mro__ if dataclasses.is_dataclass(b)]):
            if cls in shown or not cls.__doc__:
                continue
            shown.add(cls)
            users = [n for n, f in FORMATS.items() if issubclass(f.options, cls)]
            docs.append(f"\n    {', '.join(users)} (``{cls.__module__}.{cls.__name__}``):")
            docs.extend(("    " + line).rstrip()
                        for line in inspect.cleandoc(cls.__doc__).splitlines())
        for name, (typ, f) in option_fields(options).items():
            if name in {s[0] for s in specs}:
                continue
            kw = ({"default": f.default} if f.default is not dataclasses.MISSING
                  else {"default_factory": f.default_factory})
            specs.append((name, typ, dataclasses.field(**kw)))
    return dataclasses.make_dataclass(
        "TraceConfig", specs,
        namespace={"__module__": __name__, "__doc__": "\n".join(docs) + "\n    "})


#: What trace to load and how to turn it into a workload (Hydra's structured config of the
#: ``trace`` group): :class:`CommonOptions`' fields and every registered format's options.
#: All fields have defaults; the default config loads the bundled Mooncake 10-minute slice.
TraceConfig = _build_trace_config()

#: Valid values of ``TraceConfig.format``, in registration order.
TRACE_FORMATS: tuple[str, ...] = tuple(FORMATS)

_FIELD_NAMES = tuple(f.name for f in fields(TraceConfig))


def coerce_config(cfg: Any) -> TraceConfig:
    """Turn a TraceConfig, an OmegaConf DictConfig or a plain mapping into a validated TraceConfig.

    Raises:
        TraceError: unknown keys, unknown format, or an out-of-range option.
    """
    if cfg is None:
        cfg = TraceConfig()
    if isinstance(cfg, TraceConfig):
        data = {n: getattr(cfg, n) for n in _FIELD_NAMES}
    else:
        try:  # OmegaConf DictConfig (structured or plain)
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                cfg = OmegaConf.to_container(cfg, resolve=True)
        except ImportError:  # pragma: no cover
            pass
        if not isinstance(cfg, dict):
            raise TraceError(field="trace", found=type(cfg).__name__,
                             expected="TraceConfig, DictConfig or dict")
        unknown = sorted(set(cfg) - set(_FIELD_NAMES))
        if unknown:
            raise TraceError("unknown trace config keys", found=unknown,
                             expected=f"a subset of {list(_FIELD_NAMES)}")
        data = dict(cfg)
    if data.get("clients") is not None:
        data["clients"] = [int(c) for c in data["clients"]]
    c = TraceConfig(**data)
    _validate(c)
    return c


# float fields where +inf is a value (a format's ``infinite``, e.g. bench's request_rate)
INF_FIELDS = tuple(dict.fromkeys(n for f in FORMATS.values() for n in f.infinite))


def _validate(c: TraceConfig) -> None:
    for f in fields(c):  # NaN and infinities pass the range checks below
        v = getattr(c, f.name)
        if f.name in INF_FIELDS and v == math.inf:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(field=f.name, found=v, expected="a finite number")
    check_choice(c, "format", TRACE_FORMATS)
    check_choice(c, "on_error", ("fail", "skip"))
    check_choice(c, "zero_output", ("as_one", "error"))
    if not isinstance(c.rebase_to_first_arrival, bool):
        raise TraceError(field="rebase_to_first_arrival", found=repr(c.rebase_to_first_arrival),
                         expected="true or false")
    if not isinstance(c.cache, bool):
        raise TraceError(field="cache", found=repr(c.cache), expected="true or false")
    if c.cache_dir is not None and not (isinstance(c.cache_dir, str) and c.cache_dir.strip()):
        raise TraceError(field="cache_dir", found=repr(c.cache_dir),
                         expected="a folder path or null")
    if not (c.time_scale > 0):
        raise TraceError(field="time_scale", found=c.time_scale, expected="> 0")
    if c.max_requests is not None and c.max_requests < 1:
        raise TraceError(field="max_requests", found=c.max_requests, expected=">= 1 or null")
    if c.duration_s is not None and not (c.duration_s > 0):
        raise TraceError(field="duration_s", found=c.duration_s, expected="> 0 or null")
    if c.start_s < 0:
        raise TraceError(field="start_s", found=c.start_s, expected=">= 0")
    fmt = FORMATS[c.format]
    if fmt.check is not None:
        fmt.check(c)


def recorded_clock(c: TraceConfig) -> bool:
    """Whether ``c``'s arrivals are recorded timestamps (``rebase_to_first_arrival`` applies):
    the format's :attr:`~traces.registry.TraceFormat.recorded_clock` (Mooncake and Azure, and
    the session formats with ``session_arrival=absolute``)."""
    f = FORMATS[c.format].recorded_clock
    return f is not None and bool(f(c))


def traces_dir() -> Path:
    """Folder holding the real traces: env ``KVSIM_TRACES_DIR``, else ``<repo>/../shared/traces``
    where ``<repo>`` is the parent of the ``traces`` package folder."""
    env = os.environ.get("KVSIM_TRACES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    return repo.parent / "shared" / "traces"


def resolve_path(c: TraceConfig) -> Optional[Path]:
    """The file/folder to read for ``c`` (None for generated formats), as an absolute path (a
    relative ``trace.path`` is taken from the working folder, else from the traces folder).

    Raises:
        TraceError: no default known for ``c.name``, or the path does not exist.
    """
    fmt = FORMATS[c.format]
    if fmt.generated:
        return None
    hint = fmt.path_hint + " or set KVSIM_TRACES_DIR to the folder holding the traces"
    if c.path is not None:
        p = Path(os.path.expanduser(str(c.path)))
        if not p.is_absolute() and not p.exists():
            alt = traces_dir() / p
            if alt.exists():
                p = alt
    elif c.name in BUNDLED_FILES:
        p = BUNDLED_FILES[c.name]
    elif c.name in PRESET_PATHS:
        p = traces_dir() / PRESET_PATHS[c.name]
    elif c.name == c.format and fmt.default_path is not None:
        p = traces_dir() / fmt.default_path
    else:
        raise TraceError(
            "unknown trace name and no trace.path given", field="name", found=repr(c.name),
            expected=f"a preset in {[*BUNDLED_FILES, *PRESET_PATHS]} or a format name",
            hint=hint)
    if not p.exists():
        if c.path is not None:  # (the user's file: the preset's file was not looked for)
            raise TraceError(f"{fmt.input} not found", path=str(p), field="trace.path",
                             expected=f"an existing {c.format} {fmt.input} (trace.path is taken "
                                      f"from the working folder, a relative one then from "
                                      f"{traces_dir()})")
        raise TraceError(f"{fmt.input} not found", path=str(p),
                         expected=f"the {c.format} trace for the trace preset '{c.name}'",
                         hint=hint)
    return p.absolute()  # (a relative trace.path is recorded where it pointed: provenance)


from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
