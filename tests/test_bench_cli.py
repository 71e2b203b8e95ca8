"""The benchmark command's argument checks (issue "Simulation speed"): bad arguments stop it
before any case runs, with argparse's exit status 2 and a message naming the argument."""

import itertools

import pytest

from experiments import bench

SIMPY_RATE = bench.simpy_rate  # (the probe itself; the fixture below fakes it for main)


@pytest.fixture(autouse=True)
def primed(monkeypatch):
    """The cases' traces the benchmark would parse into its trace cache (``bench.prime``,
    recorded instead of parsed: the tests below fake the runs); the host-speed probe reads
    2.9 M then 2.175 M SimPy timeouts/s (2x and 1.5x the targets' machine)."""
    calls = []
    monkeypatch.setattr(bench, "prime", lambda ov: calls.append(list(ov)))
    rates = itertools.cycle([2.9e6, 2.175e6])
    monkeypatch.setattr(bench, "simpy_rate", lambda: next(rates))
    return calls


def _case(overrides):
    """The case a run's overrides belong to (the benchmark appends its one trace-cache
    override)."""
    return next(n for n, ov in bench.CASES.items() if overrides[:-1] == ov)


@pytest.mark.parametrize("argv, words", [
    (["--cases", "nope"], ["--cases 'nope'", "unknown case(s) ['nope']", "azure_conv"]),
    (["--cases", "azure_conv,weka,nope2"], ["['nope2']"]),
    (["--cases", "azure_conv,,weka"], ["unknown case(s) ['']"]),
    (["--cases", ","], ["no case given"]),
    (["--cases", "weka,weka"], ["weka listed twice"]),
    (["--quick", "--json", "/"], ["is a folder; expected a file path"]),
    (["--quick", "--repeats", "0"], ["--repeats 0: expected >= 1"]),
    (["--repeats", "-2"], ["--repeats -2"]),
    (["--quick", "--json", "/nonexistent-kvsim-dir/out.json"], ["its folder does not exist"]),
    (["--quick", "--cases", "weka"], ["leave out --cases"]),
])
def test_bad_arguments_stop_before_running(argv, words, capsys, monkeypatch):
    def no_run(_overrides):
        raise AssertionError("a case ran despite bad arguments")

    monkeypatch.setattr(bench, "run_case", no_run)
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err


