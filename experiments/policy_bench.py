"""Policies against ``full``: every preset in ``experiments/conf/policy`` timed beside the dense run
on the same trace (issue 41 part 1; BENCHMARKS.md, "Policies against full").

``python -m experiments.policy_bench [--repeats 3] [--policies h2o,tova] [--traces slice,servegen200]
[--json out.json] [--timeout 900]``; ``--report out.json`` prints the table of a saved run.

Each run is ``kvsim policy=P <trace overrides> cluster.replicas=1`` (the single engine) in a
fresh process with ``output.write_steps=false`` (:func:`experiments.bench.run_case`, the
simulation-speed suite's runner), at the preset's own cadence (no ``policy.*`` override). The runs are interleaved: repeat
r runs ``full`` and then every other policy on one trace, then the next trace, before repeat r + 1
of anything, so a slow spell of the shared machine falls on the baseline and the policies alike.
Before the timed runs every (trace, policy) runs once untimed on the trace's first 4 requests, so
numba's kernel cache is warm and the trace is in the benchmark's own parsed-trace cache (a
temporary folder, removed at the end).

Per run: the simulator's own wall (``summary.json`` ``wall.wall_s``: trace load + simulation +
writing the tables), its simulate part (``wall.simulate_s``), the process CPU time of the whole
``kvsim`` process (user + sys from ``resource.getrusage(RUSAGE_CHILDREN)`` around it: imports,
config composition and numba loading its cached kernels included) and the number of compression
rounds (``summary.json`` ``rounds``). Per (trace, policy) the table gives the medians and their
ratios to ``full``'s medians on that trace. The traces:

* ``slice``: the bundled default slice (``trace=mooncake_conversation_10min``, 1,750 requests).
* ``servegen200``: ``trace=servegen_r1 trace.num_requests=200`` (DeepSeek-R1 reasoning requests).

A run that exceeds ``--timeout`` seconds is killed and reported as ``> timeout`` with the CPU
seconds it had used (no median; that pair is not run again). The table marks a policy within
3x when both its wall and its CPU median are at most 3x ``full``'s.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.bench import REPO, CaseFailed, simpy_rate

POLICY_DIR = REPO / "experiments" / "conf" / "policy"
POLICIES = ["full", "h2o", "tova", "snapkv", "pyramidkv", "ada_kv", "streaming_llm", "triattention",
            "r_kv", "quest", "random"]
TRACES: dict[str, list[str]] = {
    "slice": [],
    "servegen200": ["trace=servegen_r1", "trace.num_requests=200"],
}


def cadence(policy: str) -> str:
    """The preset's first comment line (each preset states its paper's cadence there)."""
    for line in (POLICY_DIR / f"{policy}.yaml").read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


class RunTimedOut(RuntimeError):
    """A kvsim run went past the benchmark's ``--timeout``; ``args[1]``: its CPU seconds then."""


