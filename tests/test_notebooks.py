"""The analysis notebooks run top to bottom, headless, on the small sweeps they produce.

Each notebook (``notebooks/*.ipynb``) is executed once with nbclient in a fresh kernel, its
sweeps and figures in a temporary folder; a notebook that no longer runs, that writes into the
checkout's notebooks/figures/, or that does not open with its question and end with sentences
computed from its figures' data fails here. Each takes well under 2 minutes on 2 cores (2 sweep
workers).
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

# The PNGs each notebook must write (each with its data table, the same name with .csv) into
# the folder KVSIM_NOTEBOOK_FIGURES names (notebooks/figures/ when unset).
FIGURES = {
    "hit_by_tier": ["hit_by_tier.png", "disk_share.png", "ttft_vs_host_gib.png"],
    "ttft": ["ttft_cdf.png", "ttft_decomposition.png", "ttft_decomposition_p90.png"],
    "blocks_freed": ["blocks_freed.png", "fragmentation_one_request.png", "bytes_moved.png"],
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


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file under ``folder`` (empty when it is missing)."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", params=NOTEBOOKS, ids=lambda p: p.stem)
def executed(request, tmp_path_factory):
    """The notebook executed once in a fresh kernel, its sweeps and figures in a temporary folder
    (``KVSIM_NOTEBOOK_SWEEPS``, ``KVSIM_NOTEBOOK_FIGURES``), with the checkout's
    notebooks/figures/ listed before and after."""
    nb_path = request.param
    tmp = tmp_path_factory.mktemp(nb_path.stem)
    nb = nbformat.read(nb_path, as_version=4)
    checkout_figures = NB_DIR / "figures"
    before = _snapshot(checkout_figures)
    started = time.time()
    env = {"KVSIM_NOTEBOOK_SWEEPS": str(tmp / "sweeps"),  # the kernel inherits them
           "KVSIM_NOTEBOOK_FIGURES": str(tmp / "figures"),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    env_before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
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
    return {"name": nb_path.stem, "nb": nb, "figures": tmp / "figures", "started": started,
            "before": before, "after": _snapshot(checkout_figures)}


def _outputs(nb):
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def test_notebook_runs_headless_and_saves_each_figure_with_its_table(executed):
    errors = [o for o in _outputs(executed["nb"]) if o.get("output_type") == "error"]
    assert not errors, json.dumps(errors, default=str)[:2000]
    for name in FIGURES[executed["name"]]:
        p = executed["figures"] / name
        assert p.is_file() and p.stat().st_mtime >= executed["started"] - 1, (
            f"{executed['name']} did not write {p}")
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        table = p.with_suffix(".csv")
        assert table.is_file() and table.stat().st_size > 0, f"no data table beside {p}"
    # the figures are also displayed inline
    images = [o for o in _outputs(executed["nb"]) if "image/png" in o.get("data", {})]
    assert len(images) >= len(FIGURES[executed["name"]])


def test_notebook_leaves_the_checkouts_figures_folder_untouched(executed):
    assert executed["after"] == executed["before"], (
        f"{executed['name']} wrote into notebooks/figures/ although KVSIM_NOTEBOOK_FIGURES "
        f"named {executed['figures']}")


def test_notebook_opens_with_its_question_and_ends_with_sentences_from_its_figures(executed):
    cells = executed["nb"].cells
    title = cells[0].source.splitlines()[0]
    assert cells[0].cell_type == "markdown" and title.startswith("# ") and title.endswith("?"), (
        title)
    last = [c for c in cells if c.cell_type == "code"][-1]
    assert "plots.figure_data(" in last.source and 'f"' in last.source
    texts = [o["data"]["text/markdown"] for o in last.get("outputs", [])
             if "text/markdown" in o.get("data", {})]
    assert len(texts) == 1 and sum(ch.isdigit() for ch in texts[0]) >= 6, texts
    assert "{" not in texts[0] and "nan" not in texts[0].lower(), texts[0]
