"""Generated hostile input (hypothesis): CLI arguments, YAML configs, model configs, result cells, statistics
cache files and checkpoint folders. Properties: exit 0, or exit 2 with one stderr line and no traceback; a report
never crashes on a cell; a cell edited into another meaning is never taken as done; a tampered statistics cache
never changes a number, and a change that matters is said; a tampered checkpoint is one line or loads as written.

Profiles: `fast` (default, bounded examples, in `make test`) and `ci` (HYPOTHESIS_PROFILE=ci, in .ci/run).
"""

import contextlib
import copy
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.cli import main
from bench.cli.smoke import tiny_checkpoint

settings.register_profile("fast", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
# ci is derandomized so that a CI run is repeatable (a red CI names a case that fails again on a rerun); explore
# draws new cases every run, to go looking for crashes by hand (HYPOTHESIS_PROFILE=explore)
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("explore", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(__import__("os").environ.get("HYPOTHESIS_PROFILE", "fast"))

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tiny():
    return tiny_checkpoint()


@pytest.fixture
def checked_only(monkeypatch):
    """bench run / compress stop once everything is validated and planned (no weights, no cells): the fuzz
    explores the checks, not the compute."""
    import bench.execute
    import bench.save
    from bench.cli import ray_executor

    monkeypatch.setattr(bench.execute, "sweep", lambda run: bench.execute.prepare(run) and None)
    monkeypatch.setattr(ray_executor, "run_on_ray", lambda run: (bench.execute.prepare(run), {"failed": []})[1])
    def checked_save(run, out, merge=False, overwrite=False):
        bench.execute.open_checked(run)
        return {"weight_bytes": 1, "dense_bytes": 1, "seconds": 0.0, "custom_code": False,
                "provenance": {"budget": "-", "compression": {"groups_factorised": 0, "groups": [], "param_ratio": 1}}}

    monkeypatch.setattr(bench.save, "save_compressed", checked_save)


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


# ---------------------------------------------------------------- CLI arguments

WEIRD = st.sampled_from(["", "abc", "-1", "0", "nan", "inf", "1e309", "99999999999999999999", "é", " ", "0.5,",
                         ",", "1.5", "-0"])
VALUES = {
    "--methods": ["pca", "fasc-kfac", "all", "dense", "pcaa", "pca,act-sparse", "act-sparse:score=bogus", "wanda"],
    "--rank": ["0.5", "0.25,0.5", "1", "0", "1.5", "-0.5"],
    "--sparsity": ["2:4", "8:16", "0.5", "5:4", "0:4", "2:3", "3"],
    "--budget": ["rank", "params", "flops"],
    "--rank-align": ["1", "8", "0", "-3"],
    "--allocate": ["uniform", "fisher", "variance", "fishr"],
    "--groups": ["mlp_in", "attn_in,attn_out", "bogus"],
    "--blocks": ["0", "0-1", "999", "-1", "1-0", "a-b", "0,0"],
    "--tasks": ["ppl-token", "lama", "mmlu", "rho", "bogus", "ppl-token,lama"],
    "--calib-samples": ["1", "2", "0", "-5"],
    "--calib-seq-len": ["1", "2", "32"],
    "--pair-tokens": ["1", "32", "0"],
    "--bos": ["auto", "window", "stream", "none", "always"],
    "--seed": ["0", "3", "-1", "4294967296"],
    "--device": ["cpu", "cuda", "cuda:7", "tpu"],
    "--solve-device": ["auto", "cpu", "cuda", "cuda:3", "gpu"],
    "--dtype": ["float32", "bfloat16", "int8"],
    "--batch-size": ["1", "4", "0"],
    "--stats-memory": ["1GB", "1KB", "0", "-5GB", "12XB", "1e3MB"],
    "--executor": ["local", "ray", "spark"],
    "--ray-address": ["127.0.0.1:1", "bogus:99999", "auto"],
    "--ray-timeout": ["1", "0", "-2"],
    "--threads": ["1", "0", "-1"],
    "--limit": ["1", "0", "-1", "1000000"],
    "--ppl-windows": ["1", "0", "-2"],
    "--ppl-seq-len": ["1", "32", "0"],
    "--lama-candidates": ["1", "2", "8", "0"],
    "--mmlu-shots": ["0", "5", "1000", "-1"],
    "--text-source": ["wiki", "file:/nonexistent", "file:/etc/hostname", "file:/", "hub:nothing"],
    "--method-option": ["fasc.max_swaps=-5", "pca.bogus=1", "fasc.folds=abc", "bogus", "fasc.folds=[1", "a.b=c"],
    "--task-option": ["lama.per_relation=0", "mmlu.shots=x", "bogus.a=1", "ppl-token.max_windows=[]"],
    "--analysis-option": ["rho.units=0", "rho.per_group=maybe", "rho.units=2"],
}
flag_value = st.sampled_from(sorted(VALUES)).flatmap(
    lambda flag: st.tuples(st.just(flag), st.one_of(st.sampled_from(VALUES[flag]), WEIRD)))


@given(pairs=st.lists(flag_value, max_size=5))
def test_generated_run_arguments_end_in_one_line_or_run(tmp_path, tiny, checked_only, pairs):
    argv = ["run", "--model", str(tiny), "--output", str(tmp_path / "out"), "--no-report", "--quiet",
            "--calib-samples", "2", "--calib-seq-len", "32"]
    for flag, value in pairs:
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    assert_clean(argv)


PLAN_FLAGS = ["--methods", "--rank", "--sparsity", "--budget", "--rank-align", "--dtype", "--stats-memory",
              "--calib-samples", "--calib-seq-len", "--batch-size", "--pair-tokens", "--allocate", "--groups", "--blocks"]


@given(pairs=st.lists(st.sampled_from(PLAN_FLAGS).flatmap(
    lambda f: st.tuples(st.just(f), st.one_of(st.sampled_from(VALUES[f]), WEIRD))), max_size=5),
    compress=st.booleans())
def test_generated_plan_and_compress_arguments(tmp_path, tiny, checked_only, pairs, compress):
    argv = (["compress", "--method", "pca", "--save", str(tmp_path / "ck")] if compress else ["plan"]) + \
        ["--model", str(tiny)]
    for flag, value in pairs:
        if compress and flag == "--methods":
            flag = "--method"
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    assert_clean(argv)


# ---------------------------------------------------------------- YAML configs

KEYS = ["model", "methods", "rank", "ranks", "sparsity", "tasks", "blocks", "groups", "seed", "batch_size",
        "calib_samples", "method_options", "task_options", "analysis_options", "stats_memory", "allocate", "bos",
        "lama-limit", "ppl_windows", "overwrite", "progress", "bogus_key", "executor", "no_latency", "quiet",
        "task_option", "method-option", "no-report"]
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                      st.text(max_size=8), st.sampled_from(["pca", "2:4", "0.5", "ppl-token", "fasc", "0-1"]))
json_value = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                            st.dictionaries(st.text(max_size=6) | st.sampled_from(
                                                                ["fasc", "lama", "rho", "units"]), kids,
                                                                max_size=3)), max_leaves=6)


