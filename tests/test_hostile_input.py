"""Hostile but realistic input: every case ends with one line naming the input, exit 2, no traceback, no file."""

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from acbench.cli import main, run_config_from_argv


def base(tiny, out, **replace):
    args = {"--model": str(tiny), "--methods": "pca", "--rank": "0.5", "--tasks": "ppl-token",
            "--output": str(out), "--calib-samples": "2", "--calib-seq-len": "32", "--ppl-windows": "1",
            "--ppl-seq-len": "32", **replace}
    if "ppl" not in str(args["--tasks"]):  # the perplexity sizes would do nothing, and are refused
        args = {**args, "--ppl-windows": None, "--ppl-seq-len": None}
    flat = ["run"]
    for k, v in args.items():
        if v is not None:
            flat += [k, *(v if isinstance(v, list) else [v])]
    return flat + ["--no-report", "--quiet", "--no-latency"]


def with_extra(tiny, out, extra: list[str]) -> list[str]:
    """base's argv with `extra`'s flags in place of base's own (a flag is given once) and the others appended."""
    flags: dict = {}
    for item in extra:
        if item.startswith("--"):
            flags[item] = []
        else:
            flags[list(flags)[-1]].append(item)
    replace = {f: v for f, v in flags.items() if f in base(tiny, out)}
    rest = [x for f, v in flags.items() if f not in replace for x in (f, *v)]
    return base(tiny, out, **{f: v if len(v) != 1 else v[0] for f, v in replace.items()}) + rest


def expect_one_line(capsys, argv, needle):
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert rc == 2, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in lines[0], lines[0]
    return lines[0]


def no_cells(out: Path) -> bool:
    return not out.exists() or not [p for p in out.rglob("*.json")]


def _bad_models(tmp: Path, tiny: Path) -> dict:
    (tmp / "random.gguf").write_bytes(os.urandom(4096))
    (tmp / "garbage.gguf").write_bytes(b"GGUF" + os.urandom(4096))
    from acbench.model.sources import _alias_gguf

    real = _alias_gguf("smollm2-135m").read_bytes()
    (tmp / "truncated.gguf").write_bytes(real[: 1 << 20])
    only = tmp / "only-config"
    only.mkdir()
    shutil.copy(tiny / "config.json", only / "config.json")
    broken = tmp / "broken-config"
    shutil.copytree(tiny, broken)
    (broken / "config.json").write_text("{not json")
    return {"random.gguf": (str(tmp / "random.gguf"), "random.gguf"),
            "garbage.gguf": (str(tmp / "garbage.gguf"), "garbage.gguf"),
            "truncated.gguf": (str(tmp / "truncated.gguf"), "truncated.gguf"),
            "only-config": (str(only), "holds no weights"),
            "broken-config": (str(broken), "config.json is not valid JSON")}


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory, tiny):
    """The five bad models, written once (one reads the SmolLM2 GGUF): each case only reads its own."""
    return _bad_models(tmp_path_factory.mktemp("bad-models"), tiny)


@pytest.mark.parametrize("case", ["random.gguf", "garbage.gguf", "truncated.gguf", "only-config", "broken-config"])
def test_bad_models(tmp_path, tiny, bad_models, capsys, case):
    model, needle = bad_models[case]
    out = tmp_path / "out"
    expect_one_line(capsys, base(tiny, out, **{"--model": model}), needle)
    assert no_cells(out)


@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe\x00bad", "not UTF-8"),
    (b"methods: 5\n", "methods must be list[str]"),
    (b"tasks: 5\n", "tasks must be list[str]"),
    (b"tasks: {ppl-token: 1}\n", "tasks must be list[str], got [{'ppl-token': 1}]"),
    (b"seed: abc\n", "seed must be int"),
    (b"device: 5\n", "device must be str"),
    (b"method_options: 5\n", "method_options must be a mapping"),
    (b"output: 5\n", "output must be str"),
])
def test_bad_config_files(tmp_path, tiny, capsys, content, needle):
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(content)
    out = tmp_path / "out"
    key = content.split(b":")[0].decode(errors="replace")
    argv = base(tiny, out, **({f"--{key}": None} if key in ("methods", "tasks", "output") else {})) + ["--config", str(cfg)]
    expect_one_line(capsys, argv, needle)
    assert no_cells(out)


