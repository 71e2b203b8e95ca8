"""The protocol every fast path of the engine loop follows."""

from __future__ import annotations


class Stretch:
    """A fast path: advances several engine steps at once, leaving every table, the pool, the
    queues and the clock as the per-step loop would leave them.

    The engine asks each stretch, in its order, whether it may take the step just scheduled
    (:meth:`eligible`; at most one says yes) and then runs it (:meth:`run`), which returns the
    number of steps it advanced (0: not taken, the step runs through the per-step loop).
    ``taken`` and ``steps`` count the stretches advanced and the engine steps they covered,
    ``longest`` is the most steps one stretch covered (public counters: tests check through
    them that a configuration exercised a fast path).
    """

    name = ""
    # True when the stretch keeps one SimPy timeout per engine step, created where the per-step
    # loop creates its own, so every other event (arrivals, transfers, another replica's steps)
    # keeps its order without knowing when the next one comes; False when it advances several
    # steps in one timeout up to the next event it can foresee (``sim.env.peek()``)
    step_clock = False

    def __init__(self, sim):
        self.sim = sim
        self.taken = 0
        self.steps = 0
        self.longest = 0

    def eligible(self, plan, dt: float, hold: float | None) -> bool:
        """Whether this stretch may take the step ``plan`` (:class:`sim.scheduler.StepPlan`,
        ``dt`` s long; ``hold``: the time (s) a write-back holds it until, or None)."""
        raise NotImplementedError

    def start(self, plan, n_arr, ctx_arr, dt: float, extra_dt: float, hold: float | None):
        """SimPy process fragment advancing the stretch from the step ``plan`` (``n_arr``,
        ``ctx_arr``: its tokens and contexts as int64 arrays; ``extra_dt``: the compression
        time charged to it, included in ``dt``); returns the steps advanced."""
        raise NotImplementedError

    def run(self, plan, n_arr, ctx_arr, dt: float, extra_dt: float, hold: float | None):
        """:meth:`start`, counted in ``taken`` and ``steps``; returns the steps advanced."""
        k = yield from self.start(plan, n_arr, ctx_arr, dt, extra_dt, hold)
        if k:
            self.taken += 1
            self.steps += k
            if k > self.longest:
                self.longest = k
        return k

    def counters(self) -> dict:
        """``{"taken": stretches advanced, "steps": engine steps they covered, "longest": the
        most steps one covered}``."""
        return {"taken": self.taken, "steps": self.steps, "longest": self.longest}
