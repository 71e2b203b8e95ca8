"""Landing the SimPy clock on an exact float time.

SimPy places a timeout of ``d`` at ``now + d``. When ``now`` has a finer grid than a target
``end`` (a value the per-step loop reaches by adding step durations), ``now + (end - now)`` may
round past ``end`` for every ``d``. :func:`exact_delays` then splits the wait in two: first to a
value ``m`` just below ``end`` that ``now`` does reach, then the exact remainder ``end - m`` (same
binade: exact).
"""

from __future__ import annotations

import math

import numpy as np

from .jit import kernel


def exact_delays(now: float, end: float) -> tuple[float, ...]:
    """Timeout delays (seconds, one or two) that take the clock from ``now`` to exactly ``end``
    (``end >= now``). Raises RuntimeError if no split lands (never seen: half the values below
    ``end`` are reachable from ``now``)."""
    d = end - now
    if now + d == end:
        return (d,)
    m = end
    for _ in range(64):
        m = math.nextafter(m, -math.inf)
        if now + (m - now) == m and m + (end - m) == end:
            return (m - now, end - m)
    raise RuntimeError(f"cannot advance the SimPy clock from {now!r} to exactly {end!r}")


def advance_to(env, end: float):
    """SimPy process fragment: advance ``env``'s clock to exactly ``end`` (s, >= now), so a
    stretch of steps timed as one lands on the clock value the per-step loop's additions
    (``now += dt`` per step) reach (:func:`exact_delays`)."""
    for d in exact_delays(env.now, end):
        yield env.timeout(d)


def step_ends(start: float, durs: np.ndarray) -> np.ndarray:
    """End times (s) of consecutive steps of ``durs`` seconds from ``start``: ``start + d0``,
    ``start + d0 + d1``, ... added one at a time, left to right (the values the per-step loop
    reaches; equal bit for bit to ``np.cumsum(np.concatenate(([start], durs)))[1:]``). Shape
    ``durs.shape`` (float64, 1-d)."""
    out = np.empty(len(durs), dtype=np.float64)
    _step_ends(float(start), np.asarray(durs, dtype=np.float64), out)
    return out


@kernel("void(f8, f8[:], f8[:])")
def _step_ends(t, durs, out):  # pragma: no cover (compiled)
    for i in range(durs.shape[0]):
        t = t + durs[i]
        out[i] = t
