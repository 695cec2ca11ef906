"""Calibration in bounded memory: several passes give the one-pass statistics, a killed run resumes from the
groups already written, and compression reads one group at a time within the budget."""

from __future__ import annotations

import pytest
import torch

from acbench.calibration.engine import CalibSpec, calibrate
from acbench.model.groups import find_input_groups
from acbench.calibration.group_files import StatsStore, nbytes, read_group, write_group
from tests.conftest import tiny_model

NEEDS = frozenset({"C", "F", "abs_mean", "pairs"})
pytestmark = pytest.mark.usefixtures("private_stats_cache")  # tests of the cache: each starts from an empty one


def _close(a, b):
    for f in ("C", "F", "abs_mean", "xs", "gs"):
        x, y = getattr(a, f), getattr(b, f)
        if x is None and y is None:
            continue
        assert (x - y).abs().max() <= 1e-6 * y.abs().max(), f


def test_group_by_group_passes_equal_one_pass(windows):
    model = tiny_model("llama", hidden=32, inter=96)
    groups = find_input_groups(model)
    spec = CalibSpec(pair_tokens=64)
    once = calibrate(model, groups, windows, NEEDS, spec, progress=False)
    for g in groups:  # the smallest budget: one group per pass
        alone = calibrate(model, [g], windows, NEEDS, spec, progress=False)[g.name]
        _close(alone, once[g.name])


def test_store_round_trip_and_budget(tmp_path, windows):
    model = tiny_model("llama", hidden=32, inter=96)
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, NEEDS, CalibSpec(pair_tokens=64), progress=False)
    width = {g.name: g.d_in for g in groups}
    for name, st in stats.items():
        write_group(tmp_path, name, st, width[name])
    back = read_group(tmp_path, groups[0].name)
    _close(back, stats[groups[0].name])
    assert back.C.dtype == torch.float64 and back.xs.dtype == torch.float32
    one = nbytes(back)
    store = StatsStore(tmp_path, [g.name for g in groups], budget=one)  # room for about one group
    for g in groups:
        store[g.name]
    for g in groups:
        store[g.name]
    largest = max(nbytes(read_group(tmp_path, g.name)) for g in groups)
    assert store.reads == 2 * len(groups) and store.held_bytes <= max(one, largest)
    roomy = StatsStore(tmp_path, [g.name for g in groups], budget=None)
    for _ in range(2):
        for g in groups:
            roomy[g.name]
    assert roomy.reads == len(groups)
    with pytest.raises(KeyError):
        store["layers.9.attn_in"]


def test_bounded_run_resumes_from_written_groups(tmp_path, monkeypatch):
    """--stats-memory below the total: several passes; a group file lost (a run killed mid-way) is recomputed
    alone, and the statistics equal those of an unbounded run."""
    from acbench.model.sources import open_and_load_model
    from acbench.calibration.engine import CalibSpec
    from acbench.cli.smoke import tiny_checkpoint
    from acbench.calibration.cache import load_or_calibrate, stats_folder
    from acbench.calibration.group_files import group_file

    lm = open_and_load_model(str(tiny_checkpoint()), progress=False)
    groups = find_input_groups(lm.model)
    needs = frozenset({"C", "F", "pairs"})
    cspec = CalibSpec(samples=2, seq_len=32, pair_tokens=32, bos="none")
    full, info = load_or_calibrate(lm, groups, cspec, needs, progress=False)
    assert info["passes"] == 1
    reference = {g.name: full[g.name] for g in groups}
    folder = stats_folder(lm.fingerprint, cspec, needs)
    for g in groups:
        group_file(folder, g.name).unlink()
    from acbench.calibration.memory import calibration_chunks

    per_group = max(nbytes(s) for s in reference.values())
    memory = int(per_group * 1.5)  # the largest group and a little more per pass
    bounded, info = load_or_calibrate(lm, groups, cspec, needs, memory, progress=False)
    assert info["passes"] == len(calibration_chunks(groups, needs, 32, int(per_group * 1.5))) > 2
    for g in groups:
        _close(bounded[g.name], reference[g.name])
    group_file(folder, groups[2].name).write_bytes(b"truncated")  # as if killed while writing it
    again, info = load_or_calibrate(lm, groups, cspec, needs, memory, progress=False)
    assert info["groups_calibrated"] == 1 and info["passes"] == 1
    _close(again[groups[2].name], reference[groups[2].name])
    _, info = load_or_calibrate(lm, groups, cspec, needs, memory, progress=False)
    assert info["cached"]