def run_one(overrides: list[str], timeout: float | None) -> dict:
    """Run kvsim once in a fresh process; its summary's times, its process CPU time and rounds.

    Raises :class:`CaseFailed` on a non-zero exit, :class:`RunTimedOut` past ``timeout`` s."""
    d = tempfile.mkdtemp(prefix="kvsim-polbench-")
    cmd = [sys.executable, "-m", "sim.cli", *overrides, "sim.progress=false",
           "output.write_steps=false", "output.print_summary=false", f"output.dir={d}",
           f"hydra.run.dir={d}/hydra"]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:  # (subprocess.run killed and waited for it)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        shutil.rmtree(d, ignore_errors=True)
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        raise RunTimedOut(f"past {timeout:g} s: {' '.join(overrides)}", cpu) from None
    outer = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise CaseFailed(f"kvsim failed (exit {p.returncode}; its output folder {d} is kept): "
                         f"{' '.join(overrides)}\n{p.stderr[-2000:]}")
    s = json.loads((Path(d) / "summary.json").read_text())
    shutil.rmtree(d)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"wall_s": s["wall"]["wall_s"], "simulate_s": s["wall"]["simulate_s"],
            "process_s": outer, "cpu_s": cpu, "rounds": int(s["rounds"]),
            "steps": int(s["engine_steps"]), "requests": int(s["requests_total"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per (trace, policy); default 3")
    ap.add_argument("--policies", default=None,
                    help=f"comma-separated policies besides full (default: all of {', '.join(POLICIES[1:])})")
    ap.add_argument("--traces", default=None, help=f"comma-separated traces (default: {', '.join(TRACES)})")
    ap.add_argument("--json", default=None, help="write the raw runs and medians here (rewritten after every run)")
    ap.add_argument("--timeout", type=float, default=None, help="kill a run past this many seconds")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="print the table of a saved --json file (partial ones too) and exit")
    a = ap.parse_args(argv)
    if a.report is not None:
        if not Path(a.report).is_file():
            ap.error(f"--report {a.report}: no such file")
        print("\n".join(table(json.loads(Path(a.report).read_text()))[0]))
        return 0
    if a.repeats < 1:
        ap.error(f"--repeats {a.repeats}: expected >= 1")
    pols = POLICIES[1:] if a.policies is None else [p.strip() for p in a.policies.split(",")]
    bad = [p for p in pols if p not in POLICIES or p == "full"]
    if bad:
        ap.error(f"--policies {a.policies!r}: {bad} not among {', '.join(POLICIES[1:])} (full always runs)")
    pols = ["full", *pols]
    traces = list(TRACES) if a.traces is None else [t.strip() for t in a.traces.split(",")]
    bad = [t for t in traces if t not in TRACES]
    if bad:
        ap.error(f"--traces {a.traces!r}: {bad} not among {', '.join(TRACES)}")
    if a.json and not Path(a.json).resolve().parent.is_dir():
        ap.error(f"--json {a.json}: its folder does not exist")
    cache_dir = tempfile.mkdtemp(prefix="kvsim-polbench-cache-")
    try:
        return _run(a, pols, traces, cache_dir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _median_row(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "simulate_s", "cpu_s", "process_s")}


def table(doc: dict) -> tuple[list[str], dict]:
    """The markdown table of a benchmark's JSON (``runs``, ``timed_out``, ``cadence``; a
    partial file gives the repeats it holds) and the medians per (trace, policy): rounds, wall,
    CPU, simulate and process medians, their ratios to ``full``'s on that trace, and ``n`` (runs
    in the medians)."""
    lines = ["| trace | policy | preset (its first line) | rounds | runs | wall median s | CPU median s | "
             "wall / full | CPU / full | within 3x |", "|---|---|---|---|---|---|---|---|---|---|"]
    medians: dict = {}
    for t, per in doc["runs"].items():
        medians[t] = {}
        base = _median_row(per["full"]) if per.get("full") else None
        for p, runs in per.items():
            cad = doc["cadence"].get(p, "").split(": ", 1)[-1]  # (the paper's name left out)
            late = doc.get("timed_out", {}).get(t, {}).get(p)
            if late is not None:
                cpu = late["cpu_s"]
                rel = f" ({cpu / base['cpu_s']:.1f} x full)" if base else ""
                lines.append(f"| {t} | {p} | {cad} | | killed | > {late['wall_s']:g} | > {cpu:.1f}{rel} "
                             f"| | | no |")
                continue
            if not runs or base is None:
                continue
            m = _median_row(runs)
            rw, rc = m["wall_s"] / base["wall_s"], m["cpu_s"] / base["cpu_s"]
            medians[t][p] = {**m, "rounds": runs[0]["rounds"], "n": len(runs), "wall_ratio": rw,
                             "cpu_ratio": rc}
            lines.append(f"| {t} | {p} | {cad} | {runs[0]['rounds']:,d} | {len(runs)} | "
                         f"{m['wall_s']:.2f} | {m['cpu_s']:.2f} | {rw:.2f} | {rc:.2f} | "
                         f"{'yes' if max(rw, rc) <= 3 else 'no'} |")
    return lines, medians


def _run(a, pols: list[str], traces: list[str], cache_dir: str) -> int:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    load0 = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    host = {"simpy_timeouts_per_s_before": simpy_rate(), "loadavg_before": load0,
            "start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
    runs: dict = {t: {p: [] for p in pols} for t in traces}
    out_of_time: dict = {t: {} for t in traces}

    def ov(t: str, p: str) -> list[str]:
        return [f"policy={p}", *TRACES[t], "cluster.replicas=1", f"trace.cache_dir={cache_dir}"]

    def save(complete: bool) -> None:
        if a.json:
            Path(a.json).write_text(json.dumps(
                {"commit": commit, "repeats": a.repeats, "host": host, "complete": complete,
                 "runs": runs, "timed_out": out_of_time, "timeout": a.timeout,
                 "cadence": {p: cadence(p) for p in pols}}, indent=2))

    print(f"kvsim policy bench, commit {commit}, {a.repeats} repeat(s), load {load0}", flush=True)
    for t in traces:  # warm numba's cache and the parsed-trace cache, untimed
        for p in pols:
            run_one([*ov(t, p), "trace.max_requests=4"], None)
        run_one(ov(t, "full"), None)
    for rep in range(a.repeats):
        for t in traces:
            for p in pols:
                if p in out_of_time[t]:
                    continue
                try:
                    r = run_one(ov(t, p), a.timeout)
                except RunTimedOut as e:
                    out_of_time[t][p] = {"wall_s": a.timeout, "cpu_s": e.args[1]}
                    print(f"{t:12} {p:14} past {a.timeout:g} s (killed after {e.args[1]:.1f} s "
                          f"CPU)", flush=True)
                    save(False)
                    continue
                runs[t][p].append(r)
                print(f"{t:12} {p:14} wall {r['wall_s']:8.2f} s  cpu {r['cpu_s']:8.2f} s  "
                      f"rounds {r['rounds']:>9,d}", flush=True)
                save(False)
    host["simpy_timeouts_per_s_after"] = simpy_rate()
    host["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    host["end_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    doc = {"runs": runs, "timed_out": out_of_time, "cadence": {p: cadence(p) for p in pols},
           "timeout": a.timeout}
    lines, medians = table(doc)
    print("\n" + "\n".join(lines))
    print(f"\nmachine: {host}")
    host["medians"] = medians
    save(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
