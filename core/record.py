"""The result-cell schema: what a stored cell must hold to count as done, and to be shown in a leaderboard."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

# How the blocks are calibrated: one-pass (every block once, on the dense model; one calibration serves every
# method) or sequential (blocks calibrated and compressed in order, each on the outputs of the blocks already
# compressed, as SparseGPT's and Wanda's reference scripts do). Here, beside the record that stores them, so that
# the leaderboard reads them without torch.
ONE_PASS, SEQUENTIAL = "one-pass", "sequential"
CALIBRATION_MODES = (ONE_PASS, SEQUENTIAL)


def calibration_mode(calibration) -> str:
    """The mode a cell's calibration record names (one-pass where it names none: every cell before modes)."""
    spec = calibration.get("spec") if isinstance(calibration, dict) else None
    mode = spec.get("mode", ONE_PASS) if isinstance(spec, dict) else ONE_PASS
    return mode if mode in CALIBRATION_MODES else ONE_PASS


def calibration_label(calibration) -> str | None:
    """"12x256 one-pass (authors 128x2048 sequential)": the windows a cell's method was calibrated on, and its
    authors' where the record carries them; None for a cell without a calibration."""
    spec = calibration.get("spec") if isinstance(calibration, dict) else None
    if not isinstance(spec, dict):
        return None
    out = f"{spec.get('samples')}x{spec.get('seq_len')} {calibration_mode(calibration)}"
    authors = calibration.get("authors")
    if isinstance(authors, dict):
        out += f" (authors {authors.get('samples')}x{authors.get('seq_len')} {authors.get('mode')})"
    short = calibration.get("short")
    if isinstance(short, dict):  # fewer tokens than groups its solve reads full-rank statistics of
        out += f", SHORT for {short.get('groups')} groups (needs {short.get('tokens_needed')} tokens)"
    return out

# 2: the cell identity carries its settings key; method and task versions are stored.
# 3: the identity carries the rank allocation rule and the compressed scope (groups, blocks); a schema-2 cell is
#    read as uniform allocation over every group, which is what it was.
# 4: the identity says whether a cell is a task's or an analysis's (`kind`), and accuracy records carry their own
#    "correct" and "chance" per item; older cells are upgraded on reading (`upgrade`), so old trees stay readable.
SCHEMA_VERSION = 4
READABLE_SCHEMAS = (2, 3, 4)
CELL_KEYS = {"model": str, "method": str, "task": str, "budget": str, "key": str}
OPTIONAL_CELL_KEYS = {"allocation": str, "scope": str, "kind": str}
UNIFORM = "uniform"  # the allocation of every cell before schema 3: each group at the run's ratio
ALL_GROUPS = "all"  # the scope of every cell before schema 3: every input group compressed
DENSE = "dense"  # the method of the uncompressed model's cells
TASK_CELL, ANALYSIS_CELL = "task", "analysis"  # CellId.kind
CELL_KINDS = (TASK_CELL, ANALYSIS_CELL)


def variant_name(method: str, allocation: str) -> str:
    """A variant's name in logs, folders and table rows: the method, and its allocation where not uniform."""
    return method if allocation == UNIFORM else f"{method}+{allocation}"


def cell_kind(cell: dict) -> str:
    """A cell's kind; schemas before 4 left it out, and an analysis cell is told by its method's suffix."""
    return cell.get("kind") or (ANALYSIS_CELL if cell["method"].endswith("-analysis") else TASK_CELL)


def rank_label(rank: float | None, budget: str) -> str:
    return "full" if rank is None else f"{budget}-{rank:g}"


