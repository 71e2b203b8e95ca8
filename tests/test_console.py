"""sim.console.exit_after_interrupt: the exit status of a ``python -m`` program that caught an
interrupt inside code ``exec()`` ran from a string."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _program(tmp_path: Path, ending: str) -> int:
    """Run, as ``python -m``, a module that catches a KeyboardInterrupt raised inside an
    ``exec()`` of a string, then ends with ``ending``; its exit status."""
    (tmp_path / "caught_inside_exec.py").write_text(textwrap.dedent(f"""\
        import sys
        from sim.console import exit_after_interrupt

        try:
            exec("raise KeyboardInterrupt")
        except KeyboardInterrupt:
            print("caught", file=sys.stderr)
        {ending}
        """))
    proc = subprocess.run([sys.executable, "-m", "caught_inside_exec"], cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert proc.stderr.strip() == "caught", proc.stderr
    return proc.returncode


@pytest.mark.parametrize("status", [130, 143])
def test_exit_after_interrupt_keeps_the_status(tmp_path, status):
    assert _program(tmp_path, f"exit_after_interrupt({status})") == status


def test_sys_exit_after_such_an_interrupt_ends_by_sigint(tmp_path):
    """The hazard exit_after_interrupt exists for, on this interpreter: a normal exit's status
    is replaced by SIGINT."""
    assert _program(tmp_path, "sys.exit(143)") == -2
