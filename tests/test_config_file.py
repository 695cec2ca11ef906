"""`bench run --config`: one configuration language (the flags' own names, switches included, plus the option
blocks), the command line over the file, and the repository's example config run as a user runs it."""

import contextlib
import io
import json
from pathlib import Path

import pytest

from acbench.cli import _parser, main
from acbench.cli.run import config_from_args
from acbench.cli.smoke import tiny_checkpoint
from acbench.core.errors import UserError

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "run.yaml"


def _config(*argv):
    return config_from_args(_parser().parse_args(["run", *argv]))


def test_the_example_config_reads_as_its_flags_would():
    c = _config("--config", str(EXAMPLE))
    assert c.model == "gemma-3-270m" and c.methods == ["pca", "fasc-kfac", "whitened-svd"]
    assert c.ranks == [0.5, 0.75] and c.tasks == ["lama", "ppl-token", "rho"] and c.calib_samples == 12
    assert c.measure_latency is False  # no_latency: true
    assert c.task_options["lama"]["per_relation"] == 20 and c.task_options["ppl-token"]["max_windows"] == 8
    assert c.analysis_options == {"rho": {"units": 4}}


def test_the_command_line_overrides_the_file_option_blocks_included(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("task_options: {lama: {per_relation: 20}}\nmethod-option: [fasc.folds=3]\nno-report: true\n"
                 "quiet: false\n")
    with contextlib.redirect_stdout(io.StringIO()) as said:
        c = _config("--config", str(f), "--lama-limit", "5", "--method-option", "fasc.folds=4")
    assert c.task_options["lama"]["per_relation"] == 5 and c.method_options["fasc"]["folds"] == 4
    assert c.report is False and c.progress is True
    assert _config("--config", str(f)).task_options["lama"]["per_relation"] == 20
    # never in silence: each override is one line naming the setting, both values and where each came from
    assert said.getvalue().splitlines() == [
        "setting: lama.per_relation = 5 from a shortcut flag overrides 20 from --config",
        "setting: fasc.folds = 4 from --method-option overrides 3 from --config's method_options"]


@pytest.mark.parametrize("block", ["[1, 2]", "5", "per_relation"])
def test_a_file_task_option_of_the_wrong_type_is_named_when_the_command_line_sets_that_task(tmp_path, block):
    """The file's lama block is not a mapping: --lama-limit on the command line sets lama too, and the bad block
    is named, never replaced by the flag's value without a word."""
    f = tmp_path / "run.yaml"
    f.write_text(f"task_options:\n  lama: {block}\n")
    with pytest.raises(UserError, match="task_options: 'lama' must map to a mapping"):
        _config("--config", str(f), "--tasks", "lama", "--lama-limit", "3")


def test_a_config_narrowed_on_the_command_line_leaves_its_other_settings_out_and_says_so(tmp_path):
    """The example's sizes for lama and rho do nothing when the command line runs ppl-token alone: they are left
    out, each in one line; the same settings given on the command line for a task not run are refused."""
    with contextlib.redirect_stdout(io.StringIO()) as said:
        c = _config("--config", str(EXAMPLE), "--tasks", "ppl-token", "--methods", "pca")
    assert c.task_options == {"ppl-token": {"max_windows": 8}} and c.analysis_options == {}
    assert c.method_options == {}
    assert sorted(said.getvalue().splitlines()) == [
        "setting: --config's fasc-kfac settings left out: --methods on the command line does not include fasc-kfac",
        "setting: --config's lama settings left out: --tasks on the command line does not include lama",
        "setting: --config's rho settings left out: --tasks on the command line does not include rho"]


@pytest.mark.parametrize("text, needle", [
    ("measure_latency: false\n", "'no_latency: true'"), ("report: false\n", "'no_report: true'"),
    ("no_latency: 3\n", "is a switch"), ("task_option: {lama: 1}\n", "list of task.setting=value"),
    ("no_latncy: true\n", "did you mean 'no_latency'"),
    ("methods: pca\nmethods: fasc\n", "sets 'methods' twice (line 2)"),
    ("task_options:\n  lama:\n    per_relation: 1\n    per_relation: 2\n", "sets 'per_relation' twice (line 4)"),
    ("no-latency: true\nno_latency: false\n", "sets 'no_latency' twice ('no-latency' and 'no_latency')"),
    ("rank: 0.5\nranks: [0.25]\n", "has key 'ranks': write it as the flag is spelled, 'rank'"),
    ("ranks: [0.25]\n", "has key 'ranks'"),
    ("task_options: {lama: {per_relation: 3}}\ntask_option: [lama.per_relation=4]\n", "lama.per_relation is set twice")])
def test_a_config_key_that_is_not_a_flag_is_one_line(tmp_path, text, needle):
    f = tmp_path / "run.yaml"
    f.write_text(text)
    with pytest.raises(UserError) as e:
        _config("--config", str(f))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_example_config_runs_with_its_sizes_overridden(tmp_path, capsys):
    out = tmp_path / "results"
    assert main(["run", "--config", str(EXAMPLE), "--model", str(tiny_checkpoint()), "--methods", "pca",
                 "--rank", "0.5", "--tasks", "ppl-token", "--ppl-windows", "1", "--ppl-seq-len", "32",
                 "--calib-samples", "2", "--calib-seq-len", "32", "--output", str(out), "--quiet"]) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("ppl-token-*.json")]
    assert len(cells) == 2 and all(c["task_config"]["max_windows"] == 1 for c in cells)  # the flag over the file
    assert all(c["latency"] is None for c in cells)  # the file's no_latency: true


