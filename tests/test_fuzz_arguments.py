"""Fuzz: generated command lines of bench run, plan and compress, and every --allocate rule with every method
family; each ends in exit 0 or one line with exit 2 (tests/fuzz_common.py)."""


import importlib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pathlib import Path

from fuzz_common import assert_clean, study_outcome


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
    "--calibration-mode": ["one-pass", "sequential", "Sequential", "two-pass"],
    "--calibration": ["as-given", "authors", "author", "paper"],
    "--detect": ["lama=0.05", "lama=0.05,mmlu=0.02", "lama=0", "mmlu=1.5", "lamma=0.1", "=0.1", "lama=nan"],
    "--results": ["results", "/nonexistent", "/etc/hostname", ""],
    "--vs": ["pca", "fasc", "nobody", ""],
    "--reference": ["pca", "svd", "nobody", "", "dense"],
    "--until-decided-alpha": ["0.05", "0.002", "0.5", "0", "0.6", "nan", "inf", "-0.1", "true", "1e-320"],
    "--margin": ["lama=0.02", "ppl-token=0.05,lama=0.01", "lama=0", "lama=2", "lamma=0.02", "lama", "=0.1",
                 "lama=nan", "lama=0.02,lama=0.03", "lama=inf", "mmlu=1"],
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
    "--mmlu-format": ["letter", "cloze", "Cloze", "essay", ""],
    "--text-source": ["wiki", "file:/nonexistent", "file:/etc/hostname", "file:/", "hub:nothing"],
    "--method-option": ["fasc.max_swaps=-5", "pca.bogus=1", "fasc.folds=abc", "bogus", "fasc.folds=[1", "a.b=c"],
    "--task-option": ["lama.per_relation=0", "mmlu.shots=x", "bogus.a=1", "ppl-token.max_windows=[]",
                      "mmlu.format=cloze", "mmlu.metric=acc_norm", "mmlu.metric=f1", "mmlu.format=3"],
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
              "--calib-samples", "--calib-seq-len", "--batch-size", "--pair-tokens", "--allocate", "--groups", "--blocks",
              "--calibration-mode", "--calibration", "--detect", "--results", "--vs"]


@given(pairs=st.lists(st.sampled_from(PLAN_FLAGS).flatmap(
    lambda f: st.tuples(st.just(f), st.one_of(st.sampled_from(VALUES[f]), WEIRD))), max_size=5),
    compress=st.booleans())
def test_generated_plan_and_compress_arguments(tmp_path, tiny, checked_only, pairs, compress):
    argv = (["compress", "--method", "pca", "--save", str(tmp_path / "ck")] if compress else ["plan"]) + \
        ["--model", str(tiny)]
    for flag, value in pairs:
        if compress and flag == "--methods":
            flag = "--method"
        if compress and flag in ("--detect", "--results", "--vs"):  # plan's own
            continue
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    assert_clean(argv)


# ---------------------------------------------------------------- allocation rules with every method family

