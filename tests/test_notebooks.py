"""The analysis notebooks run top to bottom, headless, on the small sweeps they produce.

Each notebook (``notebooks/*.ipynb``) is executed with nbclient in a fresh kernel; a notebook
that no longer runs fails here. Each takes well under 2 minutes on 2 cores (2 sweep workers).
The committed notebooks must have their outputs cleared and match their jupytext pair
(``notebooks/*.py``, percent format): edit the .py (or the notebook in Jupyter with jupytext)
and run ``jupytext --sync notebooks/*.ipynb``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

REPO = Path(__file__).resolve().parent.parent
NB_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))

# The PNGs each notebook must write into notebooks/figures/.
FIGURES = {
    "hit_by_tier": ["hit_by_tier.png", "disk_share.png", "ttft_vs_host_gib.png"],
    "ttft": ["ttft_cdf.png", "ttft_decomposition.png", "ttft_decomposition_p90.png"],
    "blocks_freed": ["blocks_freed.png", "fragmentation_one_request.png", "bytes_moved.png",
                     "pool_fragmentation.png"],
}


def test_every_notebook_is_listed():
    assert sorted(p.stem for p in NOTEBOOKS) == sorted(FIGURES)


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_committed_clean_and_paired(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, (
                f"{nb_path.name}: outputs not cleared (jupyter nbconvert --clear-output --inplace)")
    jupytext = pytest.importorskip("jupytext")
    paired = nb_path.with_suffix(".py")
    assert paired.is_file(), f"{paired} missing (jupytext --set-formats ipynb,py:percent)"
    py = jupytext.read(paired)
    src = [(c.cell_type, c.source.strip()) for c in nb.cells]
    assert src == [(c.cell_type, c.source.strip()) for c in py.cells], (
        f"{nb_path.name} and {paired.name} differ: run jupytext --sync {nb_path}")


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_headless(nb_path, tmp_path):
    nb = nbformat.read(nb_path, as_version=4)
    figdir = NB_DIR / "figures"
    started = time.time()
    env_before = {k: os.environ.get(k) for k in ("KVSIM_NOTEBOOK_SWEEPS", "MPLBACKEND")}
    os.environ["KVSIM_NOTEBOOK_SWEEPS"] = str(tmp_path / "sweeps")  # the kernel inherits it
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                         resources={"metadata": {"path": str(NB_DIR)}})
        client.execute()
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, json.dumps(errors, default=str)[:2000]
    for name in FIGURES[nb_path.stem]:
        p = figdir / name
        assert p.is_file() and p.stat().st_mtime >= started - 1, f"{nb_path.stem} did not write {p}"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the figures are also displayed inline
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert len(images) >= len(FIGURES[nb_path.stem])
