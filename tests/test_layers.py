"""The package layers import only downward, and no module imports itself back through others.

Everything is one import package, `acbench`: the folder bench/ is `acbench` itself (the harness and its CLI), the
other folders sit beneath it (core/ is `acbench.core`, ...). A layer is named by its folder:
core < methods, tasks, leaderboard < analyses < bench < studies. A study's command plugs
into the CLI by entry point (`acbench.commands`), so the CLI imports no study. Every import counts, including those
inside functions.
Beside the imports: the leaderboard names no task, analysis or study, the harness has no field named after a task, and
no function is longer than 80 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "methods", "tasks", "bench", "analyses", "leaderboard", "studies")  # the folders
PACKAGE = "acbench"
# what each layer may import besides itself
ALLOWED = {
    "core": set(),
    "methods": {"core"},
    "tasks": {"core"},
    "leaderboard": {"core"},
    "analyses": {"core", "methods", "tasks", "leaderboard"},
    "bench": {"core", "methods", "tasks", "leaderboard", "analyses"},
    "studies": {"core", "methods", "tasks", "leaderboard", "analyses", "bench"},
}


def module_name(path: Path, root: Path = ROOT) -> str:
    """The import name of a file: bench/x.py is acbench.x, core/x.py is acbench.core.x."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE] + (parts[1:] if parts[0] == "bench" else parts))