def cell_relpath(model: str, method: str, rank: float | None, budget: str, task: str, key: str,
                 allocation: str = UNIFORM, scope: str = ALL_GROUPS) -> Path:
    """Where a cell lives under a results root: <model>/<method>[+<allocation>]/[<scope>/]<budget>-<ratio>/
    <task>-<key>.json (the dense model's: <model>/dense/<task>-<key>.json)."""
    slug = model.replace("/", "__")
    if method == DENSE:
        return Path(slug) / DENSE / f"{task}-{key}.json"
    # a variant's settings (act-sparse:score=fisher) and a pattern (2:4) without ':' in the path
    folder = Path(slug) / variant_name(method, allocation).replace(":", "@")
    if scope != ALL_GROUPS:
        folder = folder / "".join(ch if ch.isalnum() or ch in "-.," else "_" for ch in scope)
    return folder / rank_label(rank, budget).replace(":", "of") / f"{task}-{key}.json"


def place_problem(rec: dict, path) -> str | None:
    """None when a (valid) cell's identity is the one its file's place names, else what disagrees: a cell moved,
    copied or edited into another method's, budget's, task's or settings' place is not taken for that one."""
    c = rec["cell"]
    try:
        want = cell_relpath(c["model"], c["method"], c.get("rank"), c["budget"], c["task"], c["key"],
                            c.get("allocation", UNIFORM), c.get("scope", ALL_GROUPS))
    except (TypeError, ValueError, AttributeError):
        return "its identity does not name a place"
    got = Path(path).parts
    if tuple(got[-len(want.parts):]) != want.parts:
        return (f"its identity ({c['model']} / {variant_name(c['method'], c.get('allocation', UNIFORM))} / "
                f"{rank_label(c.get('rank'), c['budget'])} / {c['task']}, key {c['key']}) belongs at "
                f"{want.as_posix()}, not here")
    return None


# the domain of a task metric, by its name (the part after an lm-eval task's "/"): a value outside it is not a
# result, whatever wrote it
def metric_domain(name: str) -> tuple[float, float] | None:
    base = name.split("/")[-1].split(",")[0]
    if base.endswith("ppl") or base.endswith("perplexity"):
        return 1.0, math.inf
    if base in ("nll", "bits_per_byte"):
        return 0.0, math.inf
    if base.startswith("acc") or base.startswith("p@") or base in ("mrr", "exact_match", "f1"):
        return 0.0, 1.0
    return None


def describe_scope(scope: str) -> str:
    """'groups=mlp_in,mlp_out;blocks=0-5,12' -> 'groups mlp_in, mlp_out; blocks 0-5, 12'."""
    if scope == ALL_GROUPS:
        return "every input group"
    return "; ".join(part.replace("=", " ").replace(",", ", ") for part in scope.split(";"))