@given(data=st.dictionaries(st.sampled_from(KEYS) | st.integers(0, 3), json_value, max_size=5) | json_value)
def test_generated_yaml_configs(tmp_path, tiny, checked_only, data):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(data) if not isinstance(data, float) else repr(data))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--no-report", "--quiet"])


OPTION_NAMES = {"method_options": ["fasc", "pca", "act-sparse", "bogus"], "task_options": ["lama", "mmlu", "ppl-token"],
                "analysis_options": ["rho", "bogus"]}
option_block = st.sampled_from(sorted(OPTION_NAMES)).flatmap(lambda block: st.tuples(st.just(block), st.dictionaries(
    st.sampled_from(OPTION_NAMES[block]) | st.integers(0, 2), st.sampled_from([5, "x", [1], True]) | st.dictionaries(
        st.sampled_from(["max_swaps", "folds", "units", "per_relation", "shots", "limit"]) | st.integers(0, 2),
        json_value, max_size=2), max_size=2)))


@given(blocks=st.lists(option_block, min_size=1, max_size=3))
def test_generated_option_blocks(tmp_path, tiny, checked_only, blocks):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(dict(blocks)))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--tasks", "lama", "rho", "--no-report", "--quiet"])


@given(text=st.text(max_size=60))
def test_raw_config_text(tmp_path, tiny, checked_only, text):
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(text.encode("utf-8", "surrogatepass"))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--no-report", "--quiet"])


