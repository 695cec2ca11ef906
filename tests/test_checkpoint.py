"""bench compress: checkpoints that reload, with acbench or with transformers alone, to the in-sweep logits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from acbench import methods
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.model.checkpoint import MODELING_FILE, PROVENANCE_FILE, RECORD_KEY, load_checkpoint, record_digest, write_checkpoint
from acbench.cli import main
from acbench.cli.smoke import tiny_checkpoint
from acbench.deploy.compression import compressed
from acbench.model.groups import find_input_groups
from conftest import tiny_model
from acbench.core.stats import ACTIVATION_STATS, GRADIENT_STATS, SPARSITY_FAMILY, RankSpec, SparsitySpec

ROOT = Path(__file__).resolve().parent.parent
# every built-in method; the low-rank ones in both forms, act-sparse with each mitigation that adds a buffer
CASES = ([(m, "0.5", merge) for m in methods.known_methods("low-rank") for merge in (False, True)]
         # 2:4, or a density for a method that keeps none (teal's thresholds)
         + [(m, "0.5" if methods.get_method(m).pattern_problem(SparsitySpec.parse("2:4")) else "2:4", False)
            for m in methods.known_methods(SPARSITY_FAMILY)]
         + [("act-sparse:mitigation=shift,score=fisher", "8:16", False), ("act-sparse:mitigation=median", "0.5", False),
            ("act-sparse:mitigation=variance", "4:8", False)])


def _budget(method, value):
    return SparsitySpec.parse(value) if methods.family_of(method) == SPARSITY_FAMILY else RankSpec(float(value))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, windows_module):
    """Each case compressed in place, its logits taken, saved, and the model restored: {case: (folder, logits)}."""
    model = tiny_model("llama", hidden=32, inter=96)
    stats = calibrate(model, find_input_groups(model), windows_module, ACTIVATION_STATS | GRADIENT_STATS, CalibSpec(),
                      progress=False)
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for i, (method, value, merge) in enumerate(CASES):
        with compressed(model, method, _budget(method, value), stats, progress=False, merge=merge) as (m, _):
            with torch.no_grad():
                logits = m(windows_module).logits
            folder = root / f"case{i}"
            write_checkpoint(m, None, folder, {"method": method, "budget": value})
        out[(method, value, merge)] = (folder, logits)
    return out


@pytest.fixture(scope="module")
def windows_module():
    return torch.randint(0, 101, (3, 20), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}@{c[1]}{'-merged' if c[2] else ''}")
def test_reloaded_logits_equal_the_in_sweep_model(saved, windows_module, case):
    folder, logits = saved[case]
    again = load_checkpoint(folder)
    with torch.no_grad():
        assert (again(windows_module).logits - logits).abs().max() <= 1e-5
    layout = json.loads((folder / "config.json").read_text())["acbench_compression"]
    forms = {spec["form"] for spec in layout.values()}
    # custom code exactly where a module beyond the base architecture is needed
    assert (folder / MODELING_FILE).exists() == bool(forms & {"factorised", "sparse-activation", "activation-threshold"})
    if case[2]:
        assert forms == {"merged"}


def test_transformers_alone_loads_every_checkpoint_through_auto_map_and_only_so(saved, windows_module, tmp_path):
    """A subprocess that cannot import acbench (its root off sys.path, its packages blocked) loads each folder with
    from_pretrained(trust_remote_code=True) and reproduces acbench's own load bit for bit; without
    trust_remote_code (plain from_pretrained, or lm-eval's --model hf) a factorised or sparse-activation folder is
    refused instead of loading as the dense architecture with its compressed sites freshly initialised."""
    folders = [str(f) for f, _ in saved.values()]
    torch.save(windows_module, tmp_path / "x.pt")
    code = f"""
import os, sys
sys.path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != {str(ROOT)!r}]
sys.modules["acbench"] = None  # an import of acbench fails
import torch
from transformers import AutoConfig, AutoModelForCausalLM
x = torch.load({str(tmp_path / 'x.pt')!r})
out, plain = [], []
for folder in {folders!r}:
    refused = []
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained):
        for kwargs in ({{}}, {{"trust_remote_code": False}}):
            try:
                load(folder, **kwargs)
                refused.append(False)
            except ValueError as e:
                refused.append("trust_remote_code" in str(e))
    plain.append(refused)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    with torch.no_grad():
        out.append(model(x).logits)