def is_finite_or_null(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


_SCALAR = (str, int, float, bool, type(None))
# the type of every field the leaderboard (or a rerun) reads; None where a missing value is allowed
FIELD_TYPES = {
    "stderr": dict, "primary_metric": (str, type(None)), "higher_is_better": dict, "details": dict,
    "task_config": dict, "records": list, "versions": dict, "compression": (dict, type(None)),
    "calibration": (dict, type(None)), "memory": (dict, type(None)), "latency": (dict, type(None)), "timings": dict,
    "model_fingerprint": (dict, type(None)), "seed": (int, type(None)), "bos": (str, type(None)), "env": dict,
}
# nested fields the tables read: finite numbers (or null), and containers
NESTED_NUMBERS = {
    "compression": ("param_ratio", "compute_ratio", "activation_ratio", "n_fallbacks", "rank_ratio", "params_dense",
                    "params_deployed"),
    "memory": ("weight_bytes",), "latency": ("prefill_ms_per_token", "decode_ms_per_token"),
}
NESTED_TYPES = {
    "compression": {"groups": list, "fallbacks": list, "allocation": dict, "method_settings": dict, "scope": str},
    "memory": {"peak": dict}, "calibration": {"spec": dict, "authors": (dict, type(None)), "short": dict},
    "model_fingerprint": {"parameters": int, "loaded_dtype": str},
}


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def _nonneg(v) -> bool:
    return v is None or (_number(v) and v >= 0)


def latency_problem(lat: dict) -> str | None:
    """What is wrong with a cell's latency block, or None: the times, speedups and what bounds them, each of its
    type and sign (a negative bandwidth or a text overhead is a cell edited by hand, never a measurement)."""
    for key in ("body_overhead", "conditions", "speedup"):
        if key in lat and not isinstance(lat[key], (dict, type(None))):
            return f"latency.{key} is not a mapping"
    for key, v in (lat.get("body_overhead") or {}).items():
        if key in ("dense_body_ms", "floor_ms", "linear_share", "rounds") and not _nonneg(v):
            return f"latency.body_overhead.{key} {v!r} is not a number >= 0"
    for key, v in (lat.get("speedup") or {}).items():
        if not isinstance(v, dict):
            return f"latency.speedup.{key} is not a mapping"
        ci = v.get("ci95")
        if not (v.get("ratio") is None or (_number(v["ratio"]) and v["ratio"] > 0)):
            return f"latency.speedup.{key}.ratio {v['ratio']!r} is not a number > 0"
        if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(_number(x) and x > 0 for x in ci)):
            return f"latency.speedup.{key}.ci95 {ci!r} is not an interval of two numbers > 0"
    cond = lat.get("conditions") or {}
    for block, names in (("memory_bandwidth", ("copy_gb_s", "triad_gb_s")), ("dense_product", ("gb_s",))):
        part = cond.get(block)
        if part is None:
            continue
        if not isinstance(part, dict):
            return f"latency.conditions.{block} is not a mapping"
        bad = [n for n in names if n in part and not (part[n] is None or (_number(part[n]) and part[n] > 0))]
        if bad:
            return f"latency.conditions.{block}.{bad[0]} {part[bad[0]]!r} is not a number > 0"
    return None


RATIO_MAX = 4.0  # a deployed size over dense's: low-rank factors at full rank cost up to 2x, never 4x
# (kind, what a value of that kind must be): the ranges of the numbers a report, a frame or a rerun reads
RANGE_KINDS = {
    "nonneg": ("a number >= 0", lambda v: _number(v) and v >= 0),
    "positive": ("a number > 0", lambda v: _number(v) and v > 0),
    "ratio": (f"a ratio in (0, {RATIO_MAX:g}]", lambda v: _number(v) and 0 < v <= RATIO_MAX),
    "fraction": ("a fraction in (0, 1]", lambda v: _number(v) and 0 < v <= 1),
    "share": ("a share in [0, 1]", lambda v: _number(v) and 0 <= v <= 1),
    "count": ("a whole count >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "size": ("a whole count >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "shape": ("a list of whole counts >= 1", lambda v: isinstance(v, list) and bool(v) and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)),
    "flag": ("true or false", lambda v: isinstance(v, bool)),
}
# every numeric field read, by its path ("*": each value of a mapping or each entry of a list); a missing field or
# null is allowed (older cells lack the newer fields), a present one must lie in its range
FIELD_RANGES = (
    (("stderr", "*"), "nonneg"),
    (("compression", "param_ratio"), "ratio"), (("compression", "compute_ratio"), "ratio"),
    (("compression", "activation_ratio"), "ratio"), (("compression", "rank_ratio"), "fraction"),
    (("compression", "measured_density"), "fraction"), (("compression", "n_fallbacks"), "count"),
    (("compression", "params_dense"), "size"), (("compression", "params_deployed"), "count"),
    (("compression", "groups", "*", "k"), "count"), (("compression", "groups", "*", "d_in"), "size"),
    (("compression", "allocation", "allocated_params"), "count"),
    (("compression", "allocation", "budget_params"), "count"),
    (("compression", "allocation", "allocated_ratio"), "ratio"),
    (("compression", "allocation", "seconds", "*"), "nonneg"),
    (("memory", "weight_bytes"), "positive"), (("memory", "peak", "bytes"), "nonneg"),
    (("memory", "peak", "working_bytes"), "nonneg"),
    (("latency", "prefill_ms_per_token"), "positive"), (("latency", "decode_ms_per_token"), "positive"),
    (("latency", "rounds"), "size"), (("latency", "converged"), "flag"),
    (("latency", "speedup", "*", "n"), "size"),
    (("latency", "body_overhead", "dense_body_ms"), "positive"), (("latency", "body_overhead", "floor_ms"), "nonneg"),
    (("latency", "body_overhead", "linear_share"), "share"), (("latency", "body_overhead", "rounds"), "size"),
    (("latency", "conditions", "memory_bandwidth", "array_mb"), "positive"),
    (("latency", "conditions", "memory_bandwidth", "threads"), "size"),
    (("latency", "conditions", "dense_product", "shape"), "shape"),
    (("calibration", "n_tokens"), "size"), (("calibration", "spec", "samples"), "size"),
    (("calibration", "spec", "seq_len"), "size"), (("calibration", "seconds"), "nonneg"),
    (("calibration", "blocks"), "size"), (("calibration", "held_bytes"), "nonneg"),
    (("calibration", "peak", "bytes"), "nonneg"), (("calibration", "peak", "working_bytes"), "nonneg"),
    (("calibration", "authors", "samples"), "size"), (("calibration", "authors", "seq_len"), "size"),
    (("calibration", "short", "groups"), "size"), (("calibration", "short", "of"), "size"),
    (("calibration", "short", "tokens"), "size"), (("calibration", "short", "tokens_needed"), "size"),
    (("timings", "*"), "nonneg"),
)


