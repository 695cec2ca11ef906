"""examples/compress_evaluate_plot_save.ipynb runs top to bottom in a fresh kernel (nbclient), on the embedded
SmolLM2-135M, as a notebook user runs it: three methods compressed and evaluated, the plot written, one model saved
and reloaded by transformers with logits equal to the deployed ones (its last cell asserts that)."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "compress_evaluate_plot_save.ipynb"


def test_the_notebook_is_stored_without_outputs():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


@pytest.mark.slow
def test_the_notebook_runs_in_a_fresh_kernel(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's OUT lands here
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = {o.get("output_type") for c in nb.cells if c.cell_type == "code" for o in c.outputs}
    assert "error" not in outputs
    (out,) = [p for p in tmp_path.iterdir() if p.name.startswith("acbench-notebook-")]
    assert (out / "quality_vs_compute.png").stat().st_size > 0
    assert (out / "smollm2-pca-0.75" / "config.json").exists()