def test_bfloat16_weights_float64_statistics_end_to_end(tmp_path):
    """The GPU path's dtype on CPU: bfloat16 weights, statistics still float32 products summed in float64, solves
    in float64, factors deployed in bfloat16."""
    import json

    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    out = tmp_path / "out"
    assert main(["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "fasc-kfac", "--rank", "0.5",
                 "--tasks", "ppl-token", "--ppl-windows", "1", "--ppl-seq-len", "32", "--calib-samples", "2",
                 "--calib-seq-len", "32", "--dtype", "bfloat16", "--output", str(out), "--no-report", "--quiet",
                 "--no-latency"]) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("ppl-token-*.json")]
    assert len(cells) == 3 and all(c["model_fingerprint"]["dtype"] == "bfloat16" for c in cells)
    assert all(c["metrics"]["ppl"] is not None for c in cells)
    compressed = [c for c in cells if c["compression"]]
    assert all(abs(c["compression"]["param_ratio"] - 0.762) < 0.01 for c in compressed)


def test_device_map_auto_runs_where_there_is_one_device(tmp_path, capsys):
    """--device-map auto (accelerate) loads through device_map, and factorised modules are built on each site's
    own device; with no GPU everything lands on the CPU and the run completes."""
    import json

    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    out = tmp_path / "out"
    assert main(["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "--rank", "0.5", "--tasks",
                 "ppl-token", "--ppl-windows", "1", "--ppl-seq-len", "32", "--calib-samples", "2", "--calib-seq-len",
                 "32", "--device-map", "auto", "--output", str(out), "--no-report", "--quiet", "--no-latency"]) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("ppl-token-*.json")]
    assert len(cells) == 2 and all(c["model_fingerprint"]["device_map"] == "auto" for c in cells)
    capsys.readouterr()
    assert main(["run", "--model", str(tiny_checkpoint()), "--device-map", "everywhere", "--output", str(out)]) == 2
    assert "--device-map 'everywhere' is unknown" in capsys.readouterr().err


def test_calibration_is_claimed_so_concurrent_runs_compute_it_once(tmp_path, monkeypatch):
    """A run that finds another holding the calibration claim waits, then reads what the other wrote."""
    import threading

    import acbench.calibration.cache as statistics
    from acbench.calibration.engine import CalibSpec
    from acbench.cli.smoke import tiny_checkpoint
    from acbench.model.sources import open_and_load_model
    from acbench.results.store import claim_cell, release_cell

    monkeypatch.setattr(statistics, "CLAIM_POLL_S", 0.05)
    lm = open_and_load_model(str(tiny_checkpoint()), progress=False)
    groups = find_input_groups(lm.model)
    needs, cspec = frozenset({"C"}), CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none")
    windows = statistics.calibration_windows(lm.tokenizer, cspec)
    folder = statistics.stats_folder(lm.fingerprint, cspec, needs)
    assert claim_cell(folder / statistics.CLAIM)  # another run is calibrating
    got = {}
    waiter = threading.Thread(target=lambda: got.update(info=statistics.load_or_calibrate(
        lm, groups, cspec, needs, progress=False, windows=windows)[1]))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # waiting for the claim, not calibrating
    statistics._calibrate_pending(lm, groups, groups, folder, cspec, needs, 2**40, 4, False, windows, {})
    release_cell(folder / statistics.CLAIM)
    waiter.join(30)
    assert got["info"]["cached"]  # it read the other run's statistics instead of computing them again
    assert not (folder / ".calibration.lock").exists()


