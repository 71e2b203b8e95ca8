"""Seeded synthetic workload generators.

All three share one model: sessions (clients) start as a Poisson process (``arrival_rate_per_s``,
first session at 0). A session's token stream is append-only: ``shared prefix (system/tool prompt,
identical in every session) + first input + output_0 + new input_1 + output_1 + ...``; turn r's
prompt is the stream up to the end of new input r (the whole history is resent, outputs included).
Prefix ids (G = ``block_tokens``) are assigned per full block of the stream, so turn r's ids start
with all full-block ids of turn r-1's prompt + output; blocks lying entirely inside the shared
prefix get ids 0..floor(shared/G)-1 in every session. Only full blocks get ids (floor(in/G)).

Turn 0 is a root at the session start; turn r > 0 has parent = turn r-1 and think_s ~
Exponential(``think_time_mean_s``). Children's arrival_s = parent's arrival + think_s (a lower
bound, informational). No prompt exceeds ``max_context_tokens``: a session stops early when the
next prompt would exceed it (counted in ``warnings``), and the first prompt (shared prefix + first
input) fits by construction: the first input is drawn from its lognormal truncated to at most
``max_context_tokens - shared_prefix_tokens`` tokens (a draw within that is kept as drawn, one
above it is redrawn from the truncated distribution: workloads that never reach the cap are
unchanged by it). ``max_context_tokens`` must exceed ``shared_prefix_tokens``. Lengths are
lognormal: ``*_mean`` is the mean in tokens (before that truncation), ``*_sigma`` the sigma of the
underlying normal (mu = ln(mean) - sigma^2/2), rounded, at least 1. An output draw beyond
:data:`MAX_LENGTH` tokens is an error naming its mean and sigma (a unit slip; it would also wrap
the int64 token counts; an input draw beyond ``max_context_tokens`` is redrawn or ends its
session, as above), and ``max_context_tokens`` is at most that: the generator lists a prefix id
per block of every prompt.

* ``synthetic_agentic``: large shared system+tool prompt, many turns, short think (tool runs),
  each turn adds a tool output.
* ``synthetic_reasoning``: single-turn requests (each its own session): short prompts, long
  lognormal outputs, Poisson arrivals.
* ``synthetic_multiturn``: N chat clients, a few turns each, human think times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

from .._common import Parsed
from ..errors import ErrorSink, TraceError
from ..registry import TraceFormat, register

#: Per-format defaults for every ``None`` synthetic field of TraceConfig.
# the longest length (tokens) a synthetic prompt or output may reach: 2**27, 13x the longest
# context window offered (10 M tokens, Llama 4 Scout, Meta 2025)
MAX_LENGTH = 2 ** 27

SYNTHETIC_DEFAULTS: dict[str, dict] = {
    "synthetic_agentic": dict(
        num_sessions=50, turns_min=10, turns_max=40, arrival_rate_per_s=0.1,
        think_time_mean_s=2.0, shared_prefix_tokens=12000, input_mean=2000.0, input_sigma=0.8,
        turn_input_mean=800.0, turn_input_sigma=1.0, output_mean=250.0, output_sigma=0.8,
        block_tokens=16, max_context_tokens=131072),
    "synthetic_reasoning": dict(
        num_sessions=2000, turns_min=1, turns_max=1, arrival_rate_per_s=2.0,
        think_time_mean_s=0.0, shared_prefix_tokens=0, input_mean=300.0, input_sigma=0.7,
        turn_input_mean=300.0, turn_input_sigma=0.7, output_mean=4000.0, output_sigma=0.8,
        block_tokens=16, max_context_tokens=131072),
    "synthetic_multiturn": dict(
        num_sessions=64, turns_min=3, turns_max=12, arrival_rate_per_s=0.5,
        think_time_mean_s=30.0, shared_prefix_tokens=500, input_mean=400.0, input_sigma=0.8,
        turn_input_mean=150.0, turn_input_sigma=0.8, output_mean=300.0, output_sigma=0.8,
        block_tokens=16, max_context_tokens=32768),
}


def synthetic_params(cfg) -> dict:
    """Resolved parameters: cfg values, ``None`` replaced by the format's defaults.

    Raises:
        TraceError: a parameter out of range.
    """
    d = dict(SYNTHETIC_DEFAULTS[cfg.format])
    for k in d:
        v = getattr(cfg, k)
        if v is not None:
            d[k] = v
    checks = [
        ("num_sessions", d["num_sessions"] >= 1, ">= 1"),
        ("turns_min", 1 <= d["turns_min"] <= d["turns_max"], "1 <= turns_min <= turns_max"),
        ("arrival_rate_per_s", d["arrival_rate_per_s"] > 0, "> 0"),
        ("think_time_mean_s", d["think_time_mean_s"] >= 0, ">= 0"),
        ("shared_prefix_tokens", d["shared_prefix_tokens"] >= 0, ">= 0"),
        ("block_tokens", d["block_tokens"] >= 1, ">= 1"),
        ("max_context_tokens", 1 <= d["max_context_tokens"] <= MAX_LENGTH,
         f"1 .. {MAX_LENGTH:,} (2**27 tokens: the generator lists a prefix id per block of "
         f"every prompt; the longest context windows offered are 10 M tokens)"),
        # (the first prompt holds the shared prefix and at least one input token)
        ("max_context_tokens", d["max_context_tokens"] > d["shared_prefix_tokens"],
         f"> shared_prefix_tokens={d['shared_prefix_tokens']} (every prompt holds the shared "
         f"prefix plus at least one input token)"),
    ]
    for k in ("input", "turn_input", "output"):
        checks.append((f"{k}_mean", d[f"{k}_mean"] >= 1, ">= 1"))
        checks.append((f"{k}_sigma", d[f"{k}_sigma"] >= 0, ">= 0"))
    for name, ok, exp in checks:
        if not ok:
            raise TraceError(field=f"trace.{name}", found=d[name], expected=exp)
    return d


def _lognormal(rng, mean: float, sigma: float, size: int, name: str = "input",
               cap: int | None = None) -> np.ndarray:
    """``size`` lengths (tokens, int64 array): lognormal draws of mean ``mean``, sigma ``sigma``
    (the module docstring's rule), rounded, at least 1. With ``cap`` (an input's: a draw above
    it is redrawn, or ends its session, whatever its size) a draw above ``cap`` is returned as
    ``cap + 1``; without, a draw must be at most :data:`MAX_LENGTH`.

    Raises:
        TraceError: without ``cap``, a draw beyond :data:`MAX_LENGTH` (fields
            ``trace.<name>_mean`` / ``trace.<name>_sigma``)."""
    import numpy as np
    mu = math.log(mean) - sigma * sigma / 2.0
    x = rng.lognormal(mu, sigma, size)
    if cap is not None:
        return np.maximum(1, np.rint(np.minimum(x, cap + 1))).astype(np.int64)
    if size and not float(x.max()) <= MAX_LENGTH:  # (not <=: inf, and nan from an inf mean)
        raise TraceError(field=f"trace.{name}_mean / trace.{name}_sigma",
                         found=f"mean {mean:g}, sigma {sigma:g}: a draw of {float(x.max()):.3g} "
                               f"tokens",
                         expected=f"lengths up to {MAX_LENGTH:,} tokens (2**27; the longest "
                                  f"context windows offered are 10 M tokens)")
    return np.maximum(1, np.rint(x)).astype(np.int64)


def _first_input(rng, mean: float, sigma: float, cap: int, name: str = "input") -> int:
    """One first input length (tokens): ``_lognormal`` conditioned on being at most ``cap`` (>= 1),
    i.e. the lognormal truncated to ``rint(x) <= cap``. A draw within the cap is kept as drawn
    (so a workload that never reaches the cap is the one drawn without it); a draw above it is
    replaced by a draw from the truncated distribution (inverse CDF of one more uniform), which
    makes the result exactly the truncated distribution.

    Raises:
        TraceError: the lognormal has (numerically) no mass at or below ``cap``.
    """
    import numpy as np
    x = int(_lognormal(rng, mean, sigma, 1, name, cap)[0])
    if x <= cap:
        return x
    mu = math.log(mean) - sigma * sigma / 2.0
    hi = math.log(cap + 0.5)  # rint(x) <= cap  <=>  x < cap + 0.5 (up to the tie at cap + 0.5)
    if sigma == 0:
        mass = 1.0 if mu < hi else 0.0
    else:
        mass = 0.5 * math.erfc(-(hi - mu) / (sigma * math.sqrt(2.0)))  # P(ln x < hi)
    if not mass > 0:
        raise TraceError(field="max_context_tokens", found=f"{cap} tokens left for the first input",
                         expected=f"room for the first input (lognormal mean {mean:g}, sigma "
                                  f"{sigma:g}: no probability at or below {cap} tokens)")
    if sigma == 0:  # (a point mass: reached only where exp(log(mean)) rounds across the cap)
        return max(1, min(cap, int(np.rint(math.exp(mu)))))
    u = (1.0 - rng.random()) * mass  # in (0, mass]
    if not u > 0:  # (underflow of a subnormal mass)
        u = mass
    z = NormalDist().inv_cdf(min(u, math.nextafter(1.0, 0.0)))
    # (min: rint of x at the very edge, x = cap + 0.5, rounds to even)
    return max(1, min(cap, int(np.rint(math.exp(mu + sigma * z)))))


def generate(path, cfg, rng: np.random.Generator, sink: ErrorSink, seed: int = 0) -> Parsed:
    """Generate the synthetic workload of ``cfg.format`` (see module docstring)."""
    import numpy as np
    d = synthetic_params(cfg)
    G = int(d["block_tokens"])
    shared_blocks = int(d["shared_prefix_tokens"]) // G
    S = int(d["num_sessions"])
    gaps = rng.exponential(1.0 / d["arrival_rate_per_s"], S)
    gaps[0] = 0.0
    starts = np.cumsum(gaps)
    turns = rng.integers(int(d["turns_min"]), int(d["turns_max"]) + 1, S)
    next_gid = shared_blocks
    cols = {k: [] for k in ("session", "turn", "arrival", "think", "parent", "in", "out")}
    offs = [0]
    vals: list[int] = []
    truncated = 0
    for s in range(S):
        T = int(turns[s])
        first_in = int(d["shared_prefix_tokens"]) + _first_input(
            rng, d["input_mean"], d["input_sigma"],
            int(d["max_context_tokens"]) - int(d["shared_prefix_tokens"]))
        new_in = _lognormal(rng, d["turn_input_mean"], d["turn_input_sigma"], T, "turn_input",
                            int(d["max_context_tokens"]))  # (more ends the session)
        outs = _lognormal(rng, d["output_mean"], d["output_sigma"], T, "output")
        thinks = rng.exponential(d["think_time_mean_s"], T) if d["think_time_mean_s"] > 0 else np.zeros(T)
        stream: list[int] = []  # global id per full block of the stream
        prompt = first_in
        arrival = float(starts[s])
        for r in range(T):
            if r > 0:
                prompt = prompt + int(outs[r - 1]) + int(new_in[r])
                if prompt > d["max_context_tokens"]:
                    truncated += 1
                    break
                arrival += float(thinks[r])
            nb = prompt // G
            while len(stream) < nb:
                j = len(stream)
                if j < shared_blocks:
                    stream.append(j)
                else:
                    stream.append(next_gid)
                    next_gid += 1
            row = len(cols["session"])
            cols["session"].append(s)
            cols["turn"].append(r)
            cols["arrival"].append(arrival)
            cols["think"].append(float(thinks[r]) if r > 0 else 0.0)
            cols["parent"].append(row - 1 if r > 0 else -1)
            cols["in"].append(prompt)
            cols["out"].append(int(outs[r]))
            vals.extend(stream[:nb])
            offs.append(len(vals))
    warnings = []
    if truncated:
        warnings.append(f"{truncated} sessions ended early at max_context_tokens="
                        f"{d['max_context_tokens']}")
    return Parsed(
        session_id=np.asarray(cols["session"], dtype=np.int64),
        turn=np.asarray(cols["turn"], dtype=np.int32),
        arrival_s=np.asarray(cols["arrival"], dtype=np.float64),
        think_s=np.asarray(cols["think"], dtype=np.float64),
        parent=np.asarray(cols["parent"], dtype=np.int64),
        input_tokens=np.asarray(cols["in"], dtype=np.int64),
        output_tokens=np.asarray(cols["out"], dtype=np.int64),
        prefix_offsets=np.asarray(offs, dtype=np.int64),
        prefix_values=np.asarray(vals, dtype=np.int64),
        block_tokens=G,
        source=f"synthetic:{cfg.format}",
        warnings=warnings,
        notes={"params": d, "sessions": S},
    )

@dataclass
class SyntheticOptions:
    """The synthetic generators' options (the module docstring has the model); null: the
    format's default (:data:`SYNTHETIC_DEFAULTS`). Lognormal lengths: ``*_mean`` is the mean of
    the distribution in tokens, ``*_sigma`` the sigma of the underlying normal.

    Attributes:
        num_sessions: sessions (for ``synthetic_reasoning``, requests).
        turns_min, turns_max: turns per session, drawn uniformly.
        arrival_rate_per_s: sessions (reasoning: requests) per second, Poisson.
        think_time_mean_s: mean of the exponential think time between turns.
        shared_prefix_tokens: system/tool prompt shared by all sessions.
        input_mean, input_sigma: the first prompt after the shared prefix.
        turn_input_mean, turn_input_sigma: new tokens per later turn.
        output_mean, output_sigma: output tokens.
        block_tokens: G of the generated prefix ids.
        max_context_tokens: a session ends before a prompt would exceed it.
    """

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


for _name in SYNTHETIC_DEFAULTS:
    register(TraceFormat(name=_name, options=SyntheticOptions, input="generated", load=generate),
             __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
