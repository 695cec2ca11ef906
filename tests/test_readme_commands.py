"""Every `bench` command line of the README and of docs/ passes the command's own checks as written, without
computing.

A command is a line of a code block that starts with `bench` plus its indented continuation lines (or `\\`
continuations); `# ...` ends it. Notation, as the README's synopsis uses it: `a|b` (or `a | b`) is a list of
alternatives and `[...]` an optional group: every alternative, and each optional group present and absent, must
pass (one choice point varied at a time, the others at their first choice); `N` stands for a count and `...` for
more of the same. `bench run` and `bench plan` lines are resolved by `resolve_run` (every user error of a run is
found there, before a model is opened), `bench compress` by its config check as well, `bench emerge` by its own,
and the rest by the argument parser.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from acbench.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
SYNOPSIS = re.compile(r"<!-- generated: synopsis -->\n.*?<!-- end generated -->", re.S)


def readme_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every `bench` command in the README's code blocks (the generated synopsis, whose
    lines are notation, not commands, excepted: its own test checks it)."""
    text = SYNOPSIS.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    out: list[tuple[int, str]] = []
    in_block, current = False, None
    for number, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("```"):
            in_block, current = not in_block, None
            continue
        if not in_block:
            continue
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if current is not None and (raw[:1].isspace() or out[current][1].endswith("\\")):
            if line.strip():  # a comment-only continuation line adds nothing
                n, cmd = out[current]
                out[current] = (n, cmd.removesuffix("\\").rstrip() + " " + line.strip())
            continue
        if re.match(r"(\$ )?bench\s", line):
            out.append((number, line.removeprefix("$ ")))
            current = len(out) - 1
        else:
            current = None
    return [(n, cmd.removesuffix("\\").strip()) for n, cmd in out]


def choice_points(cmd: str) -> list[list[list[str]]]:
    """The command as a list of choice points, each a list of token sequences (one sequence: no choice)."""
    cmd = re.sub(r"\s*\|\s*", "|", cmd)
    points: list[list[list[str]]] = []
    tokens = shlex.split(cmd)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("["):
            group = [tok[1:]]
            while not group[-1].endswith("]"):
                i += 1
                group.append(tokens[i])
            group[-1] = group[-1][:-1]
            points.append([[t for t in group if t], []])
        elif tok == "...":
            pass
        elif "|" in tok:
            points.append([[alt] for alt in tok.split("|")])
        else:
            points.append([["2" if tok == "N" else tok]])
        i += 1
    return points


def variants(cmd: str) -> list[list[str]]:
    points = choice_points(cmd)
    first = [p[0] for p in points]
    out = [sum(first, [])]
    for i, p in enumerate(points):
        for alt in p[1:]:
            out.append(sum(first[:i] + [alt] + first[i + 1:], []))
    return out


def check(argv: list[str]) -> None:
    """The command's own checks, short of opening a model: raises UserError or SystemExit (the parser's)."""
    from acbench.cli import _parser
    from acbench.runner.resolve import resolve_run

    args = _parser().parse_args(argv[1:])
    if args.cmd == "run":
        from acbench.cli.run import run_configs_of as run_configs

        for config in run_configs(args):  # one per model
            resolve_run(config, writes=False)
    elif args.cmd == "plan":
        from acbench.cli.plan import plan_configs

        for config in plan_configs(args):
            resolve_run(config, writes=False)
    elif args.cmd == "compress":
        from acbench.cli.compress import compress_config

        resolve_run(compress_config(args)[0], writes=False)
    elif args.cmd == "emerge":
        from acbench.studies.emergence.command import _config

        _config(args)


def _doc_commands() -> list[tuple[str, str]]:
    from conftest import doc_pages

    return [(f"{page}:{n}", cmd) for page, text in doc_pages().items() for n, cmd in readme_commands(text)]


COMMANDS = _doc_commands()


def test_the_readme_has_its_commands():
    cmds = [c for _, c in COMMANDS]
    assert len(cmds) >= 20
    assert any(c.startswith("bench run") and "--executor" in c for c in cmds)  # the synopsis is read
    assert {c.split()[1] for c in cmds} >= {"run", "plan", "compress", "emerge", "ls", "report", "smoke", "prepare"}


@pytest.mark.parametrize("line,cmd", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_readme_command_passes_its_checks(line, cmd, monkeypatch, tmp_path):
    import torch

    monkeypatch.chdir(ROOT)  # relative paths (examples/run.yaml) as a reader in the clone types them
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(tmp_path / "stats"))
    # the GPU examples are checked as a GPU machine would check them (here, --device cuda is refused for the machine)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    bad = []
    for argv in variants(cmd):
        try:
            check(argv)
        except UserError as e:
            bad.append(f"{' '.join(argv)}\n    -> {e}")
        except SystemExit as e:
            bad.append(f"{' '.join(argv)}\n    -> the parser refused it (exit {e.code})")
    assert not bad, f"{line}:\n" + "\n".join(bad)