def _at(obj, path: tuple, shown: str = ""):
    """(dotted name, value) of every field at `path` under obj; a missing or wrongly-shaped step yields nothing
    (field_problem's type checks name those)."""
    if not path:
        yield shown, obj
        return
    head, rest = path[0], path[1:]
    if head == "*":
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for k, v in items:
            yield from _at(v, rest, f"{shown}[{k}]" if isinstance(obj, list) else f"{shown}.{k}")
    elif isinstance(obj, dict) and head in obj:
        yield from _at(obj[head], rest, f"{shown}.{head}" if shown else head)


def range_problem(rec: dict) -> str | None:
    """The first numeric field outside its range (a negative stderr, a ratio of 0, a time of 0 ms, a shape that
    is a number), or None: such a field is a cell edited by hand, never a measurement."""
    for path, kind in FIELD_RANGES:
        what, ok = RANGE_KINDS[kind]
        for name, v in _at(rec, path):
            if v is not None and not ok(v):
                return f"{name} {v!r} is not {what}"
    return None


def field_problem(rec: dict) -> str | None:
    """What is wrong with the types of a cell's fields (beyond its identity and metrics), or None."""
    for key, kind in FIELD_TYPES.items():
        if key in rec and (not isinstance(rec[key], kind) or isinstance(rec[key], bool)):  # no field is a bool
            return f"{key} is not a {_type_name(kind)}"
    for key in ("stderr",):
        bad = [k for k, v in rec.get(key, {}).items() if not is_finite_or_null(v)]
        if bad:
            return f"{key}.{bad[0]} is not a finite number"
    if any(not isinstance(v, (bool, type(None))) for v in rec.get("higher_is_better", {}).values()):
        return "higher_is_better holds a value that is not true, false or null"
    if any(not isinstance(r, dict) for r in rec.get("records", [])):
        return "records holds an entry that is not a mapping"
    for key in ("env", "model_fingerprint"):
        if any(not isinstance(v, _SCALAR) for v in (rec.get(key) or {}).values()):
            return f"{key} holds a value that is not a string, number or null"
    for key, names in NESTED_NUMBERS.items():
        block = rec.get(key) or {}
        bad = [n for n in names if n in block and not is_finite_or_null(block[n])]
        if bad:
            return f"{key}.{bad[0]} is not a finite number"
    for key, types in NESTED_TYPES.items():
        block = rec.get(key) or {}
        bad = [n for n, kind in types.items() if n in block and not isinstance(block[n], kind)]
        if bad:
            return f"{key}.{bad[0]} is not a {_type_name(types[bad[0]])}"
    calibration = rec.get("calibration") or {}
    for where in ("spec", "authors"):
        mode = (calibration.get(where) or {}).get("mode", ONE_PASS)
        if mode not in CALIBRATION_MODES:
            return f"calibration.{where}.mode {mode!r} is not one of {', '.join(CALIBRATION_MODES)}"
    groups = (rec.get("compression") or {}).get("groups") or []
    if any(not isinstance(g, dict) for g in groups):
        return "compression.groups holds an entry that is not a mapping"
    lat = latency_problem(rec["latency"]) if isinstance(rec.get("latency"), dict) else None
    if lat:
        return lat
    peak = (rec.get("memory") or {}).get("peak") or {}
    bad = [k for k in ("bytes", "working_bytes") if k in peak and not is_finite_or_null(peak[k])]
    if bad:
        return f"memory.peak.{bad[0]} is not a finite number"
    return range_problem(rec)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# per-item fields of a task that scores two accuracies (MMLU's cloze form: raw and per character)
