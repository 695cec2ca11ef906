"""The mutation score per module from mutmut's records (mutants/**/*.meta), after `make mutate`.

Killed: a test failed (or the mutant timed out: it ran away). Survived: every test that exercises the function
passed. A survivor listed in tests/mutation_equivalent.txt (mutant name, then why it cannot change a result) is
left out of the score; the others are printed, one per line, to be killed by a test or added there with a reason.
Usage: python tests/mutation_score.py [--survivors]
       python tests/mutation_score.py --list survived|not-run [module path prefix ...]
The --list form prints mutant names, one per line, for `mutmut run` to retest or finish exactly those (mutmut reruns
every mutant a pattern names, the finished ones included).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED, SURVIVED, UNTESTED, OTHER = "killed", "survived", "not exercised", "not run"


def status(code) -> str:
    if code in (1, 3) or code in (36, -24, 24, 152, 255):  # a failing test, or a timeout
        return KILLED
    if code == 0:
        return SURVIVED
    if code in (5, 33):
        return UNTESTED
    return OTHER


def equivalents(path: Path = ROOT / "tests" / "mutation_equivalent.txt") -> dict[str, str]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, why = line.partition(" ")
                out[name] = why.strip()
    return out


def collect(mutants: Path = ROOT / "mutants") -> dict[str, dict[str, str]]:
    """{module path: {mutant name: status}}."""
    out = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        module = str(meta.relative_to(mutants))[: -len(".meta")]
        out[module] = {name: status(code) for name, code in data.get("exit_code_by_key", {}).items()}
    return out


def listed(by_module: dict, what: str, prefixes: list[str], equiv: dict) -> list[str]:
    want = {"survived": SURVIVED, "not-run": OTHER}[what]
    return [n for module, statuses in by_module.items() if not prefixes or module.startswith(tuple(prefixes))
            for n, s in statuses.items() if s == want and n not in equiv]


def main(argv: list[str]) -> int:
    by_module = collect()
    if not by_module:
        print("no mutation results under mutants/: run `make mutate` first")
        return 1
    equiv = equivalents()
    if "--list" in argv:
        i = argv.index("--list")
        print("\n".join(listed(by_module, argv[i + 1], argv[i + 2:], equiv)))
        return 0
    rows, survivors = [], []
    totals = Counter()
    for module, statuses in by_module.items():
        c = Counter("equivalent" if s == SURVIVED and n in equiv else s for n, s in statuses.items())
        totals.update(c)
        scored = c[KILLED] + c[SURVIVED]
        rows.append((module, c[KILLED], c[SURVIVED], c["equivalent"], c[UNTESTED], c[OTHER],
                     f"{100 * c[KILLED] / scored:.1f} %" if scored else "-"))
        survivors += [n for n, s in statuses.items() if s == SURVIVED and n not in equiv]
    scored = totals[KILLED] + totals[SURVIVED]
    rows.append(("all", totals[KILLED], totals[SURVIVED], totals["equivalent"], totals[UNTESTED], totals[OTHER],
                 f"{100 * totals[KILLED] / scored:.1f} %" if scored else "-"))
    print("| module | killed | survived | equivalent | not exercised | not run | score |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    if "--survivors" in argv:
        print("\nsurvivors (kill with a test, or add to tests/mutation_equivalent.txt with a reason):")
        for n in survivors:
            print(f"  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