torch.save((out, plain), {str(tmp_path / 'y.pt')!r})
"""
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got, plain = torch.load(tmp_path / "y.pt")
    for (folder, _), logits, refused in zip(saved.values(), got, plain):
        with torch.no_grad():
            assert torch.equal(logits, load_checkpoint(folder)(windows_module).logits), folder
        custom = (folder / MODELING_FILE).exists()
        # custom code: refused every way; dense-shaped (merged, masked weights): the base architecture, loaded
        assert refused == [custom] * 4, (folder, refused)


def test_carried_code_is_the_package_code(saved):
    folder, _ = saved[("fasc-kfac", "0.5", False)]
    for name in ("compressed_layers.py", "experts.py", "sparsity.py"):
        assert (folder / name).read_bytes() == (ROOT / "core" / name).read_bytes()
    assert "Compressed" in json.loads((folder / "config.json").read_text())["architectures"][0]


# ---------------------------------------------------------------- the command

CALIB = ["--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32", "--quiet"]
PPL = ["--tasks", "ppl-token", "--ppl-windows", "2", "--ppl-seq-len", "32", "--no-latency", "--no-report", "--quiet"]


def _ppl(results: Path, method: str) -> float:
    cells = [json.loads(p.read_text()) for p in results.rglob("*.json") if "ppl-token" in p.name]
    return next(c["metrics"]["ppl"] for c in cells if c["cell"]["method"] == method)


@pytest.mark.parametrize("extra", [["--rank", "0.5"], ["--budget", "params", "--rank", "0.7", "--allocate", "fisher"]],
                         ids=["rank", "params-fisher"])
def test_bench_compress_then_bench_run_gives_the_sweep_cell(tmp_path, capsys, extra):
    tiny = tiny_checkpoint()
    out = tmp_path / "ck"
    assert main(["compress", "--model", str(tiny), "--method", "fasc-kfac", *extra, "--save", str(out), *CALIB]) == 0
    said = capsys.readouterr().out
    assert "weights on disk" in said and "trust_remote_code=True" in said
    prov = json.loads((out / PROVENANCE_FILE).read_text())
    assert prov["method"] == "fasc-kfac" and prov["source_model"]["name"] == tiny.name
    assert prov["compression"]["groups"] and all("k" in g and "form" in g for g in prov["compression"]["groups"])
    assert prov["calibration"]["spec"]["samples"] == 2
    assert sorted(prov["weights"]) == ["model.safetensors"]
    # the saved model, evaluated as a model of its own, scores the sweep's cell of the same variant
    assert main(["run", "--model", str(out), "--methods", "dense", *PPL, "--output", str(tmp_path / "saved")]) == 0
    assert main(["run", "--model", str(tiny), "--methods", "fasc-kfac", *extra, *PPL, *CALIB,
                 "--output", str(tmp_path / "sweep")]) == 0
    assert _ppl(tmp_path / "saved", "dense") == pytest.approx(_ppl(tmp_path / "sweep", "fasc-kfac"), rel=1e-5)
    assert main(["report", "--results", str(tmp_path / "saved")]) == 0
    header = (tmp_path / "saved" / "LEADERBOARD.md").read_text()
    assert "compressed checkpoint: fasc-kfac at" in header and tiny.name in header


def test_merged_checkpoint_is_a_standard_architecture(tmp_path):
    tiny = tiny_checkpoint()
    out = tmp_path / "merged"
    assert main(["compress", "--model", str(tiny), "--method", "pca", "--rank", "0.5", "--merged",
                 "--save", str(out), *CALIB]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert "auto_map" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    assert not (out / MODELING_FILE).exists()
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(out)  # no custom code, no acbench
    ours = load_checkpoint(out)
    x = torch.randint(0, 1000, (1, 12))
    with torch.no_grad():
        assert torch.equal(plain(x).logits, ours(x).logits)


# ---------------------------------------------------------------- refused, each in one line

@pytest.fixture(scope="module")
def saved_cli(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "ck"
    assert main(["compress", "--model", str(tiny_checkpoint()), "--method", "pca", "--rank", "0.5",
                 "--save", str(out), *CALIB]) == 0
    return out


def _one_line(capsys, argv, needle, rc=2):
    got = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line]
    assert got == rc and len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


def _compress(save, *extra):
    return ["compress", "--model", str(tiny_checkpoint()), "--save", str(save), *CALIB, *extra]


def test_save_targets_are_refused(tmp_path, capsys, saved_cli):
    (tmp_path / "file").write_text("x")
    _one_line(capsys, _compress(tmp_path / "file", "--method", "pca", "--rank", "0.5"), "is a file")
    _one_line(capsys, _compress(saved_cli, "--method", "pca", "--rank", "0.5"), "--overwrite")
    _one_line(capsys, _compress(tmp_path / "file" / "sub", "--method", "pca", "--rank", "0.5"), "cannot write")


def test_methods_and_budgets_are_refused_as_bench_run_refuses_them(tmp_path, capsys):
    for method, budget in (("pcaa", ["--rank", "0.5"]), ("pca", ["--rank", "1.5"]), ("wanda", ["--rank", "0.5"])):
        line = _one_line(capsys, _compress(tmp_path / "c", "--method", method, *budget), "")
        run_line = _one_line(capsys, ["run", "--model", str(tiny_checkpoint()), "--methods", method, *budget,
                                      "--output", str(tmp_path / "r")], "")
        assert line.split("error: ", 1)[1] == run_line.split("error: ", 1)[1]
    _one_line(capsys, _compress(tmp_path / "c", "--method", "pca", "--rank", "0.5", "0.3"), "give one value")
    _one_line(capsys, _compress(tmp_path / "c", "--method", "all", "--rank", "0.5"), "name one")
    _one_line(capsys, _compress(tmp_path / "c", "--method", "act-sparse", "--sparsity", "2:4", "--merged"), "--merged")
    assert not (tmp_path / "c").exists()


def _forge(folder, prov):
    """compression.json replaced and config.json's digest of it updated to match: an edit made consistently, so the
    checks behind the digest are reached."""
    (folder / PROVENANCE_FILE).write_text(json.dumps(prov))
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, RECORD_KEY: record_digest(prov)}))


def test_tampered_checkpoints_are_one_line_on_load(tmp_path, capsys, saved_cli):
    import shutil

    run = lambda folder: ["run", "--model", str(folder), "--methods", "dense", *PPL, "--output", str(tmp_path / "r")]
    _one_line(capsys, ["run", "--model", str(saved_cli), "--methods", "pca", "--rank", "0.5", *PPL,
                       "--output", str(tmp_path / "r")], "compressed checkpoint")

    def copy(name):
        dst = tmp_path / name
        shutil.copytree(saved_cli, dst)
        return dst

    prov = json.loads((saved_cli / PROVENANCE_FILE).read_text())
    cfg = json.loads((saved_cli / "config.json").read_text())
    f = copy("prov")
    (f / PROVENANCE_FILE).write_text(json.dumps({**prov, "layout_sha256": "0" * 64}))
    _one_line(capsys, run(f), "does not match compression.json")
    f = copy("relabelled")  # the method and budget edited: the leaderboard would file it under another variant
    (f / PROVENANCE_FILE).write_text(json.dumps({**prov, "method": "fasc", "budget": "0.3 rank"}))
    _one_line(capsys, run(f), "does not match the digest config.json records")
    f = copy("dropped")  # without compression.json, the folder must not load as the base architecture
    (f / PROVENANCE_FILE).unlink()
    _one_line(capsys, run(f), "compression.json is missing")
    f = copy("replaced-config")  # the base model's config.json put back: compression.json has no layout to check
    (f / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if not k.startswith("acbench")
                                               and k != "auto_map"} | {"model_type": "llama"}))
    _one_line(capsys, run(f), "records no compression layout")
    f = copy("old-schema")
    _forge(f, {**prov, "schema": 1})
    _one_line(capsys, run(f), "schema 1")
    f = copy("escape")
    _forge(f, {**prov, "weights": {"../../x.safetensors": "0" * 64}})
    _one_line(capsys, run(f), "as a weight file")
    f = copy("no-weights")  # an empty list once skipped every weight digest
    _forge(f, {**prov, "weights": {}})
    _one_line(capsys, run(f), "lists no weight files")
    f = copy("json")
    (f / PROVENANCE_FILE).write_text("{not json")
    _one_line(capsys, run(f), "not readable JSON")
    f = copy("layout")
    site = next(iter(cfg["acbench_compression"]))
    (f / "config.json").write_text(json.dumps({**cfg, "acbench_compression": {
        **cfg["acbench_compression"], site: {**cfg["acbench_compression"][site], "k": 1}}}))
    _one_line(capsys, run(f), "does not match compression.json")
    f = copy("model-type")  # a dense model type on a factorised layout: transformers would load it dense
    (f / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    _one_line(capsys, run(f), "does not fit its layout")
    f = copy("code")
    with open(f / "compressed_layers.py", "a") as fh:
        fh.write("\n# edited\n")
    _one_line(capsys, run(f), "compressed_layers.py differs")
    f = copy("experts-code")  # the carried expert splitter is checked like every code file
    with open(f / "experts.py", "a") as fh:
        fh.write("\n# edited\n")
    _one_line(capsys, run(f), "experts.py differs")
    f = copy("experts-code-gone")
    (f / "experts.py").unlink()
    _one_line(capsys, run(f), "experts.py")
    f = copy("extra-code")
    (f / "sitecustomize.py").write_text("")
    _one_line(capsys, run(f), "sitecustomize.py is not a code file")
    f = copy("missing")
    (f / "model.safetensors").unlink()
    _one_line(capsys, run(f), "holds no weights")
    (f / "extra.safetensors").write_bytes(b"")  # another weight file, but not the one compression.json lists
    _one_line(capsys, run(f), "is missing")
    f = copy("weights")
    data = bytearray((f / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (f / "model.safetensors").write_bytes(bytes(data))
    _one_line(capsys, run(f), "differs from the file bench compress wrote")


def test_the_record_names_its_versions_and_code(saved_cli):
    prov = json.loads((saved_cli / PROVENANCE_FILE).read_text())
    import transformers

    assert prov["written_by"]["torch"] == torch.__version__
    assert prov["written_by"]["transformers"] == transformers.__version__
    assert "git_commit" in prov["written_by"]
    assert sorted(prov["code"]) == ["compressed_layers.py", "configuration_acbench.py", "experts.py",
                                    "modeling_acbench.py", "sparsity.py"]
    assert "tokenizer.json" in prov["other"] and "generation_config.json" in prov["other"]
    cfg = json.loads((saved_cli / "config.json").read_text())
    assert cfg["model_type"] == "acbench_llama" and cfg[RECORD_KEY] == record_digest(prov)


def test_written_files_follow_the_umask(saved_cli, tmp_path):
    """Atomic writes once left every cell and compression.json at 0600, unreadable to the user's group."""
    mask = os.umask(0o022)
    os.umask(mask)
    want = 0o666 & ~mask
    for name in (PROVENANCE_FILE, "config.json", "model.safetensors"):
        assert (saved_cli / name).stat().st_mode & 0o777 == want, name
    from acbench.core.io import atomic_write_json

    atomic_write_json(tmp_path / "cell.json", {})
    assert (tmp_path / "cell.json").stat().st_mode & 0o777 == want