@given(method=st.sampled_from(importlib.import_module("acbench.methods").known_methods()),
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


# ---------------------------------------------------------------- calibration modes with every method

@settings(max_examples=60, deadline=None)  # 0.1 s each: the CI profile's 150 cost 16 s
@given(method=st.sampled_from(importlib.import_module("acbench.methods").known_methods()),
       mode=st.sampled_from(["one-pass", "sequential", "", "SEQUENTIAL"]),
       calibration=st.sampled_from(["as-given", "authors", "x"]),
       extra=st.sampled_from([[], ["--calib-samples", "3"], ["--allocate", "fisher", "--budget", "params"],
                              ["--tasks", "rho"]]),
       command=st.sampled_from(["run", "plan", "compress"]))
def test_every_calibration_mode_with_every_method(tmp_path, tiny, checked_only, method, mode, calibration, extra,
                                                 command):
    """--calibration-mode and --calibration with any method, budget and command: it runs or is one line (a method
    that reads gradients or allocates across groups cannot be sequential; authors' sizes exclude the size flags)."""
    family = importlib.import_module("acbench.methods").family_of(method)
    argv = [command, "--model", str(tiny), "--calibration-mode", mode, "--calibration", calibration,
            "--rank" if family == "low-rank" else "--sparsity", "0.5"]
    argv += ["--method" if command == "compress" else "--methods", method]
    if command == "compress":
        argv += ["--save", str(tmp_path / "ck")]
    elif command == "run":
        argv += ["--output", str(tmp_path / "out"), "--no-report", "--quiet"]
    if command != "compress" or "--tasks" not in extra:
        argv += extra
    assert_clean(argv)


# ---------------------------------------------------------------- method names: new-method, check-method, smoke

NAME_TEXT = st.one_of(st.text(max_size=20), st.sampled_from(
    ["torch", "bench", "dense", "all", "my-svd", "pca", "act-sparse:score=bogus", "act-sparse:score=abs",
     "x" * 300, "a-b", "class", "json", "", " ", "pca:", "pca:k", "fasc,pca", "../x", "rho-analysis"]))


@given(name=NAME_TEXT, output=st.sampled_from(["dir", "file", "under-file", "new/deep"]),
       form=st.sampled_from([None, "function", "class", "Function", "", "func", "--class"]))
def test_new_method_names_and_outputs_end_in_one_line_or_a_whole_package(tmp_path_factory, name, output, form):
    """Any name, --form and --output: exit 0 with the whole package written, or one line and nothing written."""
    root = tmp_path_factory.mktemp("author")
    (root / "afile").write_text("x")
    parent = {"dir": root, "file": root / "afile", "under-file": root / "afile" / "sub",
              "new/deep": root / "new" / "deep"}[output]
    if name.startswith("-") or "\x00" in name:
        return  # argparse reads a leading dash as a flag; a NUL cannot be a path
    rc = assert_clean(["new-method", name, "--family", "low-rank", "--output", str(parent),
                       *(["--form", form] if form is not None else [])])
    written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    if rc == 0:
        module = name.replace("-", "_")
        assert f"{Path(parent).relative_to(root).as_posix()}/{name}/{module}/method.py".lstrip("./") in \
            [w.lstrip("./") for w in written], written
    else:
        assert written == ["afile"], written


@given(name=NAME_TEXT)
def test_check_method_and_smoke_names_end_in_one_line_or_reach_the_work(tmp_path, monkeypatch, name):
    """`bench check-method NAME` and `bench smoke --methods NAME`: a name that is not a method or a valid variant is
    one line, before the smoke model is trained; a valid one reaches the work (stubbed here)."""
    import acbench.cli.author
    import acbench.cli.smoke

    if name.startswith("-"):
        return
    reached = []
    monkeypatch.setattr(acbench.cli.smoke, "trained_tiny_checkpoint", lambda *a, **k: reached.append(1) or
                        (_ for _ in ()).throw(SystemExit(0)))
    monkeypatch.setattr("acbench.testing.CHECKS", ())  # the contract's checks themselves are tested elsewhere
    assert_clean(["check-method", name])
    assert_clean(["smoke", "--methods", name, "--no-latency", "--output", str(tmp_path / "smoke")])


# ---------------------------------------------------------------- model lists, in flags and config files

@pytest.fixture(scope="module")
def model_folders(tmp_path_factory, tiny):
    """The tiny model, a link to it, another model, and another model whose folder has the tiny one's name."""
    from tests.test_hostile_sweeps import _other_weights

    root = tmp_path_factory.mktemp("models")
    (root / "link").symlink_to(tiny, target_is_directory=True)
    return {"tiny": str(tiny), "tiny/": f"{tiny}/", "link": str(root / "link"),
            "other": str(_other_weights(tiny, root / "a" / "m", 1.01)),
            "other-same-name": str(_other_weights(tiny, root / "b" / tiny.name, 1.02)),
            "missing": str(root / "nope"), "": "", ",": ",", "not-an-alias": "gemma-3-270m-typo"}


@settings(max_examples=20)  # each example opens up to four models (tokenizers, digests): 1-2 s
@given(picks=st.lists(st.sampled_from(["tiny", "tiny/", "link", "other", "other-same-name", "missing", "", ",",
                                       "not-an-alias"]), min_size=1, max_size=4), in_file=st.booleans())
def test_model_lists_end_in_one_line_or_one_folder_per_model(tmp_path_factory, model_folders, checked_only,
                                                             monkeypatch, picks, in_file):
    """Any list of models, on the command line or as a config file's `model:`: one line naming the problem (a
    model named twice, one that does not exist), or every model planned under a results folder of its own."""
    import acbench.runner.execute
    import yaml

    models = [model_folders[p] for p in picks]
    planned = []

    def plan_only(runs):
        prepared = acbench.runner.execute.prepare_models(runs)
        planned.extend(p.source.name for p in prepared)
        return prepared

    monkeypatch.setattr(acbench.runner.execute, "sweep_runs", plan_only)
    root = tmp_path_factory.mktemp("sweep")
    if in_file:
        cfg = root / "run.yaml"
        cfg.write_text(yaml.safe_dump({"model": models}))
        argv = ["run", "--config", str(cfg)]
    else:
        argv = ["run", "--model", *models]
    argv += ["--methods", "dense", "--tasks", "ppl-token", "--ppl-windows", "1", "--ppl-seq-len", "32",
             "--output", str(root / "out"), "--no-report", "--quiet"]
    rc = assert_clean(argv)
    if rc == 0:
        assert len(planned) == len(set(planned)), planned  # one folder per model


# ---------------------------------------------------------------- the architecture coverage script

@settings(max_examples=40, deadline=None)
@given(seconds=st.one_of(WEIRD, st.sampled_from(["30", "120"])),
       only=st.lists(st.sampled_from(["llama", "gpt2", "lama", "bogus", "", "mixtral", "bert"]), min_size=1, max_size=3),
       models=st.sampled_from(["none", "new", "file", "full", "empty"]), bench_run=st.booleans())
def test_architecture_script_flags_end_in_one_line_or_reach_the_work(tmp_path_factory, monkeypatch, capsys, seconds,
                                                                     only, models, bench_run):
    """`python -m acbench.studies.architectures`: --seconds, --only, --models and --bench-run as a user might type them;
    each ends in exit 2 with one line, or reaches the checks (stood in for: the real ones are test_architectures')."""
    import acbench.studies.architectures as arch

    root = tmp_path_factory.mktemp("arch")
    where = {"none": None, "new": root / "new", "file": root / "a-file", "full": root / "full", "empty": root / "empty"}
    (root / "a-file").write_text("x")
    (root / "full").mkdir()
    (root / "full" / "kept").write_text("x")
    (root / "empty").mkdir()
    reached = []
    monkeypatch.setattr(arch, "check_all", lambda types, secs, folder: [(t, arch.Coverage(t, checks={"svd": "ok"}))
                                                                          for t in types])
    monkeypatch.setattr(arch, "_save_and_run", lambda types, folder, run, secs: reached.append(types) or {})
    monkeypatch.setattr(arch, "out_of_scope", lambda t: "an encoder (stood in)" if t == "bert" else None)
    argv = ["--seconds", seconds, "--only", *only] + (["--models", str(where[models])] if where[models] else [])
    argv += ["--bench-run"] if bench_run else []
    try:
        code = arch.main(argv)
    except SystemExit as e:
        code = e.code
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err and ": error: " in err[-1], err  # argparse's usage, then the one line
        assert "Traceback" not in "\n".join(err)
        return
    assert code == 0
    assert int(seconds) > 0 and all(t in ("llama", "gpt2", "mixtral", "bert") for t in only)
    assert models in ("none", "new", "empty") and (models != "none" or not bench_run)
    checked = [t for t in only if t != "bert"]
    assert reached == ([] if models == "none" else [checked])
    said = capsys.readouterr().out
    assert ("bert: not checked: an encoder (stood in)" in said) == ("bert" in only)  # never skipped in silence


# ---------------------------------------------------------------- the claims study

LAMA_SOURCES = ["embedded", "lama:examples/sources/lama/TREx:examples/sources/lama/relations.jsonl",
                "lama:/nonexistent:/nonexistent.jsonl", "lama:examples/sources/lama/TREx", "qa_wikidata:",
                "qa_wikidata:/etc/hostname", "lama:examples/sources/lama/TREx:examples/sources/lama/TREx",
                "hub:lama"]

@settings(max_examples=60, deadline=None)
@given(ranks=st.lists(st.one_of(WEIRD, st.sampled_from(["0.9", "0.75", "0.5", "1", "1.5"])), min_size=1, max_size=3),
       limit=st.one_of(WEIRD, st.sampled_from(["10", "1"])),
       doc=st.sampled_from(["docs/claims.md", "x.txt", "", "a/", "/dev/null/claims.md", "docs"]),
       models=st.lists(st.sampled_from(["smollm2-135m", "gemma-3-270m", "nope"]), min_size=1, max_size=2),
       lama=st.one_of(WEIRD, st.sampled_from(LAMA_SOURCES)), report_only=st.booleans())
def test_claims_study_flags_end_in_one_line_or_reach_the_sweep(monkeypatch, capsys, ranks, limit, doc, models, lama,
                                                               report_only):
    """`python -m acbench.studies.claims`: --ranks, --mmlu-limit, --lama-source, --doc, --models and --report-only as
    typed; each ends in exit 2 with one line (argparse's, or bench's UserError for a model bench refuses), or reaches
    the sweep (or the stored cells) with checked values."""
    import acbench.studies.claims as claims
    from acbench.core.errors import UserError

    reached = []

    def fake_sweep(s):
        if "nope" in s.models:
            raise UserError("unknown model nope: did you mean ...")
        reached.append(s)
        return []

    monkeypatch.setattr(claims, "compute_cells", fake_sweep)
    monkeypatch.setattr(claims, "stored_cells", fake_sweep)
    monkeypatch.setattr(claims, "write_doc", lambda s, cells: Path(s.doc))
    argv = ["--ranks", *ranks, "--mmlu-limit", limit, "--doc", doc, "--models", *models,
            "--lama-source" if not lama.startswith("-") else f"--lama-source={lama}",
            *([] if lama.startswith("-") else [lama]), *(["--report-only"] if report_only else [])]
    try:
        code = claims.main(argv)
    except SystemExit as e:
        err = capsys.readouterr().err.strip().splitlines()
        assert e.code == 2 and err and ": error: " in err[-1], err
        assert "Traceback" not in "\n".join(err)
        assert not reached  # an unwritable page is found before the sweep, never after an hour of it
        return
    assert doc not in ("/dev/null/claims.md", "docs")
    err = capsys.readouterr().err.strip().splitlines()
    if code == 2:
        assert "nope" in models and len(err) == 1 and err[0].startswith("error: ")
        return
    assert code == 0 and len(reached) == 1
    s = reached[0]
    assert all(0 < r <= 1 for r in s.ranks) and len(set(s.ranks)) == len(s.ranks) == len(ranks)
    assert s.mmlu_limit >= 0 and s.doc.endswith(".md")
    # a probe source reaches the sweep only where it reads (here: the embedded set and the examples' copy)
    assert s.lama_source == lama and lama in LAMA_SOURCES[:2]


# ---------------------------------------------------------------- the newer baselines' settings

@settings(max_examples=80, deadline=None)
@given(variant=st.sampled_from(["sparsegpt:damping=", "sparsegpt:block_size=", "svd-llm-v2:allocate=",
                                "larosa:in_factor=", "larosa:out_factor=", "wina:weighted=",
                                "r-sparse:sparse_ratio="]),
       value=st.one_of(WEIRD, st.sampled_from(["0.01", "0.5", "1", "128", "7", "true", "false", "[1]", "{a: 1}",
                                               "1e-300", "-0.01", "authors", "all"])))
def test_new_method_settings_end_in_one_line_or_a_checked_method(monkeypatch, variant, value):
    """sparsegpt's damping and block_size, svd-llm-v2's allocate, larosa's factors, as a user may write them: one line
    naming the setting (bench check-method: exit 2), or a method whose settings are in range."""
    from acbench import methods

    monkeypatch.setattr("acbench.testing.CHECKS", ())  # the contract's checks themselves are tested elsewhere
    name = variant + value
    rc = assert_clean(["check-method", name])
    try:
        comp = methods.build(name)
    except (ValueError, methods.UnknownName) as e:
        assert rc == 2 and "\n" not in str(e)
        return
    s = comp.settings
    if variant.startswith("sparsegpt"):
        assert 0 < s.damping < 1 and isinstance(s.block_size, int) and s.block_size >= 1
    elif variant.startswith("r-sparse"):
        assert 0 < s.sparse_ratio <= 1
    elif variant.startswith("wina"):
        assert s.weighted in ("authors", "all")
    elif variant.startswith("larosa"):
        assert 0 < s.in_factor <= 10 and 0 < s.out_factor <= 10
    else:
        assert isinstance(s.allocate, bool)


@settings(max_examples=30, deadline=None)
@given(models=st.lists(st.sampled_from(["smollm2-135m", "nope", "", "gemma-3-270m"]), min_size=0, max_size=2),
       doc=st.sampled_from(["docs/baselines.md", "", "x.md", "x.txt", "/dev/null/x.md"]),
       root=st.sampled_from(["cells", "missing", "/dev/null/x", "a-file"]),
       extra=st.sampled_from([[], ["--bogus"], ["--models"]]))
def test_baselines_study_flags_end_in_one_line_or_write_the_page(capsys, tmp_path, models, doc, root, extra):
    """`python -m acbench.studies.baselines`: --models, --root, --doc as typed; exit 2 with one line (argparse's), or the
    page written from whatever the root holds (nothing: every model "not yet measured")."""
    import acbench.studies.baselines as baselines

    (tmp_path / "cells").mkdir(exist_ok=True)
    (tmp_path / "a-file").write_text("x")
    out = str(tmp_path / doc) if doc else doc
    where = root if root.startswith("/") else str(tmp_path / root)
    argv = (["--models", *models] if models else []) + ["--doc", out, "--root", where] + extra
    code = study_outcome(baselines.main, argv, capsys)
    if code in (None, 2):
        return
    assert code == 0 and doc.endswith(".md") and (tmp_path / doc).is_file()


@settings(max_examples=30, deadline=None)
@given(study=st.sampled_from(["calibration", "reproductions"]),
       models=st.lists(st.sampled_from(["smollm2-135m", "nope", "", "gemma-3-270m"]), min_size=0, max_size=2),
       doc=st.sampled_from(["x.md", "", "x.txt", "/dev/null/x.md"]),
       extra=st.sampled_from([[], ["--bogus"], ["--models"], ["--tokens", "4096"], ["--tokens", "100"],
                              ["--tokens", "x"], ["--modes", "sequential"], ["--modes", "both"], ["--report-only"],
                              ["--root", "/dev/null/x"], ["--quiet"]]))
def test_calibration_and_reproduction_study_flags_end_in_one_line_or_reach_the_parts(monkeypatch, capsys, tmp_path,
                                                                                    study, models, doc, extra):
    """The two studies' flags: an argparse error (exit 2, one line), one `error:` line from a part's refusal, or the
    parts reached (faked here) and the page written."""
    import importlib

    from acbench.core.errors import UserError

    mod = importlib.import_module(f"studies.{study}")
    if study == "reproductions" and any(x in extra for x in ("--tokens", "--modes")):
        extra = []

    def fake_part(model, *args, **kw):
        if model in ("nope", ""):
            raise UserError("unknown model: did you mean ...")

    monkeypatch.setattr(mod, "run_part", fake_part)
    argv = (["--models", *models] if models else []) + ["--doc", str(tmp_path / doc) if doc else doc] + \
        [x for x in extra if x != "/dev/null/x"] + (["/dev/null/x"] if "/dev/null/x" in extra else [])
    if "--root" not in argv:
        argv += ["--root", str(tmp_path / "cells")]
    code = study_outcome(mod.main, argv, capsys)
    if code in (None, 2):
        return
    assert code == 0 and (tmp_path / doc).is_file()


@settings(max_examples=25, deadline=None)
@given(models=st.lists(st.sampled_from(["smollm2-135m", "nope", ""]), min_size=0, max_size=2),
       doc=st.sampled_from(["x.md", "", "x.txt", "/dev/null/x.md"]),
       extra=st.lists(st.sampled_from(["--samples", "--seq-len", "0", "1", "16", "-3", "x", "--quiet", "--bogus"]),
                      max_size=4))
def test_objectives_study_flags_end_in_one_line_or_reach_the_measurement(monkeypatch, capsys, tmp_path, models, doc,
                                                                         extra):
    import acbench.studies.objectives as mod
    from acbench.core.errors import UserError

    def fake_measure(model, samples, seq_len, progress=True):
        if model in ("nope", ""):
            raise UserError("unknown model: did you mean ...")
        assert samples >= 1 and seq_len >= 2
        return []

    monkeypatch.setattr(mod, "measure", fake_measure)
    argv = (["--models", *models] if models else []) + ["--doc", str(tmp_path / doc) if doc else doc] + extra
    code = study_outcome(mod.main, argv, capsys)
    if code in (None, 2):
        return
    assert code == 0 and (tmp_path / doc).is_file()


# ---------------------------------------------------------------- bench report --out

@settings(max_examples=15, deadline=None)  # one report (plots included) per example: about 0.5 s
@given(where=st.sampled_from(["outside", "top", "in-tree", "a-cell"]),
       suffix=st.sampled_from([".md", ".MD", ".json", ".csv", ".txt", "", ".md.json", ".png"]),
       standing=st.sampled_from(["none", "user-md", "user-json", "user-csv", "own"]))
def test_report_out_never_replaces_a_file_it_did_not_write(tmp_path_factory, where, suffix, standing):
    """Any --out (outside the tree, at its top, among its cells, a stored cell itself; any suffix) with any file
    standing where it or its exports go: exit 0 with every file the report did not write as it was, or one line
    and nothing changed."""
    import json
    import shutil

    from fuzz_common import FIXTURES

    tmp = tmp_path_factory.mktemp("report-out")
    results = tmp / "results"
    shutil.copytree(FIXTURES / "results", results)
    cell = next(results.rglob("lama-*.json"))
    out = {"outside": tmp / f"lb{suffix}", "top": results / f"lb{suffix}",
           "in-tree": cell.parent / f"lb{suffix}", "a-cell": cell}[where]
    if standing.startswith("user-"):
        ext = "." + standing.split("-")[1]
        (out.with_suffix(ext) if out.suffix else out.with_name(out.name + ext)).write_text('{"mine": 1}')
    elif standing == "own" and where != "a-cell":
        assert_clean(["report", "--results", str(results), "--out", str(out)])
    before = {p: p.read_bytes() for p in tmp.rglob("*") if p.is_file()}
    own = {p for p, b in before.items() if b.startswith((b"# acbench leaderboard", b"[", b"model,", b"budget,"))
           or p.suffix == ".png"}
    assert_clean(["report", "--results", str(results), "--out", str(out)])
    for p, b in before.items():
        if p not in own:
            assert p.read_bytes() == b, (out, p)
    if not (where == "a-cell" and standing == "user-json"):  # there the user's file written above is the cell
        assert json.loads(cell.read_text())["cell"]["task"] == "lama"


# ---------------------------------------------------------------- --until-decided with any reference and tasks

@settings(max_examples=30, deadline=None)
@given(methods=st.lists(st.sampled_from(["pca", "svd", "teal", "dense", "fasc"]), min_size=1, max_size=3, unique=True),
       reference=st.sampled_from([None, "pca", "svd", "teal", "nobody", "", "dense"]),
       tasks=st.lists(st.sampled_from(["lama", "ppl-token", "mmlu", "rho"]), min_size=1, max_size=2, unique=True),
       limits=st.sampled_from([[], ["--lama-limit", "0"], ["--ppl-windows", "3"], ["--lama-limit", "-1"]]),
       switch=st.sampled_from(["--until-decided", "--until-decided=1"]))
def test_until_decided_with_any_reference_ends_in_one_line_or_runs(tmp_path, tiny, checked_only, methods, reference,
                                                                   tasks, limits, switch):
    argv = ["run", "--model", str(tiny), "--output", str(tmp_path / "out"), "--no-report", "--quiet", switch,
            "--methods", *methods, "--rank", "0.5", "--sparsity", "0.5", "--tasks", *tasks, *limits]
    if reference is not None:
        argv += ["--reference", reference] if reference and not reference.startswith("-") else \
            [f"--reference={reference}"]
    assert_clean(argv)


# ---------------------------------------------------------------- bench report --margin

MARGIN_ITEM = st.one_of(st.text(max_size=12), st.builds(
    lambda t, v: f"{t}={v}", st.sampled_from(["lama", "ppl-token", "mmlu", "ppl-word", "lm-eval", "LAMA", "", "rho"]),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(
        ["0.02", "1", "0", "-0.1", "1e-9", "true", "", "0.5,", "0x1", "1_0"]))))


