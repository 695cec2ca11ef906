"""Several models in one sweep, as a user's disk has them: two checkpoints that share a folder name, one model
named twice, a later model that cannot load. Each ends in a folder per model or one line before the first cell."""

import json
import shutil
from pathlib import Path

import pytest

from acbench.cli import main
from tests.test_hostile_input import base, expect_one_line, no_cells


def _other_weights(tiny: Path, dst: Path, scale: float = 1.01) -> Path:
    """The tiny checkpoint with one tensor changed: another model of the same shapes."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny, dst)
    tensors = load_file(dst / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name] * scale
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _dense(models, out):
    return base(models[0], out, **{"--model": [str(m) for m in models], "--methods": "dense", "--rank": None})


def _models_in(out: Path) -> dict[str, set]:
    found: dict[str, set] = {}
    for p in out.rglob("*.json"):
        rec = json.loads(p.read_text())
        found.setdefault(rec["cell"]["model"], set()).add(rec["model_fingerprint"]["sha256"])
    return found


def test_two_models_with_one_folder_name_get_a_folder_each(tmp_path, tiny):
    """runs/a/checkpoint-1 and runs/b/checkpoint-1: two results folders, each one model's; a rerun computes
    nothing and a later run of b alone finds its own folder; the report shows both models."""
    a = _other_weights(tiny, tmp_path / "a" / "checkpoint-1", 1.0)
    b = _other_weights(tiny, tmp_path / "b" / "checkpoint-1", 1.01)
    out = tmp_path / "out"
    assert main(_dense([a, b], out)) == 0
    found = _models_in(out)
    assert len(found) == 2 and all(len(h) == 1 for h in found.values()), found
    assert "checkpoint-1" in found and any(n.startswith("checkpoint-1-") for n in found)
    before = sorted(p for p in out.rglob("*.json"))
    assert main(_dense([b], out)) == 0 and sorted(out.rglob("*.json")) == before  # b's cells found, not redone
    from acbench.leaderboard.load import read_result_set

    rs = read_result_set(out)
    assert {c.cell.model for c in rs.cells} == set(found) and not rs.problems


@pytest.mark.parametrize("twin", ["slash", "link"])
def test_one_model_named_twice_is_refused_before_any_cell(tmp_path, tiny, capsys, twin):
    a = _other_weights(tiny, tmp_path / "m", 1.0)
    if twin == "slash":
        other = f"{a}/"
    else:
        (tmp_path / "link").symlink_to(a, target_is_directory=True)
        other = str(tmp_path / "link")
    out = tmp_path / "out"
    argv = base(a, out, **{"--model": [str(a), other], "--methods": "dense", "--rank": None})
    expect_one_line(capsys, argv, "names one model twice")
    assert no_cells(out)


def test_a_later_model_whose_weights_do_not_fit_is_refused_before_the_first_cell(tmp_path, tiny, capsys):
    good = _other_weights(tiny, tmp_path / "good", 1.0)
    wide = _other_weights(tiny, tmp_path / "wide", 1.0)
    cfg = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 2 * cfg["intermediate_size"]}))
    out = tmp_path / "out"
    expect_one_line(capsys, _dense([good, wide], out), "do not fit its config.json (model.layers.")
    assert no_cells(out)


def test_an_old_tree_with_two_models_in_one_folder_is_said_not_merged(tmp_path, tiny):
    """Cells of two models filed under one name by an earlier version: the report keeps the newest model's cells
    and names the others, never mixing the two in one row."""
    from acbench.leaderboard.load import read_result_set

    a = _other_weights(tiny, tmp_path / "x" / "ck", 1.0)
    out = tmp_path / "out"
    assert main(_dense([a], out)) == 0
    src = next(out.rglob("*.json"))
    rec = json.loads(src.read_text())
    rec["model_fingerprint"] = {**rec["model_fingerprint"], "sha256": "f" * 64}
    rec["env"] = {**rec["env"], "date": "2000-01-01T00:00:00"}
    rec["cell"]["key"] = "0123456789"
    (src.parent / f"{rec['cell']['task']}-0123456789.json").write_text(json.dumps(rec))
    rs = read_result_set(out)
    assert len(rs.cells) == 1 and rs.cells[0].model_hash != "f" * 64
    assert any("another model" in p for p in rs.problems), rs.problems
