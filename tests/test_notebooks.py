"""The notebooks execute headless, top to bottom, at their small default sizes.

``notebooks/01_quickstart.ipynb`` (the library in ten cells) and ``notebooks/02_benchmarks.ipynb``
(the PPR comparison with the peers, plotted) are run with nbclient in a fresh kernel; figures go
to a temporary folder. Skipped, with the reason, when nbclient / nbformat / ipykernel /
matplotlib are not installed (they are benchmark / docs extras, not runtime dependencies).
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _require(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (notebook extras)")


@pytest.mark.parametrize("name", ["01_quickstart", "02_benchmarks", "03_learning_from_use"])
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("nbformat", "nbclient", "ipykernel", "matplotlib"):
        _require(module)
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("SOULMEM_NB_OUT", str(tmp_path))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(
        nb,
        timeout=240,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any failure
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors
    if name == "01_quickstart":  # no warnings in what a reader sees; both figures drawn
        stderr = [
            out["text"]
            for cell in nb.cells
            if cell.cell_type == "code"
            for out in cell.get("outputs", [])
            if out.get("output_type") == "stream" and out.get("name") == "stderr"
        ]
        assert not stderr, stderr
        assert sorted(p.name for p in tmp_path.glob("*.png")) == [
            "memory_graph.png",
            "query_ppr.png",
        ]
    if name == "02_benchmarks":
        assert sorted(p.name for p in tmp_path.glob("*.png")) == [
            "ppr_cpu_vs_gpu.png",
            "ppr_time_vs_error.png",
            "ppr_time_vs_size.png",
        ]


@pytest.mark.parametrize(("name", "figures"), [("01_quickstart", 2), ("02_benchmarks", 3)])
def test_notebook_is_committed_with_its_outputs(name: str, figures: int) -> None:
    """Whoever browses the repository sees the results and plots without running anything
    (regenerate with nbclient after changing a notebook; CI still executes it above)."""
    import json

    nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c.get("execution_count") for c in code), "a code cell was not run"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == figures, f"{name}: {len(pngs)} figures in the committed outputs"