def test_the_readme_synopsis_is_the_parsers():
    """One synopsis, generated (tests/readme_numbers.py): the README's copy is what bench/cli/synopsis.py gives
    from the argument parser now, so a flag added, renamed or removed fails here until it is regenerated."""
    from acbench.cli.synopsis import synopsis

    blocks = SYNOPSIS.findall((ROOT / "README.md").read_text())
    assert len(blocks) == 1
    assert blocks[0] == f"<!-- generated: synopsis -->\n```text\n{synopsis()}\n```\n<!-- end generated -->"
    for flag in ("--model X...", "--method-option X", "--lama-limit X", "--family {low-rank,sparsity}"):
        assert flag in blocks[0]


def test_the_synopsis_follows_the_parser(monkeypatch):
    """The generator reads the parser: a flag the parser gains appears, wrapped between arguments only."""
    import acbench.cli
    from acbench.cli.synopsis import synopsis

    real = acbench.cli._parser

    def with_new_flag():
        parser = real()
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        sub.choices["report"].add_argument("--brand-new-flag", choices=["a", "b"], required=True)
        return parser

    monkeypatch.setattr(acbench.cli, "_parser", with_new_flag)
    line = next(x for x in synopsis().splitlines() if x.startswith("bench report"))
    assert line.endswith("--brand-new-flag {a,b}") and "[--vs X]" in line
    assert all(len(x) <= 118 and x.count("[") == x.count("]") for x in synopsis().splitlines())


def test_the_checker_refuses_a_wrong_line():
    """A line that breaks a rule fails, so a passing README means something."""
    for cmd in ("bench run --rank 0.5 --rank-align 8 --allocate fisher",
                "bench run --ray-address auto",
                "bench run --methods wanda --rank 0.5",
                "bench run --tasks emerge",
                "bench run --no-such-flag"):
        with pytest.raises((UserError, SystemExit)):
            for argv in variants(cmd):
                check(argv)


def test_notation():
    assert variants("bench ls methods | tasks") == [["bench", "ls", "methods"], ["bench", "ls", "tasks"]]
    assert variants("bench run --budget rank|params [--merged] --limit N") == [
        ["bench", "run", "--budget", "rank", "--merged", "--limit", "2"],
        ["bench", "run", "--budget", "params", "--merged", "--limit", "2"],
        ["bench", "run", "--budget", "rank", "--limit", "2"]]
    text = "x\n```text\nbench run --a 1   # note\n          --b 2\nbench ls x\n```\n```bash\nbench plan \\\n  --c 3\n```\n"
    assert readme_commands(text) == [(3, "bench run --a 1 --b 2"), (5, "bench ls x"), (8, "bench plan --c 3")]


def test_the_example_sources_run(tmp_path, monkeypatch, capsys):
    """Each file of examples/sources/ through `bench run`, as the README shows it, on a tiny model: every question,
    probe and word of the files is read."""
    import json

    from acbench.cli import main
    from acbench.cli.smoke import tiny_checkpoint

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(tmp_path / "stats"))
    src = "examples/sources"
    common = ["--model", str(tiny_checkpoint()), "--methods", "dense", "--no-latency", "--no-report", "--quiet"]
    runs = {"files": ["--tasks", "mmlu", "lama", "ppl-token", "--mmlu-source", f"{src}/mmlu", "--mmlu-limit", "0",
                      "--lama-source", f"lama:{src}/lama/TREx:{src}/lama/relations.jsonl", "--lama-limit", "0",
                      "--text-source", f"file:{src}/text.txt", "--ppl-seq-len", "32"],
            "qa": ["--tasks", "lama", "--lama-source", f"qa_wikidata:{src}/qa_wikidata/task.json", "--lama-limit", "0"]}
    cells = {}
    for name, argv in runs.items():
        assert main(["run", *common, *argv, "--output", str(tmp_path / name)]) == 0, capsys.readouterr().err
        for path in (tmp_path / name).rglob("*.json"):
            if not path.name.startswith("."):
                cell = json.loads(path.read_text())
                cells[(name, cell["cell"]["task"])] = cell
    assert cells[("files", "mmlu")]["task_config"]["n_questions"] == 3
    assert cells[("files", "lama")]["task_config"]["n_probes"] == 8
    assert cells[("qa", "lama")]["task_config"]["n_probes"] == 3
    assert cells[("files", "ppl-token")]["metrics"]["ppl"] > 1


def test_the_readme_plan_block_is_what_bench_plan_prints(capsys):
    """The 8B plan in the README is the command's output (its memory numbers; the time estimate is the machine's)."""
    from tests.readme_numbers import main

    assert main(["--check"]) == 0, capsys.readouterr().out