def test_a_cached_superset_of_the_statistics_needed_is_read_not_recomputed(monkeypatch):
    """A sweep's C, F and pairs serve a later run (or `bench compress`) that needs C alone: nothing is calibrated,
    the values are the sweep's; a calibration of other tokens (another seed) is not taken for it."""
    import acbench.calibration.cache as statistics
    from acbench.cli.smoke import tiny_checkpoint
    from acbench.model.sources import open_and_load_model

    lm = open_and_load_model(str(tiny_checkpoint()), progress=False)
    groups = find_input_groups(lm.model)
    cspec = CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none")
    wide, _ = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C", "F", "pairs"}), progress=False)
    wide_C = {g.name: wide[g.name].C.clone() for g in groups}
    monkeypatch.setattr(statistics, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
    narrow, info = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C"}), progress=False)
    assert info["cached"] and info["needed"] == ["C"] and info["stats"] == ["C", "F", "pairs"]
    assert all(torch.equal(narrow[g.name].C, wide_C[g.name]) for g in groups)
    other = CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none", seed=1)
    with pytest.raises(pytest.fail.Exception, match="calibrated again"):
        statistics.load_or_calibrate(lm, groups, other, frozenset({"C"}), progress=False)


def _tiny_lm():
    from acbench.cli.smoke import tiny_checkpoint
    from acbench.model.sources import open_and_load_model

    lm = open_and_load_model(str(tiny_checkpoint()), progress=False)
    return lm, find_input_groups(lm.model), CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none")


def test_a_cached_folder_serves_the_statistics_its_files_hold_not_those_its_info_claims(monkeypatch):
    """info.json claiming [C, F] over files holding C only is not reused for a run that needs F: F is calibrated,
    and the record says what the files hold."""
    import json

    import acbench.calibration.cache as statistics

    lm, groups, cspec = _tiny_lm()
    _, info = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C"}), progress=False)
    folder = statistics.stats_cache_dir() / info["cache"]
    claimed = json.loads((folder / "info.json").read_text())
    (folder / "info.json").write_text(json.dumps({**claimed, "stats": ["C", "F", "pairs"]}))
    assert statistics.superset_folder(info["base"], frozenset({"C", "F"}), groups) is None
    store, wide = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C", "F"}), progress=False)
    assert not wide["cached"] and wide["stats"] == ["C", "F"]
    assert store[groups[0].name].F is not None


def test_a_cached_folder_is_read_only_for_the_calibration_its_files_name(monkeypatch):
    """Another model's (another base's) statistics are not served, whatever info.json's base says; a wider folder
    is found by its files, with info.json deleted or garbled."""
    import json

    import acbench.calibration.cache as statistics

    lm, groups, cspec = _tiny_lm()
    _, info = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C", "F"}), progress=False)
    folder = statistics.stats_cache_dir() / info["cache"]
    other_base = statistics.stats_base({"source": "local", "sha256": "0" * 64}, cspec)
    (folder / "info.json").write_text(json.dumps({"base": other_base, "stats": ["C", "F"]}))
    assert statistics.superset_folder(other_base, frozenset({"C"}), groups) is None
    assert statistics.superset_folder(info["base"], frozenset({"C"}), groups) == folder
    for garbage in ('{"stats": 5, "base": 3}', '{"stats": ["C", ["F"]]}', "[1, 2]", "{not json", '{"seconds": "abc"}'):
        (folder / "info.json").write_text(garbage)
        monkeypatch.setattr(statistics, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
        _, narrow = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C"}), progress=False)
        assert narrow["cached"] and narrow["stats"] == ["C", "F"] and narrow["base"] == info["base"]
        assert "seconds" not in narrow or isinstance(narrow["seconds"], float)


def test_a_group_file_of_another_calibration_is_recomputed_not_read(monkeypatch):
    """A group file copied in from another model's folder (same shapes, its own digest intact) is moved aside and
    its group recomputed: the file names the calibration it belongs to, under its digest."""
    import shutil

    import acbench.calibration.cache as statistics
    from acbench.calibration.group_files import group_file, group_problem

    lm, groups, cspec = _tiny_lm()
    _, info = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C"}), progress=False)
    folder = statistics.stats_cache_dir() / info["cache"]
    other = CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none", seed=1)
    _, info2 = statistics.load_or_calibrate(lm, groups, other, frozenset({"C"}), progress=False)
    g = groups[0]
    shutil.copy(group_file(statistics.stats_cache_dir() / info2["cache"], g.name), group_file(folder, g.name))
    assert group_problem(folder, g.name, g.d_in) is None  # a sound file ...
    assert "another model or calibration" in group_problem(folder, g.name, g.d_in, info["base"])  # ... not ours
    _, again = statistics.load_or_calibrate(lm, groups, cspec, frozenset({"C"}), progress=False)
    assert not again["cached"] and again["groups_calibrated"] == 1
