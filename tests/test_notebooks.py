"""Every notebook in notebooks/ runs top to bottom in its short form (SERVESIM_NOTEBOOK_SHORT=1)."""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CORE = ("01_", "02_", "03_", "04_", "05_")   # issue 5's notebooks (06: the claims audit)
CELL_TIMEOUT_S = 180


def test_core_notebooks_exist():
    names = [p.name for p in NOTEBOOKS]
    for prefix in CORE:
        assert any(n.startswith(prefix) for n in names), f"no notebooks/{prefix}*.ipynb"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name.startswith(CORE)], ids=lambda p: p.name)
def test_core_notebook_is_committed_clean(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(c.get("outputs") for c in code), f"{path.name}: clear its outputs before committing"
    assert any("SERVESIM_NOTEBOOK_SHORT" in c.source for c in code), \
        f"{path.name}: its parameters cell must read SERVESIM_NOTEBOOK_SHORT"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_uses_only_the_public_api(path):
    """`import servesim` (servesim.py) and nothing of servesim's own packages: the notebooks show
    what a user's code looks like, and the internals may move."""
    import re

    nb = nbformat.read(path, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    inner = re.findall(r"^\s*(?:from|import)\s+(sim|calibrate|kernels|cli)\b.*$", code, re.M)
    assert not inner, f"{path.name} imports servesim's internals: {inner}"
    assert re.search(r"^import servesim$", code, re.M)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_short(path, monkeypatch):
    monkeypatch.setenv("SERVESIM_NOTEBOOK_SHORT", "1")   # the kernel inherits it
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute()   # raises CellExecutionError naming the cell on any error
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