@settings(max_examples=20, deadline=None)  # one report per accepted example: about 0.5 s
@given(items=st.lists(MARGIN_ITEM, min_size=1, max_size=3))
def test_report_margins_end_in_one_line_or_a_report_with_them(tmp_path_factory, items):
    """Any --margin items: exit 0 with every margin given stated in the leaderboard's note, or one line and no
    leaderboard."""
    import shutil

    from acbench.results.leaderboard_display import check_margins
    from acbench.core.errors import UserError
    from fuzz_common import FIXTURES

    tmp = tmp_path_factory.mktemp("margin")
    shutil.copytree(FIXTURES / "results", tmp / "results")
    argv = ["report", "--results", str(tmp / "results"), "--out", str(tmp / "lb.md"), "--margin"]
    items = [" " + i if i.startswith("-") else i for i in items]  # argparse would read it as a flag
    argv += items
    try:
        wanted = check_margins(items)
    except UserError:
        wanted = None
    rc = assert_clean(argv)
    assert (rc == 0) == (wanted is not None) == (tmp / "lb.md").exists(), (items, rc)
    if rc == 0:
        text = (tmp / "lb.md").read_text()
        assert all(f"{t} ±{m:g}" in text for t, m in wanted.items() if t in ("lama", "mmlu", "ppl-token"))