def test_every_flag_of_every_subcommand_is_in_the_docs():
    import argparse
    import re

    from conftest import docs_text

    readme = docs_text()
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {opt}" for name, parser in sub.choices.items() for action in parser._actions
               for opt in action.option_strings
               if opt.startswith("--") and opt != "--help" and not re.search(re.escape(opt) + r"(?![\w-])", readme)]
    assert not missing, missing


@pytest.mark.parametrize("what", ["methods", "tasks", "analyses"])
def test_bench_ls_lists_every_setting_each_plugin_declares(capsys, what):
    import dataclasses

    from acbench import analyses
    from acbench import methods
    from acbench import tasks

    assert main(["ls", what]) == 0
    out = capsys.readouterr().out
    names = {"methods": methods.known_methods(), "tasks": tasks.REGISTRY.names(),
             "analyses": analyses.REGISTRY.names()}[what]
    get = methods.get_method if what == "methods" else (tasks.REGISTRY if what == "tasks" else analyses.REGISTRY).get
    for name in names:
        lines = out.splitlines()
        block = lines[next(i for i, line in enumerate(lines) if line.split(" ", 1)[0] == name) + 1]
        Settings = getattr(get(name), "Settings", None)
        fields = dataclasses.fields(Settings) if Settings is not None and dataclasses.is_dataclass(Settings) else ()
        for f in fields:
            assert f" {f.name}=" in block or f"settings: {f.name}=" in block, (name, f.name, block)
        assert fields or "settings: (none)" in block


ARCHITECTURE = EXAMPLE.parent.parent / "docs" / "architecture.md"


def test_the_layout_table_names_every_module():
    root = EXAMPLE.parent.parent
    readme = ARCHITECTURE.read_text()
    table = readme[readme.index("## Layout"):]
    rows = {line.split("|")[1].strip().strip("`").rstrip("/"): line for line in table.splitlines()
            if line.startswith("| `")}
    missing = []
    for folder, row in rows.items():
        parts = [folder] + [f"{folder}/{d.name}" for d in sorted((root / folder).iterdir())
                            if d.is_dir() and folder != "bench" and (d / "__init__.py").exists()]
        for part in parts:
            for f in sorted((root / part).glob("*.py")):
                if f.name != "__init__.py" and f"`{f.name}`" not in row:
                    missing.append(f"{part}/{f.name}")
    assert set(rows) >= {"core", "methods", "tasks", "bench", "analyses", "bench/cli", "leaderboard", "studies"}
    assert not missing, missing


def test_the_layout_table_states_the_layering_test_order():
    """The "may import" column says what tests/test_layers.py enforces."""
    from tests.test_layers import ALLOWED, ROOMS

    readme = ARCHITECTURE.read_text()
    table = readme[readme.index("## Layout"):]
    said = {}
    for line in table.splitlines():
        if line.startswith("| `"):
            folder = line.split("|")[1].strip().strip("`").rstrip("/")
            text = line.split("|")[3].strip()
            said[folder] = set() if text == "nothing of acbench" else {t.strip() for t in text.split(",")}
    assert said.pop("bench/cli") == said["bench"]  # the CLI is part of the harness's layer, below the studies
    rooms = [f for f in said if f.startswith("bench/")]
    # bench's rooms, in the order tests/test_layers.py lets them import each other (each the rows above it)
    assert ["acbench." + f.split("/")[1] for f in rooms] == [r for r in ROOMS if r.count(".") == 1
                                                          and r not in ("acbench.testing", "acbench.api", "acbench.cli")]
    assert all(said.pop(f) == {"as `bench/`", "and the rooms in the rows above this one"} for f in rooms)
    assert said == ALLOWED


def test_display_says_only_what_the_run_did():
    """No speed note where nothing was timed (--no-latency), no calibration size where nothing is calibrated."""
    from acbench.runner.resolve import resolve_run
    from acbench.leaderboard.formatting import COMPUTE_NOTE, LATENCY_NOTE, measured_speed, speed_notes

    untimed = [{"method": "act-sparse", "compute ratio": 0.5, "decode speedup": None}]
    assert not measured_speed(untimed) and speed_notes(untimed, sparse=True) == [COMPUTE_NOTE]
    assert speed_notes(untimed, sparse=False) == []
    assert speed_notes([{"method": "pca", "decode speedup": 1.7}], sparse=False) == [LATENCY_NOTE]
    dense = resolve_run(_config("--model", "x", "--methods", "dense", "--tasks", "ppl-token"))
    assert not any("calibration" in line for line in dense.describe())
    pca = resolve_run(_config("--model", "x", "--methods", "pca", "--rank", "0.5", "--tasks", "ppl-token"))
    sizes = next(line for line in pca.describe() if line.startswith("sizes:"))
    assert "calibration 12 x 256 tokens" in sizes and "(x, g) pairs" not in sizes  # pca reads C, no pairs
