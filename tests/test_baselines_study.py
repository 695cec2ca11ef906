"""studies/baselines.py: each new method paired with the older ones of its family at the papers' budgets, on the
same windows; Holm's correction across the page; a destroyed budget marked; a model without cells said so."""

import pytest

from conftest import hand_cell

BASE = [3.0 + 0.05 * i for i in range(8)]


def _cell(method, budget, rank, shift, model="m", calibration=None, compute=0.5):
    return hand_cell(model, method, "ppl-token", rank, [b + shift + 0.01 * (i % 3) for i, b in enumerate(BASE)],
                     budget=budget, compute=compute, calibration=calibration)


def test_each_section_pairs_its_new_methods_with_the_older_ones_and_holm_reads_the_verdicts():
    from acbench.core.meta_analysis import holm
    from acbench.core.significance import compare
    from acbench.studies.baselines import comparisons, render

    cells = [hand_cell("m", "dense", "ppl-token", None, BASE),
             _cell("sparsegpt", "unstructured", 0.5, 0.10), _cell("wanda", "unstructured", 0.5, 0.30),
             _cell("magnitude-prune", "unstructured", 0.5, 2.50),  # more than 5x dense's perplexity: destroyed
             _cell("sparsegpt", "2:4", 0.5, 0.6), _cell("wanda", "2:4", 0.5, 0.6),
             _cell("svd-llm-v2", "params", 0.8, 0.2), _cell("whitened-svd", "params", 0.8, 0.25),
             _cell("cats", "unstructured", 0.5, 0.05, compute=0.76), _cell("teal", "unstructured", 0.5, 0.2)]
    rows = comparisons(cells, ["m"])
    pairs = [(r["budget"], r["new"].cell.method, r["old"].cell.method) for r in rows]
    assert pairs == [("density 0.5", "cats", "teal"), ("density 0.5", "sparsegpt", "wanda"),
                     ("density 0.5", "sparsegpt", "magnitude-prune"), ("2:4", "sparsegpt", "wanda"),
                     ("params 0.8", "svd-llm-v2", "whitened-svd")]
    ps = [compare(r["old"], r["new"])["p"] for r in rows]
    assert [r["holm_p"] for r in rows] == pytest.approx(holm(ps))
    verdicts = {p[1:] + (p[0],): r["verdict"] for p, r in zip(pairs, rows)}
    assert verdicts[("sparsegpt", "wanda", "density 0.5")] == "better"  # 0.2 nats lower on every window
    assert verdicts[("sparsegpt", "wanda", "2:4")] == "equivalent"  # the same windows to the last digit
    text = render(cells, "root", models=["m", "other"])
    assert "(destroyed)" in text and "### other\n\nNot yet measured." in text
    assert "Not yet measured (17): wina vs act-sparse (density 0.5); wina vs teal (density 0.5);" in text
    assert "| density 0.5 | sparsegpt | wanda " in text.replace("  ", " ").replace("  ", " ")


def test_the_page_is_written_from_the_stored_cells(tmp_path):
    from acbench.studies.baselines import main

    doc = tmp_path / "b.md"
    assert main(["--root", str(tmp_path / "none"), "--doc", str(doc), "--models", "m"]) == 0
    assert "Not yet measured." in doc.read_text()
    with pytest.raises(SystemExit):
        main(["--doc", "b.txt"])
