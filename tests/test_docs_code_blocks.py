"""Every code block of docs/ and the README, by its language. Python runs: docs/python-api.md's blocks in
test_python_api_docs.py (fast on the tiny model, slow on SmolLM2), the method and task pages' here, their plugins
then checked as the harness checks its own (the method contract; the task evaluated on the tiny model). toml and
yaml parse, and an entry point names what the page's python defines. A shell line is checked, not run (a `bench
run` takes minutes to hours): a `bench` line by the command's own checks (test_readme_commands.py), a `make` line
by the Makefile's targets, any other program by a list of the outside tools the docs may name. A `text` block is
sample output. A block without a language fails: every block is one of these."""

from __future__ import annotations

import re
import sys
import tomllib
import types
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
LANGUAGES = {"python", "toml", "yaml", "bash", "sh", "text"}
# programs a shell line of the docs may start with besides bench and make: installers, the test runner, and the
# cluster tools of docs/distributed.md (not on this machine; their lines are the cluster's, shown as written)
OUTSIDE_TOOLS = {"pip", "pytest", "ray", "srun", "scontrol", "head", "python"}


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line, language, code) of each fenced block of `page`."""
    out, lines = [], page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            out.append((i + 1, m.group(1), "\n".join(lines[i + 1:end]) + "\n"))
            i = end
        i += 1
    return out


def page_blocks(name: str, language: str) -> list[str]:
    return [code for _, lang, code in blocks(ROOT / "docs" / name) if lang == language]


def run_as_module(code: str, name: str) -> types.ModuleType:
    """`code` executed as module `name` (registered in sys.modules, as an installed plugin's module is)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(code, f"<{name}>", "exec"), module.__dict__)  # noqa: S102
    return module


def entry_points(toml_code: str, group: str) -> dict[str, str]:
    return tomllib.loads(toml_code)["project"]["entry-points"][group]


def test_every_block_has_a_language_this_test_knows():
    unknown = [f"{p.relative_to(ROOT)}:{line} ```{lang}" for p in PAGES for line, lang, _ in blocks(p)
               if lang not in LANGUAGES]
    assert unknown == [], unknown


def test_the_checker_reads_a_page_it_is_given(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x\n```python\nprint(1)\n```\n```\nbare\n```\n")
    assert blocks(page) == [(2, "python", "print(1)\n"), (5, "", "bare\n")]


def test_the_method_page_runs_and_its_methods_meet_the_contract(monkeypatch):
    from acbench.testing import check_method
    from tests.test_method_authors import Registered

    (code,) = page_blocks("adding-a-method.md", "python")
    monkeypatch.setitem(sys.modules, "doc_methods", None)
    module = run_as_module(code, "doc_methods")
    (toml_code,) = page_blocks("adding-a-method.md", "toml")
    named = entry_points(toml_code, "acbench.methods")
    assert sorted(named) == ["relative-magnitude", "top-norm"]
    for name, target in named.items():
        cls = getattr(module, target.partition(":")[2])
        assert cls.name == name
        with Registered(cls):
            failed = {c.name: c.detail for c in check_method(name) if c.passed is False}
        assert failed == {}, (name, failed)


def test_the_task_page_runs_and_its_task_scores_the_tiny_model(monkeypatch, tiny):
    import acbench

    (code,) = page_blocks("adding-a-task.md", "python")
    monkeypatch.setitem(sys.modules, "doc_tasks", None)
    module = run_as_module(code, "doc_tasks")
    (toml_code,) = page_blocks("adding-a-task.md", "toml")
    (target,) = entry_points(toml_code, "acbench.tasks").values()
    task = getattr(module, target.partition(":")[2])()
    lm = acbench.load_model(str(tiny), progress=False)
    result = task.evaluate(lm.model, lm.tokenizer, progress=False)
    assert 0 <= result.metrics["acc"] <= 1 and len(result.records) == 2 * 63
    (yaml_code,) = page_blocks("adding-a-task.md", "yaml")
    spec = yaml.safe_load(yaml_code)
    assert spec["task"] == "capitals" and spec["output_type"] == "multiple_choice"


def shell_lines(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = [re.sub(r"(^|\s)#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line]


def programs(line: str) -> list[list[str]]:
    """Each command of a line (split at && and ;) as its words, environment assignments dropped."""
    out = []
    for part in re.split(r"&&|;", line):
        part = re.sub(r"^\s*[A-Za-z_]\w*=\$\(", "", part)  # x=$(program ...): the program
        words = [w for w in part.split() if not re.fullmatch(r"[A-Za-z_]\w*=\S*", w)]
        if words:
            out.append(words)
    return out


def test_every_shell_line_names_a_program_and_a_make_target_that_exist():
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    unknown = []
    for page in PAGES:
        for line_no, lang, code in blocks(page):
            if lang not in ("bash", "sh"):
                continue
            for line in shell_lines(code):
                for words in programs(line):
                    where = f"{page.relative_to(ROOT)}:{line_no}: {' '.join(words)}"
                    if words[0] == "make":
                        unknown += [f"{where} (no target {t})" for t in words[1:] if t not in targets and "=" not in t]
                    elif words[0] not in {"bench", *OUTSIDE_TOOLS} and not words[0].startswith("$("):
                        unknown.append(f"{where} (program {words[0]!r})")
    assert unknown == [], unknown


@pytest.mark.parametrize("line,problem", [("make nothing-here", "no target nothing-here"),
                                          ("frobnicate --all", "program 'frobnicate'")])
def test_the_shell_check_fails_on_a_missing_target_or_program(tmp_path, monkeypatch, line, problem):
    page = tmp_path / "page.md"
    page.write_text(f"```bash\n{line}\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "Makefile").write_text("test:\n\ttrue\n")
    with pytest.raises(AssertionError, match=re.escape(problem)):
        test_every_shell_line_names_a_program_and_a_make_target_that_exist()


# files the docs name that acbench writes (into a checkpoint, a results folder, a cache) or that a user writes (a
# plugin package the page builds, the authors' own repository): every other named file is one of the repository's
WRITTEN_OR_USERS = {"my_svd/method.py", "tests/test_my_svd.py", "my_tasks/my_tasks/__init__.py", "compression.json",
                    "configuration_acbench.py", "modeling_acbench.py", "info.json", "emerge/results/EMERGENCE.md",
                    "utils/setup.py", "mutants/mutmut-stats.json", "results/LEADERBOARD.md"}
FILE = re.compile(r"`([A-Za-z0-9_.\-/]+\.(?:py|md|json|yaml|yml|toml|ipynb|png|txt|csv|sh))`")


def missing_files(pages, files: list[str]) -> list[str]:
    """Files named in backticks that the repository does not hold: a path by itself or as the end of one (a
    module named in its folder's row), a bare name anywhere."""
    names = {Path(f).name for f in files}
    out = []
    for page in pages:
        for name in sorted(set(FILE.findall(page.read_text(encoding="utf-8")))):
            held = name in files or ("/" not in name and name in names) or any(f.endswith("/" + name) for f in files)
            if not held and name not in WRITTEN_OR_USERS:
                out.append(f"{page.name}: {name}")
    return out


def test_every_file_the_docs_name_exists(tmp_path):
    import subprocess

    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.split()
    assert missing_files(PAGES, files) == []
    page = tmp_path / "page.md"
    page.write_text("`methods/pca.py`, `pca.py`, `methods/gone.py` and `gone.py`")
    assert missing_files([page], files) == ["page.md: gone.py", "page.md: methods/gone.py"]  # it can fail


def api_keywords() -> set[str]:
    """Every keyword a Python call of the API takes: the calls' parameters, sweep's (RunConfig's fields and the task
    shortcuts) and the methods' settings."""
    import dataclasses
    import inspect

    import acbench
    from acbench import methods
    from acbench.runner.config import RunConfig
    from acbench.runner.shortcuts import task_shortcuts

    names = set(RunConfig.field_names()) | {f.lstrip("-").replace("-", "_") for f in task_shortcuts()}
    for call in (acbench.load_model, acbench.compress, acbench.evaluate, acbench.sweep, acbench.load_results, acbench.compare,
                 acbench.to_frame, acbench.statistics_cache):
        names |= set(inspect.signature(call).parameters)
    for name in methods.known_methods():
        names |= {f.name for f in dataclasses.fields(methods.get_method(name).Settings)}
    return names


def unknown_keywords(text: str, known: set[str]) -> set[str]:
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return {k for s in spans for k in re.findall(r"(?<![\w.-])([a-z_][a-z0-9_]*)=(?!=)", s)} - known


def test_every_keyword_the_python_page_names_is_one_a_call_takes():
    known = api_keywords()
    assert unknown_keywords((ROOT / "docs" / "python-api.md").read_text(encoding="utf-8"), known) == set()
    assert unknown_keywords("pass `cache_size=1` or `cache=True`", known) == {"cache_size"}  # it can fail
