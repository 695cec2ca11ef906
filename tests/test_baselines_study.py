"""studies/baselines.py: the tables pair each new method with the older ones of its family on the same items, and
LaRoSa's matched-density cells get rows of their own; CATS meets the older methods at its own compute only."""

from conftest import hand_cell


def _cell(model, method, task, rank, values, compute=0.5):
    return hand_cell(model, method, task, rank, values, compute=compute)


def test_new_methods_are_paired_with_their_family_and_matched_density_rows_are_their_own():
    from studies.baselines import tables

    lama = {"dense": [1] * 8 + [0] * 2, "act-sparse": [1] * 5 + [0] * 5, "teal": [1] * 4 + [0] * 6,
            "wina": [1] * 7 + [0] * 3, "larosa": [1] * 6 + [0] * 4, "wanda": [1] * 3 + [0] * 7,
            "sparsegpt": [1] * 6 + [0] * 4}
    cells = []
    for method, v in lama.items():
        cells.append(_cell("m", method, "lama", 0.5, v))
        cells.append(_cell("m", method, "ppl-token", 0.5, [3.0, 3.2, 3.1] if method == "dense" else [3.5, 3.6, 3.4]))
    cells += [_cell("m", "larosa", "lama", 0.312, [1] * 2 + [0] * 8, 0.5),
              _cell("m", "larosa", "ppl-token", 0.312, [4.0, 4.2, 4.1], 0.5),
              _cell("m", "cats", "lama", 0.5, [1] * 7 + [0] * 3, 0.76),
              _cell("m", "cats", "ppl-token", 0.5, [3.3, 3.4, 3.2], 0.76),
              _cell("m", "teal", "lama", 0.76, [1] * 6 + [0] * 4, 0.76),
              _cell("m", "teal", "ppl-token", 0.76, [3.4, 3.5, 3.3], 0.76)]
    text = "\n".join(tables(cells))
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| new")]
    pairs = [tuple(c.strip() for c in ln.strip("|").split("|")[:6:5]) for ln in rows]
    assert pairs == [("wina", "act-sparse"), ("wina", "teal"), ("larosa", "act-sparse"), ("larosa", "teal"),
                     ("larosa@0.312", "act-sparse"), ("larosa@0.312", "teal"), ("cats", "teal@0.76"),
                     ("sparsegpt", "wanda")]
    wina_vs_act = rows[0]
    assert "+0.200" in wina_vs_act  # 7 of 10 right against 5 of 10, paired on the same items
    assert "Dense: LAMA P@1 0.800" in text
