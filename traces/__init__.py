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
from .cache import input_fingerprint
from .errors import TraceError
from .loader import generate_bench, load_workload
from .workload import WORKLOAD_SCHEMA, Workload

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
