"""The mutation score per module from mutmut's records (.mutation/mutants/**/*.meta), after `make mutate`.

Killed: a test failed (or the mutant timed out: it ran away). Survived: every test that exercises the function
passed. A survivor listed in tests/mutation_equivalent.txt (mutant name, then why it cannot change a result) is
left out of the score; the others are printed, one per line, to be killed by a test or added there with a reason.
Usage: python tests/mutation_score.py [--survivors] [--record]
       python tests/mutation_score.py --list survived|not-run [module path prefix ...]
The --list form prints mutant names, one per line, for `mutmut run` to retest or finish exactly those (mutmut reruns
every mutant a pattern names, the finished ones included).

mutmut forgets every result when its test list or arguments change, and a full run takes nights here, so verdicts
are also kept in tests/mutation_record.json (`--record` merges this run's into it, dated): a mutant without a
result in mutants/ takes its recorded verdict while the function it mutates is unchanged (mutmut's hash of the
function's source), and a changed function's record no longer counts.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_stage import STAGE, import_name, repo_path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "mutation_record.json"
KILLED, SURVIVED, UNTESTED, OTHER = "killed", "survived", "not exercised", "not run"


def status(code) -> str:
    # a failing test, a timeout, or the test process crashed (SIGSEGV: a mutated kernel writing past its buffer)
    if code in (1, 3) or code in (36, -24, 24, 152, 255, -11):
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


def function_of(module: str, name: str) -> tuple[str, int]:
    """('methods/pca.py', 'acbench.methods.pca.xǁPCAǁsolve__mutmut_3') -> ('xǁPCAǁsolve', 3)."""
    dotted = import_name(module)
    head, _, number = name.rpartition("__mutmut_")
    return head[len(dotted) + 1:], int(number)


def collect_runs(mutants: Path = STAGE / "mutants") -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """({module's path in the repository: {mutant name: status}}, {mutant name: hash of its function}) from mutmut's
    records in the staged package (tests/mutation_stage.py)."""
    out, hashes = {}, {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        module = repo_path(meta.relative_to(mutants).as_posix()[: -len(".meta")])
        out[module] = {name: status(code) for name, code in data.get("exit_code_by_key", {}).items()}
        fn_hash = data.get("hash_by_function_name", {})
        hashes.update({name: fn_hash.get(function_of(module, name)[0], "") for name in out[module]})
    return out, hashes


def load_record(path: Path = RECORD) -> dict:
    """{module: {function: {"hash", "date", status: [mutant numbers]}}}."""
    return json.loads(path.read_text()) if path.exists() else {}


def recorded(record: dict, module: str, name: str, fn_hash: str) -> tuple[str, str] | None:
    """(status, date) recorded for this mutant of this version of its function, or None."""
    function, number = function_of(module, name)
    entry = record.get(module, {}).get(function)
    if not entry or not fn_hash or entry["hash"] != fn_hash:
        return None
    return next(((s, entry["date"]) for s in (KILLED, SURVIVED, UNTESTED) if number in entry.get(s, [])), None)


def merged(runs: dict, hashes: dict, record: dict) -> tuple[dict, dict[str, set[str]]]:
    """This run's verdicts, a mutant it did not run taking its recorded one; and per module the dates used."""
    out, dates = {}, {}
    for module, statuses in runs.items():
        out[module], dates[module] = {}, set()
        for name, s in statuses.items():
            old = recorded(record, module, name, hashes.get(name, "")) if s == OTHER else None
            out[module][name] = old[0] if old else s
            dates[module].add(old[1] if old else ("today" if s != OTHER else ""))
        dates[module].discard("")
    return out, dates


def update_record(runs: dict, hashes: dict, record: dict, today: str) -> dict:
    """The record with this run's verdicts merged in (a copy: `record` is left as it was); a function whose hash
    changed starts a new entry."""
    new = {m: {f: {k: list(v) if isinstance(v, list) else v for k, v in e.items()} for f, e in fns.items()}
           for m, fns in record.items()}
    for module, statuses in runs.items():
        for name, s in statuses.items():
            if s == OTHER or not hashes.get(name):
                continue
            function, number = function_of(module, name)
            entry = new.setdefault(module, {}).get(function)
            if entry is None or entry["hash"] != hashes[name]:
                entry = new[module][function] = {"hash": hashes[name]}
            for key in (KILLED, SURVIVED, UNTESTED):  # the mutant's previous verdict, if any, gives way
                if number in entry.get(key, []):
                    entry[key].remove(number)
                    if not entry[key]:
                        del entry[key]
            entry[s] = sorted(entry.get(s, []) + [number])
            entry["date"] = today
    return new


def write_record(record: dict, path: Path = RECORD) -> None:
    """Atomically, one line per function (a diff shows which functions a run changed)."""
    modules = []
    for module in sorted(record):
        fns = [f"  {json.dumps(f, ensure_ascii=False)}: {json.dumps(e, sort_keys=True, ensure_ascii=False)}"
               for f, e in sorted(record[module].items())]
        modules.append(f" {json.dumps(module)}: {{\n" + ",\n".join(fns) + "\n }")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("{\n" + ",\n".join(modules) + "\n}\n")
    os.replace(tmp, path)


def listed(by_module: dict, what: str, prefixes: list[str], equiv: dict) -> list[str]:
    want = {"survived": SURVIVED, "not-run": OTHER}[what]
    return [n for module, statuses in by_module.items() if not prefixes or module.startswith(tuple(prefixes))
            for n, s in statuses.items() if s == want and n not in equiv]


def main(argv: list[str]) -> int:
    runs, hashes = collect_runs()
    if not runs:
        print("no mutation results under .mutation/mutants/: run `make mutate` first")
        return 1
    record = load_record()
    if "--record" in argv:
        record = update_record(runs, hashes, record, datetime.datetime.now(datetime.timezone.utc).date().isoformat())
        write_record(record)
    by_module, dates = merged(runs, hashes, record)
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
                     f"{100 * c[KILLED] / scored:.1f} %" if scored else "-", ", ".join(sorted(dates[module]))))
        survivors += [n for n, s in statuses.items() if s == SURVIVED and n not in equiv]
    scored = totals[KILLED] + totals[SURVIVED]
    rows.append(("all", totals[KILLED], totals[SURVIVED], totals["equivalent"], totals[UNTESTED], totals[OTHER],
                 f"{100 * totals[KILLED] / scored:.1f} %" if scored else "-", ""))
    print("| module | killed | survived | equivalent | not exercised | not run | score | run on |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    if "--survivors" in argv:
        print("\nsurvivors (kill with a test, or add to tests/mutation_equivalent.txt with a reason):")
        for n in survivors:
            print(f"  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
