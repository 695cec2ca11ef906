"""Fuzz: every ACBENCH_* environment variable, set to anything, is one line naming it before any work, or a
working value (hypothesis over each variable's text)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz_common import outcome

VARIABLES = ("ACBENCH_BANDWIDTH_MB", "ACBENCH_LOCK_TTL", "ACBENCH_DECODE_KERNEL", "ACBENCH_CACHE",
             "ACBENCH_STATS_CACHE", "ACBENCH_STATS_CACHE_LIMIT")
VALUES = st.one_of(st.text(max_size=12), st.sampled_from(["abc", "-1", "0", "1e12", "1e400", "nan", "inf", "16",
                                                          "2.5", " 8 ", "triton", "tritn", "/dev/null", "/proc/x", "50GB",
                                                          "2GiB", "-1GB", "1 KB"]))


@given(name=st.sampled_from(VARIABLES), value=VALUES)
def test_any_value_of_any_variable_is_one_line_or_works(tmp_path_factory, monkeypatch, name, value):
    if "\x00" in value:
        return  # the environment cannot hold a NUL
    where = tmp_path_factory.mktemp("cwd")
    cache_var = name in ("ACBENCH_CACHE", "ACBENCH_STATS_CACHE", "ACBENCH_STATS_CACHE_LIMIT")
    # a cache variable is read by commands that use the cache: the report of a tree without cells, whose own
    # refusal ("no result cells") is the other possible line
    argv = ["report", "--results", str(where)] if cache_var else ["ls", "methods"]
    with monkeypatch.context() as m:
        m.chdir(where)  # a relative folder is made here, not in the repository
        m.setenv(name, value)
        rc, lines = outcome(argv)
    if rc == 0:
        return
    assert rc == 2 and len(lines) == 1 and "Traceback" not in lines[0], (name, value, lines)
    assert name in lines[0] or (cache_var and "cells" in lines[0]) or "cache folder" in lines[0], (name, value, lines)


@pytest.mark.parametrize("value,needle", [
    ("abc", "ACBENCH_BANDWIDTH_MB='abc' is not a whole number"), ("-1", "ACBENCH_BANDWIDTH_MB='-1'"),
    ("1e12", "ACBENCH_BANDWIDTH_MB='1e12'"), ("100000000", "do not fit in half of this machine's"),
])
def test_a_bandwidth_probe_size_that_cannot_run_is_refused_before_the_run(tmp_path, tiny, monkeypatch, capsys, value,
                                                                          needle):
    from tests.test_hostile_input import base, expect_one_line, no_cells

    monkeypatch.setenv("ACBENCH_BANDWIDTH_MB", value)
    out = tmp_path / "out"
    argv = [a for a in base(tiny, out, **{"--methods": "dense", "--rank": None}) if a != "--no-latency"]
    expect_one_line(capsys, argv, needle)
    assert no_cells(out)


@pytest.mark.parametrize("name,value,needle", [
    ("ACBENCH_LOCK_TTL", "soon", "ACBENCH_LOCK_TTL='soon' is not a number of seconds"),
    ("ACBENCH_LOCK_TTL", "-5", "ACBENCH_LOCK_TTL='-5'"),
    ("ACBENCH_CACHE", "FILE", "ACBENCH_CACHE"), ("ACBENCH_STATS_CACHE", "FILE", "it is a file"),
])
def test_a_lock_ttl_or_cache_folder_that_cannot_serve_is_one_line(tmp_path, monkeypatch, capsys, name, value, needle):
    from acbench.cli import main

    if value == "FILE":
        (tmp_path / "afile").write_text("x")
        value = str(tmp_path / "afile")
    monkeypatch.setenv(name, value)
    rc = main(["plan", "--methods", "pca", "--rank", "0.5", "--model", str(tmp_path / "none")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and needle in err[0], err