# ---------------------------------------------------------------- model config.json

CONFIG_KEYS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "vocab_size", "model_type", "head_dim", "tie_word_embeddings",
               "max_position_embeddings", "rms_norm_eps", "architectures"]


@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), json_value, min_size=1, max_size=3),
       drop=st.lists(st.sampled_from(CONFIG_KEYS), max_size=2), run=st.booleans())
def test_generated_model_configs(tmp_path, tiny, checked_only, changes, drop, run):
    folder = tmp_path / "model"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(tiny, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    for key in drop:
        cfg.pop(key, None)
    (folder / "config.json").write_text(json.dumps(cfg))
    argv = (["run", "--model", str(folder), "--methods", "pca", "--tasks", "ppl-token", "--output",
             str(tmp_path / "out"), "--no-report", "--quiet"] if run else ["plan", "--model", str(folder)])
    assert_clean(argv)


# ---------------------------------------------------------------- result cells

@pytest.fixture(scope="module")
def valid_cell():
    return json.loads((FIXTURES / "results" / VALID_PLACE).read_text())


VALID_PLACE = "model-b/fasc/rank-0.5/lama-k1.json"


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:2]):
            yield from _paths(v, prefix + (i,))


@given(data=st.data())
def test_generated_cells_never_crash_the_report(tmp_path, valid_cell, data):
    from leaderboard.report import write_report

    paths = [p for p in _paths(valid_cell) if p]
    cell = copy.deepcopy(valid_cell)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = cell
        try:
            for step in path[:-1]:
                parent = parent[step]
            parent[path[-1]] = data.draw(json_value)
        except (KeyError, IndexError, TypeError):
            continue  # the path went away with an earlier change
    root = tmp_path / "results"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(FIXTURES / "results" / "model-b" / "dense", root / "model-b" / "dense")
    # at the place its (changed) identity names, so that the report reads it; where the identity names no place,
    # at the original one (the reader skips it, saying why)
    from core.record import cell_relpath

    try:
        c = cell["cell"]
        place = cell_relpath(c["model"], c["method"], c.get("rank"), c["budget"], c["task"], c["key"],
                             c.get("allocation", "uniform"), c.get("scope", "all"))
        assert ".." not in place.parts and not place.is_absolute()
    except Exception:
        place = Path(VALID_PLACE)
    target = root / place
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(cell))
    except (OSError, ValueError):  # a generated name the file system refuses
        (root / VALID_PLACE).parent.mkdir(parents=True, exist_ok=True)
        (root / VALID_PLACE).write_text(json.dumps(cell))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        md = write_report(str(root))
    assert md.exists()


# another value of each identity field that a valid cell could carry (the hard case: the cell stays well-formed)
PLAUSIBLE = {"model": st.sampled_from(["model-a", "model-b/x", "gemma-3-270m"]),
             "method": st.sampled_from(["pca", "fasc-kfac", "svd", "dense", "act-sparse", "wanda"]),
             "rank": st.floats(0.01, 1.0), "budget": st.sampled_from(["rank", "params", "sparsity"]),
             "task": st.sampled_from(["ppl-token", "mmlu", "rho", "lama"]),
             "key": st.text("0123456789abcdef", min_size=1, max_size=12),
             "allocation": st.sampled_from(["uniform", "fisher", "greedy"]),
             "scope": st.sampled_from(["all", "groups=mlp_in", "blocks=0-1"])}
IDENTITY = tuple(PLAUSIBLE)
PROVENANCE = ("env", "model_fingerprint", "compression")


@given(data=st.data(), field=st.sampled_from(IDENTITY), metric_value=st.floats(allow_nan=False),
       drop=st.sampled_from(PROVENANCE), which=st.sampled_from(["identity", "metric", "provenance"]))