def test_readme_numbers_copies_a_stored_runs_tables(tmp_path, capsys):
    import shutil

    from tests.readme_numbers import first_table, leaderboard, main

    results = tmp_path / "results"
    shutil.copytree(ROOT / "tests" / "fixtures" / "results", results)
    readme = tmp_path / "README.md"
    readme.write_text('intro\n<!-- generated: leaderboard "### rank ratio 0.25" -->\n| typed | by hand |\n'
                      "<!-- end generated -->\nafter\n")
    assert main(["--readme", str(readme), "--results", str(results), "--check"]) == 1
    assert "is stale" in capsys.readouterr().out
    assert main(["--readme", str(readme), "--results", str(results)]) == 0
    table = first_table(leaderboard(results), "### rank ratio 0.25")
    assert table.startswith("| method") and "pca (ref)" in table and "typed" not in readme.read_text()
    assert readme.read_text() == ('intro\n<!-- generated: leaderboard "### rank ratio 0.25" -->\n' + table
                                  + "<!-- end generated -->\nafter\n")
    assert main(["--readme", str(readme), "--results", str(results), "--check"]) == 0
    assert not (results / "LEADERBOARD.readme.md").exists()


def test_readme_numbers_stage_table_from_a_stored_log(tmp_path):
    """A stages block is the Nth stored run's stage log: compress stages summed into one row naming the largest,
    what no stage covers as its own row, shares of the run's total; the leaderboard does not read the log."""
    import shutil
    from types import SimpleNamespace

    from acbench.runner.execute import write_stage_log
    from acbench.leaderboard.load import read_result_set
    from tests.readme_numbers import main

    results = tmp_path / "results"
    shutil.copytree(ROOT / "tests" / "fixtures" / "results", results)
    run = SimpleNamespace(config=SimpleNamespace(device="cpu"), output=results)
    first = {"model load": 2.0, "calibration": 30.0, "compress pca": 5.0, "compress fasc": 25.0,
             "evaluate lama": 20.0, "latency": 10.0}
    write_stage_log(run, first, 100.0, 7)
    log = next((results / ".runs").glob("*.stages"))
    stored = json.loads(log.read_text())
    assert stored["stages"] == [list(kv) for kv in first.items()] and stored["cells_written"] == 7
    log.with_name("later.stages").write_text(json.dumps({**stored, "date": "2999-01-01T00:00:00Z", "seconds": 50.0}))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- generated: stages 1 -->\nold\n<!-- end generated -->\nb\n")
    assert main(["--readme", str(readme), "--results", str(results)]) == 0
    body = readme.read_text().split("-->\n")[1].split("<!--")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines()[:9]]
    assert rows[0] == ["stage", "seconds", "share"] and set("".join(rows[1])) <= set("-:")
    assert rows[2:] == [
        ["model load", "2.0", "2%"], ["calibration", "30.0", "30%"],
        ["compress, 2 methods (fasc 25.0 of it)", "30.0", "30%"], ["evaluate lama", "20.0", "20%"],
        ["latency", "10.0", "10%"], ["other (planning, cell files, reports)", "8.0", "8%"], ["total", "100.0", "100%"]]
    assert "7 cells" in body
    readme.write_text("a\n<!-- generated: stages 2 -->\nold\n<!-- end generated -->\nb\n")
    assert main(["--readme", str(readme), "--results", str(results)]) == 0
    assert re.search(r"\| total +\| 50\.0 +\| 100% +\|", readme.read_text())
    readme.write_text("a\n<!-- generated: stages 3 -->\nold\n<!-- end generated -->\nb\n")
    with pytest.raises(SystemExit, match="wants run 3 .* which stored 2"):
        main(["--readme", str(readme), "--results", str(results)])
    assert not [p for p in read_result_set(results).problems if ".runs" in p]  # the hidden logs are not cells


def test_every_flag_the_docs_name_after_a_command_exists():
    """Every `bench <command> ... --flag` written in README.md or docs/ (code blocks and inline code) is a flag that
    command's parser knows (docs/cli.md once named a `bench compress --out` that never existed)."""
    import re

    from acbench.cli import _parser

    commands = {name: {o for action in sub._actions for o in action.option_strings}
                for group in _parser()._subparsers._group_actions for name, sub in group.choices.items()}
    unknown = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
        inline = re.findall(r"`([^`\n]+)`", re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S))
        for line in (ln for seg in blocks + inline for ln in seg.splitlines()):
            for m in re.finditer(r"\bbench ([a-z][a-z-]*)((?: +[^|;&#]*)?)", line):
                known = commands.get(m.group(1))
                if known is None:
                    continue
                unknown += [f"{path.name}: bench {m.group(1)} {flag}" for flag in
                            re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2)) if flag not in known]
    assert unknown == []
