"""The package layers import only downward, and no module imports itself back through others.

core <- methods, tasks <- bench (the harness) <- analyses <- the CLI (bench/cli.py, bench/smoke.py,
bench/ray_executor.py);
leaderboard <- core only. Every import counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "methods", "tasks", "bench", "analyses", "leaderboard")
CLI = {"bench.cli", "bench.smoke", "bench.ray_executor"}
# what each layer may import besides itself
ALLOWED = {
    "core": set(),
    "methods": {"core"},
    "tasks": {"core"},
    "leaderboard": {"core"},
    "bench": {"core", "methods", "tasks"},
    "analyses": {"core", "methods", "tasks", "bench"},
    "cli": {"core", "methods", "tasks", "bench", "analyses", "leaderboard"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    return "cli" if module in CLI else module.split(".")[0]


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
            # `from pkg import mod` imports pkg.mod when that is a module
            names = [stem] + [f"{stem}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            if n.split(".")[0] in PACKAGES:
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


def test_layers_import_only_downward():
    bad = []
    for mod, targets in project_graph().items():
        for t in targets:
            if layer(t) != layer(mod) and layer(t) not in ALLOWED[layer(mod)]:
                bad.append(f"{mod} ({layer(mod)}) imports {t} ({layer(t)})")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = project_graph()
    # A package's __init__ importing its own modules is how a package is built, not a cycle between modules.
    edges = {m: {t for t in ts if not (m in PACKAGES and t.startswith(m + "."))
                 and not (t in PACKAGES and m.startswith(t + "."))} for m, ts in graph.items()}
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


def test_the_checker_sees_a_violation(tmp_path):
    """The walker resolves relative and function-level imports (a test that could not fail proves nothing)."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from ..bench import runner\n    import leaderboard.report\n")
    assert imports_of(f, "methods.x") >= {"bench", "bench.runner", "leaderboard.report"}