def test_failed_case_keeps_earlier_results(tmp_path, monkeypatch, capsys):
    """A case whose kvsim run fails ends the command with status 1; the cases before it stay in
    the JSON file, marked incomplete."""
    import json

    def fake_run(overrides):
        if "trace=weka_agentic" in overrides:
            raise bench.CaseFailed("kvsim failed (exit 2): trace=weka_agentic\nno trace")
        return {"wall_s": 1.0, "process_s": 1.5, "peak_rss_mb": 100.0, "steps": 10,
                "load_s": 0.1, "simulate_s": 0.8, "requests": 5, "sim_tokens": 1000}

    monkeypatch.setattr(bench, "run_case", fake_run)
    out = tmp_path / "b.json"
    assert bench.main(["--cases", "azure_conv,weka", "--repeats", "1", "--json", str(out)]) == 1
    d = json.loads(out.read_text())
    assert d["complete"] is False and list(d["cases"]) == ["azure_conv"]
    assert "case weka: kvsim failed" in capsys.readouterr().err
    assert bench.main(["--cases", "azure_conv", "--repeats", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["complete"] is True


def test_failed_run_keeps_its_folder_and_names_it(tmp_path, monkeypatch):
    """A case whose kvsim run fails raises CaseFailed naming the run's output folder, which is
    kept (its logs are there); a run that succeeds leaves no folder behind."""
    import re
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(bench.CaseFailed) as e:
        bench.run_case(["trace.max_requests=-1"])
    kept = re.search(r"its output folder (\S+) is kept", str(e.value)).group(1)
    assert (tmp_path / kept.rsplit("/", 1)[-1]).is_dir()
    assert "trace.max_requests" in str(e.value)
    r = bench.run_case(["trace.max_requests=3"])
    assert r["requests"] == 3
    assert [p.name for p in tmp_path.iterdir()] == [kept.rsplit("/", 1)[-1]]


def test_repeats_run_round_robin(monkeypatch, capsys):
    """The repeats go round-robin over the cases (a slow spell of the machine falls on all of
    them, so the linearity and pool ratios compare like with like); medians per case."""
    order = []

    def fake_run(overrides):
        order.append(overrides[0])
        return {"wall_s": float(len(order)), "process_s": 1.0, "peak_rss_mb": 100.0, "steps": 10,
                "load_s": 0.1, "simulate_s": 0.5, "requests": 5, "sim_tokens": 1000}

    monkeypatch.setattr(bench, "run_case", fake_run)
    assert bench.main(["--cases", "azure_conv,weka", "--repeats", "3"]) == 0
    a, w = bench.CASES["azure_conv"][0], bench.CASES["weka"][0]
    assert order == [a, w, a, w, a, w]
    out = capsys.readouterr().out
    assert "round 3 of 3 done" in out
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith(("azure_conv", "weka"))] == ["3.00", "4.00"]


@pytest.mark.parametrize("mode", ["warm", "off"])
def test_the_trace_cache_is_primed_untimed_or_off(mode, primed, monkeypatch, capsys):
    """warm (the default): each case's trace is parsed once into the benchmark's own cache before
    any timed run, and every timed run names that cache; off: no priming, every run parses
    (trace.cache=false). The folder is removed at the end."""
    import os

    runs = []

    def fake_run(overrides):
        runs.append(list(overrides))
        return {"wall_s": 1.0, "process_s": 1.0, "peak_rss_mb": 100.0, "steps": 10,
                "load_s": 0.1, "simulate_s": 0.5, "requests": 5, "sim_tokens": 1000}

    monkeypatch.setattr(bench, "run_case", fake_run)
    argv = ["--cases", "azure_conv,weka", "--repeats", "2"]
    assert bench.main(argv if mode == "warm" else [*argv, "--trace-cache", "off"]) == 0
    out = capsys.readouterr().out
    assert [_case(r) for r in runs] == ["azure_conv", "weka"] * 2
    if mode == "off":
        assert primed == [] and all(r[-1] == "trace.cache=false" for r in runs)
        assert "trace cache off" in out
        return
    assert [_case(p) for p in primed] == ["azure_conv", "weka"]
    tail = {r[-1] for r in runs} | {p[-1] for p in primed}
    assert len(tail) == 1 and tail.pop().startswith("trace.cache_dir=")
    folder = runs[0][-1].split("=", 1)[1]
    assert f"into the trace cache {folder} (untimed)" in out
    assert not os.path.exists(folder)


def test_linearity_lines_split_fixed_costs(monkeypatch, capsys):
    """The linearity lines give the wall per request, per engine step and the simulate time per
    request against the 1x slice: a fixed cost in the wall (parsing the whole file, writing the
    results) shows in the first and not in the last."""
    sizes = {"trace.max_requests=3000": 3000, "trace.max_requests=6000": 6000,
             "trace.max_requests=12000": 12000}

    def fake_run(overrides):
        n = sizes[overrides[1]]
        return {"wall_s": 0.5 + n / 1000, "process_s": 3.0, "peak_rss_mb": 100.0, "steps": n,
                "load_s": 0.2, "simulate_s": n / 1000, "requests": n, "sim_tokens": 10 * n}

    monkeypatch.setattr(bench, "run_case", fake_run)
    assert bench.main(["--cases", "linear_1x,linear_2x,linear_4x", "--repeats", "1"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("linearity")]
    assert lines[2] == ("linearity 4x: 0.89 x the 1x wall per request, 0.89 x per engine step, "
                        "1.00 x the 1x simulate time per request (target <= 1.10: met)")


def test_table_says_whether_each_target_is_met(tmp_path, monkeypatch, capsys):
    """Each case with a target gets yes / NO in the table (and in the JSON), and the linearity
    and pool lines say met / NOT met (cost growing at most 10% faster than the trace, or than
    the 1x pool's)."""
    import json

    walls = {"azure_conv": 6.12, "weka": 50.0, "linear_1x": 1.0, "linear_2x": 2.0,
             "linear_4x": 4.8, "pool_10x": 1.05}

    def fake_run(overrides):
        name = _case(overrides)
        return {"wall_s": walls[name], "process_s": walls[name] + 1, "steps": 10, "load_s": 0.1,
                "peak_rss_mb": 2100.0 if name == "weka" else 100.0, "simulate_s": walls[name],
                "requests": {"linear_2x": 2, "linear_4x": 4}.get(name, 1), "sim_tokens": 1000}

    monkeypatch.setattr(bench, "run_case", fake_run)
    out = tmp_path / "b.json"
    assert bench.main(["--cases", ",".join(walls), "--repeats", "1", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = {ln.split()[0]: ln for ln in lines if ln.split() and ln.split()[0] in walls}
    assert row["azure_conv"].rstrip().endswith("<=5s,<=1024MB   NO")
    assert row["weka"].rstrip().endswith("NO")  # 50 s but 2,100 MB against 2,048
    assert not row["linear_1x"].rstrip().endswith(("yes", "NO"))  # no target of its own
    assert any(ln.startswith("linearity 2x: 1.00") and ln.endswith("(target <= 1.10: met)")
               for ln in lines)
    assert any(ln.startswith("linearity 4x: 1.20") and ln.endswith("NOT met)") for ln in lines)
    assert "pool 10x: 1.05 x the 1x wall (target <= 1.10: met)" in lines
    d = json.loads(out.read_text())["cases"]
    assert d["azure_conv"]["target_met"] is False and d["linear_1x"]["target_met"] is None


def test_host_speed_is_measured_around_the_runs(tmp_path, monkeypatch, capsys):
    """The machine's SimPy event rate, read before and after the runs, is printed beside the
    targets' machine's and kept in the JSON, with the range the walls scale by."""
    import json

    monkeypatch.setattr(bench, "run_case", lambda ov: {
        "wall_s": 1.0, "process_s": 1.5, "peak_rss_mb": 100.0, "steps": 10, "load_s": 0.1,
        "simulate_s": 0.8, "requests": 5, "sim_tokens": 1000})
    out = tmp_path / "b.json"
    assert bench.main(["--quick", "--repeats", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "host speed before the runs: 2.90 M SimPy timeouts/s (the targets' machine: 1.45 M/s)" in text
    assert "would be about 1.50-2.00 x these" in text
    host = json.loads(out.read_text())["host"]
    assert host == {"reference_simpy_timeouts_per_s": 1.45e6, "simpy_timeouts_per_s_before": 2.9e6,
                    "simpy_timeouts_per_s_after": 2.175e6}


def test_simpy_rate_counts_events_per_second():
    """The probe itself: a positive rate, within two orders of magnitude of the targets'
    machine's."""
    r = SIMPY_RATE(events=2000, repeats=1)
    assert bench.REFERENCE_SIMPY_RATE / 100 < r < 100 * bench.REFERENCE_SIMPY_RATE