CORRECT_BY_METRIC = {"acc": "correct_acc", "acc_norm": "correct_acc_norm"}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _record_problem(r: dict, task: str) -> str | None:
    """What is wrong with one per-item record, or None: the fields the paired tests and the chance test read."""
    for key in ("correct", *CORRECT_BY_METRIC.values()):
        if key in r and not (isinstance(r[key], (bool, int, float)) and r[key] in (0, 1)):
            return f"{key} {r[key]!r} is not 0 or 1"
    if "loglikelihoods" in r and not (isinstance(r["loglikelihoods"], list) and r["loglikelihoods"] and all(
            _number(v) and v <= 0 for v in r["loglikelihoods"])):
        return f"loglikelihoods {r['loglikelihoods']!r} is not a list of finite numbers <= 0"
    if "nll" in r and not (_number(r["nll"]) and r["nll"] >= 0):
        return f"nll {r['nll']!r} is not a finite number >= 0"
    if "rank" in r and r["rank"] is not None and not (isinstance(r["rank"], int) and not isinstance(r["rank"], bool)
                                                        and r["rank"] >= 0):
        return f"rank {r['rank']!r} is not a count"
    if "rank" in r and "correct" in r and bool(r["correct"]) != (r["rank"] == 0):
        return f"correct {r['correct']!r} disagrees with rank {r['rank']!r}"
    if "chance" in r:
        chance, n = r["chance"], r.get("n_candidates", 4 if task == "mmlu" else None)
        if not (_number(chance) and 0 < chance <= 1):
            return f"chance {chance!r} is not a probability"
        if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n >= 1 and _close(chance, 1 / n)):
            return f"chance {chance!r} is not 1 / the {n!r} candidates it was guessed among"
    return None