@pytest.mark.parametrize("extra,needle", [
    (["--method-option", "fasc.max_swaps=abc"], "max_swaps must be int"),
    (["--method-option", "fasc.max_swaps=[1"], "fasc.max_swaps=[1"),
    (["--task-option", "ppl-token.seq_len=abc"], "seq_len must be int"),
    (["--method-option", "fasc.max_swaps=-5"], "max_swaps must be >= 0"),
    (["--device", "tpu"], "--device tpu"),
    (["--ppl-seq-len", "1"], "setting seq_len must be >= 2, got 1"),
    (["--calib-seq-len", "1"], "--calib-seq-len must be an integer >= 2"),
    (["--tasks", "rhoo"], "Did you mean 'rho'?"),
    (["--analysis-option", "rh.units=1"], "See `bench ls analyses`"),
    (["--analysis-option", "rho.unitz=2"], "analysis 'rho' has no setting unitz"),
    (["--analysis-option", "rho.units=0"], "setting units must be >= 1"),
    (["--stats-memory", "lots"], "--stats-memory 'lots' is not a size"),
    (["--device-map", "everywhere"], "--device-map 'everywhere' is unknown"),
    (["--allocate", "fisher"], "add --budget params"),
    (["--allocate", "fishr", "--budget", "params"], "Did you mean 'fisher'?"),
    (["--allocate", "fisher", "--budget", "params", "--methods", "svd"], "svd factorises each site on its own"),
    (["--allocate", "fisher", "--budget", "params", "--rank-align", "8"], "does not combine with --rank-align"),
    (["--methods", "fasc-kfac", "--budget", "params", "--allocate", "greedy", "fisher"],
     "--allocate greedy sets a density per input group for activation sparsity"),
    (["--allocate", "fisher", "--budget", "params", "--rank", "0.001"], "below the minimum ranks"),
    (["--groups", "mlp"], "unknown group kind 'mlp'"),
    (["--blocks", "0-x"], "'0-x' is not a block index"),
    (["--blocks", "0,7"], "block 7 does not exist, the model has 2 blocks (0-1)"),
])
def test_bad_options(tmp_path, tiny, capsys, extra, needle):
    out = tmp_path / "out"
    expect_one_line(capsys, with_extra(tiny, out, extra), needle)
    assert no_cells(out)


def _bad_data(tmp: Path) -> dict:
    mmlu = tmp / "mmlu"
    for split in ("dev", "test"):
        (mmlu / split).mkdir(parents=True)
        (mmlu / split / f"anatomy_{split}.csv").write_bytes(b"\x80\x81\xfe" + os.urandom(200))
    lama = tmp / "lama"
    lama.mkdir()
    (lama / "P19.jsonl").write_text('{"sub_label": "a", "obj_label": "b"}\n')
    typed = tmp / "lama-typed"
    typed.mkdir()
    (typed / "P19.jsonl").write_text('{"sub_label": 5, "obj_label": ["Paris"]}\n')
    (tmp / "relations.jsonl").write_text('{"relation": "P19", "template": "[X] was born in [Y] ."}\n')
    (tmp / "empty.txt").write_text("")
    (tmp / "short.txt").write_text("Just a few words here.")
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 20)
    (tmp / "folder").mkdir()
    return {
        "mmlu-random-bytes": ({"--tasks": "mmlu", "--mmlu-source": str(mmlu)}, "not UTF-8"),
        "lama-missing-relations": ({"--tasks": "lama", "--lama-source": f"lama:{lama}:{tmp / 'nope.jsonl'}"},
                                   "nope.jsonl does not exist"),
        "lama-number-label": ({"--tasks": "lama", "--lama-source": f"lama:{typed}:{tmp / 'relations.jsonl'}"},
                              "P19.jsonl, row 1: field sub_label must be a non-empty string, got 5"),
        "qa-wikidata-missing": ({"--tasks": "lama", "--lama-source": f"qa_wikidata:{tmp / 'task.json'}"},
                                "task.json does not exist"),
        "text-empty": ({"--text-source": f"file:{tmp / 'empty.txt'}"}, "empty.txt"),
        "text-short": ({"--text-source": f"file:{tmp / 'short.txt'}"}, "fewer than one window"),
        "text-binary": ({"--text-source": f"file:{tmp / 'binary.bin'}"}, "binary.bin"),
        "limit-huge": ({"--tasks": "lama", "--limit": "1000000000000"}, "exceeds the largest relation"),
        "calib-folder": ({"--calib-source": f"file:{tmp / 'folder'}"}, "is a folder"),
        "calib-bare-folder": ({"--calib-source": str(tmp / "folder")}, "write it as file:"),
    }


