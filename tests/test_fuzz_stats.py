"""Fuzz: a tampered statistics cache never changes a number, and a change that matters is said."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from acbench.core.log import console_lines
from hypothesis import given
from hypothesis import strategies as st

from acbench.cli.smoke import tiny_checkpoint
from tests.fuzz_common import json_value


# ---------------------------------------------------------------- the statistics cache

@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """The tiny model's statistics in a cache of their own, and the values a clean read gives."""
    import os

    from acbench.calibration.engine import CalibSpec
    from acbench.model.groups import find_input_groups
    from acbench.model.sources import open_and_load_model
    from acbench.calibration.cache import calibration_windows, load_or_calibrate, stats_folder

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("ACBENCH_CACHE"), os.environ.get("ACBENCH_STATS_CACHE")
    os.environ["ACBENCH_CACHE"] = str(cache)
    os.environ["ACBENCH_STATS_CACHE"] = str(cache / "stats")
    try:
        lm = open_and_load_model(str(tiny_checkpoint()), progress=False)
        groups = find_input_groups(lm.model)
        cspec, needs = CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none"), frozenset({"C", "F", "pairs", "act_hist"})
        windows = calibration_windows(lm.tokenizer, cspec)  # tokenized once: recomputing a group is then quick
        store, _ = load_or_calibrate(lm, groups, cspec, needs, progress=False, windows=windows)
        reference = {g.name: store[g.name] for g in groups}
        yield lm, groups, cspec, needs, stats_folder(lm.fingerprint, cspec, needs), reference, cache, windows
    finally:
        for name, value in zip(("ACBENCH_CACHE", "ACBENCH_STATS_CACHE"), old):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8:8 + n])


def _with_header(path: Path, header: dict, n_old: int) -> None:
    raw = path.read_bytes()
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n_old:])


TAMPERS = ["flip", "dtype", "shape", "drop_meta", "scalars", "token_count", "add_meta", "truncate", "garbage_info",
           "swap_files"]


@given(tamper=st.sampled_from(TAMPERS), which=st.integers(0, 7), where=st.floats(0, 1))
def test_tampered_statistics_never_change_a_number(calibrated, tamper, which, where, monkeypatch):
    from acbench.calibration.cache import load_or_calibrate
    from acbench.calibration.group_files import group_file, group_problem

    lm, groups, cspec, needs, folder, reference, cache, windows = calibrated
    monkeypatch.setenv("ACBENCH_CACHE", str(cache))
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(cache / "stats"))
    g = groups[which % len(groups)]
    path = group_file(folder, g.name)
    before = path.read_bytes()
    n, header = _header(path)
    tensors = [k for k in header if k != "__metadata__"]
    key = tensors[int(where * (len(tensors) - 1))]
    if tamper == "flip":
        data = bytearray(before)
        data[8 + n + int(where * (len(data) - 9 - n))] ^= 0x10
        path.write_bytes(bytes(data))
    elif tamper == "dtype":  # same byte count, another meaning (the F32 -> I32)
        header[key]["dtype"] = "I32"
        _with_header(path, header, n)
    elif tamper == "shape":
        shape = header[key]["shape"]
        header[key]["shape"] = [shape[-1], shape[0]] if len(shape) == 2 and shape[0] != shape[-1] else [1] + shape
        _with_header(path, header, n)
    elif tamper == "drop_meta":
        header["__metadata__"].pop(["scalars", "group", "digest", "tensors"][which % 4])
        _with_header(path, header, n)
    elif tamper == "scalars":
        header["__metadata__"]["scalars"] = json.dumps({"n_tokens": "many", "extra": 1})
        _with_header(path, header, n)
    elif tamper == "token_count":  # a plausible count, off by a little: only the digest can tell
        scalars = json.loads(header["__metadata__"]["scalars"])
        header["__metadata__"]["scalars"] = json.dumps({**scalars, "n_tokens": scalars["n_tokens"] + 1 + which})
        _with_header(path, header, n)
    elif tamper == "add_meta":
        header["__metadata__"]["group"] = groups[(which + 1) % len(groups)].name
        _with_header(path, header, n)
    elif tamper == "truncate":
        path.write_bytes(before[: int(where * (len(before) - 1))])
    elif tamper == "garbage_info":
        (folder / "info.json").write_text("{garbage")
    elif tamper == "swap_files":
        other = group_file(folder, groups[(which + 1) % len(groups)].name)
        path.write_bytes(other.read_bytes())
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), console_lines():  # as the CLI says them
        store, _ = load_or_calibrate(lm, groups, cspec, needs, progress=False, windows=windows)
        got = {name: store[name] for name in reference}
    for name, ref in reference.items():  # recomputed or untouched: the same numbers either way
        for f in ("C", "F", "xs", "gs"):
            assert torch.equal(getattr(got[name], f), getattr(ref, f)), (tamper, name, f)
        assert got[name].n_tokens == ref.n_tokens, (tamper, name)
    said = log.getvalue()
    if tamper == "garbage_info":
        assert "info.json" in said and "unreadable" in said
        (folder / "info.json").write_text("{}")
    else:  # every change to a group file is seen, said, and the file replaced
        assert f"recomputing calibration statistics of {g.name}" in said and str(path) in said, said
        assert group_problem(folder, g.name, g.d_in) is None


INFO_KEYS = ["stats", "base", "spec", "cache", "seconds", "passes", "n_tokens", "groups_calibrated", "cached"]


@given(edits=st.dictionaries(st.sampled_from(INFO_KEYS), json_value, max_size=4), narrower=st.booleans())
def test_a_rewritten_info_json_never_changes_a_number_or_the_record(calibrated, edits, narrower, monkeypatch):
    """info.json with any field of any type: the statistics, and what the record says they are (stats, base, spec),
    come from the files; its timing fields reach the record only as valid counts and times."""
    import math

    import acbench.calibration.cache as statistics

    lm, groups, cspec, needs, folder, reference, cache, windows = calibrated
    monkeypatch.setenv("ACBENCH_CACHE", str(cache))
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(cache / "stats"))
    info_path = folder / "info.json"
    original = info_path.read_text()
    try:
        info_path.write_text(json.dumps({**json.loads(original), **edits}, allow_nan=True))
        monkeypatch.setattr(statistics, "calibrate", lambda *a, **k: pytest.fail("calibrated again"))
        asked = frozenset({"C"}) if narrower else needs
        log = io.StringIO()
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            store, info = statistics.load_or_calibrate(lm, groups, cspec, asked, progress=False, windows=windows)
        for name, ref in reference.items():
            assert torch.equal(store[name].C, ref.C)
        assert info["stats"] == sorted(needs) and info["base"] == statistics.stats_base(lm.fingerprint, cspec)
        assert info["spec"] == cspec.as_dict() and info["cached"] is True
        for key in ("passes", "n_tokens", "groups_calibrated"):
            assert key not in info or (type(info[key]) is int and info[key] >= 0)
        assert "seconds" not in info or (isinstance(info["seconds"], (int, float))
                                         and not isinstance(info["seconds"], bool)
                                         and math.isfinite(info["seconds"]) and info["seconds"] >= 0)
    finally:
        info_path.write_text(original)