def records_problem(rec: dict) -> str | None:
    """What is wrong with a cell's per-item records, or None: each record's values have their types and ranges,
    and the metrics they are summed into agree with them (a perplexity with exp of the mean per-window NLL, an
    accuracy over items with the share of correct ones)."""
    recs, task, metrics = rec.get("records") or [], rec["cell"]["task"], rec["metrics"]
    for i, r in enumerate(recs):
        problem = _record_problem(r, task)
        if problem:
            return f"records[{i}]: {problem}"
    nlls = [r["nll"] for r in recs if "nll" in r]
    if nlls and len(nlls) == len(recs):
        mean = sum(nlls) / len(nlls)
        if _number(metrics.get("nll")) and not _close(metrics["nll"], mean):
            return f"metric nll {metrics['nll']!r} is not the mean of its records' nll ({mean!r})"
        if _number(metrics.get("ppl")) and mean < 700 and not _close(metrics["ppl"], math.exp(mean)):
            return f"metric ppl {metrics['ppl']!r} is not exp of its records' mean nll ({math.exp(mean)!r})"
    shown = CORRECT_BY_METRIC.get(rec.get("primary_metric"))
    kept = [m for m, key in CORRECT_BY_METRIC.items() if recs and all(key in r for r in recs)]
    if kept and shown is None:  # which accuracy "correct" is would be anyone's guess
        return (f"primary metric {rec.get('primary_metric')!r} is not one of the accuracies its records keep "
                f"({', '.join(kept)})")
    for i, r in enumerate(recs):  # "correct" is the shown accuracy's, which the paired tests read
        if shown in r and "correct" in r and float(r["correct"]) != float(r[shown]):
            return f"records[{i}]: correct {r['correct']!r} disagrees with {shown} {r[shown]!r} (the metric shown)"
    # the accuracies over items (acc_macro and p@1 average per subject/relation), each against its own records'
    # field where the records keep one per accuracy (MMLU's cloze form), else against "correct"
    for name in ("acc", "acc_norm", "p@1_micro"):
        key = CORRECT_BY_METRIC.get(name) if recs and all(CORRECT_BY_METRIC.get(name) in r for r in recs) else "correct"
        right = [r[key] for r in recs if key in r]
        if not right or len(right) != len(recs) or not _number(metrics.get(name)):
            continue
        share = sum(map(float, right)) / len(right)
        if not _close(metrics[name], share):
            which = "that are correct" if key == "correct" else f"whose {key} is 1"
            return f"metric {name} {metrics[name]!r} is not the share of its records {which} ({share!r})"
    return None


# what a cell evaluated until decided seals with a digest of its records: the decision the run took, how far it went,
# and against which reference records (an edit of any of these, or of a record, no longer matches the digest)
SEALED_UNTIL_DECIDED = ("reference", "looks", "margin", "budget", "block", "items", "decision", "stopped",
                        "reference_digest")


