"""The README's "Adding a task" examples, installed as a user would and run through `bench run` and `bench report`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from acbench.cli import main
from acbench.cli.smoke import tiny_checkpoint

README = __import__("conftest").docs_text()  # README.md and docs/, where the plugin examples live


def readme_block(lang: str, first_line: str) -> str:
    return re.search(rf"```{lang}\n({re.escape(first_line)}.*?)```", README, re.S).group(1)


def install_entry_point(tmp_path: Path, group: str, name: str, target: str) -> None:
    """What `pip install` of a plugin distribution leaves behind: a dist-info whose entry points name the class."""
    dist = tmp_path / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")


def run_args(out: Path, tasks: list[str], *extra: str) -> list[str]:
    return ["run", "--model", str(tiny_checkpoint()), "--methods", "pca", "svd", "--rank", "0.5", "--tasks", *tasks,
            "--calib-samples", "2", "--calib-seq-len", "32", "--output", str(out), "--no-report", "--quiet",
            "--no-latency", *extra]


@pytest.fixture
def task_registry_restored():
    from acbench import tasks

    yield tasks.REGISTRY
    tasks.REGISTRY.unregister("next-token-acc")
    tasks.REGISTRY.reload()


def test_readme_task_plugin_runs_end_to_end(tmp_path, monkeypatch, task_registry_restored):
    code = readme_block("python", "# my_tasks/my_tasks/next_token_accuracy.py")
    (tmp_path / "my_next_token.py").write_text(code)
    install_entry_point(tmp_path, "acbench.tasks", "next-token-acc", "my_next_token:NextTokenAccuracy")
    monkeypatch.syspath_prepend(str(tmp_path))
    task_registry_restored.reload()
    assert "next-token-acc" in task_registry_restored.names()

    out = tmp_path / "results"
    # its size through --task-option, and through the shortcut flag generated from its declaration
    assert main(run_args(out, ["next-token-acc", "ppl-token"], "--ppl-windows", "1", "--ppl-seq-len", "32",
                         "--task-option", "next-token-acc.windows=1")) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("next-token-acc-*.json")]
    assert len(cells) == 3  # dense, pca, svd
    assert all(c["primary_metric"] == "acc" and c["versions"]["task"] == 1 and c["cell"]["key"] for c in cells)
    assert all(c["task_config"]["windows"] == 1 and len(c["records"]) == 63 for c in cells)  # 1 window of 64
    assert main(["report", "--results", str(out)]) == 0
    md = (out / "LEADERBOARD.md").read_text()
    assert "next-token acc ↑" in md  # its own label, a column no leaderboard code names
    header = next(line for line in md.splitlines() if "next-token acc ↑" in line)
    assert header.index("PPL (ppl-token)") < header.index("next-token acc ↑")  # its declared order
    assert "Δ next-token acc vs pca" in md  # paired to the reference on the same tokens
    assert re.search(r"next-token-acc dense [0-9.]+ vs chance 0\.000", md)  # its declared chance level
    shortcut = tmp_path / "shortcut"
    assert main(run_args(shortcut, ["next-token-acc"], "--ntp-windows", "1")) == 0
    same = {p.name for p in out.rglob("next-token-acc-*.json")}
    assert {p.name for p in shortcut.rglob("next-token-acc-*.json")} == same  # the same settings, the same keys


def test_readme_lm_eval_yaml_task_runs_end_to_end(tmp_path, monkeypatch):
    yaml_text = readme_block("yaml", "# capitals.yaml")
    (tmp_path / "capitals.yaml").write_text(yaml_text)
    docs = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"), ("Egypt", "Cairo"),
            ("Peru", "Lima")]
    cities = [c for _, c in docs]
    with open(tmp_path / "capitals.jsonl", "w") as f:
        for country, city in docs:
            choices = [city] + [c for c in cities if c != city][:2]
            f.write(json.dumps({"question": f"What is the capital of {country}?", "choices": choices,
                                "answer": 0}) + "\n")
    monkeypatch.chdir(tmp_path)  # the YAML names its data relative to where bench runs
    out = tmp_path / "results"
    assert main(run_args(out, ["lm-eval"], "--task-option", "lm-eval.tasks=capitals.yaml")) == 0
    cells = [json.loads(p.read_text()) for p in out.rglob("lm-eval-*.json")]
    assert len(cells) == 3
    for c in cells:
        assert c["primary_metric"] == "capitals/acc" and c["higher_is_better"]["capitals/acc"] is True
        assert len(c["records"]) == len(docs) and {r["correct"] for r in c["records"]} <= {0, 1}
    assert main(["report", "--results", str(out)]) == 0
    md = (out / "LEADERBOARD.md").read_text()
    assert "lm-eval capitals/acc ↑" in md and "Δ lm-eval capitals/acc vs pca" in md


def _readme_files(prefix: str) -> dict[str, str]:
    """Every README block whose first line names a file under `prefix` ("# my_methods/..."): {path: text}."""
    return {m.group(2): m.group(1) for m in re.finditer(r"```(?:python|toml)\n(# (" + re.escape(prefix) +
                                                         r"[^\s]+)[^\n]*\n.*?)```", README, re.S)}


@pytest.mark.slow
def test_readme_plugin_packages_install_with_pip_and_run(tmp_path):
    """The README's plugin folders written out as shown, installed by pip (the project's own build backend, no
    index), then listed and run by bench in a fresh process: the packaging, not only the code, is what a user
    copies."""
    import os
    import subprocess
    import sys

    for prefix in ("my_methods/", "my_tasks/"):
        files = _readme_files(prefix)
        assert f"{prefix}pyproject.toml" in files, sorted(files)
        for rel, text in files.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
        (tmp_path / prefix / prefix.rstrip("/") / "__init__.py").write_text("")  # "with an empty __init__.py"
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(tmp_path / "my_methods"), str(tmp_path / "my_tasks")],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": str(site)}
    bench = [sys.executable, "-c", "import sys; from acbench.cli import main; sys.exit(main())"]
    listed = subprocess.run(bench + ["ls", "methods"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "top-norm" in listed.stdout and "relative-magnitude" in listed.stdout, listed.stdout + listed.stderr
    listed = subprocess.run(bench + ["ls", "tasks"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert "next-token-acc" in listed.stdout, listed.stdout + listed.stderr
    common = ["--model", str(tiny_checkpoint()), "--tasks", "next-token-acc", "--ntp-windows", "1", "--calib-samples",
              "2", "--calib-seq-len", "32", "--no-latency", "--no-report", "--quiet"]
    for budget in (["--methods", "top-norm", "--rank", "0.5"], ["--methods", "relative-magnitude", "--sparsity",
                                                                 "2:4"]):
        out = tmp_path / budget[1]
        run = subprocess.run(bench + ["run", *budget, *common, "--output", str(out)], capture_output=True, text=True,
                             env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
        assert len(list(out.rglob("next-token-acc-*.json"))) == 2  # dense and the plugin method