def test_save_targets_that_would_replace_the_source_or_the_current_folder_are_refused(tmp_path, capsys,
                                                                                       monkeypatch):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(tiny_checkpoint(), src)
    for target in (src, src / "inner", tmp_path):
        _one_line(capsys, ["compress", "--model", str(src), "--save", str(target), *CALIB, "--method", "pca",
                                  "--rank", "0.5", "--overwrite"], "source model")
    monkeypatch.chdir(src / "..")
    for target in (".", ".."):
        _one_line(capsys, _compress(target, "--method", "pca", "--rank", "0.5", "--overwrite"), "current folder")
    assert sorted(p.name for p in src.iterdir()) == sorted(p.name for p in tiny_checkpoint().iterdir())


@pytest.mark.slow
def test_lm_eval_cli_runs_a_local_task_on_a_saved_checkpoint(tmp_path, saved_cli):
    """`lm_eval --model hf --model_args pretrained=<checkpoint>,trust_remote_code=True` on a local task YAML."""
    rows = [("France", "Paris"), ("Japan", "Tokyo"), ("Peru", "Lima"), ("Kenya", "Nairobi")]
    with open(tmp_path / "capitals.jsonl", "w") as f:
        for country, capital in rows:
            choices = [c for _, c in rows]
            f.write(json.dumps({"question": f"What is the capital of {country}?", "choices": choices,
                                "answer": choices.index(capital)}) + "\n")
    (tmp_path / "capitals.yaml").write_text(
        f"task: capitals\ndataset_path: json\ndataset_kwargs:\n  data_files: {{test: {tmp_path / 'capitals.jsonl'}}}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"Question: {{question}}\\nAnswer:\"\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n"
        "    aggregation: mean\n    higher_is_better: true\n")
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
         f"pretrained={saved_cli},trust_remote_code=True,dtype=float32", "--tasks", "capitals", "--include_path",
         str(tmp_path), "--device", "cpu", "--batch_size", "2", "--output_path", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    assert 0.0 <= results["results"]["capitals"]["acc,none"] <= 1.0
    assert results["config"]["model_args"]["pretrained"] == str(saved_cli)
    # without trust_remote_code lm-eval cannot build the factorised sites: it must stop, not score a dense model
    proc = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={saved_cli},dtype=float32",
         "--tasks", "capitals", "--include_path", str(tmp_path), "--device", "cpu", "--batch_size", "2",
         "--output_path", str(tmp_path / "plain")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0 and "trust_remote_code" in proc.stderr, proc.stderr[-3000:]
    assert not list((tmp_path / "plain").rglob("results_*.json"))