def test_a_cell_that_is_not_what_its_place_says_is_never_taken_as_done(tmp_path, valid_cell, data, field,
                                                                       metric_value, drop, which):
    """Edited in its place, a cell is done only if it still means what its place says: an identity field changed
    (a pca cell relabelled fasc), a metric outside its domain (a ppl of -1), a provenance field dropped: each is
    a reason to recompute it (bench run) and to name it (bench report)."""
    from bench.store import cell_status
    from core.record import metric_domain

    cell = copy.deepcopy(valid_cell)
    target = tmp_path / VALID_PLACE
    target.parent.mkdir(parents=True, exist_ok=True)  # tmp_path is shared by the examples: each rewrites the cell
    target.write_text(json.dumps(cell))
    assert cell_status(target) is None  # the fixture is a done cell at its own place
    if which == "identity":
        value = data.draw(PLAUSIBLE[field] | json_value)
        if cell["cell"].get(field) == value or (field == "allocation" and value == "uniform" and field not in
                                                cell["cell"]) or (field == "scope" and value == "all"):
            return  # the same identity
        cell["cell"][field] = value
    elif which == "metric":
        name = next(iter(cell["metrics"]))
        lo, hi = metric_domain(name)
        if lo <= metric_value <= hi:
            return  # inside the domain: a possible result, which no check can refuse
        cell["metrics"][name] = metric_value
    else:
        del cell[drop]
    target.write_text(json.dumps(cell))
    assert cell_status(target) is not None, (which, field, value, metric_value, drop)


# ---------------------------------------------------------------- the statistics cache

@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    """The tiny model's statistics in a cache of their own, and the values a clean read gives."""
    import os

    from bench.calibrate import CalibSpec
    from bench.groups import find_input_groups
    from bench.models import load_model
    from bench.statistics import calibration_windows, load_or_calibrate, stats_folder

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("ACBENCH_CACHE"), os.environ.get("ACBENCH_STATS_CACHE")
    os.environ["ACBENCH_CACHE"] = str(cache)
    os.environ["ACBENCH_STATS_CACHE"] = str(cache / "stats")
    try:
        lm = load_model(str(tiny_checkpoint()), progress=False)
        groups = find_input_groups(lm.model)
        cspec, needs = CalibSpec(samples=2, seq_len=32, pair_tokens=16, bos="none"), frozenset({"C", "F", "pairs"})
        windows = calibration_windows(lm.tokenizer, cspec)  # tokenized once: recomputing a group is then quick
        store, _ = load_or_calibrate(lm, groups, cspec, needs, progress=False, windows=windows)
        reference = {g.name: store[g.name] for g in groups}
        yield lm, groups, cspec, needs, stats_folder(lm.fingerprint, cspec, needs), reference, cache, windows
    finally:
        for name, value in zip(("ACBENCH_CACHE", "ACBENCH_STATS_CACHE"), old):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8:8 + n])


def _with_header(path: Path, header: dict, n_old: int) -> None:
    raw = path.read_bytes()
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n_old:])


TAMPERS = ["flip", "dtype", "shape", "drop_meta", "scalars", "token_count", "add_meta", "truncate", "garbage_info",
           "swap_files"]