# ---------------------------------------------------------------- settings that would do nothing

OPTION_FLAGS = {
    "--method-option": ["sparsegpt.damping=0.1", "pca.bogus=1", "fasc.max_swaps=3", "larosa.out_factor=1.5",
                        "teal.x=1"],
    "--task-option": ["mmlu.format=cloze", "lama.per_relation=2", "ppl-token.max_windows=1", "ppl-word.max_docs=1"],
    "--analysis-option": ["rho.units=2"],
    "--mmlu-format": ["cloze"], "--lama-limit": ["2"], "--ppl-windows": ["1"], "--limit": ["3"],
    "--allocate": ["greedy", "uniform,greedy", "uniform"],
    "--margin": ["lama=0.03", "ppl-token=0.02", "mmlu=0.05"], "--reference": ["pca", "fasc"],
    "--until-decided": [None],
}


@settings(max_examples=25, deadline=None)  # each example resolves a run twice: about 0.2 s
@given(methods=st.lists(st.sampled_from(["pca", "fasc", "teal", "wanda", "larosa", "cats", "act-sparse",
                                         "sparsegpt"]), min_size=1, max_size=2, unique=True),
       tasks=st.lists(st.sampled_from(["lama", "ppl-token", "mmlu", "rho"]), min_size=1, max_size=2, unique=True),
       pairs=st.lists(st.sampled_from(sorted(OPTION_FLAGS)).flatmap(
           lambda f: st.tuples(st.just(f), st.sampled_from(OPTION_FLAGS[f]))), max_size=3))
