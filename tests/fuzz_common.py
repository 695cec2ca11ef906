"""What the fuzz targets (tests/test_fuzz_*.py, hypothesis) share: the profiles, the tiny model, the stub that
stops a command once everything is checked, and the one-line-or-success property.

Properties the targets check: exit 0, or exit 2 with one stderr line and no traceback; a report never crashes on a
cell; a cell edited into another meaning is never taken as done; a tampered statistics cache never changes a number,
and a change that matters is said; a tampered checkpoint is one line or loads as written.

The hypothesis profiles (fast, ci, explore) are tests/conftest.py's.
"""

import contextlib
import io
from pathlib import Path

from hypothesis import strategies as st

from acbench.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def outcome(argv) -> tuple[int, list[str]]:
    """(exit status, stderr lines) of `bench <argv>`, whatever it raises."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    lines = [line for line in err.getvalue().splitlines() if line.strip() and "it/s]" not in line
             and "Warning" not in line and not line.startswith(("  warnings.warn", "W ", "["))]
    return rc, lines


def assert_clean(argv):
    rc, lines = outcome(argv)
    if rc == 0:
        return rc
    assert rc == 2, (argv, rc, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0], (argv, lines)
    assert lines[0].startswith("bench"), (argv, lines)
    return rc



# a JSON value of any shape, for the fields of configs, cells and checkpoints
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                      st.text(max_size=8), st.sampled_from(["pca", "2:4", "0.5", "ppl-token", "fasc", "0-1"]))
json_value = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                            st.dictionaries(st.text(max_size=6) | st.sampled_from(
                                                                ["fasc", "lama", "rho", "units"]), kids,
                                                                max_size=3)), max_leaves=6)


def study_outcome(main, argv, capsys) -> int | None:
    """A study's `main(argv)`: an argparse refusal (exit 2, its last line `...: error: ...`, no traceback) gives
    None; a refusal of its own is exit 2 with one `error: ` line; else its exit code (for the caller to check)."""
    try:
        code = main(argv)
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        assert e.code == 2 and err and ": error: " in err[-1] and "Traceback" not in "\n".join(err)
        return None
    err = capsys.readouterr().err.strip().splitlines()
    if code == 2:
        assert len(err) == 1 and err[0].startswith("error: ")
    return code


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            yield from _paths(v, prefix + (i,))
