"""Fuzz: a tampered checkpoint is one line or loads as written, and every built-in method's saved checkpoint is
evaluated by bench run as the dense model."""

import contextlib
import io
import json
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from acbench.cli import main
from acbench.cli.smoke import tiny_checkpoint
from fuzz_common import _paths, assert_clean, json_value


# ---------------------------------------------------------------- checkpoint folders

def _saved(folder, method: str, budget: list[str]):
    """(folder, x, logits): the tiny model compressed by `bench compress --save folder`, and what acbench's load of
    it gives for a fixed x."""
    from acbench.model.sources import open_and_load_model

    args = ["compress", "--model", str(tiny_checkpoint()), "--method", method, *budget, "--save", str(folder),
            "--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32", "--quiet"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    x = torch.arange(1, 13)[None]
    with torch.no_grad():
        return folder, x, open_and_load_model(str(folder), progress=False).model(x).logits


def _refused_or_as_saved(folder, x, reference, why=()) -> None:
    """Loading `folder` is one UserError line, or a model whose logits are `reference`'s, bit for bit."""
    from acbench.model.sources import open_and_load_model
    from acbench.core.errors import UserError

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            lm = open_and_load_model(str(folder), progress=False)
    except UserError as e:
        assert "\n" not in str(e).strip(), str(e)
        return
    with torch.no_grad():
        assert torch.equal(lm.model(x).logits, reference), why


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A factorised checkpoint of the tiny model (bench compress), and the logits acbench's load gives."""
    return _saved(tmp_path_factory.mktemp("ck") / "pca", "pca", ["--rank", "0.5"])


CHECKPOINT_TAMPERS = ["flip", "delete", "add", "edit_json", "drop_key", "truncate"]


@given(tamper=st.sampled_from(CHECKPOINT_TAMPERS), which=st.integers(0, 20), where=st.floats(0, 1),
       value=json_value)
def test_a_tampered_checkpoint_is_refused_or_loads_as_written(tmp_path, checkpoint, tamper, which, where, value):
    """Any change to a saved checkpoint's files (a byte flipped, a file deleted, added or truncated, a JSON field
    edited or dropped) is one UserError on load, or leaves the model it loads bit-identical: never a traceback,
    never other numbers."""

    folder, x, reference = checkpoint
    f = tmp_path / "ck"
    shutil.rmtree(f, ignore_errors=True)
    shutil.copytree(folder, f)
    files = sorted(p for p in f.iterdir() if p.is_file())
    target = files[which % len(files)]
    if tamper == "flip":
        data = bytearray(target.read_bytes())
        data[int(where * (len(data) - 1))] ^= 0x01
        target.write_bytes(bytes(data))
    elif tamper == "delete":
        target.unlink()
    elif tamper == "add":
        names = ["extra.safetensors", "extra.py", "special_tokens_map.json", "pytorch_model.bin", "notes.md"]
        (f / names[which % len(names)]).write_bytes(b"{}")
    elif tamper == "truncate":
        target.write_bytes(target.read_bytes()[: int(where * (target.stat().st_size - 1))])
    else:
        name = ["config.json", "compression.json", "tokenizer_config.json", "generation_config.json"][which % 4]
        obj = json.loads((f / name).read_text())
        paths = [p for p in _paths(obj) if p]
        path = paths[int(where * (len(paths) - 1))]
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        if tamper == "drop_key" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        (f / name).write_text(json.dumps(obj))
    _refused_or_as_saved(f, x, reference, (tamper, target.name))


@pytest.fixture(scope="module")
def newer_checkpoints(tmp_path_factory):
    """A LaRoSa checkpoint (rotated inputs: the layout's `rotation` field), an R-Sparse one (low-rank branches:
    `rank`) and a CATS one (thresholded activations: entries keyed by an activation module, `form` and `d_in`) of the
    tiny model, with their logits."""
    return {m: _saved(tmp_path_factory.mktemp("ck") / m, m, ["--sparsity", "0.5"])
            for m in ("larosa", "r-sparse", "cats")}


@settings(max_examples=30, deadline=None)
@given(field=st.sampled_from([("larosa", "rotation"), ("r-sparse", "rank"), ("cats", "form"), ("cats", "d_in")]),
       value=json_value, drop=st.booleans(),
       which=st.integers(0, 50))
def test_a_tampered_rotation_or_rank_field_is_refused_or_loads_as_written(tmp_path_factory, newer_checkpoints, field,
                                                                          value, drop, which):
    """The `rotation` field of a rotated site's layout spec, the `rank` of a site's low-rank branch, or the `form` or
    `d_in` of a thresholded activation, set to any JSON value or dropped: one UserError on load, or the model it
    loads is the one saved."""
    from acbench.core.compressed_layers import LAYOUT_KEY

    method, key = field
    folder, x, reference = newer_checkpoints[method]
    f = tmp_path_factory.mktemp("tampered") / "ck"
    shutil.copytree(folder, f)
    cfg = json.loads((f / "config.json").read_text())
    holders = sorted(site for site, spec in cfg[LAYOUT_KEY].items() if spec.get(key))
    assert holders
    spec = cfg[LAYOUT_KEY][holders[which % len(holders)]]
    if drop:
        del spec[key]
    else:
        spec[key] = value
    (f / "config.json").write_text(json.dumps(cfg))
    _refused_or_as_saved(f, x, reference, (method, key))


# ---------------------------------------------------------------- saved checkpoints, run as the dense model

def _saved_cases():
    """Every built-in method at a budget it takes (2:4, or a density for a method that keeps thresholds), the
    threshold method under its per-group allocation, and one merged low-rank form."""
    from acbench import methods
    from acbench.core.stats import SPARSITY_FAMILY, SparsitySpec

    cases = []
    for m in methods.known_methods():
        if methods.family_of(m) != SPARSITY_FAMILY:
            cases.append((m, ["--rank", "0.5"]))
        elif methods.get_method(m).pattern_problem(SparsitySpec.parse("2:4")):
            cases.append((m, ["--sparsity", "0.5"]))
        else:
            cases.append((m, ["--sparsity", "2:4"]))
    return cases + [("teal", ["--sparsity", "0.5", "--allocate", "greedy"]), ("pca", ["--rank", "0.5", "--merged"])]


@pytest.mark.parametrize("method,budget", _saved_cases(), ids=lambda c: c if isinstance(c, str) else " ".join(c))
def test_every_saved_checkpoint_is_evaluated_by_bench_run_as_dense(tmp_path, tiny, method, budget):
    """A checkpoint `bench compress` wrote is a model like any other: `bench run --model <ckpt> --methods dense`
    writes its cell (a threshold checkpoint's with the density its tokens kept), never a traceback."""
    ck, out = tmp_path / "ck", tmp_path / "out"
    calib = ["--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32"]
    assert assert_clean(["compress", "--model", str(tiny), "--method", method, *budget, "--save", str(ck), *calib,
                         "--quiet"]) == 0
    rc = assert_clean(["run", "--model", str(ck), "--methods", "dense", "--tasks", "ppl-token", "--ppl-windows", "1",
                       "--ppl-seq-len", "32", "--output", str(out), "--no-latency", "--no-report", "--quiet"])
    assert rc == 0
    (cell,) = out.rglob("ppl-token-*.json")
    rec = json.loads(cell.read_text())
    assert rec["cell"]["method"] == "dense" and rec["metrics"]["ppl"] > 0
    thresholds = method in ("teal", "cats")
    density = (rec.get("compression") or {}).get("measured_density")
    assert (density is not None) == thresholds, rec.get("compression")
    if thresholds:
        assert 0 < density < 1