def nulls_for_nonfinite(obj):
    """NaN and infinity are not JSON: an undefined value (a standard error of one item, an overflowing
    perplexity) is stored as null, which readers show as a blank; tuples become lists. The form a stored cell reads
    back in."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: nulls_for_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nulls_for_nonfinite(v) for v in obj]
    return obj


def records_digest(records, sealed: dict | None = None) -> str:
    """A digest of per-item records (and of `sealed`, a mapping of what else they decided), in their stored form:
    the same before writing and after reading back."""
    import hashlib
    import json

    text = json.dumps(nulls_for_nonfinite({"records": records, **(sealed or {})}), sort_keys=True,
                      separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def until_decided_digest(records, spec: dict) -> str:
    """The digest an until-decided cell stores in details.until_decided.digest: its records and its decision."""
    sealed = {k: spec.get(k) for k in SEALED_UNTIL_DECIDED}
    if "alpha" in spec:  # sealed where a run set it (cells of the default level keep the digest they were written with)
        sealed["alpha"] = spec["alpha"]
    return records_digest(records, sealed)


def is_sequence_level(alpha) -> bool:
    """A level an until-decided run may set for its confidence sequences: a number in (0, 0.5] (not a bool, not nan)."""
    return isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0 < alpha <= 0.5


def until_decided_problem(rec: dict) -> str | None:
    """A cell evaluated until decided must carry the digest of its records and decision, and match it: an edited
    reference would move every verdict taken against it, and an edited decision would be printed as taken."""
    spec = (rec.get("details") or {}).get("until_decided") if isinstance(rec.get("details"), dict) else None
    if spec is None:
        return None
    if not isinstance(spec, dict):
        return "details.until_decided is not a mapping"
    alpha = spec.get("alpha", 0.05)
    if not is_sequence_level(alpha):
        return f"details.until_decided.alpha {alpha!r} is not a level in (0, 0.5]"
    if not isinstance(spec.get("digest"), str):
        return "details.until_decided has no digest of its records (written before digests, or edited): rerun it"
    if spec["digest"] != until_decided_digest(rec.get("records") or [], spec):
        return ("its records or its until-decided decision do not match the digest written with them (edited "
                "since the run): rerun it")
    return None


def cell_problem(rec) -> str | None:
    """None for a valid cell; otherwise what is wrong with it, in a few words."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if rec.get("schema_version") not in READABLE_SCHEMAS:
        return (f"schema version {rec.get('schema_version')} (this version reads "
                f"{', '.join(map(str, READABLE_SCHEMAS))})")
    cell = rec.get("cell")
    if not isinstance(cell, dict):
        return "no cell identity (model, method, rank, task)"
    for key, kind in CELL_KEYS.items():
        if not isinstance(cell.get(key), kind):
            return f"cell.{key} missing or not a {kind.__name__}"
    for key, kind in OPTIONAL_CELL_KEYS.items():
        if key in cell and not isinstance(cell[key], kind):
            return f"cell.{key} is not a {kind.__name__}"
    if cell.get("kind", TASK_CELL) not in CELL_KINDS:
        return f"cell.kind {cell['kind']!r} is not one of {', '.join(CELL_KINDS)}"
    rank = cell.get("rank")
    if not (rank is None or (is_finite_or_null(rank) and 0 < rank <= 1)):
        return f"cell.rank {rank!r} is not a ratio in (0, 1]"
    if rank is None and cell["method"] != DENSE:
        return f"cell.rank missing for method {cell['method']!r} (only the dense model's cells have no ratio)"
    metrics = rec.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return "no metrics"
    bad = [k for k, v in metrics.items() if not is_finite_or_null(v)]
    if bad:
        return f"metric {bad[0]} is not a finite number"
    kind = cell_kind(cell)
    if kind == TASK_CELL:
        for k, v in metrics.items():
            dom = metric_domain(k)
            if dom and v is not None and not dom[0] <= v <= dom[1]:
                return f"metric {k} = {v!r} is outside its domain [{dom[0]:g}, {dom[1]:g}]"
    if not rec.get("env"):
        return "no env (the provenance every cell carries)"
    if kind == TASK_CELL and not rec.get("model_fingerprint"):
        return "no model_fingerprint (which weights a task cell measured)"
    if kind == TASK_CELL and cell["method"] != DENSE and not rec.get("compression"):
        return "no compression summary (a compressed model's cell carries what was deployed)"
    # an older cell's records as the leaderboard reads them
    typed = field_problem(rec) or records_problem(upgrade(rec)) or until_decided_problem(rec)
    if typed:
        return typed
    fp = rec.get("model_fingerprint") or {}  # a mapping of scalars, by field_problem
    named = fp.get("alias") or (fp.get("id") if fp.get("source") == "hub" else None)
    if isinstance(named, str) and cell["model"] != named and not (
            cell["model"].startswith(named + "-") and len(cell["model"]) == len(named) + 9):
        return f"cell.model {cell['model']!r} is not the model its fingerprint names ({named!r})"
    pm = rec.get("primary_metric")
    if pm is not None and pm not in metrics:
        return f"primary metric {pm!r} is not among its metrics"
    return None


@dataclass(frozen=True)
class CellId:
    """Which result a cell is: the leaderboard never merges two cells whose `key` (the hash of every setting that
    produced them, method and task versions included) differs."""

    model: str
    method: str
    rank: float | None
    budget: str
    task: str
    key: str = ""
    allocation: str = UNIFORM  # how k is split across groups: uniform (one ratio per group), fisher, variance
    scope: str = ALL_GROUPS  # which input groups were compressed (see acbench.runner.selection): "all" or "groups=...;blocks=..."
    kind: str = TASK_CELL  # a task's cell or an analysis's (whose method is "<analysis>-analysis")

    @property
    def is_analysis(self) -> bool:
        return self.kind == ANALYSIS_CELL

    def identity(self, model_hash: str | None = None) -> tuple:
        return (self.model, model_hash or self.model, self.method, self.allocation, self.scope, self.budget,
                self.rank, self.task, self.key)