@given(tamper=st.sampled_from(TAMPERS), which=st.integers(0, 7), where=st.floats(0, 1))
def test_tampered_statistics_never_change_a_number(calibrated, tamper, which, where, monkeypatch):
    from bench.statistics import load_or_calibrate
    from bench.stats_store import group_file, group_problem

    lm, groups, cspec, needs, folder, reference, cache, windows = calibrated
    monkeypatch.setenv("ACBENCH_CACHE", str(cache))
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(cache / "stats"))
    g = groups[which % len(groups)]
    path = group_file(folder, g.name)
    before = path.read_bytes()
    n, header = _header(path)
    tensors = [k for k in header if k != "__metadata__"]
    key = tensors[int(where * (len(tensors) - 1))]
    if tamper == "flip":
        data = bytearray(before)
        data[8 + n + int(where * (len(data) - 9 - n))] ^= 0x10
        path.write_bytes(bytes(data))
    elif tamper == "dtype":  # same byte count, another meaning (the F32 -> I32)
        header[key]["dtype"] = "I32"
        _with_header(path, header, n)
    elif tamper == "shape":
        shape = header[key]["shape"]
        header[key]["shape"] = [shape[-1], shape[0]] if len(shape) == 2 and shape[0] != shape[-1] else [1] + shape
        _with_header(path, header, n)
    elif tamper == "drop_meta":
        header["__metadata__"].pop(["scalars", "group", "digest", "tensors"][which % 4])
        _with_header(path, header, n)
    elif tamper == "scalars":
        header["__metadata__"]["scalars"] = json.dumps({"n_tokens": "many", "extra": 1})
        _with_header(path, header, n)
    elif tamper == "token_count":  # a plausible count, off by a little: only the digest can tell
        scalars = json.loads(header["__metadata__"]["scalars"])
        header["__metadata__"]["scalars"] = json.dumps({**scalars, "n_tokens": scalars["n_tokens"] + 1 + which})
        _with_header(path, header, n)
    elif tamper == "add_meta":
        header["__metadata__"]["group"] = groups[(which + 1) % len(groups)].name
        _with_header(path, header, n)
    elif tamper == "truncate":
        path.write_bytes(before[: int(where * (len(before) - 1))])
    elif tamper == "garbage_info":
        (folder / "info.json").write_text("{garbage")
    elif tamper == "swap_files":
        other = group_file(folder, groups[(which + 1) % len(groups)].name)
        path.write_bytes(other.read_bytes())
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        store, _ = load_or_calibrate(lm, groups, cspec, needs, progress=False, windows=windows)
        got = {name: store[name] for name in reference}
    for name, ref in reference.items():  # recomputed or untouched: the same numbers either way
        for f in ("C", "F", "xs", "gs"):
            assert torch.equal(getattr(got[name], f), getattr(ref, f)), (tamper, name, f)
        assert got[name].n_tokens == ref.n_tokens, (tamper, name)
    said = log.getvalue()
    if tamper == "garbage_info":
        assert "info.json" in said and "unreadable" in said
        (folder / "info.json").write_text("{}")
    else:  # every change to a group file is seen, said, and the file replaced
        assert f"recomputing calibration statistics of {g.name}" in said and str(path) in said, said
        assert group_problem(folder, g.name, g.d_in) is None


