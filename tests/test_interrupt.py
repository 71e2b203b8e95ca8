"""Interrupted runs: Ctrl-C (SIGINT), SIGTERM or a crash in the middle of a simulation leave the
results directory marked incomplete (INCOMPLETE marker, no summary.json, no tables), so
``is_complete`` and ``output.skip_completed`` never take it for a finished run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SINGLE_ENGINE
from sim.run import MARKER, is_complete

REPO = Path(__file__).resolve().parents[1]
KVSIM = [sys.executable, "-c", "from sim.cli import main; main()"]
# H2O scores every step: the bundled slice takes the single engine minutes, so the run is surely
# mid-simulation
LONG = ["policy=h2o", "policy.budget=512", "output.print_summary=false", "sim.progress=true",
        *SINGLE_ENGINE]
PROGRESS = re.compile(rb"\| *([1-9]\d*)/1750 ")  # tqdm: at least one request done


def _default_sigint() -> None:
    # a test run started in the background by a shell without job control inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler: the child gets Ctrl-C's
    # default, as from a terminal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(out: Path):
    return subprocess.Popen([*KVSIM, f"output.dir={out}", *LONG], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)


def _wait_simulating(proc, timeout=90.0) -> bytes:
    """Read the progress bar until a request has finished (the engine is running)."""
    os.set_blocking(proc.stderr.fileno(), False)
    buf = b""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        chunk = proc.stderr.read()
        if chunk:
            buf += chunk
            if PROGRESS.search(buf):
                return buf
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"kvsim did not start simulating (rc={proc.poll()}): {buf[-2000:]!r}")


def _assert_incomplete(out: Path) -> None:
    names = sorted(p.name for p in out.iterdir())
    assert MARKER in names, names
    assert "summary.json" not in names
    assert not any(n.endswith(".parquet") for n in names), names
    assert not is_complete(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_simulation_leaves_incomplete_dir(tmp_path, sig):
    out = tmp_path / "run"
    proc = _start(out)
    try:
        _wait_simulating(proc)
        assert (out / MARKER).exists()
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == (130 if sig == signal.SIGINT else 143)
    err = proc.stderr.read().decode()
    assert ("kvsim: interrupted; " if sig == signal.SIGINT else "kvsim: stopped by SIGTERM; ") \
        + f"{out} is marked INCOMPLETE" in err
    assert "Traceback" not in err
    _assert_incomplete(out)
    assert not (out / ".kvsim_running").exists()  # (the run's lock is let go)


@pytest.mark.parametrize("sig,delay", [(signal.SIGINT, 0.3), (signal.SIGINT, 0.8),
                                       (signal.SIGINT, 1.5), (signal.SIGINT, 3.0),
                                       (signal.SIGTERM, 0.8), (signal.SIGTERM, 1.5)],
                         ids=["SIGINT-0.3", "SIGINT-0.8", "SIGINT-1.5", "SIGINT-3.0",
                              "SIGTERM-0.8", "SIGTERM-1.5"])
def test_signal_at_any_moment_is_one_line_and_leaves_no_folder_that_looks_complete(tmp_path,
                                                                                    sig, delay):
    """Ctrl-C (SIGTERM) at any moment of a single run (while its modules are imported, while
    Hydra composes the config and makes the run folder, or while it simulates) ends with one
    ``kvsim: interrupted; ...`` (``kvsim: stopped by SIGTERM; ...``) line and exit status 130
    (143), no traceback, and leaves no results folder, an empty one, or one marked INCOMPLETE:
    none that looks complete or unmarked (a folder holding only Hydra's ``cli.log``)."""
    out = tmp_path / "run"
    proc = subprocess.Popen([*KVSIM, f"output.dir={out}", *LONG], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    try:
        time.sleep(delay)
        proc.send_signal(sig)
        err = proc.communicate(timeout=120)[1].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == -sig:  # (before Python's own handler was installed)
        assert err == "" and not out.exists()
        return
    assert proc.returncode == (130 if sig == signal.SIGINT else 143), err[-2000:]
    assert "Traceback" not in err and "Fatal Python error" not in err, err[-2000:]
    assert err.splitlines()[-1].startswith(
        "kvsim: interrupted; " if sig == signal.SIGINT else "kvsim: stopped by SIGTERM; "), \
        err[-2000:]
    # (no folder, the empty folder the check of output.dir made, or the run's marked folder)
    assert not out.exists() or not any(out.iterdir()) or (out / MARKER).exists(), \
        (sorted(p.name for p in out.iterdir()), err[-2000:])
    assert not is_complete(out)


_IMPORTS_BEFORE_SIGTERM_HANDLER = """
import re  # (the console script's own imports, before it imports sim.cli)
import sys

before_handler = []


class Probe:
    \"\"\"Notes each module imported while SIGTERM has no handler of kvsim's.\"\"\"

    def find_spec(self, name, path=None, target=None):
        sig = sys.modules.get("signal")
        handler = None if sig is None else sig.getsignal(sig.SIGTERM)
        if handler in (None, sig and sig.SIG_DFL, sig and sig.SIG_IGN):
            before_handler.append(name)
        return None


sys.meta_path.insert(0, Probe())
from sim.cli import main

sys.argv = ["kvsim", "--version"]
main()
print(",".join(before_handler))
"""


def test_sigterm_handler_is_set_before_any_module_beyond_sim_cli_is_imported():
    """The console script's window in which SIGTERM still ends the process by its default
    action (exit -15, nothing said) is the interpreter's start and the import of ``sim.cli``
    alone: ``sim`` and ``sim.cli`` import nothing, and :func:`sim.cli.main` sets the handler
    before importing any other module (``signal`` itself aside)."""
    r = subprocess.run([sys.executable, "-c", _IMPORTS_BEFORE_SIGTERM_HANDLER], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("kvsim "), r.stdout  # (the --version line: main ran)
    assert set(r.stdout.splitlines()[-1].split(",")) <= {"sim", "sim.cli", "signal"}, r.stdout


_STOP_AT_RESULTS_LINE = """
import sys

class Stdout:
    def __init__(self, f):
        self.f = f
    def write(self, t):
        if t.startswith("results: "):
            raise KeyboardInterrupt
        return self.f.write(t)
    def __getattr__(self, n):
        return getattr(self.f, n)

sys.stdout = Stdout(sys.stdout)
from sim.cli import main
main()
"""


def test_ctrl_c_after_the_results_are_written_leaves_a_complete_run_and_exit_0(tmp_path):
    """A run whose results and summary are written is complete: Ctrl-C after that (here while
    its ``results:`` line is printed) says so in one line and exits 0, the folder complete."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-c", _STOP_AT_RESULTS_LINE, f"output.dir={out}",
                        "trace.max_requests=5", "sim.progress=false",
                        "output.print_summary=false"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.splitlines()[-1] == (f"kvsim: interrupted; the run had completed: its results "
                                         f"in {out} are complete"), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert is_complete(out)


_SIGNALS_AFTER_MAIN_RETURNED = """
import os, signal, sys
sys.argv = ["kvsim", "--version"]
from sim.cli import main
main()
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGTERM)
print("still running")
"""


def test_ctrl_c_or_sigterm_after_the_command_returned_changes_nothing():
    """Once the command has returned (here ``kvsim --version``; a run after its ``results:``
    line), Ctrl-C and SIGTERM while the interpreter shuts down are ignored: exit 0, no
    traceback, rather than an end by the signal."""
    r = subprocess.run([sys.executable, "-c", _SIGNALS_AFTER_MAIN_RETURNED], cwd=REPO,
                       capture_output=True, text=True, timeout=120,
                       preexec_fn=_default_sigint)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "still running", r.stdout
    assert r.stderr == "", r.stderr[-2000:]


def test_sigterm_to_a_sweep_stops_its_workers(tmp_path):
    """SIGTERM to ``kvsim -m`` stops the sweep as Ctrl-C does: one line, exit 143, every process
    of the group gone (no orphaned joblib worker writing into job folders that a resumed sweep
    runs again), the unfinished jobs marked INCOMPLETE."""
    sweep = tmp_path / "sw"
    proc = subprocess.Popen([*KVSIM, "-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2",
                             f"hydra.sweep.dir={sweep}", "cache.block_size=16,32",
                             "sim.progress=false", *LONG[:3]], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((sweep / j / MARKER).exists() for j in ("0", "1")):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the sweep's jobs did not start (rc={proc.poll()})")
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        gone = time.monotonic() + 15  # (no worker left in the process group, once reaped)
        while True:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < gone, "the sweep's workers outlived it"
            time.sleep(0.2)
    finally:
        try:  # (workers left would hold the stderr pipe open: read it after they are gone)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    err = proc.stderr.read().decode()
    assert rc == 143, err[-2000:]
    assert ("kvsim: sweep stopped (SIGTERM); its unfinished jobs are marked INCOMPLETE and "
            "kvsim-collect lists those that never started") in err
    assert "Traceback" not in err
    for j in ("0", "1"):
        _assert_incomplete(sweep / j)


_SIGTERM_BEFORE_THE_SWEEP_STARTS = """
from sim.callbacks import FailedRunsExit

def stopped(self, config, **kwargs):
    raise KeyboardInterrupt("SIGTERM")  # (what sim.cli.main's SIGTERM handler raises)

FailedRunsExit.on_multirun_start = stopped
from sim.cli import main
main()
"""


def test_sigterm_before_a_sweep_takes_its_folder_says_no_job_ran(tmp_path):
    """SIGTERM while Hydra prepares a sweep, before the sweep takes its folder: one line saying
    no job ran (not that jobs were marked), exit 143, and no sweep folder."""
    sweep = tmp_path / "sw"
    r = subprocess.run([sys.executable, "-c", _SIGTERM_BEFORE_THE_SWEEP_STARTS, "-m",
                        f"hydra.sweep.dir={sweep}", "cache.block_size=16,32",
                        "trace.max_requests=5", "sim.progress=false"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 143, r.stderr[-2000:]
    assert r.stderr.strip() == "kvsim: sweep stopped (SIGTERM) before it started; no job ran", \
        r.stderr[-2000:]
    assert not sweep.exists()


def test_crash_mid_simulation_leaves_incomplete_dir(tmp_path):
    """An exception raised inside the engine (here: the simulated-time limit) ends the process
    non-zero with the directory still marked."""
    out = tmp_path / "run"
    r = subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false", "sim.max_sim_time_s=30",
                        "output.print_summary=false"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0
    assert "sim.max_sim_time_s=30" in r.stderr
    _assert_incomplete(out)


def test_rerun_into_completed_dir_that_fails_is_not_complete(tmp_path):
    """A finished directory reused by a run rejected by the config checks keeps its results
    (nothing is touched before the checks pass); reused by a run that fails while simulating,
    it loses its summary.json and gets the marker back, so it no longer reads as complete."""
    from sim.errors import ConfigError
    from sim.run import compose_config, run_simulation

    out = tmp_path / "run"
    run_simulation(compose_config(["sim.progress=false", "trace.max_requests=5"]), out)
    assert is_complete(out)
    summary = (out / "summary.json").read_bytes()
    with pytest.raises(ConfigError):
        run_simulation(compose_config(["sim.progress=false", "cache.block_size=3"]), out)
    assert is_complete(out) and (out / "summary.json").read_bytes() == summary
    with pytest.raises(ConfigError, match="max_sim_time_s"):
        run_simulation(compose_config(["sim.progress=false", "trace.max_requests=50",
                                       "sim.max_sim_time_s=1"]), out)
    assert (out / MARKER).exists() and not (out / "summary.json").exists()
    assert not is_complete(out)


def test_interrupt_message_says_what_the_folder_holds(tmp_path):
    """The closing line of a stopped run says which of four states the folder holds: nothing
    written, this run's INCOMPLETE marker, this run's complete results (stopped after writing
    them), or an earlier complete run (stopped before touching it)."""
    from sim.cli.job import _interrupted_state, _summary_stamp
    from sim.run import compose_config, run_simulation

    out = tmp_path / "run"
    assert _interrupted_state(out, None) == f"nothing was written to {out}"
    out.mkdir()
    (out / MARKER).write_text("stopped\n")
    assert _interrupted_state(out, None) == f"{out} is marked INCOMPLETE (no summary.json)"
    (out / MARKER).unlink()
    run_simulation(compose_config(["trace.max_requests=5", "sim.progress=false"]), out)
    assert _interrupted_state(out, None) == \
        f"this run had completed: its results in {out} are complete"
    assert _interrupted_state(out, _summary_stamp(out)) == \
        f"nothing was written; {out} keeps an earlier complete run"


def test_collect_names_the_overrides_of_interrupted_and_damaged_runs(tmp_path):
    """kvsim-collect lists an interrupted ``output.dir`` run (no .hydra/) and a run whose
    steps.parquet was deleted with their overrides: the in-progress marker records the run's
    overrides, and a summary's overrides are read before its checks."""
    import json

    from experiments import collect as C

    res = tmp_path / "res"
    proc = _start(res / "killed")
    try:
        _wait_simulating(proc)
    finally:
        proc.kill()  # (SIGKILL: nothing of kvsim's runs after it)
        proc.wait()
    for name in ("damaged", "good"):
        r = subprocess.run([*KVSIM, f"output.dir={res / name}", "sim.progress=false",
                            "trace.max_requests=20", "cache.block_size=32",
                            "output.print_summary=false"], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    (res / "damaged" / "steps.parquet").unlink()
    C.collect(res, tmp_path / "c", quiet=True)
    failed = {f["run_id"]: f for f in json.loads((tmp_path / "c" / "failed_runs.json").read_text())}
    assert set(failed) == {"killed", "damaged"}
    # (output.* and sim.progress are bookkeeping)
    assert failed["killed"]["overrides"] == " ".join([*LONG[:2], *SINGLE_ENGINE])
    assert "run interrupted or crashed" in failed["killed"]["reason"]
    assert failed["damaged"]["overrides"] == "trace.max_requests=20 cache.block_size=32"
    assert "steps.parquet" in failed["damaged"]["reason"]
