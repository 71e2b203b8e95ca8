"""Trace configuration (Hydra structured-config schema of group ``trace``) and path resolution."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from .errors import TraceError

__all__ = [
    "TraceConfig",
    "TRACE_FORMATS",
    "PRESET_PATHS",
    "FORMAT_DEFAULT_PATHS",
    "BUNDLED_PRESET",
    "traces_dir",
    "resolve_path",
    "coerce_config",
]

#: Valid values of ``TraceConfig.format``.
TRACE_FORMATS: tuple[str, ...] = (
    "mooncake",
    "azure",
    "weka",
    "servegen",
    "synthetic_agentic",
    "synthetic_reasoning",
    "synthetic_multiturn",
    "bench",
    "claude_code",
    "openai_log",
)

SYNTHETIC_FORMATS = ("synthetic_agentic", "synthetic_reasoning", "synthetic_multiturn")
#: Formats generated from their options (no file; ``trace.path`` is not read).
GENERATED_FORMATS = (*SYNTHETIC_FORMATS, "bench")

#: The preset shipped inside the package (default trace).
BUNDLED_PRESET = "mooncake_conversation_10min"
BUNDLED_FILE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_10min.jsonl"
#: Every slice shipped in ``traces/data`` (see traces/data/NOTICE.md), by preset name.
BUNDLED_FILES: dict[str, Path] = {
    BUNDLED_PRESET: BUNDLED_FILE,
    "weka_agentic_slice": Path(__file__).resolve().parent / "data" / "weka_agentic_trace_0002.jsonl.xz",
    "claude_code": Path(__file__).resolve().parent / "data" / "claude_code_sample.jsonl.xz",
}
#: Formats whose ``trace.path`` may be a folder (read recursively; see docs/AGENT_TRACES.md).
FOLDER_FORMATS = ("servegen", "claude_code", "openai_log")
#: Formats whose arrivals can be recorded timestamps: ``rebase_to_first_arrival`` applies to
#: them (Weka, Claude Code and OpenAI logs with ``session_arrival=absolute`` only: poisson and
#: recorded session starts are made up; the generated formats and ServeGen's sampled arrivals
#: keep their own clock too). See :func:`recorded_clock`.
RECORDED_CLOCK_FORMATS = ("mooncake", "azure", "weka", "claude_code", "openai_log")
#: ``session_arrival`` when it is null, by format (the others do not read it).
SESSION_ARRIVAL_DEFAULTS = {"weka": "poisson", "claude_code": "absolute", "openai_log": "absolute"}

#: Default location of each preset's data, relative to :func:`traces_dir` (``path: null``).
PRESET_PATHS: dict[str, str] = {
    "mooncake_conversation": "mooncake/conversation_trace.jsonl",
    "mooncake_synthetic": "mooncake/synthetic_trace.jsonl",
    "azure_conv": "azure2023/AzureLLMInferenceTrace_conv.csv",
    "azure_code": "azure2023/AzureLLMInferenceTrace_code.csv",
    "weka_agentic": "weka_agentic/weka_traces.jsonl.xz",
    "servegen_r1": "servegen_deepseek_r1",
}

#: Fallback default per format, used only when ``name`` equals the format name.
FORMAT_DEFAULT_PATHS: dict[str, str] = {
    "mooncake": "mooncake/conversation_trace.jsonl",
    "azure": "azure2023/AzureLLMInferenceTrace_conv.csv",
    "weka": "weka_agentic/weka_traces.jsonl.xz",
    "servegen": "servegen_deepseek_r1",
}


@dataclass
class TraceConfig:
    """What trace to load and how to turn it into a workload.

    All fields have defaults; the default config loads the bundled Mooncake 10-minute slice.
    ``None`` in a synthetic parameter means "the format's default" (see
    ``traces.synthetic.SYNTHETIC_DEFAULTS``).

    Common:
        name: preset name (``experiments/conf/trace/<name>.yaml``); used to find the default path.
        format: one of :data:`TRACE_FORMATS`.
        path: trace file or folder; None = preset default (bundled slice for
            ``mooncake_conversation_10min``, else ``<traces_dir>/<PRESET_PATHS[name]>``;
            ``traces_dir`` = env ``KVSIM_TRACES_DIR`` or ``<repo>/../shared/traces``).
        time_scale: factor (> 0) applied to every ``arrival_s`` after slicing (0.5 = twice the load).
            ``think_s`` is not scaled.
        max_requests: keep only the first N rows (canonical order) after time slicing.
        start_s, duration_s: keep roots with ``start_s <= arrival < start_s + duration_s`` on the
            trace clock (before ``time_scale``) plus their descendants; arrivals are rebased so
            ``start_s`` becomes 0 (then, with ``rebase_to_first_arrival``, the first kept arrival).
        rebase_to_first_arrival: traces of recorded timestamps (Mooncake, Azure; Weka, Claude
            Code and OpenAI logs with ``session_arrival=absolute``: :func:`recorded_clock`):
            count arrivals from the first kept request's arrival instead of ``start_s`` (a slice
            of a trace whose clock does not start at 0, such as Mooncake's arXiv trace at
            1,178,625 ms, then starts at 0 s; the shift is ``Workload.notes['rebase_s']``, named
            in ``warnings`` and in summary.json's ``trace_rebase_s``). ``false``: the trace clock
            minus ``start_s``. Generated traces and ServeGen's sampled arrivals keep their clock.
        timestamp_spread: Mooncake's quantised (~3 s) timestamps: ``keep`` | ``even`` | ``jitter``.
        on_error: ``fail`` (raise on the first bad row) | ``skip`` (skip, count, keep 10 examples).
        zero_output: rows whose recorded output length is 0: ``as_one`` (load with
            output_tokens = 1, i.e. prefill plus the one sampled token; counted in ``warnings``
            and ``notes['zero_output_rows']``) | ``error`` (treat as a bad row).
        cache: keep the parsed trace on disk and reuse it when the file, the options the loader
            reads, the seed and the loader code are the same (``traces.cache``; results are the
            same bit for bit). cache_dir: where (None = ``$KVSIM_CACHE_DIR/traces``, else
            ``~/.cache/kvsim/traces``).

    Weka, Claude Code and OpenAI logs (sessions):
        session_arrival: ``poisson`` (seeded, ``session_rate_per_s``; first session at 0) |
            ``recorded`` (session order, ``session_interval_s`` apart) | ``absolute`` (the
            sessions' recorded wall-clock starts: Weka needs a session ``start_time``, which
            the published traces lack) | null (the format's default: Weka ``poisson``, Claude
            Code and OpenAI logs ``absolute``).
        share_system_prefix: map the leading ids covering ``system_tokens + tool_tokens`` to one
            id space shared across sessions (assumption: same system/tool prompt everywhere).
        max_sessions: read only the first N sessions (Weka: file order; Claude Code and OpenAI
            logs: in order of their first call).

    Claude Code transcripts (``claude_code``) and OpenAI-compatible chat completion logs
    (``openai_log``): ``path`` is a file or a folder (read recursively); docs/AGENT_TRACES.md
    has the accepted fields and the mapping. block_tokens: G of the prefix ids made up for the
    calls' prompts (null = 16); share_system_prefix: the leading tokens each chain's first call
    read from the provider's cache are taken as one prefix shared by every chain (an assumption).

    ServeGen:
        num_requests: requests to sample; clients: chunk numbers (None = all in the folder);
        servegen_iat: ``rate`` (fitted family and shape, scale rescaled so the mean inter-arrival
            equals 1/rate of the window) | ``fit`` (shape and scale exactly as in the file).

    Synthetic (lognormal: ``*_mean`` = mean of the distribution in tokens, ``*_sigma`` = sigma of
    the underlying normal):
        num_sessions, turns_min, turns_max, arrival_rate_per_s (sessions or, for reasoning,
        requests per second), think_time_mean_s (exponential), shared_prefix_tokens (system/tool
        prompt shared by all sessions), input_mean/input_sigma (first prompt after the shared
        prefix), turn_input_mean/turn_input_sigma (new tokens per later turn), output_mean/
        output_sigma, block_tokens (G of the generated prefix ids), max_context_tokens (a session
        ends before a prompt would exceed it).

    Bench (``format: bench``, a serving benchmark's client such as ``vllm bench serve
    --dataset-name random``; ``traces/bench.py`` has the rules and their sources):
        num_requests: prompts sent in all (``--num-prompts``).
        max_concurrency: closed loop, this many requests in flight (``--max-concurrency``); each
            finish sends the next prompt at once. request_rate: open loop, requests per second
            (``--request-rate``; ``inf`` = unpaced: with max_concurrency the closed loop, alone
            every prompt at 0 s). Set one of the two (a finite rate and a cap together are an
            error: the table cannot hold a prompt back for both).
        burstiness: gamma shape of the open loop's inter-arrival times (``--burstiness``; 1 =
            Poisson, ``inf`` = fixed rate); 1 for a closed loop.
        input_len, output_len: tokens around which the random part of each prompt and each
            output are drawn (``--random-input-len``, ``--random-output-len``; vLLM's defaults
            1024 and 128). range_ratio: their spread (``--random-range-ratio``, 0 = fixed).
        range_rule: ``symmetric`` (vLLM: uniform integers in [floor(L(1-r)), ceil(L(1+r))],
            r < 1) | ``one_sided`` (InferenceMAX's and SGLang's clients: [int(L r), L], r <= 1).
        prefix_tokens: shared tokens before every prompt's random part (``--random-prefix-len``;
            the prompt is input_len-drawn + prefix_tokens long), identified for the prefix cache
            in full blocks of ``block_tokens`` (default 16). num_prefix_groups: that many distinct
            shared prefixes, given to the prompts round robin.
        chain_assignment: how a closed loop deals prompts to its N chains: ``earliest_free``
            (the chain with the fewest output tokens so far: the benchmark client's semaphore
            replayed with time in flight taken as output length) | ``round_robin`` (i mod N).
    """

    name: str = BUNDLED_PRESET
    format: str = "mooncake"
    path: Optional[str] = None
    time_scale: float = 1.0
    max_requests: Optional[int] = None
    start_s: float = 0.0
    duration_s: Optional[float] = None
    timestamp_spread: str = "even"
    on_error: str = "fail"
    zero_output: str = "as_one"
    cache: bool = True
    cache_dir: Optional[str] = None
    rebase_to_first_arrival: bool = True
    # Weka, Claude Code, OpenAI logs (None: the format's default, SESSION_ARRIVAL_DEFAULTS)
    session_arrival: Optional[str] = None
    session_rate_per_s: float = 0.2
    session_interval_s: float = 5.0
    share_system_prefix: bool = False
    max_sessions: Optional[int] = None
    # ServeGen
    num_requests: int = 5000
    clients: Optional[list[int]] = None
    servegen_iat: str = "rate"
    # Synthetic (None = format default)
    num_sessions: Optional[int] = None
    turns_min: Optional[int] = None
    turns_max: Optional[int] = None
    arrival_rate_per_s: Optional[float] = None
    think_time_mean_s: Optional[float] = None
    shared_prefix_tokens: Optional[int] = None
    input_mean: Optional[float] = None
    input_sigma: Optional[float] = None
    turn_input_mean: Optional[float] = None
    turn_input_sigma: Optional[float] = None
    output_mean: Optional[float] = None
    output_sigma: Optional[float] = None
    block_tokens: Optional[int] = None
    max_context_tokens: Optional[int] = None
    # Bench (num_requests and block_tokens above are read too)
    max_concurrency: Optional[int] = None
    request_rate: Optional[float] = None
    burstiness: float = 1.0
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    range_rule: str = "symmetric"
    prefix_tokens: int = 0
    num_prefix_groups: int = 1
    chain_assignment: str = "earliest_free"


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


# float fields where +inf is a value (traces/bench.py): request_rate (unpaced), burstiness (fixed
# rate)
INF_FIELDS = ("request_rate", "burstiness")


def _choice(c: TraceConfig, field: str, options: tuple[str, ...]) -> None:
    v = getattr(c, field)
    if v not in options:
        raise TraceError(field=field, found=repr(v), expected=f"one of {list(options)}")


def _validate(c: TraceConfig) -> None:
    for f in fields(c):  # NaN and infinities pass the range checks below
        v = getattr(c, f.name)
        if f.name in INF_FIELDS and v == math.inf:  # (bench's "unpaced" and "fixed rate")
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise TraceError(field=f.name, found=v, expected="a finite number")
    _choice(c, "format", TRACE_FORMATS)
    _choice(c, "timestamp_spread", ("keep", "even", "jitter"))
    _choice(c, "on_error", ("fail", "skip"))
    _choice(c, "zero_output", ("as_one", "error"))
    if c.session_arrival is not None:
        _choice(c, "session_arrival", ("poisson", "recorded", "absolute"))
    if not isinstance(c.rebase_to_first_arrival, bool):
        raise TraceError(field="rebase_to_first_arrival", found=repr(c.rebase_to_first_arrival),
                         expected="true or false")
    if c.format in ("claude_code", "openai_log") and c.block_tokens is not None \
            and not (isinstance(c.block_tokens, int) and c.block_tokens >= 1):
        raise TraceError(field="block_tokens", found=repr(c.block_tokens),
                         expected="an integer >= 1 (tokens per prefix id) or null (16)")
    _choice(c, "servegen_iat", ("rate", "fit"))
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
    if c.session_rate_per_s <= 0:
        raise TraceError(field="session_rate_per_s", found=c.session_rate_per_s, expected="> 0")
    if c.session_interval_s < 0:
        raise TraceError(field="session_interval_s", found=c.session_interval_s, expected=">= 0")
    if c.max_sessions is not None and c.max_sessions < 1:
        raise TraceError(field="max_sessions", found=c.max_sessions, expected=">= 1 or null")
    if c.num_requests < 1:
        raise TraceError(field="num_requests", found=c.num_requests, expected=">= 1")
    if c.format == "bench":
        from .bench import _check_config

        _check_config(c)


def session_arrival_of(c: TraceConfig) -> str:
    """``c.session_arrival``, or the format's default when it is null
    (:data:`SESSION_ARRIVAL_DEFAULTS`; ``poisson`` for a format without one)."""
    return c.session_arrival or SESSION_ARRIVAL_DEFAULTS.get(c.format, "poisson")


def recorded_clock(c: TraceConfig) -> bool:
    """Whether ``c``'s arrivals are recorded timestamps (``rebase_to_first_arrival`` applies):
    Mooncake and Azure, and the session formats with ``session_arrival=absolute``."""
    if c.format not in RECORDED_CLOCK_FORMATS:
        return False
    return c.format in ("mooncake", "azure") or session_arrival_of(c) == "absolute"


def traces_dir() -> Path:
    """Folder holding the real traces: env ``KVSIM_TRACES_DIR``, else ``<repo>/../shared/traces``
    where ``<repo>`` is the parent of the ``traces`` package folder."""
    env = os.environ.get("KVSIM_TRACES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    return repo.parent / "shared" / "traces"


def resolve_path(c: TraceConfig) -> Optional[Path]:
    """The file/folder to read for ``c`` (None for generated formats: synthetic and bench), as an absolute path (a
    relative ``trace.path`` is taken from the working folder, else from the traces folder).

    Raises:
        TraceError: no default known for ``c.name``, or the path does not exist.
    """
    if c.format in GENERATED_FORMATS:
        return None
    hint = ("Point trace.path at the folder of chunk-N-trace.csv / chunk-N-dataset.json files "
            "(e.g. `trace.path=/data/traces/servegen_deepseek_r1` on the Hydra command line)"
            if c.format == "servegen" else
            "Point trace.path at a transcript file or a folder of them (e.g. "
            "`trace.path=~/.claude/projects/-home-me-myproject`; docs/AGENT_TRACES.md)"
            if c.format in ("claude_code", "openai_log") else
            "Point trace.path at the file (e.g. `trace.path=/data/traces/x.jsonl` on the Hydra "
            "command line)") + " or set KVSIM_TRACES_DIR to the folder holding the traces"
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
    elif c.name == c.format and c.format in FORMAT_DEFAULT_PATHS:
        p = traces_dir() / FORMAT_DEFAULT_PATHS[c.format]
    else:
        raise TraceError(
            "unknown trace name and no trace.path given", field="name", found=repr(c.name),
            expected=f"a preset in {[*BUNDLED_FILES, *PRESET_PATHS]} or a format name",
            hint=hint)
    if not p.exists():
        what = "trace folder" if c.format == "servegen" else \
            "trace file or folder" if c.format in FOLDER_FORMATS else "trace file"
        raise TraceError(f"{what} not found", path=str(p),
                         expected=f"the {c.format} trace for '{c.name}'", hint=hint)
    return p.absolute()  # (a relative trace.path is recorded where it pointed: provenance)

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