@pytest.mark.parametrize("case", ["mmlu-random-bytes", "lama-missing-relations", "lama-number-label",
                                  "qa-wikidata-missing", "text-empty", "text-short", "text-binary", "limit-huge", "calib-folder", "calib-bare-folder"])
def test_bad_data_refused_before_the_model_loads(tmp_path, tiny, capsys, monkeypatch, case):
    replace, needle = _bad_data(tmp_path)[case]
    import transformers

    def no_weights(*a, **k):
        raise AssertionError("the weights loaded before the data was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    out = tmp_path / "out"
    expect_one_line(capsys, base(tiny, out, **replace), needle)
    assert no_cells(out)


def test_unwritable_results_subfolder(tmp_path, tiny, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / tiny.name).write_text("a file where the model's results folder belongs")
    expect_one_line(capsys, base(tiny, out), "cannot write")
    assert no_cells(out)


def test_report_refusals(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    expect_one_line(capsys, ["report", "--results", str(tmp_path / "empty")], "no result cells")
    fixture = Path(__file__).parent / "fixtures" / "results"
    (tmp_path / "a-file").write_text("x")
    expect_one_line(capsys, ["report", "--results", str(fixture), "--out", str(tmp_path / "a-file" / "LB.md")],
                    "a-file")


def _tree_snapshot(root: Path) -> dict:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_report_never_writes_over_what_it_reads(tmp_path, capsys):
    """--out with an export's suffix (the markdown would be overwritten by its own JSON or CSV), inside a results
    tree among its cells, at a stored cell, or where a file the report did not write stands (the markdown's path
    or an export's): one line, and every file as it was."""
    results = tmp_path / "results"
    shutil.copytree(Path(__file__).parent / "fixtures" / "results", results)
    mine = tmp_path / "notes.md"
    mine.write_text("my notes")
    (tmp_path / "mine.json").write_text('{"my": "data"}')
    (tmp_path / "mine.md").write_text("# acbench leaderboard\n")  # a leaderboard of ours, but the JSON beside is not
    cell = next(results.rglob("lama-*.json"))
    before = _tree_snapshot(tmp_path)
    for out, needle in ((tmp_path / "x.json", "own export"), (tmp_path / "x.csv", "own export"),
                        (tmp_path / "x.txt", "ending in .md"), (cell, "own export"),
                        (cell.with_suffix(".md"), "inside the results tree"),
                        (results / "model-b" / "LB.md", "inside the results tree"),
                        (mine, "not a file an acbench report wrote"), (tmp_path / "mine.md", "mine.json exists")):
        expect_one_line(capsys, ["report", "--results", str(results), "--out", str(out)], needle)
        assert _tree_snapshot(tmp_path) == before, out
    # its own outputs are rewritten on a second call, at the default place and elsewhere
    for argv in (["report", "--results", str(results)], ["report", "--results", str(results), "--out",
                                                          str(tmp_path / "lb.md")]):
        assert main(argv) == 0 and main(argv) == 0
    assert (results / "LEADERBOARD.json").exists() and (tmp_path / "lb.csv").exists()
    assert json.loads(cell.read_text()) == json.loads(before[cell])


def test_comma_and_space_lists_mean_the_same():
    a = run_config_from_argv(["--methods", "pca,fasc", "--tasks", "lama,ppl-token", "--rank", "0.5,0.25"])
    b = run_config_from_argv(["--methods", "pca", "fasc", "--tasks", "lama", "ppl-token", "--rank", "0.5", "0.25"])
    assert a == b
    assert a.methods == ["pca", "fasc"] and a.ranks == [0.5, 0.25] and a.tasks == ["lama", "ppl-token"]


# ---------------------------------------------------------------- corrupt or foreign result files

def test_invalid_cells_are_named_recomputed_and_skipped_by_report(tmp_path, tiny, capsys):
    out = tmp_path / "out"
    assert main(base(tiny, out)) == 0
    capsys.readouterr()
    files = sorted(p for p in out.rglob("*.json"))
    assert len(files) == 2  # dense and pca ppl-token
    dense, pca = (f for f in files)
    good = json.loads(pca.read_text())
    assert good["bos"] == "none" and good["task_config"]["bos"] == "none"  # SmolLM2's tokenizer adds no BOS
    assert good["calibration"]["spec"]["bos"] == "none"
    from acbench.core.record import SCHEMA_VERSION

    dense.write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    broken = dict(good)
    broken.pop("metrics")
    pca.write_text(json.dumps(broken))
    assert main(base(tiny, out)) == 0
    log = capsys.readouterr().out
    assert f"recomputing {dense}: no cell identity" in log
    assert f"recomputing {pca}: no metrics" in log
    assert all("metrics" in json.loads(f.read_text()) for f in files)
    # a cell whose identity is a string is named and skipped by report, not a crash
    pca.write_text(json.dumps({**good, "cell": "oops"}))
    from acbench.leaderboard.load import read_result_set

    rs = read_result_set(out)
    assert any(pca.name in p and "no cell identity" in p for p in rs.problems)
    assert main(["report", "--results", str(out)]) == 0
    assert main(base(tiny, out)) == 0  # and a rerun recomputes it


class Payload:
    marker = ""

    def __reduce__(self):
        return (Path(self.marker).touch, ())


def test_planted_pickle_in_the_statistics_cache_never_runs(tmp_path, tiny, capsys, monkeypatch):
    monkeypatch.setenv("ACBENCH_STATS_CACHE", str(tmp_path / "cache" / "stats"))
    out = tmp_path / "out"
    assert main(base(tiny, out)) == 0
    stats = sorted((tmp_path / "cache" / "stats").rglob("*.safetensors"))
    assert len(stats) == 8  # one file per input group: 2 blocks x 4 groups
    marker = tmp_path / "pwned"
    Payload.marker = str(marker)
    stats[0].write_bytes(pickle.dumps(Payload()))
    assert main(base(tiny, out) + ["--overwrite"]) == 0
    assert not marker.exists()
    assert "recomputing calibration statistics" in capsys.readouterr().out
    assert not [p for p in (tmp_path / "cache" / "stats").rglob("*") if p.suffix == ".tmp"]


def test_two_runs_on_one_results_directory_split_the_work(tmp_path, tiny):
    out = tmp_path / "out"
    argv = base(tiny, out, **{"--methods": ["pca", "svd", "random", "whitened-svd", "asvd", "fasc-kfac"],
                              "--rank": ["0.5", "0.25"]})
    procs = [subprocess.Popen([sys.executable, "-m", "acbench.cli", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    done = [{l.split("]")[0] + "]" for l in o.splitlines() if l.startswith("[")} for o, _ in logs]
    assert not done[0] & done[1], done  # no variant computed twice
    assert len(done[0] | done[1]) == 1 + 6 * 2
    assert len([p for p in out.rglob("*.json")]) == 1 + 6 * 2
    assert not [p for p in out.rglob("*.lock")]


def test_undefined_numbers_are_stored_as_null_never_as_bare_nan(tmp_path):
    from acbench.results.store import cell_path, cell_status, write_cell
    from acbench.core.record import CellId, CellRecord

    path = cell_path(tmp_path, "m", "pca", 0.5, "rank", "ppl-token", "k")
    write_cell(path, CellRecord(cell=CellId("m", "pca", 0.5, "rank", "ppl-token", "k"),
                                metrics={"ppl": float("inf"), "nll": 800.0}, stderr={"nll": float("nan")},
                                primary_metric="ppl", env={"date": "2026-12-02"}, model_fingerprint={"sha256": "s"},
                                compression={"param_ratio": 0.75}))
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in a cell"))
    assert rec["metrics"]["ppl"] is None and rec["stderr"]["nll"] is None
    assert cell_status(path) is None


@pytest.mark.parametrize("flags,needle", [
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": "5:4"}, "0 < N < M"),
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": "0:4"}, "0 < N < M"),
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": "2:3"}, "cannot split group layers.0.attn_in (d_in = 64)"),
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": "1.5"}, "outside (0, 1]"),
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": "abc"}, "neither an N:M pattern nor a density"),
    ({"--methods": "wanda"}, "wanda is a sparsity method but no sparsity budget is given: add --sparsity"),
    ({"--methods": "pca", "--rank": None, "--sparsity": "2:4"}, "pca is a low-rank method but no low-rank budget"),
    ({"--methods": "act-sparse:score=bogus", "--sparsity": "2:4"}, "score 'bogus' is unknown"),
    ({"--methods": "act-sparse:fisher", "--sparsity": "2:4"}, "setting=value"),
    ({"--methods": ["pca", "act-sparse"], "--sparsity": "2:4", "--allocate": "fisher", "--budget": "params"},
     "--allocate fisher"),
])
def test_bad_sparsity_flags(tmp_path, tiny, capsys, flags, needle):
    out = tmp_path / "out"
    expect_one_line(capsys, base(tiny, out, **flags), needle)
    assert no_cells(out)


def test_unquoted_pattern_in_yaml_is_named(tmp_path, tiny, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("sparsity: [2:4]\nmethods: [act-sparse]\n")
    out = tmp_path / "out"
    expect_one_line(capsys, base(tiny, out, **{"--methods": None, "--rank": None}) + ["--config", str(cfg)], "quote")
    assert no_cells(out)


def test_prepare_reports_a_bad_model_from_its_conversion_process(tmp_path, tiny, capsys):
    # the first model converts in a second process: its error still reaches the user as one line, exit 2
    model, needle = _bad_models(tmp_path, tiny)["garbage.gguf"]
    assert main(["prepare", "--models", model, str(tiny)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0] and "Traceback" not in err[0]


@pytest.mark.parametrize("flags,needle", [
    ({"--methods": "act-sparse:score=abs,score=wina", "--rank": None, "--sparsity": "2:4"},
     "setting score is given twice"),
    ({"--methods": "act-sparse:mitigation=shift,,", "--rank": None, "--sparsity": "2:4"},
     "an empty name or setting between commas"),
    ({"--methods": ["act-sparse", "act-sparse:score=abs"], "--rank": None, "--sparsity": "2:4"},
     "act-sparse and act-sparse:score=abs have the same settings"),
    ({"--rank": ["0.5", "0.5"]}, "--rank 0.5 is given twice"),
    ({"--rank": "0.5,0.5"}, "--rank 0.5 is given twice"),
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": ["2:4", "2:4"]}, "--sparsity 2:4 is given twice"),
    ({"--methods": "pca", "--sparsity": "2:4"}, "--sparsity 2:4 is given, but no sparsity method is named (pca)"),
    ({"--methods": "wanda", "--rank": "0.3", "--sparsity": "2:4"},
     "--rank 0.3 is given, but no low-rank method or analysis is named (wanda)"),
    ({"--methods": "act-sparse", "--rank": None, "--sparsity": "0.5", "--budget": "params"},
     "--budget params sets how a rank budget is read, but no low-rank method is named (act-sparse)"),
    ({"--methods": "wanda", "--rank": None, "--sparsity": "2:4", "--rank-align": "8"},
     "--rank-align 8 sets how a rank budget is read, but no low-rank method is named (wanda)"),
    ({"--rank-align": "1000"}, "--rank-align 1000 rounds the k of group layers.0.attn_in up to its full width 64"),
    ({"--ppl-seq-len": "100000"},
     "ppl-token's seq_len 100000 is longer than the model's 512 positions: pass --ppl-seq-len 512 or less"),
    ({"--calib-seq-len": "100000"},
     "--calib-seq-len 100000 is longer than the model's 512 positions: pass --calib-seq-len 512 or less"),
    # the authors' windows are not a flag the user gave: the fix is --calibration as-given, never "pass at most"
    ({"--methods": "sparsegpt", "--rank": None, "--sparsity": "0.5", "--calib-samples": None, "--calib-seq-len": None,
      "--calibration": "authors"},
     "sparsegpt's authors' calibration windows (2048 tokens) are longer than the model's 512 positions: run "
     "sparsegpt with --calibration as-given"),
])
def test_inputs_that_mean_nothing_are_refused(tmp_path, tiny, capsys, flags, needle):
    """Each of these was accepted and then ignored (the last setting won, the budget was printed but unused, two
    rows of one cell, a cell planned twice, a group left dense at --rank 0.5)."""
    out = tmp_path / "out"
    expect_one_line(capsys, base(tiny, out, **flags), needle)
    assert no_cells(out)


@pytest.mark.parametrize("stage", ["calibration", "variant"])
def test_sigterm_releases_every_claim(tmp_path, tiny, capsys, monkeypatch, private_stats_cache, stage):
    """SIGTERM while a claim is held (the calibration claim, or a variant's cell claims): exit 143, no lock left
    behind to make the next run wait on a dead process, and the rerun computes the rest."""
    import os
    import signal

    import acbench.runner.execute
    import acbench.calibration.cache

    target = (acbench.calibration.cache, "_calibrate_pending") if stage == "calibration" else (acbench.runner.execute.Worker, "claim")
    original = getattr(*target)

    def terminated(*args, **kwargs):
        got = original(*args, **kwargs) if stage == "variant" else None
        if stage == "variant" and all(c.id.method == "dense" for c in args[1]):
            return got  # the dense cell is computed; the variant's claim is the one held when the signal comes
        locks = list(tmp_path.rglob("*.lock")) + list(private_stats_cache.rglob("*.lock"))
        assert locks  # the claim is held at this point
        os.kill(os.getpid(), signal.SIGTERM)
        return got if stage == "variant" else original(*args, **kwargs)

    monkeypatch.setattr(*target, terminated)
    out = tmp_path / "out"
    assert main(base(tiny, out)) == 143
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.lock")) and not list(private_stats_cache.rglob("*.lock"))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is bench's only while it runs
    monkeypatch.setattr(*target, original)
    assert main(base(tiny, out)) == 0
    assert "1 cell(s) written" in capsys.readouterr().out  # the variant's cell (the dense one was written first)


class _RunsCode:
    def __reduce__(self):
        return (Path(self.marker).touch, ())


def test_pickle_weights_that_are_not_plain_tensors_are_refused_before_anything_runs(tmp_path, tiny, capsys):
    """A pytorch_model.bin that needs more than tensors is one line at open (it once stopped the run mid-way with
    a traceback, after the cells were planned); a plain-tensor .bin loads; a refused run leaves no folder behind."""
    import pickle
    import shutil

    import torch

    plain, hostile = tmp_path / "plain", tmp_path / "hostile"
    for folder in (plain, hostile):
        shutil.copytree(tiny, folder)
        (folder / "model.safetensors").unlink()
    from safetensors.torch import load_file

    torch.save(load_file(tiny / "model.safetensors"), plain / "pytorch_model.bin")
    _RunsCode.marker = str(tmp_path / "ran")
    (hostile / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _RunsCode()}))
    out = tmp_path / "out" / "nested"
    assert main(base(hostile, out)) == 2
    err = capsys.readouterr().err
    assert "pytorch_model.bin is not plain tensors" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "out").exists()
    assert main(base(plain, tmp_path / "plain-out")) == 0


def test_an_unreachable_hub_is_one_line_within_seconds(tmp_path, capsys, monkeypatch):
    """No retry loop: one connection attempt, then offline mode (huggingface_hub once printed 12-23 lines of
    retries over 35-52 s before the one line)."""
    import time

    import datasets.config
    import huggingface_hub.constants

    import acbench.core.hub

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    monkeypatch.setattr(acbench.core.hub, "_answer", [])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    t0 = time.perf_counter()
    assert main(["run", "--model", "no-such-org/no-such-model", "--methods", "dense", "--tasks", "ppl-token",
                 "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "127.0.0.1 cannot be reached" in err[0] and "local hub cache" in err[0], err
    assert time.perf_counter() - t0 < 20
    # offline only for the load (what is cached would still load); the libraries' flags put back after it
    assert huggingface_hub.constants.HF_HUB_OFFLINE is False and datasets.config.HF_DATASETS_OFFLINE is False
    assert "HF_HUB_OFFLINE" not in os.environ and "HF_DATASETS_OFFLINE" not in os.environ


def test_weights_that_do_not_fit_the_config_are_one_line_not_a_load_report(tmp_path, tiny, capsys):
    """transformers prints a table (its load report) before raising on a size mismatch, and only warns on a missing
    tensor, then runs it freshly initialised: both are one line, exit 2."""
    import shutil

    from safetensors.torch import load_file, save_file

    wide = tmp_path / "wide"
    shutil.copytree(tiny, wide)
    cfg = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 2 * cfg["intermediate_size"]}))
    lacking = tmp_path / "lacking"
    shutil.copytree(tiny, lacking)
    tensors = load_file(lacking / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, lacking / "model.safetensors", metadata={"format": "pt"})
    for folder, needle in ((wide, "do not fit its config.json (model.layers."), (lacking, "lack 1 tensor(s)")):
        assert main(base(folder, tmp_path / f"out-{folder.name}", **{"--methods": "dense", "--rank": None})) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and needle in err[0], err


@pytest.mark.parametrize("value,needle", [
    ("tritn", "ACBENCH_DECODE_KERNEL='tritn' is not a decode kernel: set it to one of auto, embedding_bag, triton"),
    ("triton", "ACBENCH_DECODE_KERNEL=triton needs a CUDA device (this model is on cpu)"),
])
def test_a_decode_kernel_that_cannot_run_is_refused_when_the_model_loads(tmp_path, tiny, capsys, monkeypatch, value,
                                                                         needle):
    import acbench.core.compressed_layers as layers

    monkeypatch.setattr(layers, "_CHOSEN", {})  # read once per process: this test's setting, not an earlier one's
    monkeypatch.setattr(layers, "triton_importable", lambda: True)
    monkeypatch.setenv("ACBENCH_DECODE_KERNEL", value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "out"
    expect_one_line(capsys, base(tiny, out, **{"--methods": "act-sparse", "--rank": None, "--sparsity": "2:4"}),
                    needle)
    assert no_cells(out)


def test_a_rule_named_twice_is_one_rule_not_a_cell_left_to_another_run(tmp_path, tiny, capsys):
    """--allocate greedy greedy once planned one cell twice and said the second was "left to another run"."""
    out = tmp_path / "out"
    assert main(base(tiny, out, **{"--methods": "act-sparse", "--rank": None, "--sparsity": "0.5",
                                  "--allocate": ["greedy", "greedy"]})) == 0
    err = capsys.readouterr()
    assert "another run" not in err.err + err.out
    assert len(list(out.rglob("*.json"))) == 2  # dense and act-sparse+greedy, once each


# ---------------------------------------------------------------- a setting that does nothing (issue 76, class 6)

@pytest.mark.parametrize("extra,needle", [
    (["--method-option", "sparsegpt.damping=0.1"], "sparsegpt is not among this run's methods (pca)"),
    (["--mmlu-format", "cloze"], "mmlu.format (set by --mmlu-format or --task-option) applies to mmlu, which this run "
                                 "does not score (ppl-token)"),
    (["--task-option", "lama.per_relation=2"], "lama.per_relation (set by --lama-limit or --task-option) applies to"),
    (["--task-option", "mmlu.shots=1"], "mmlu.shots (set by --mmlu-shots or --task-option) applies to mmlu"),
    (["--analysis-option", "rho.units=2"], "--analysis-option rho.units: rho is not among --tasks"),
    (["--limit", "3"], "--limit sets lama and mmlu, and this run scores neither (ppl-token)"),
    (["--methods", "wanda", "--rank", None, "--sparsity", "0.5", "--allocate", "greedy"],
     "which wanda cannot deploy as allocated"),
    (["--methods", "larosa", "--rank", None, "--sparsity", "0.5", "--allocate", "uniform,greedy"],
     "which larosa cannot deploy as allocated"),
    (["--methods", "cats", "--rank", None, "--sparsity", "0.5", "--allocate", "greedy"],
     "which cats cannot deploy as allocated"),
    (["--methods", "larosa:out_factor=10", "--rank", None, "--sparsity", "0.5"],
     "larosa out_factor 10 at sparsity 0.5 (density 0.5) zeroes 5 of the channels"),
    (["--methods", "larosa", "--rank", None, "--sparsity", "0.5", "--method-option", "larosa.in_factor=2.5"],
     "larosa in_factor 2.5 at sparsity 0.5"),
    (["--method-option", "pca.x=1", "--method-option", "pca.x=2"], "--method-option pca.x is given twice"),
    (["--model", "TINY,"], "has an empty entry between commas"),
    (["--model", "TINY,,TINY"], "has an empty entry between commas"),
])
def test_a_setting_that_does_nothing_is_refused(tmp_path, tiny, capsys, extra, needle):
    """Each setting the probe found ignored in silence: one line naming it and what it applies to, no cell."""
    out = tmp_path / "out"
    replace, rest = {}, []
    it = iter(extra)
    for flag in it:
        value = next(it)
        if flag in ("--methods", "--rank", "--sparsity", "--model"):
            replace[flag] = value.replace("TINY", str(tiny)) if value else value
        else:
            rest += [flag, value]
    expect_one_line(capsys, base(tiny, out, **replace) + rest, needle)
    assert no_cells(out)


@pytest.mark.parametrize("text,needle", [
    ("model: null\n", "'model' in --config is null"), ("model: [[a]]\n", "holds ['a'], which is not a model name"),
    ("model: [TINY, null]\n", "holds None, which is not a model name"), ("ranks: [0.5]\n", "has key 'ranks'"),
    ("analysis_options: {rho: {units: 2}}\n", "rho is not among --tasks"),
])
def test_a_config_model_or_key_that_does_nothing_is_one_line(tmp_path, tiny, capsys, text, needle):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("tasks: [ppl-token]\n" + text.replace("TINY", str(tiny)))
    argv = [a for a in base(tiny, tmp_path / "out") if a not in ("--model", str(tiny), "--tasks", "ppl-token")]
    expect_one_line(capsys, argv + ["--config", str(cfg)], needle)


def test_quiet_keeps_what_other_libraries_print_in_the_runs_log(tmp_path, tiny, capsys, monkeypatch):
    """--quiet: lm-eval's notes on an in-memory model and its progress bars (ppl-word runs through lm-eval), a
    transformers log record and a Python warning from inside a cell reach neither stderr nor stdout; they are kept,
    one line each, in results/.runs/<stamp>.log, and stdout says where in one line."""
    import logging
    import warnings

    from acbench import tasks

    ppl = tasks.get_task("ppl-token")
    scored = ppl.evaluate

    def noisy(self, *a, **k):
        logging.getLogger("transformers.models.mamba").warning("fast path is not available: falling back")
        warnings.warn("a library's warning", UserWarning, stacklevel=2)
        return scored(self, *a, **k)

    monkeypatch.setattr(ppl, "evaluate", noisy)
    out = tmp_path / "out"
    argv = base(tiny, out, **{"--tasks": "ppl-token,ppl-word"}) + ["--task-option", "ppl-word.max_docs=1"]
    assert main(argv) == 0
    said = capsys.readouterr()
    assert said.err.strip() == "", said.err
    kept = "\n".join(p.read_text() for p in (out / ".runs").glob("*.log"))
    assert "lm_eval" in kept and "fast path is not available" in kept and "a library's warning" in kept
    assert "Running loglikelihood requests" in kept
    assert [line for line in said.out.splitlines() if "other libraries printed kept in" in line]