@dataclass
class CellRecord:
    """One stored result. The harness writes it, the leaderboard reads it; `to_json`/`from_json` are the schema."""

    cell: CellId
    metrics: dict
    primary_metric: str
    higher_is_better: dict = field(default_factory=dict)  # metric -> True / False / None (no direction)
    stderr: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    task_config: dict = field(default_factory=dict)
    records: list = field(default_factory=list)  # per item, for paired comparisons
    versions: dict = field(default_factory=dict)  # {"method": int, "task": int} of the plugins that made it
    compression: dict | None = None
    calibration: dict | None = None
    memory: dict | None = None
    latency: dict | None = None
    timings: dict = field(default_factory=dict)
    model_fingerprint: dict | None = None
    seed: int | None = None
    bos: str | None = None
    env: dict = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["cell"] = asdict(self.cell)
        return out

    @classmethod
    def from_json(cls, data) -> "CellRecord":
        """The record, or ValueError naming what is wrong (the same rule `cell_problem` applies)."""
        problem = cell_problem(data)
        if problem:
            raise ValueError(problem)
        data = upgrade(data)
        known = {f.name for f in fields(cls)}
        cell = CellId(**{k: v for k, v in data["cell"].items() if k in {f.name for f in fields(CellId)}})
        rec = cls(**{k: v for k, v in data.items() if k in known and k != "cell"}, cell=cell)
        if not rec.primary_metric or rec.primary_metric not in rec.metrics:
            rec.primary_metric = next(iter(rec.metrics))
        return rec

    @property
    def model_hash(self) -> str | None:
        return (self.model_fingerprint or {}).get("sha256")

    def direction(self, metric: str) -> bool | None:
        return self.higher_is_better.get(metric)


def _legacy_chance(task: str, rec: dict, details: dict) -> float | None:
    """The chance level the first schemas left unstored: MMLU 1/4, LAMA 1/|candidates| of the probe (earlier, of
    its relation)."""
    if task == "mmlu":
        return 0.25
    n = rec.get("n_candidates")
    if not (isinstance(n, int) and n > 0):
        per_relation = details.get("n_candidates")
        n = per_relation.get(rec.get("relation")) if isinstance(per_relation, dict) else None
    return 1.0 / n if isinstance(n, int) and n > 0 else None


# what the first schemas' accuracy records stored instead of "correct": MMLU the predicted and gold letters, LAMA
# the rank of the best-ranked gold candidate
_LEGACY_CORRECT = {"mmlu": ("pred", lambda r: float(r["pred"] == r["gold"])),
                   "lama": ("rank", lambda r: float(r["rank"] == 0))}


def upgrade(data: dict) -> dict:
    """A cell of an older readable schema in today's form (a validated dict; the file is never rewritten)."""
    if data.get("schema_version", SCHEMA_VERSION) >= 4:
        return data
    data = dict(data)
    cell = dict(data["cell"])
    cell["kind"] = cell_kind(cell)
    data["cell"] = cell
    legacy = _LEGACY_CORRECT.get(cell["task"])
    recs = data.get("records")
    if legacy and isinstance(recs, list) and recs and all(isinstance(r, dict) and legacy[0] in r for r in recs) \
            and not any("correct" in r for r in recs):
        details = data.get("details") if isinstance(data.get("details"), dict) else {}
        out = []
        for r in recs:
            chance = _legacy_chance(cell["task"], r, details)
            out.append({**r, "correct": legacy[1](r), **({"chance": chance} if chance is not None else {})})
        data["records"] = out
    return data