def test_a_setting_for_what_the_run_does_not_include_is_refused(tmp_path, tiny, checked_only, methods, tasks, pairs):
    """Method, task and analysis options, task shortcuts and --allocate greedy, each for a method, task or analysis
    the run may or may not include: the run starts only if every one of them applies to something it computes
    (checked on the resolved configuration), else one line naming the setting."""
    from acbench.cli import run_config_from_argv
    from acbench.runner.resolve import resolve_run
    from acbench import methods as registry

    argv = ["run", "--model", str(tiny), "--output", str(tmp_path / "out"), "--no-report", "--quiet", "--no-latency",
            "--calib-samples", "2", "--calib-seq-len", "32", "--methods", ",".join(methods), "--tasks", ",".join(tasks)]
    low = [m for m in methods if registry.family_of(m) == registry.LOW_RANK_FAMILY]
    argv += (["--rank", "0.5"] if low else []) + (["--sparsity", "0.5"] if len(low) < len(methods) else [])
    for flag, value in pairs:
        argv += [flag] if value is None else [flag, value]
    if assert_clean(argv) != 0:
        return
    run = resolve_run(run_config_from_argv(argv[1:]))
    assert set(run.config.margin or {}) <= set(run.tasks)  # a margin for a task it scores
    assert run.config.reference is None or run.config.until_decided  # --reference only with --until-decided
    if run.config.until_decided:  # and --until-decided only where a task can stop early
        assert any(t.until_decided is not None for t in run.tasks.values())
    given = {}
    for flag, value in pairs:  # a flag given twice, the same both times
        assert given.setdefault(flag, value) == value
    bases = {registry.base_name(m) for m in run.methods}
    assert set(run.config.method_options) <= bases
    assert set(run.config.task_options) <= set(run.tasks) | {t for a in run.analyses.values() for t in a.uses_tasks}
    assert set(run.config.analysis_options) <= set(run.analyses)
    if "greedy" in run.allocate:
        assert any(getattr(registry.get_method(registry.base_name(m)), "takes_group_density", False)
                   for m in run.methods)
        assert all(registry.get_method(registry.base_name(m)).takes_group_density or "uniform" in run.allocate
                   for m in run.methods if registry.family_of(m) == registry.SPARSITY_FAMILY)
