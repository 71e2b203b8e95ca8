"""kvsim trace loaders: real and synthetic LLM-serving traces -> one canonical workload table.

Public API (the simulator codes against exactly these names):

* :func:`load_workload` ``(cfg, seed) -> Workload``
* :class:`Workload` (``table`` with :data:`WORKLOAD_SCHEMA` plus provenance and numpy accessors)
* :class:`TraceConfig` (Hydra structured config of group ``trace``)
* :class:`TraceError` (``ValueError`` naming file, line, field, found, expected)
* :data:`WORKLOAD_SCHEMA`, :data:`TRACE_FORMATS`

Formats: ``mooncake`` (Qin et al., FAST'25), ``azure`` (Patel et al., Splitwise, ISCA'24),
``weka`` (WEKA kv-cache-tester agentic traces), ``servegen`` (Xiang et al., arXiv 2505.09999),
seeded generators ``synthetic_agentic``, ``synthetic_reasoning``, ``synthetic_multiturn``, and
``bench``, a serving benchmark's client (closed loop at a fixed concurrency or open loop at a
request rate, vLLM's random-dataset lengths; :func:`traces.generate_bench`), and agent
transcripts: ``claude_code`` (Claude Code session JSONL) and ``openai_log`` (OpenAI-compatible
chat completion logs), docs/AGENT_TRACES.md.
See ``traces/README.md`` for each mapping and its assumptions. Mooncake timestamps are quantised
into ~3 s buckets; ``TraceConfig.timestamp_spread`` (default ``even``) spreads requests that share
a timestamp evenly over the bucket in file order (``keep``: as recorded; ``jitter``: seeded
uniform offsets, sorted to keep file order).
"""
from .config import PRESET_PATHS, TRACE_FORMATS, TraceConfig, traces_dir
from .errors import TraceError

# (the loaders, the parsed-trace cache and the workload table, with numpy and pyarrow, are
# imported on first use of one of their names: composing a run's config needs only the above)
_LAZY = {"input_fingerprint": "cache", "generate_bench": "loader", "load_workload": "loader",
         "WORKLOAD_SCHEMA": "workload", "Workload": "workload"}


def __getattr__(name: str):
    """``traces.NAME`` for the names of ``_LAZY``, from the module that defines it."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    if module == "cache":
        from . import cache as m
    elif module == "loader":
        from . import loader as m
    else:
        from . import workload as m
    value = getattr(m, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "load_workload",
    "generate_bench",
    "input_fingerprint",
    "Workload",
    "TraceConfig",
    "TraceError",
    "WORKLOAD_SCHEMA",
    "TRACE_FORMATS",
    "PRESET_PATHS",
    "traces_dir",
]

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
