"""Simulation-speed benchmark suite: full real traces, wall time and peak RSS against targets (BENCHMARKS.md; not part of the test run).

``python -m experiments.bench [--repeats 3] [--cases a,b] [--json out.json] [--quick]``

Each case runs ``kvsim`` in a fresh process (so peak RSS is that run's own) with
``output.write_steps=false``, ``repeats`` times (round-robin: the first repeat of every case,
then the second, ...), and reports the median wall time (the
simulator's own ``summary.json["wall"]["wall_s"]``: trace loading + simulation + writing), the
median peak RSS, engine steps, steps per wall second, and simulated tokens (prompt + output tokens
of finished requests) per wall second. ``--json`` writes the raw and median numbers, with the git
commit, so two commits can be compared.

The same code's walls differ between machines and between spells of one machine (BENCHMARKS.md:
up to 3.5x here). Before and after the runs the benchmark measures the machine's SimPy event rate
(:func:`simpy_rate`) and prints it beside the rate of the machine the targets were set on
(:data:`REFERENCE_SIMPY_RATE`), so a table can be read against the targets' machine.

``--trace-cache warm`` (the default) measures what a sweep's runs after its first see: each case's
trace is parsed once, untimed, into a parsed-trace cache of the benchmark's own (a temporary
folder, removed at the end; ``traces.cache``), and every timed run loads it from there.
``--trace-cache off`` parses the trace in every timed run (``trace.cache=false``), as a first run
of a sweep does. Each run's ``load_s`` and ``load_cache`` (hit / miss / off) are in the JSON.

Cases (full traces from ../shared/traces or KVSIM_TRACES_DIR; the targets BENCHMARKS.md holds them to):

* ``azure_conv``: Azure 2023 conversation (19,366 requests), Llama-3.1-8B on H100, prefix caching
  on. Target <= 5 s and <= 1 GB.
* ``mooncake_tiers``: Mooncake conversation (12,031 requests), Qwen3-8B on H200, host + disk tiers
  and NVFP4. Target <= 10 s.
* ``weka``: Weka agentic (710 sessions, 49,334 requests, closed loop). Target <= 60 s, <= 2 GB.
* ``servegen_tri``: ServeGen R1, 20,000 sampled requests, TriAttention + forward packing.
  Target <= 30 s.
* ``linear_1x/2x/4x``: the first 3,000 / 6,000 / 12,000 Mooncake requests; wall time per request
  should stay within 10% of the 1x slice's.
* ``pool_10x``: the Mooncake 1x slice with 10x more GPU blocks; wall within 10% of ``linear_1x``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# every case is the single engine, whatever kvsim's root config sets
SINGLE_ENGINE = ["cluster.replicas=1"]
CASES: dict[str, list[str]] = {
    "azure_conv": ["trace=azure_conv", "model=llama3_1_8b", "gpu=h100", *SINGLE_ENGINE],
    "mooncake_tiers": ["trace=mooncake_conversation", "tiers=gpu_host_disk", "codec=nvfp4",
                       *SINGLE_ENGINE],
    "weka": ["trace=weka_agentic", *SINGLE_ENGINE],
    "servegen_tri": ["trace=servegen_r1", "trace.num_requests=20000", "policy=triattention",
                     "compaction=forward_pack", *SINGLE_ENGINE],
    "linear_1x": ["trace=mooncake_conversation", "trace.max_requests=3000", *SINGLE_ENGINE],
    "linear_2x": ["trace=mooncake_conversation", "trace.max_requests=6000", *SINGLE_ENGINE],
    "linear_4x": ["trace=mooncake_conversation", "trace.max_requests=12000", *SINGLE_ENGINE],
    "pool_10x": ["trace=mooncake_conversation", "trace.max_requests=3000",
                 "cache.num_gpu_blocks=499870", *SINGLE_ENGINE],
}
TARGETS = {"azure_conv": (5.0, 1024.0), "mooncake_tiers": (10.0, None), "weka": (60.0, 2048.0),
           "servegen_tri": (30.0, None)}
QUICK = {"quick_default": ["trace.max_requests=300", *SINGLE_ENGINE]}


def target_met(row: dict, target: tuple) -> bool:
    """Whether a case's medians meet its target ``(wall s, peak RSS MB or None)``."""
    wall, rss = target
    return row["median_wall_s"] <= wall and (rss is None or row["median_peak_rss_mb"] <= rss)


class CaseFailed(RuntimeError):
    """A benchmark case's kvsim run exited with an error (its stderr tail in the message)."""


# SimPy timeout events per second, one process, on the machine the targets were set on
# (issue "Simulation speed", its reference points: "about 1.45 M timeout events/s")
REFERENCE_SIMPY_RATE = 1.45e6