# ---------------------------------------------------------------- checkpoint folders

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A factorised checkpoint of the tiny model (bench compress), and the logits acbench's load gives."""
    from bench.models import load_model

    out = tmp_path_factory.mktemp("ck") / "pca"
    args = ["compress", "--model", str(tiny_checkpoint()), "--method", "pca", "--rank", "0.5", "--save", str(out),
            "--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32", "--quiet"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    x = torch.arange(1, 13)[None]
    with torch.no_grad():
        return out, x, load_model(str(out), progress=False).model(x).logits


CHECKPOINT_TAMPERS = ["flip", "delete", "add", "edit_json", "drop_key", "truncate"]


@given(tamper=st.sampled_from(CHECKPOINT_TAMPERS), which=st.integers(0, 20), where=st.floats(0, 1),
       value=json_value)
def test_a_tampered_checkpoint_is_refused_or_loads_as_written(tmp_path, checkpoint, tamper, which, where, value):
    """Any change to a saved checkpoint's files (a byte flipped, a file deleted, added or truncated, a JSON field
    edited or dropped) is one UserError on load, or leaves the model it loads bit-identical: never a traceback,
    never other numbers."""
    from bench.models import load_model
    from core.errors import UserError

    folder, x, reference = checkpoint
    f = tmp_path / "ck"
    shutil.rmtree(f, ignore_errors=True)
    shutil.copytree(folder, f)
    files = sorted(p for p in f.iterdir() if p.is_file())
    target = files[which % len(files)]
    if tamper == "flip":
        data = bytearray(target.read_bytes())
        data[int(where * (len(data) - 1))] ^= 0x01
        target.write_bytes(bytes(data))
    elif tamper == "delete":
        target.unlink()
    elif tamper == "add":
        names = ["extra.safetensors", "extra.py", "special_tokens_map.json", "pytorch_model.bin", "notes.md"]
        (f / names[which % len(names)]).write_bytes(b"{}")
    elif tamper == "truncate":
        target.write_bytes(target.read_bytes()[: int(where * (target.stat().st_size - 1))])
    else:
        name = ["config.json", "compression.json", "tokenizer_config.json", "generation_config.json"][which % 4]
        obj = json.loads((f / name).read_text())
        paths = [p for p in _paths(obj) if p]
        path = paths[int(where * (len(paths) - 1))]
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        if tamper == "drop_key" and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        (f / name).write_text(json.dumps(obj))
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            lm = load_model(str(f), progress=False)
    except UserError as e:
        assert "\n" not in str(e).strip(), str(e)
        return
    with torch.no_grad():
        assert torch.equal(lm.model(x).logits, reference), (tamper, target.name)


# ---------------------------------------------------------------- saved checkpoints, run as the dense model

def _saved_cases():
    """Every built-in method at a budget it takes (2:4, or a density for a method that keeps thresholds), the
    threshold method under its per-group allocation, and one merged low-rank form."""
    import methods
    from core.stats import SPARSITY_FAMILY, SparsitySpec

    cases = []
    for m in methods.known_methods():
        if methods.family_of(m) != SPARSITY_FAMILY:
            cases.append((m, ["--rank", "0.5"]))
        elif methods.get_method(m).pattern_problem(SparsitySpec.parse("2:4")):
            cases.append((m, ["--sparsity", "0.5"]))
        else:
            cases.append((m, ["--sparsity", "2:4"]))
    return cases + [("teal", ["--sparsity", "0.5", "--allocate", "greedy"]), ("pca", ["--rank", "0.5", "--merged"])]


@pytest.mark.parametrize("method,budget", _saved_cases(), ids=lambda c: c if isinstance(c, str) else " ".join(c))
def test_every_saved_checkpoint_is_evaluated_by_bench_run_as_dense(tmp_path, tiny, method, budget):
    """A checkpoint `bench compress` wrote is a model like any other: `bench run --model <ckpt> --methods dense`
    writes its cell (a threshold checkpoint's with the density its tokens kept), never a traceback."""
    ck, out = tmp_path / "ck", tmp_path / "out"
    calib = ["--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32"]
    assert assert_clean(["compress", "--model", str(tiny), "--method", method, *budget, "--save", str(ck), *calib,
                         "--quiet"]) == 0
    rc = assert_clean(["run", "--model", str(ck), "--methods", "dense", "--tasks", "ppl-token", "--ppl-windows", "1",
                       "--ppl-seq-len", "32", "--output", str(out), "--no-latency", "--no-report", "--quiet"])
    assert rc == 0
    (cell,) = out.rglob("ppl-token-*.json")
    rec = json.loads(cell.read_text())
    assert rec["cell"]["method"] == "dense" and rec["metrics"]["ppl"] > 0
    thresholds = method == "teal"
    density = (rec.get("compression") or {}).get("measured_density")
    assert (density is not None) == thresholds, rec.get("compression")
    if thresholds:
        assert 0 < density < 1


# ---------------------------------------------------------------- allocation rules with every method family

@given(method=st.sampled_from(__import__("methods").known_methods()),
       rules=st.lists(st.sampled_from(["uniform", "fisher", "variance", "greedy"]), min_size=1, max_size=3,
                      unique=True),
       budget=st.sampled_from(["rank", "params"]), sparsity=st.sampled_from([None, "0.5", "2:4", "0.25,2:4"]),
       rank=st.booleans(), command=st.sampled_from(["run", "plan", "compress"]))
def test_every_allocation_rule_with_every_method_family(tmp_path, tiny, checked_only, method, rules, budget,
                                                        sparsity, rank, command):
    """--allocate names rules of one family or the other; with any method, budget and pattern it runs or is one
    line (greedy is for unstructured sparsity, fisher and variance for a parameter budget of projections)."""
    argv = [command, "--model", str(tiny), "--allocate", *rules, "--budget", budget]
    argv += ["--method" if command == "compress" else "--methods", method]
    if command == "compress":
        argv += ["--save", str(tmp_path / "ck")]
    elif command == "run":
        argv += ["--output", str(tmp_path / "out"), "--no-report", "--quiet"]
    if sparsity:
        argv += ["--sparsity", *sparsity.split(",")]
    if rank:
        argv += ["--rank", "0.5"]
    assert_clean(argv)


# ---------------------------------------------------------------- data sources: fields of every JSON type

json_any = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
                        | st.text(max_size=6) | st.sampled_from(["Paris", "[X] was born in [Y] .", "P19", ""]),
                        lambda kids: st.lists(kids, max_size=2) | st.dictionaries(st.text(max_size=4), kids,
                                                                                  max_size=2), max_leaves=4)


