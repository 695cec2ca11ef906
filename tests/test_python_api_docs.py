"""docs/python-api.md's examples run as written: every ```python block, in order, in one namespace, with `OUT` a
fresh folder. The fast test swaps the page's model for the smoke check's tiny Llama (the calls and keywords are the
page's own); the slow one runs the page unchanged on SmolLM2-135M."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_docs_code_blocks import blocks

PAGE = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"
MODEL_LINE = 'MODEL = "smollm2-135m"'


def page_code() -> str:
    code = [text for _, language, text in blocks(PAGE) if language == "python"]
    assert len(code) >= 2, "the page's examples are its python blocks"
    return "\n".join(code)


OUT_LINE = 'OUT = Path(tempfile.mkdtemp(prefix="acbench-"))'


def run_page(code: str, out: Path, capsys) -> str:
    """The page's code in one namespace, its OUT the test's folder (the page makes a temporary one of its own)."""
    assert code.count(OUT_LINE) == 1, "the page defines OUT once, in its first block"
    namespace = {"__name__": "python_api_page"}
    exec(compile(code.replace(OUT_LINE, f"OUT = Path({str(out)!r})"), str(PAGE), "exec"), namespace)  # noqa: S102
    return capsys.readouterr().out


def check_ran(printed: str, out: Path):
    assert (out / "smollm2-fasc-kfac-0.5" / "config.json").exists()  # c.save wrote a checkpoint
    cells = list((out / "results").rglob("*.json"))
    assert cells, "the sweep stored its cells"
    assert "ppl" in printed and "fasc-kfac" in printed and "->" in printed


def test_the_page_names_its_model_once():
    assert page_code().count(MODEL_LINE) == 1  # the line the fast test swaps


def test_the_page_runs_on_the_tiny_model(tiny, tmp_path, capsys):
    code = page_code().replace(MODEL_LINE, f"MODEL = {str(tiny)!r}")
    check_ran(run_page(code, tmp_path, capsys), tmp_path)


@pytest.mark.slow
def test_the_page_runs_as_written_on_smollm2(tmp_path, capsys):
    check_ran(run_page(page_code(), tmp_path, capsys), tmp_path)