def simpy_rate(events: int = 500_000, repeats: int = 3) -> float:
    """This machine's speed at the event loop kvsim runs on: SimPy timeout events per second
    of one process yielding ``events`` timeouts of 1 s, the median of ``repeats`` runs (about
    0.25 s each on a machine at the reference rate). The table's times compare across machines
    (or slow spells of one) in proportion to it; :data:`REFERENCE_SIMPY_RATE` is the rate of the
    machine the targets were set on."""
    import simpy

    def proc(env):
        for _ in range(events):
            yield env.timeout(1)

    rates = []
    for _ in range(repeats):
        env = simpy.Environment()
        env.process(proc(env))
        t0 = time.perf_counter()
        env.run()
        rates.append(events / (time.perf_counter() - t0))
    return statistics.median(rates)


def run_case(overrides: list[str]) -> dict:
    """Run kvsim once in a fresh process; return its summary's speed numbers."""
    d = tempfile.mkdtemp(prefix="kvsim-bench-")
    cmd = [sys.executable, "-m", "sim.cli", *overrides, "sim.progress=false",
           "output.write_steps=false", "output.print_summary=false", f"output.dir={d}",
           f"hydra.run.dir={d}/hydra"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    outer = time.perf_counter() - t0
    if p.returncode != 0:  # the run's folder is kept for its logs (the message names it)
        raise CaseFailed(f"kvsim failed (exit {p.returncode}; its output folder {d} is kept): "
                         f"{' '.join(overrides)}\n{p.stderr[-2000:]}")
    s = json.loads((Path(d) / "summary.json").read_text())
    shutil.rmtree(d)
    tokens = s["prompt_tokens_total"] + s["output_tokens_total"]
    return {"wall_s": s["wall"]["wall_s"], "process_s": outer, "peak_rss_mb": s["wall"]["peak_rss_mb"],
            "load_s": s["wall"]["load_s"], "load_cache": s["wall"].get("load_cache"),
            "simulate_s": s["wall"]["simulate_s"],
            "steps": s["engine_steps"], "requests": s["requests_total"], "sim_tokens": tokens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (>= 1; default 3); the median is reported")
    ap.add_argument("--cases", default=None,
                    help=f"comma-separated cases to run (default: all of {', '.join(CASES)})")
    ap.add_argument("--json", default=None,
                    help="write results as JSON to this path (rewritten after every case)")
    ap.add_argument("--trace-cache", choices=("warm", "off"), default="warm",
                    help="warm (default): parse each case's trace once, untimed, into the "
                         "benchmark's own parsed-trace cache and time runs that load it from "
                         "there; off: every timed run parses the trace (trace.cache=false)")
    ap.add_argument("--quick", action="store_true",
                    help=f"only the tiny smoke case ({', '.join(QUICK)}); not with --cases")
    a = ap.parse_args(argv)
    if a.repeats < 1:
        ap.error(f"--repeats {a.repeats}: expected >= 1")
    if a.quick and a.cases is not None:
        ap.error("--quick runs only its smoke case; leave out --cases")
    names = list(CASES) if a.cases is None else [c.strip() for c in a.cases.split(",")]
    valid = f"a comma-separated subset of {', '.join(CASES)}"
    if not any(names):
        ap.error(f"--cases {a.cases!r}: no case given; expected {valid}")
    bad = [c for c in names if c not in CASES]
    if bad:
        ap.error(f"--cases {a.cases!r}: unknown case(s) {bad}; expected {valid}")
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        ap.error(f"--cases {a.cases!r}: {', '.join(twice)} listed twice")
    if a.json and Path(a.json).is_dir():
        ap.error(f"--json {a.json}: is a folder; expected a file path")
    if a.json and not Path(a.json).resolve().parent.is_dir():
        ap.error(f"--json {a.json}: its folder does not exist")
    cases = QUICK if a.quick else {k: CASES[k] for k in names}
    cache_dir = None
    if a.trace_cache == "warm":
        cache_dir = tempfile.mkdtemp(prefix="kvsim-bench-cache-")
        cases = {k: [*ov, f"trace.cache_dir={cache_dir}"] for k, ov in cases.items()}
    else:
        cases = {k: [*ov, "trace.cache=false"] for k, ov in cases.items()}
    try:
        return _run(a, cases, cache_dir)
    finally:
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)


def prime(overrides: list[str]) -> None:
    """Parse a case's trace into its parsed-trace cache (``trace.cache_dir`` in ``overrides``),
    untimed, in this process."""
    from sim.run import compose_config
    from traces import load_workload

    cfg = compose_config(list(overrides))
    load_workload(cfg.trace, seed=int(cfg.seed))


def _run(a, cases: dict, cache_dir) -> int:
    """The timed rounds of :func:`main` over ``cases`` (name -> overrides)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    results = {}
    host = {"reference_simpy_timeouts_per_s": REFERENCE_SIMPY_RATE,
            "simpy_timeouts_per_s_before": simpy_rate()}

    def save(complete: bool) -> None:
        if a.json:
            Path(a.json).write_text(json.dumps({"commit": commit, "repeats": a.repeats,
                                                "trace_cache": a.trace_cache, "host": host,
                                                "complete": complete, "cases": results}, indent=2))
    print(f"kvsim bench, commit {commit}, {a.repeats} repeat(s), median reported, trace cache "
          f"{a.trace_cache}", flush=True)
    print(f"host speed before the runs: {host['simpy_timeouts_per_s_before'] / 1e6:.2f} M SimPy "
          f"timeouts/s (the targets' machine: {REFERENCE_SIMPY_RATE / 1e6:.2f} M/s)", flush=True)
    if cache_dir is not None:
        for name, ov in cases.items():
            prime(ov)
        print(f"parsed {len(cases)} case(s) into the trace cache {cache_dir} (untimed)", flush=True)
    hdr = (f"{'case':16} {'wall s':>8} {'load s':>7} {'rss MB':>8} {'steps':>9} {'steps/s':>9} "
           f"{'Mtok/s':>7} "
           f"{'target':>14} {'met':>4}")

    def row_of(ov: list, runs: list) -> dict:
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("wall_s", "peak_rss_mb", "process_s", "simulate_s", "load_s")}
        steps, tok = runs[0]["steps"], runs[0]["sim_tokens"]
        return {"overrides": ov, "runs": runs, "median_wall_s": med["wall_s"],
                "median_simulate_s": med["simulate_s"], "median_load_s": med["load_s"],
                "median_peak_rss_mb": med["peak_rss_mb"], "steps": steps,
                "steps_per_s": steps / med["wall_s"], "sim_tokens": tok,
                "sim_tokens_per_s": tok / med["wall_s"], "requests": runs[0]["requests"]}

    # round-robin: repeat r of every case before repeat r + 1 of any, so a slow spell of the
    # machine falls on all the cases (the linearity and pool ratios compare them)
    runs_of: dict = {name: [] for name in cases}
    for rep in range(a.repeats):
        for name, ov in cases.items():
            try:
                runs_of[name].append(run_case(ov))
            except CaseFailed as e:
                results.update({n: row_of(cases[n], r) for n, r in runs_of.items() if r})
                save(False)
                print(f"bench: case {name}: {e}", file=sys.stderr)
                if a.json:
                    print(f"bench: the runs before it are in {a.json} (marked incomplete)", file=sys.stderr)
                return 1
            results[name] = row_of(ov, runs_of[name])
            save(False)
        if a.repeats > 1:
            print(f"round {rep + 1} of {a.repeats} done", flush=True)
    print(hdr)
    for name in cases:
        row = results[name]
        t = TARGETS.get(name)
        tgt = "" if t is None else f"<={t[0]:g}s" + ("" if t[1] is None else f",<={t[1]:g}MB")
        met = "" if t is None else ("yes" if target_met(row, t) else "NO")
        row["target_met"] = None if t is None else met == "yes"
        print(f"{name:16} {row['median_wall_s']:8.2f} {row['median_load_s']:7.2f} "
              f"{row['median_peak_rss_mb']:8.0f} {row['steps']:9,d} "
              f"{row['steps_per_s']:9,.0f} {row['sim_tokens_per_s'] / 1e6:7.2f} {tgt:>14} {met:>4}",
              flush=True)
    lin = [results.get(f"linear_{k}x") for k in (1, 2, 4)]
    if all(lin):
        base = lin[0]["median_wall_s"] / lin[0]["requests"]
        base_step = lin[0]["median_wall_s"] / lin[0]["steps"]
        base_sim = lin[0]["median_simulate_s"] / lin[0]["requests"]
        for k, r in zip((1, 2, 4), lin):
            # the wall holds costs that do not grow with the slice (the whole file is parsed
            # and checked whatever max_requests keeps; the results are written): the simulate
            # time per request shows the part that does grow
            ratio = r['median_wall_s'] / r['requests'] / base
            print(f"linearity {k}x: {ratio:.2f} x the 1x wall per "
                  f"request, {r['median_wall_s'] / r['steps'] / base_step:.2f} x per engine step, "
                  f"{r['median_simulate_s'] / r['requests'] / base_sim:.2f} x the 1x simulate time "
                  f"per request" + ("" if k == 1 else f" (target <= 1.10: "
                                    f"{'met' if ratio <= 1.10 else 'NOT met'})"))
    if results.get("pool_10x") and results.get("linear_1x"):
        ratio = results['pool_10x']['median_wall_s'] / results['linear_1x']['median_wall_s']
        print(f"pool 10x: {ratio:.2f} x the 1x wall (target <= 1.10: "
              f"{'met' if ratio <= 1.10 else 'NOT met'})")
    host["simpy_timeouts_per_s_after"] = after = simpy_rate()
    lo, hi = sorted(r / REFERENCE_SIMPY_RATE for r in (host["simpy_timeouts_per_s_before"], after))
    print(f"host speed after the runs: {after / 1e6:.2f} M SimPy timeouts/s; scaled by this "
          f"rate, the walls on the targets' machine would be about {lo:.2f}-{hi:.2f} x these")
    save(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