def _refused_in_one_line_or_loaded(source: str) -> None:
    from core.errors import UserError
    from tasks.data.lama_data import load_lama

    try:
        ls = load_lama(source)
    except UserError as e:
        assert "\n" not in str(e).strip() and ("row" in str(e) or "does not exist" in str(e)), str(e)
        return
    for p in ls.probes:  # what loads is what a probe needs: text to prompt with and text to score
        assert isinstance(p.prompt, str) and all(isinstance(o, str) and o for o in p.objects), p


@given(sub=json_any, obj=json_any, relation=json_any, template=json_any,
       drop=st.sampled_from([None, "sub_label", "obj_label"]))
def test_lama_rows_with_fields_of_every_json_type(tmp_path, sub, obj, relation, template, drop):
    """A LAMA folder whose rows hold any JSON value in any field loads as text or is refused naming the file and
    the row (a number or list where a label belongs once ended in a TypeError)."""
    folder = tmp_path / "lama"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    row = {"sub_label": sub, "obj_label": obj}
    if drop:
        del row[drop]
    (folder / "P19.jsonl").write_text(json.dumps({"sub_label": "Ada", "obj_label": "London"}) + "\n"
                                      + json.dumps(row) + "\n")
    (tmp_path / "relations.jsonl").write_text(json.dumps({"relation": "P19", "template": "[X] was born in [Y] ."})
                                              + "\n" + json.dumps({"relation": relation, "template": template}) + "\n")
    _refused_in_one_line_or_loaded(f"lama:{folder}:{tmp_path / 'relations.jsonl'}")


@given(question=json_any, target=json_any)
def test_qa_wikidata_examples_with_fields_of_every_json_type(tmp_path, question, target):
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"examples": [{"input": "The capital of France is", "target": "Paris"},
                                             {"input": question, "target": target}]}))
    _refused_in_one_line_or_loaded(f"qa_wikidata:{task}")


# ---------------------------------------------------------------- config keys: values of every YAML type

def _config_keys() -> list[str]:
    from bench.cli.run import _NEGATED, shortcut_dest, task_shortcuts
    from bench.config import RunConfig

    return sorted(RunConfig.field_names() - set(_NEGATED.values()) - {"model", "output", "executor"}
                  | set(_NEGATED) | {shortcut_dest(f) for f in task_shortcuts()} | {"rank", "method_option"})


# every type YAML's safe loader produces: null, bool, int, float (nan, inf), str, binary, date, timestamp, lists
# and mappings (keys that name tasks, methods and settings, so a mapping can look like what a key expects)
yaml_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
                      st.text(max_size=8), st.binary(max_size=4), st.dates(), st.datetimes(),
                      st.sampled_from(["pca", "teal", "2:4", "0.5", "ppl-token", "lama", "fasc", "0-1", "uniform"]))
yaml_value = st.recursive(yaml_leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=3),
    st.dictionaries(st.sampled_from(["ppl-token", "lama", "rho", "pca", "fasc", "units", "max_swaps", "limit"])
                    | st.text(max_size=4) | st.integers(0, 3), kids, max_size=3)), max_leaves=6)


@given(key=st.sampled_from(_config_keys()), value=yaml_value, dashes=st.booleans())
@example(key="tasks", value={"ppl-token": 1}, dashes=False)
@example(key="methods", value={"pca": 1}, dashes=False)
@example(key="allocate", value={"greedy": None}, dashes=False)
def test_config_keys_with_values_of_every_yaml_type(tmp_path, tiny, checked_only, key, value, dashes):
    """Every key a --config file may hold, with a value of any YAML type: the run goes on or it is one line (a
    mapping where a list of task names belongs once ended in a TypeError)."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({key.replace("_", "-") if dashes else key: value}))
    assert_clean(["run", "--config", str(cfg), "--model", str(tiny), "--output", str(tmp_path / "out"),
                  "--no-report", "--quiet"])
