"""Golden matrix (tests/golden/matrix.py): every trace x tiers x policy x compactor case gives
the recorded tables with the per-step loop and with the fast paths."""

import json

import pytest

from golden.matrix import GOLDEN, MODES, SHARED_TRACES, cases, run_case
from traces.config import traces_dir

_GOLDEN = json.loads(GOLDEN.read_text())


def _params():
    for cid, ov in cases(shared=True).items():
        shared = cid.split("/")[0] in SHARED_TRACES
        for mode in MODES:
            marks = [pytest.mark.slow] if shared else []
            yield pytest.param(cid, ov, mode, id=f"{cid}/{mode}", marks=marks)


@pytest.mark.parametrize("cid,overrides,mode", list(_params()))
def test_golden_matrix_tables(cid, overrides, mode):
    if cid.split("/")[0] in SHARED_TRACES and not traces_dir().is_dir():
        pytest.skip(f"{traces_dir()} absent: the real traces are not here (set KVSIM_TRACES_DIR)")
    assert run_case([*overrides, *MODES[mode]]) == _GOLDEN[cid]