def layer(module: str) -> str:
    """The folder a module lives in (its layer); a name outside acbench is its own."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return parts[0]
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "bench"


def imports_of(path: Path, module: str) -> set[str]:
    """Project modules imported anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import name` imports pkg.name when that is a module, else pkg (resolved by project_graph)
            names = [f"{stem}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n.split(".")[0] == PACKAGE:
                out.add(n)
    return out


def project_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        targets = set()
        for name in imports_of(path, mod):
            while name and name not in files:  # `from x import func` -> the module x
                name = name.rpartition(".")[0]
            if name and name != mod:
                targets.add(name)
        graph[mod] = targets
    return graph


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{mod} ({layer(mod)}) imports {t} ({layer(t)})" for mod, targets in graph.items() for t in targets
                  if layer(t) != layer(mod) and layer(t) not in ALLOWED[layer(mod)])


def test_layers_import_only_downward():
    bad = upward_imports(project_graph())
    assert not bad, "\n".join(bad)


def test_a_back_arrow_from_the_cli_to_a_study_fails():
    """The CLI is part of bench: were it to import a study again (as it once did), the check names the arrow."""
    graph = {**project_graph(), "acbench.cli.emerge": {"acbench.studies.emergence"}}
    assert upward_imports(graph) == ["acbench.cli.emerge (bench) imports acbench.studies.emergence (studies)"]


def test_the_study_command_is_plugged_in_by_entry_point():
    from acbench.cli import _parser
    from acbench.results.plugged import plugged_commands

    assert list(plugged_commands()) == ["emerge"]
    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    assert "emerge" in sub.choices


def test_no_import_cycles():
    graph = project_graph()
    # A package's __init__ importing its own modules is how a package is built, not a cycle between modules.
    tops = {module_name(ROOT / pkg / "__init__.py") for pkg in PACKAGES}
    edges = {m: {t for t in ts if not (m in tops and t.startswith(m + "."))
                 and not (t in tops and m.startswith(t + "."))} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
    assert not cycles, "\n".join(cycles)


# bench/'s rooms, in the order the data flows through them: a room imports only the rooms before it.
# `acbench.testing` (the method contract) and `acbench.api` (the Python calls) sit above the runner, the CLI above
# them, and `acbench` itself (bench/__init__.py, the door to the calls) above everything: nothing inside imports it
# (the version lives in acbench.core.version).
ROOMS = ["acbench.results", "acbench.model", "acbench.calibration", "acbench.deploy", "acbench.measure",
         "acbench.runner", "acbench.testing", "acbench.api", "acbench.cli", "acbench"]


def room(module: str) -> str | None:
    """The bench room a module belongs to, or None outside bench."""
    if layer(module) != "bench":
        return None
    return max((r for r in ROOMS if module == r or module.startswith(r + ".")), key=len)  # the innermost


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports between bench's rooms that point up the flow."""
    out = []
    for mod, targets in graph.items():
        for t in targets:
            a, b = room(mod), room(t)
            if a and b and ROOMS.index(b) > ROOMS.index(a):
                out.append(f"{mod} ({a}) imports {t} ({b})")
    return sorted(out)


def test_bench_rooms_import_only_down_the_flow():
    bad = back_arrows(project_graph())
    assert not bad, "\n".join(bad)


def test_every_bench_module_lives_in_a_room():
    """bench/ holds the rooms (the public calls, api/, among them) and the method contract: nothing else at its
    top."""
    top = sorted(p.name for p in (ROOT / "bench").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists())
    assert top == sorted(["__init__.py", "testing.py"] + [r.split(".")[1] for r in ROOMS if "." in r
                                                          and r != "acbench.testing"])


def test_a_back_arrow_between_rooms_fails():
    graph = {**project_graph(), "acbench.model.x": {"acbench.runner.execute"}}
    assert back_arrows(graph) == ["acbench.model.x (acbench.model) imports acbench.runner.execute (acbench.runner)"]


def test_no_two_bench_modules_share_a_name_stem():
    """A newcomer finds a module by its name: none of bench's stems repeats, or names a core module."""
    stems = [p.stem for p in (ROOT / "bench").rglob("*.py") if p.stem not in ("__init__", "__main__")]
    stems += [p.name for p in (ROOT / "bench").iterdir() if (p / "__init__.py").exists()]
    core = {p.stem for p in (ROOT / "core").glob("*.py")}
    repeated = sorted({s for s in stems if stems.count(s) > 1} | (set(stems) & core))
    assert not repeated, repeated


def test_the_checker_sees_a_violation(tmp_path):
    """The walker resolves relative and function-level imports (a test that could not fail proves nothing)."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from .. import runner\n    import acbench.leaderboard.report\n    import tasks\n")
    got = imports_of(f, "acbench.methods.x")
    assert got == {"acbench.runner", "acbench.leaderboard.report"}


def test_the_order_is_total_and_matches_the_docstring():
    """Each layer may import exactly the layers below it: the allowed sets nest, so no arrow can run back up."""
    order = ["core", "methods", "analyses", "bench", "studies"]
    for lower, upper in zip(order, order[1:]):
        assert ALLOWED[lower] | {lower} <= ALLOWED[upper], (lower, upper)
        assert upper not in ALLOWED[lower]
    assert ALLOWED["methods"] == ALLOWED["tasks"] == ALLOWED["leaderboard"] == {"core"}


def test_no_analysis_imports_the_harness():
    """An analysis is what a sweep runs: it gets the harness's context, never imports bench (or a study)."""
    bad = [f"{mod} imports {t}" for mod, targets in project_graph().items() for t in targets
           if layer(mod) == "analyses" and layer(t) in ("bench", "studies")]
    assert not bad, "\n".join(sorted(bad))


def test_no_package_but_studies_imports_a_study():
    bad = [f"{mod} imports {t}" for mod, targets in project_graph().items() for t in targets
           if layer(t) == "studies" and layer(mod) != "studies"]
    assert not bad, "\n".join(sorted(bad))


def _names_in(path: Path) -> list[tuple[int, str]]:
    """Every string literal, identifier and attribute of a file, with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.append((node.lineno, node.name))
    return out


def plugin_names() -> set[str]:
    from acbench import analyses
    from acbench import tasks
    from acbench.results.plugged import report_sections

    # "lm-eval" is also the library whose version the leaderboard header reports, not only the bridge task
    names = set(tasks.known_tasks()) | set(analyses.known_analyses()) | set(report_sections())
    return names - {"lm-eval"}


def test_leaderboard_names_no_task_or_analysis():
    import re

    names = plugin_names()
    assert {"mmlu", "lama", "ppl-token", "rho", "emerge"} <= names
    bad = []
    for path in sorted((ROOT / "leaderboard").rglob("*.py")):
        for line, text in _names_in(path):
            for name in names:
                if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text, re.I):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {name!r} in {text[:60]!r}")
    assert not bad, "\n".join(bad)


def test_the_harness_has_no_field_named_after_a_task():
    """Task sizes live in each task's Settings: no attribute, argument or dataclass field of bench/ is
    mmlu_..., lama_..., ppl_..."""
    import re

    bad = []
    for path in sorted((ROOT / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.append(node.target.id)
            elif isinstance(node, ast.arg):
                names.append(node.arg)
            elif isinstance(node, ast.Attribute):
                names.append(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.append(node.arg)
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if re.match(r"(mmlu|lama|ppl)_", n)]
    assert not bad, "\n".join(bad)


MAX_FUNCTION_LINES = 80


def long_functions(root: Path = ROOT) -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_FUNCTION_LINES:
                        out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_function_longer_than_80_lines():
    assert not long_functions(), "\n".join(long_functions())


def test_the_length_check_sees_a_long_function(tmp_path):
    (tmp_path / "core").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "core" / "long.py").write_text(f"def long():\n{body}\n")
    for pkg in PACKAGES[1:]:
        (tmp_path / pkg).mkdir()
    assert long_functions(tmp_path) == [f"core/long.py:1 long: {MAX_FUNCTION_LINES + 1} lines"]


# ---------------------------------------------------------------- one public name, one meaning

LIBRARY = ("bench", "core", "tasks", "methods", "leaderboard", "analyses")
# the same name on purpose: each plugin registry's `build` builds its plugins from names and options; the API's
# `compare` is acbench.core.significance's paired comparison over what evaluate and sweep return, with its verdict
SHARED_NAMES = {"build": {"methods/__init__.py", "analyses/__init__.py"},
                "compare": {"bench/api/evaluate_call.py", "core/significance.py"}}


def public_definitions(files) -> dict[str, list[str]]:
    """{name: [file, ...]} of every module-level function and class whose name has no leading underscore."""
    import ast

    out: dict[str, list[str]] = {}
    for path, text in files:
        for node in ast.parse(text).body:
            # mutmut's copies of each function (x_name__mutmut_orig, _1, ...) in its mutants/ tree are its own
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_") \
                    and "__mutmut_" not in node.name:
                out.setdefault(node.name, []).append(path)
    return out


def collisions(defs: dict[str, list[str]]) -> list[str]:
    return sorted(f"{name}: {', '.join(files)}" for name, files in defs.items()
                  if len(files) > 1 and set(files) != SHARED_NAMES.get(name))


def test_no_two_library_modules_define_one_public_name():
    """A name says one thing: no public function or class is defined in two of the library's modules (the API's
    load_model once shared its name with the loader under it, and load_results with the leaderboard's reader)."""
    files = [(str(p.relative_to(ROOT)), p.read_text()) for pkg in LIBRARY for p in (ROOT / pkg).rglob("*.py")]
    assert collisions(public_definitions(files)) == []


def test_the_name_checker_sees_a_collision():
    defs = public_definitions([("a/x.py", "def sweep():\n    pass\n"), ("b/y.py", "class sweep:\n    pass\n"),
                               ("c/z.py", "def _private():\n    pass\n"), ("d/w.py", "def _private():\n    pass\n"),
                               ("e/v.py", "def x_f__mutmut_1():\n    pass\n"),
                               ("f/u.py", "def x_f__mutmut_1():\n    pass\n")])
    assert collisions(defs) == ["sweep: a/x.py, b/y.py"]
