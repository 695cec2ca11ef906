"""Verdicts across models (core/meta_analysis.py, leaderboard/across_models.py) against references written here:
DerSimonian-Laird by hand, Friedman against scipy's, Nemenyi against Demsar's published table, win rate and mean
rank on a hand case with ties, and a three-model result tree the report renders."""

import json
import math
import re
from pathlib import Path

import pytest
from scipy import stats

from acbench.core.meta_analysis import (cliques, common_effect, dersimonian_laird, holm, friedman, nemenyi_cd, paired_effect, scenario_ranks,
                                stratified_mcnemar, win_rates)
from acbench.core.record import cell_relpath
from acbench.leaderboard.report import build_report


# ---------------------------------------------------------------- the statistics, by hand

def test_dersimonian_laird_by_hand():
    y, v = [0.10, 0.30, -0.05], [0.01, 0.02, 0.015]
    w = [100.0, 50.0, 1 / 0.015]  # 1 / v
    fixed = (100 * 0.10 + 50 * 0.30 - 0.05 / 0.015) / sum(w)
    assert fixed == pytest.approx(0.1)
    q = 100 * 0.0 ** 2 + 50 * 0.2 ** 2 + (1 / 0.015) * 0.15 ** 2  # = 2 + 1.5
    assert q == pytest.approx(3.5)
    c = sum(w) - (100 ** 2 + 50 ** 2 + (1 / 0.015) ** 2) / sum(w)
    tau2 = (q - 2) / c
    ws = [1 / (vi + tau2) for vi in v]
    est = sum(wi * yi for wi, yi in zip(ws, y)) / sum(ws)
    se = math.sqrt(1 / sum(ws))
    got = dersimonian_laird(y, v)
    assert got["q"] == pytest.approx(3.5)
    assert got["df"] == 2 and got["k"] == 3
    assert got["tau2"] == pytest.approx(tau2) and got["tau2"] == pytest.approx(0.0108333, rel=1e-4)
    assert got["i2"] == pytest.approx(1.5 / 3.5)
    assert got["estimate"] == pytest.approx(est) and got["estimate"] == pytest.approx(0.105708, rel=1e-4)
    assert got["se"] == pytest.approx(se)
    assert got["ci95"] == pytest.approx([est - 1.959964 * se, est + 1.959964 * se], rel=1e-6)
    assert got["p"] == pytest.approx(2 * (1 - stats.norm.cdf(est / se)))
    assert sum(got["weights"]) == pytest.approx(1.0)
    assert got["weights"][0] == pytest.approx(ws[0] / sum(ws))


def test_hartung_knapp_by_hand():
    """The interval around DerSimonian-Laird's estimate from the effects' weighted spread about it, t with k - 1
    degrees of freedom; the spread's scale kept at 1 or more (two near-equal effects get no narrower interval than
    their weights give)."""
    y, v = [0.10, 0.30, -0.05], [0.01, 0.02, 0.015]
    got = dersimonian_laird(y, v)
    tau2, est = got["tau2"], got["estimate"]
    ws = [1 / (vi + tau2) for vi in v]
    scale = sum(w * (yi - est) ** 2 for w, yi in zip(ws, y)) / 2
    assert scale > 1
    se = math.sqrt(scale / sum(ws))
    t = stats.t.ppf(0.975, 2)
    assert t == pytest.approx(4.302653, rel=1e-6)
    hk = got["hartung_knapp"]
    assert hk["df"] == 2 and hk["scale"] == pytest.approx(scale) and hk["se"] == pytest.approx(se)
    assert hk["ci95"] == pytest.approx([est - t * se, est + t * se], rel=1e-9)
    assert hk["p"] == pytest.approx(2 * stats.t.sf(est / se, 2))
    # nearly equal effects: the scale (about 0) is held at 1, so the se is DerSimonian-Laird's
    close = dersimonian_laird([0.2, 0.2001], [0.01, 0.02])
    assert close["hartung_knapp"]["scale"] < 1e-3
    assert close["hartung_knapp"]["se"] == pytest.approx(close["se"])
    assert close["hartung_knapp"]["ci95"][1] - close["hartung_knapp"]["ci95"][0] == pytest.approx(
        2 * stats.t.ppf(0.975, 1) * close["se"])
    assert dersimonian_laird([0.1], [0.01])["hartung_knapp"] is None  # one model: no spread to read


def test_dersimonian_laird_homogeneous_is_the_fixed_effect():
    """Q below its degrees of freedom: tau^2 is 0 and the estimate the inverse-variance mean."""
    got = dersimonian_laird([0.1, 0.12], [0.01, 0.04])
    q = 100 * (0.1 - 0.104) ** 2 + 25 * (0.12 - 0.104) ** 2  # fixed = (10 + 3) / 125 = 0.104
    assert got["q"] == pytest.approx(q)
    assert got["tau2"] == 0.0 and got["i2"] == 0.0
    assert got["estimate"] == pytest.approx(0.104)
    assert got["se"] == pytest.approx(math.sqrt(1 / 125))


def test_dersimonian_laird_one_model_is_that_model():
    got = dersimonian_laird([-0.2], [0.04])
    assert (got["estimate"], got["se"], got["tau2"], got["df"]) == (pytest.approx(-0.2), pytest.approx(0.2), 0.0, 0)


@pytest.mark.parametrize("y, v", [([], []), ([0.1], [0.0]), ([0.1, float("nan")], [0.1, 0.1]), ([0.1], [0.1, 0.2])])
def test_dersimonian_laird_refuses_what_it_cannot_weigh(y, v):
    with pytest.raises(ValueError):
        dersimonian_laird(y, v)


def test_paired_effect_by_hand():
    ref, other = [1, 1, 0, 0, 1], [1, 0, 1, 1, 1]  # d = 0, -1, 1, 1, 0
    diff, var = paired_effect(ref, other)
    assert diff == pytest.approx(1 / 5)
    # sample variance of d: (sum d^2 - n mean^2) / (n - 1) = (3 - 0.2) / 4 = 0.7; over n
    assert var == pytest.approx(0.7 / 5)
    same_diff, floor = paired_effect([0.0, 1.0, 2.0, 3.0], [0.5, 1.5, 2.5, 3.5])  # a constant difference
    assert same_diff == pytest.approx(0.5) and floor == pytest.approx(1 / 16)
    with pytest.raises(ValueError):
        paired_effect([1.0], [0.0])


def test_stratified_mcnemar_pools_the_discordant_pairs():
    # model 1: 3 items only the other method gets right, 1 only the reference; model 2: 4 and 0
    s2 = ([0, 0, 0, 0, 1], [1, 1, 1, 1, 1])
    s1 = ([1, 0, 0, 0, 1, 0], [0, 1, 1, 1, 1, 0])
    got = stratified_mcnemar([s1, s2])
    b, c, n = 1, 7, 11
    assert got["discordant"] == [b, c] and got["n"] == n and got["strata"] == 2
    assert got["diff"] == pytest.approx((c - b) / n)
    assert got["p"] == pytest.approx(stats.binomtest(c, b + c, 0.5).pvalue)
    assert got["p"] == pytest.approx(2 * (1 + 8) / 2 ** 8)  # two-sided: P(X <= 1) + P(X >= 7), X ~ Bin(8, 1/2)
    with pytest.raises(ValueError):
        stratified_mcnemar([([1, 0], [1])])


def test_ranks_and_win_rates_on_a_hand_case_with_ties():
    acc = ({"a": 0.5, "b": 0.5, "c": 0.2}, True)  # a and b tie for first
    ppl = ({"a": 30.0, "b": 20.0, "c": 40.0}, False)  # b best, c worst
    assert scenario_ranks(*acc) == {"a": 1.5, "b": 1.5, "c": 3.0}
    assert scenario_ranks(*ppl) == {"a": 2.0, "b": 1.0, "c": 3.0}
    wr = win_rates([acc, ppl])
    # a: (0.5 + 1) / 2 in acc, 1 / 2 in ppl -> (0.75 + 0.5) / 2; b: 0.75 and 1; c: 0 and 0
    assert wr == {"a": pytest.approx(0.625), "b": pytest.approx(0.875), "c": 0.0}
    assert win_rates([({"a": 1.0}, True)]) == {}  # a scenario of one method has nothing to win


def test_friedman_equals_scipys_with_ties():
    values = [[0.61, 0.55, 0.55, 0.40], [0.72, 0.70, 0.69, 0.50], [0.33, 0.35, 0.30, 0.30],
              [0.80, 0.80, 0.80, 0.79], [0.52, 0.49, 0.51, 0.45]]
    names = ["w", "x", "y", "z"]
    rows = [scenario_ranks(dict(zip(names, v)), True) for v in values]
    got = friedman(rows)
    # scipy ranks ascending within blocks; the statistic is the same for ranks by -value
    ref = stats.friedmanchisquare(*[[-v[j] for v in values] for j in range(4)])
    assert got["statistic"] == pytest.approx(ref.statistic)
    assert got["p"] == pytest.approx(ref.pvalue)
    assert got["df"] == 3 and got["n"] == 5
    assert got["mean_ranks"]["w"] == pytest.approx(sum(r["w"] for r in rows) / 5)
    with pytest.raises(ValueError):
        friedman([{"a": 1.0, "b": 2.0}])  # 2 methods


def test_nemenyi_cd_matches_demsars_worked_example():
    """Demsar (2006), section 3.2.2: four classifiers on 14 data sets, q_0.05 = 2.569 from his Table 5(a),
    CD = 2.569 * sqrt(4 * 5 / (6 * 14)) = 1.25."""
    cd = nemenyi_cd(4, 14)
    assert cd / math.sqrt(4 * 5 / (6 * 14)) == pytest.approx(2.569, abs=5e-4)
    assert cd == pytest.approx(1.25, abs=0.005)
    # the rest of his Table 5(a) at 0.05: k = 2, 3, 5, 10
    for k, q in ((2, 1.960), (3, 2.343), (5, 2.728), (10, 3.164)):
        assert nemenyi_cd(k, 6) / math.sqrt(k * (k + 1) / 36) == pytest.approx(q, abs=1e-3)  # printed to 3 places


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04: times 3, 2, 1 -> 0.03, 0.04, 0.04 (kept non-decreasing); given order returned
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.03125, 0.25]) == pytest.approx([0.0625, 0.25])
    assert holm([]) == []


def test_common_effect_by_hand():
    # weights 100 and 25: (100 * 0.1 + 25 * 0.2) / 125 = 0.12, se sqrt(1 / 125)
    got = common_effect([0.1, 0.2], [0.01, 0.04])
    assert got["estimate"] == pytest.approx(0.12) and got["se"] == pytest.approx(math.sqrt(1 / 125))
    assert got["ci95"] == pytest.approx([0.12 - 1.959964 * got["se"], 0.12 + 1.959964 * got["se"]], abs=1e-6)
    assert got["p"] == pytest.approx(2 * stats.norm.sf(0.12 / math.sqrt(1 / 125)))
    with pytest.raises(ValueError):
        common_effect([0.1], [0.0])


def test_cliques_are_the_maximal_runs_within_the_cd():
    ranks = {"a": 1.0, "b": 1.5, "c": 2.1, "d": 3.5, "e": 3.6}
    assert cliques(ranks, 1.3) == [["a", "b", "c"], ["d", "e"]]
    assert cliques(ranks, 0.05) == []
    assert cliques(ranks, 10) == [["a", "b", "c", "d", "e"]]


# ---------------------------------------------------------------- a three-model tree the report renders

N = 40
# correct items: the first k of each task's N (so the discordant pairs are known exactly)
LAMA = {"model-x": {"dense": 30, "pca": 20, "fasc-kfac": 26, "svd": 10},
        "model-y": {"dense": 28, "pca": 18, "fasc-kfac": 21, "svd": 19},
        "model-z": {"dense": 5, "pca": 4, "fasc-kfac": 5, "svd": 3}}  # dense at chance (0.1): left out
NLL = {"model-x": {"dense": 3.0, "pca": 3.4, "fasc-kfac": 3.3, "svd": 4.0},
       "model-y": {"dense": 2.8, "pca": 3.1, "fasc-kfac": 3.05, "svd": 3.9},
       "model-z": {"dense": 3.5, "pca": 3.9, "fasc-kfac": 3.95, "svd": 4.4}}
WINDOWS = 6


def window_nll(model, method):
    return [NLL[model][method] + 0.01 * ((3 * i + len(model) + len(method)) % 5) for i in range(WINDOWS)]


def _ppl_scores(model):
    return window_nll(model, "pca"), window_nll(model, "fasc-kfac")


def write_cell(root: Path, model: str, method: str, task: str):
    rank = None if method == "dense" else 0.5
    if task == "lama":
        k = LAMA[model][method]
        records = [{"id": i, "correct": i < k, "chance": 0.1} for i in range(N)]
        metrics, higher = {"p@1": k / N}, {"p@1": True}
    else:
        nll = window_nll(model, method)
        records = [{"window": i, "nll": v} for i, v in enumerate(nll)]
        metrics, higher = {"ppl": math.exp(sum(nll) / WINDOWS)}, {"ppl": False}
    rec = {"schema_version": 2, "cell": {"model": model, "method": method, "rank": rank, "budget": "rank",
                                         "task": task, "key": "k1"},
           "higher_is_better": higher, "versions": {"task": 1, "method": None if method == "dense" else 1},
           "model_fingerprint": {"source": "gguf", "sha256": f"{model}-sha", "dtype": "float32"}, "seed": 0,
           "env": {"date": "2026-12-01T00:00:00Z"}, "metrics": metrics, "stderr": {}, "primary_metric": next(iter(metrics)),
           "records": records, "details": {}, "compression": None if method == "dense" else {"param_ratio": 0.5}}
    p = root / cell_relpath(model, method, rank, "rank", task, "k1")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rec))


@pytest.fixture(scope="module")
def three_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("across")
    root = out / "results"
    for model in LAMA:
        for method in LAMA[model]:
            for task in ("lama", "ppl-token"):
                write_cell(root, model, method, task)
    info = build_report([root], out / "LEADERBOARD.md")
    return info, out, (out / "LEADERBOARD.md").read_text()


def _row(text: str, method: str, task: str) -> list[str]:
    section = text[text.index("## Across models"):]
    line = next(l for l in section.splitlines() if l.startswith(f"| {method} ") and f"| {task}" in l)
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_report_pools_each_method_over_the_models(three_models):
    _, _, text = three_models
    assert "### rank ratio 0.5: 3 models (model-x, model-y, model-z)" in text
    assert "at chance, so left out of the pooled verdicts and the ranking: lama on model-z" in text
    row = _row(text, "fasc-kfac", "lama p@1")
    # per model (x, y; z at chance): 6 and 3 items only fasc-kfac gets right, none only pca
    assert row[4] == "" and row[5] == "2 of 2 (+ + ·)"
    # model-x: 6 of 6 discordant for fasc-kfac, exact p 1/32; model-y 3 of 3, p 1/4: better on model-x alone, but
    # Holm across the two models makes it 2/32 = 0.0625, so significant in neither
    assert row[2].startswith("+0.150") and row[2].endswith("better (detectable 0.167)")  # Connor at psi 0.15, n 40
    assert row[3].startswith("+0.075") and "undecided (could miss" in row[3]
    assert row[6] == "better in 0 of 2"
    effects = [paired_effect([i < LAMA[m]["pca"] for i in range(N)], [i < LAMA[m]["fasc-kfac"] for i in range(N)])
               for m in ("model-x", "model-y")]
    assert effects[0][0] == pytest.approx(6 / 40) and effects[1][0] == pytest.approx(3 / 40)
    common = common_effect([e[0] for e in effects], [e[1] for e in effects])
    lo, hi = common["ci95"]
    assert row[7].startswith(f"{common['estimate']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    # over all 80 items: 9 discordant pairs, all for fasc-kfac
    assert row[8].startswith(f"{9 / 80:+.3f}") and f"p={stats.binomtest(9, 9, 0.5).pvalue:.2g}" in row[8]
    # two models: no random effects, and the table says why in that row
    assert row[9] == "not estimable from 2 models" and row[10] == ""
    assert "random-effects Δ (DerSimonian-Laird, HKSJ interval)" in text
    nll = _row(text, "fasc-kfac", "ppl-token ppl (Δ NLL)")
    assert nll[5] == "2 of 3 (+ + −)" and nll[8] == ""  # worse than pca on model-z; no exact test for NLL
    pooled = dersimonian_laird(*zip(*[paired_effect(*_ppl_scores(m)) for m in ("model-x", "model-y", "model-z")]))
    hk = pooled["hartung_knapp"]
    assert nll[9].startswith(f"{pooled['estimate']:+.3f} [{hk['ci95'][0]:+.3f}, {hk['ci95'][1]:+.3f}]")
    svd = _row(text, "svd", "lama p@1")
    assert svd[5] == "1 of 2 (− + ·)"


def test_the_report_ranks_the_methods_with_friedman_and_a_cd_figure(three_models):
    info, out, text = three_models
    section = text[text.index("Ranking over 5 (model, task) scenarios"):]
    # per scenario (x/lama, x/ppl, y/lama, y/ppl, z/ppl): fasc-kfac ranks 1 1 1 1 2, pca 2 2 3 2 1, svd 3 3 2 3 3
    fasc = next(l for l in section.splitlines() if l.startswith("| fasc-kfac"))
    assert [c.strip() for c in fasc.strip("|").split("|")][1:4] == ["0.900", "1.20", "1"]
    pca = next(l for l in section.splitlines() if l.startswith("| pca"))
    assert [c.strip() for c in pca.strip("|").split("|")][1:3] == ["0.500", "2.00"]
    ranks = [{"fasc-kfac": 1, "pca": 2, "svd": 3}] * 2 + [{"fasc-kfac": 1, "pca": 3, "svd": 2},
                                                          {"fasc-kfac": 1, "pca": 2, "svd": 3},
                                                          {"fasc-kfac": 2, "pca": 1, "svd": 3}]
    fr = friedman(ranks)
    assert f"Friedman χ² = {fr['statistic']:.2f} (df 2, n = 5 scenarios), p = {fr['p']:.2g}" in section
    assert f"Nemenyi critical difference at 0.05: {nemenyi_cd(3, 5):.2f}" in section
    figure = out / "plots" / "across_models_cd_rank_0.5.png"
    assert figure in info["plots"] and figure.stat().st_size > 0
    assert "![critical difference diagram](plots/across_models_cd_rank_0.5.png)" in section
    rows = json.loads((out / "LEADERBOARD.json").read_text())
    pooled = [r for r in rows if r["model"] == "across models"]
    assert {(r["method"], r["task"]) for r in pooled} == {(m, t) for m in ("fasc-kfac", "svd")
                                                         for t in ("lama", "ppl-token")}


def test_one_model_has_no_across_models_section(tmp_path):
    root = tmp_path / "results"
    for method in LAMA["model-x"]:
        write_cell(root, "model-x", method, "lama")
    build_report([root], tmp_path / "LEADERBOARD.md")
    assert "Across models" not in (tmp_path / "LEADERBOARD.md").read_text()
    assert re.search(r"## model-x", (tmp_path / "LEADERBOARD.md").read_text())


# ---------------------------------------------------------------- bench run --model A B

def two_models(tmp_path) -> list[str]:
    """The tiny checkpoint, and a copy under another name with one tensor changed by a thousandth (a second model
    of the sweep: the same weights twice would be one model named twice, which a sweep refuses)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from acbench.cli.smoke import tiny_checkpoint

    first = Path(tiny_checkpoint())
    second = tmp_path / "tiny-copy"
    shutil.copytree(first, second)
    tensors = load_file(second / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name] * 1.001
    save_file(tensors, second / "model.safetensors", metadata={"format": "pt"})
    return [str(first), str(second)]


def sweep_args(models: list[str], out: Path) -> list[str]:
    return ["run", "--model", *models, "--methods", "pca", "svd", "--rank", "0.5", "--tasks", "lama", "ppl-token",
            "--calib-samples", "2", "--calib-seq-len", "32", "--pair-tokens", "32", "--lama-limit", "1",
            "--lama-candidates", "6", "--ppl-windows", "2", "--ppl-seq-len", "32", "--output", str(out), "--quiet",
            "--no-latency"]


def test_a_model_that_cannot_load_stops_the_sweep_before_any_cell(tmp_path, capsys):
    from acbench.cli import main

    models = two_models(tmp_path)[:1] + [str(tmp_path / "no-such-model")]
    rc = main(sweep_args(models, tmp_path / "out"))
    err = capsys.readouterr().err
    assert rc == 2 and "no-such-model does not exist" in err and "Traceback" not in err
    assert not list((tmp_path / "out").rglob("*.json"))  # the first model's cells were not started


def test_compress_takes_one_model(tmp_path, capsys):
    from acbench.cli import main

    rc = main(["compress", "--model", "a", "b", "--method", "pca", "--save", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "takes one model, and --model names 2 (a, b)" in err


def test_a_sweep_over_two_models_writes_both_and_pools_them(tmp_path):
    from acbench.cli import main

    models = two_models(tmp_path)
    out = tmp_path / "out"
    assert main(sweep_args(models, out)) == 0
    names = {p.relative_to(out).parts[0] for p in out.rglob("*.json") if p.parent != out}
    assert len(names) == 2 and "tiny-copy" in names
    text = (out / "LEADERBOARD.md").read_text()
    assert "## Across models" in text and "### rank ratio 0.5: 2 models" in text
    # the copy's weights differ by a thousandth in one tensor: both models pooled under a common effect; two models
    # give no random-effects column at all
    row = _row(text, "svd", "PPL (ppl-token) (Δ NLL)")
    assert row[4] in ("2 of 2 (+ +)", "0 of 2 (− −)") and row[5].startswith("better in ")
    assert row[6].startswith(("+", "-")) and "random-effects" not in text


def test_a_config_file_names_several_models(tmp_path):
    """`model:` as a YAML list or a comma list gives one config per model; the command line's --model wins."""
    from acbench.cli import _parser
    from acbench.cli.run import configs_from_args

    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("model: [gemma-3-270m, smollm2-135m]\nmethods: pca\n")
    configs = configs_from_args(_parser().parse_args(["run", "--config", str(cfg)]))
    assert [c.model for c in configs] == ["gemma-3-270m", "smollm2-135m"]
    assert all(c.methods == ["pca"] for c in configs)
    cfg.write_text("model: gemma-3-270m, smollm2-135m, gemma-3-270m\n")
    assert [c.model for c in configs_from_args(_parser().parse_args(["run", "--config", str(cfg)]))] == \
        ["gemma-3-270m", "smollm2-135m"]  # each once
    args = _parser().parse_args(["run", "--config", str(cfg), "--model", "x"])
    assert [c.model for c in configs_from_args(args)] == ["x"]


def test_plan_prices_each_model_and_the_sweep(capsys):
    """`bench plan --model A B`: each model's plan under its name, then the sweep's seconds (their sum) and peak
    memory (their maximum: the models run one after another)."""
    from acbench.cli import main

    configs = Path(__file__).parent / "fixtures" / "configs"
    a, b = str(configs / "llama-3-8b"), str(configs / "mistral-7b")
    assert main(["plan", "--model", a, b, "--methods", "pca", "--rank", "0.5", "--stats-memory", "16GB"]) == 0
    out = capsys.readouterr().out
    assert out.index(f"## {a}") < out.index(f"## {b}") < out.index("the sweep over 2 models")
    table = out[out.index("the sweep over 2 models"):]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ") and not line.startswith("| model ")}
    totals = [float(m.group(1)) for m in re.finditer(r"\| total \(evaluation not included\)\s*\|\s*(\d+)", out)]
    assert len(totals) == 2 and float(rows["sweep (models in turn)"][1]) == pytest.approx(sum(totals), abs=1)
    assert main(["plan", "--model", a, str(configs / "nope"), "--methods", "pca"]) == 2  # the second refused


def _pca_rerun_on_five_windows(root, model: str) -> None:
    """pca's stored perplexity cell of `model` as a rerun over 5 windows of the others' 6 would write it."""
    path = root / cell_relpath(model, "pca", 0.5, "rank", "ppl-token", "k1")
    rec = json.loads(path.read_text())
    rec["records"] = rec["records"][:5]
    rec["metrics"]["ppl"] = math.exp(sum(r["nll"] for r in rec["records"]) / 5)
    path.write_text(json.dumps(rec))


def test_a_scenario_whose_methods_scored_different_items_is_left_out_of_the_ranking(tmp_path, three_models):
    """pca's perplexity on model-y rerun over 5 windows of the others' 6: that scenario is not ranked, and the
    section says so; the other four still are."""
    import shutil

    _, out, _ = three_models
    root = tmp_path / "results"
    shutil.copytree(out / "results", root)
    _pca_rerun_on_five_windows(root, "model-y")
    build_report([root], tmp_path / "L.md")
    text = (tmp_path / "L.md").read_text()
    assert ("- left out of the ranking, its methods scored on different items (a rerun at other sizes): "
            "model-y / ppl-token ppl") in text
    assert "Ranking over 4 (model, task) scenarios" in text


# ---------------------------------------------------------------- reference edges of the verdicts (mutation score)

def test_the_verdicts_refuse_what_they_cannot_compute_in_their_own_words():
    from acbench.core.meta_analysis import stratified_mcnemar

    for bad in ([], [([1.0, 0.0], [1.0])]):
        with pytest.raises(ValueError, match="^stratified_mcnemar needs equal-length, non-empty item lists per "
                                             "stratum$"):
            stratified_mcnemar(bad)
    with pytest.raises(ValueError, match="^friedman needs at least one block$"):
        friedman([])
    with pytest.raises(ValueError, match="^friedman needs every block to rank the same methods$"):
        friedman([{"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 2.0, "d": 3.0}])
    with pytest.raises(ValueError, match="^friedman needs at least 3 methods, got 2$"):
        friedman([{"a": 1.0, "b": 2.0}])
    for k, n in ((1, 5), (3, 0)):  # either too few methods or too few blocks is enough to refuse
        with pytest.raises(ValueError, match=f"^nemenyi_cd needs k >= 2 methods and n >= 1 blocks, got k={k}, n={n}$"):
            nemenyi_cd(k, n)
    assert nemenyi_cd(3, 1) == pytest.approx(nemenyi_cd(3, 4) * 2)  # one block is enough; CD shrinks as 1/sqrt(n)


def test_the_stratified_test_names_itself_and_its_strata():
    from acbench.core.meta_analysis import stratified_mcnemar

    out = stratified_mcnemar([([1.0, 0.0, 0.0], [1.0, 1.0, 1.0]), ([0.0, 1.0], [1.0, 1.0])])
    assert out["strata"] == 2 and out["test"] == "McNemar exact, stratified by model"
    assert out["diff"] == pytest.approx(3 / 5)


def test_friedman_where_every_block_is_one_tie_has_nothing_to_order():
    """All methods tied in every block: the tie correction is 0, and the statistic is 0 (p = 1), not a division
    by zero or a constant."""
    out = friedman([{"a": 2.0, "b": 2.0, "c": 2.0}] * 4)
    assert out["statistic"] == 0.0 and out["p"] == pytest.approx(1.0) and out["k"] == 3 and out["n"] == 4


def test_cliques_follow_mean_rank_not_name_order_and_a_difference_of_exactly_cd_splits():
    # by mean rank b (1), c (2), a (3): b-c and c-a are within 1.5 of each other, b-a is not
    assert cliques({"a": 3.0, "b": 1.0, "c": 2.0}, 1.5) == [["b", "c"], ["c", "a"]]
    assert cliques({"a": 1.0, "b": 2.0}, 1.0) == []  # a difference equal to the CD is a difference
    assert cliques({"a": 1.0, "b": 1.9}, 1.0) == [["a", "b"]]


def test_paired_effect_and_pooling_refuse_in_their_own_words():
    with pytest.raises(ValueError, match="^a paired difference needs at least 2 items, got 1$"):
        paired_effect([1.0], [0.0])
    for y, v in (([], []), ([1.0], [1.0, 2.0])):
        with pytest.raises(ValueError, match="^dersimonian_laird needs one variance per effect, and at least one "
                                             "effect$"):
            dersimonian_laird(y, v)
    with pytest.raises(ValueError, match="^dersimonian_laird needs finite effects and finite positive variances$"):
        dersimonian_laird([1.0, 2.0], [1.0, 0.0])


def test_dersimonian_laird_at_the_edges_of_its_between_model_variance():
    # large within-model variances (c = 0.1 < 1): tau^2 = (Q - df) / c = (5 - 1) / 0.1
    out = dersimonian_laird([0.0, 10.0], [10.0, 10.0])
    assert out["q"] == pytest.approx(5.0) and out["tau2"] == pytest.approx(40.0)
    assert out["i2"] == pytest.approx(0.8)
    # one weight swamps the other in floating point (c = 0 exactly): no between-model variance, no division by 0
    lop = dersimonian_laird([0.0, 1.0], [1e-20, 1.0])
    assert lop["tau2"] == 0.0 and lop["estimate"] == pytest.approx(0.0, abs=1e-12)
    # identical effects: Q = 0, and I^2 is 0, not a share of nothing
    same = dersimonian_laird([0.3, 0.3], [1.0, 2.0])
    assert same["q"] == 0.0 and same["i2"] == 0.0 and same["tau2"] == 0.0


def test_win_rates_skip_a_lone_method_and_split_a_tie_whichever_direction_is_better():
    assert win_rates([({"a": 1.0}, True), ({"a": 1.0, "b": 2.0}, True)]) == {"a": 0.0, "b": 1.0}
    assert win_rates([({"a": 1.0, "b": 1.0}, False)]) == {"a": 0.5, "b": 0.5}
    assert win_rates([({"a": 1.0, "b": 2.0}, False)]) == {"a": 1.0, "b": 0.0}


# ---------------------------------------------------------------- the section's pieces, on hand-built cells

def _cell(model: str, method: str, task: str, records: list):
    """A stored cell of `task` (lama: accuracy records; ppl-token: per-window NLL records) for the pieces below."""
    from acbench.core.record import CellRecord

    if all("correct" in r for r in records):
        metrics, higher = {"p@1": sum(bool(r["correct"]) for r in records) / len(records)}, {"p@1": True}
    else:
        metrics, higher = {"ppl": math.exp(sum(r["nll"] for r in records) / len(records))}, {"ppl": False}
    rank = None if method == "dense" else 0.5
    return CellRecord.from_json({
        "schema_version": 2, "cell": {"model": model, "method": method, "rank": rank, "budget": "rank", "task": task,
                                      "key": "k1"},
        "higher_is_better": higher, "versions": {"task": 1, "method": None if method == "dense" else 1},
        "model_fingerprint": {"source": "gguf", "sha256": f"{model}-sha", "dtype": "float32"}, "seed": 0,
        "env": {"date": "2026-12-01T00:00:00Z"}, "metrics": metrics, "stderr": {}, "primary_metric": next(iter(metrics)),
        "records": records, "details": {}, "compression": None if method == "dense" else {"param_ratio": 0.5}})


def _acc(correct: list) -> list:
    return [{"id": i, "correct": bool(c), "chance": 0.1} for i, c in enumerate(correct)]


def _nll(values: list) -> list:
    return [{"window": i, "nll": float(v)} for i, v in enumerate(values)]


def test_paired_takes_two_or_more_items_of_one_kind_on_the_same_keys():
    from acbench.leaderboard.across_models import _paired

    a = _cell("m", "pca", "lama", _acc([1, 0, 1]))
    b = _cell("m", "svd", "lama", _acc([1, 1, 0]))
    assert _paired(a, b) == ("accuracy", [1.0, 0.0, 1.0], [1.0, 1.0, 0.0])
    assert _paired(a, None) is None and _paired(None, b) is None
    assert _paired(_cell("m", "pca", "lama", _acc([1])), _cell("m", "svd", "lama", _acc([0]))) is None  # one item
    same_keys_other_kind = _cell("m", "svd", "lama", [{"id": i, "nll": v} for i, v in enumerate([1.0, 2.0, 3.0])])
    assert _paired(a, same_keys_other_kind) is None
    assert _paired(a, _cell("m", "svd", "lama", _acc([1, 0]))) is None  # fewer items
    reordered = _cell("m", "svd", "lama", [dict(r, id=2 - r["id"]) for r in _acc([1, 1, 0])])
    assert _paired(a, reordered) is None


def test_better_is_strict_in_both_directions():
    from acbench.leaderboard.across_models import _better

    assert _better(0.1, True) and _better(-0.1, False)
    assert not _better(-0.1, True) and not _better(0.1, False)
    assert not _better(0.0, True) and not _better(0.0, False)


def _hand_grouped():
    """Four models: pca (the reference) and svd everywhere but mw (no pca); aaa on mx alone; bbb on mx and my; ccc
    on every model, but on mz only for ppl-token; svd equals pca on my's lama items (a difference of exactly 0)."""
    from acbench.leaderboard.tables import group_cells

    return group_cells(_hand_cells())


def _hand_cells() -> list:
    lama = {"mx": {"dense": [1] * 8 + [0] * 2, "pca": [1] * 6 + [0] * 4, "svd": [1] * 4 + [0] * 6,
                   "aaa": [1] * 5 + [0] * 5, "bbb": [1] * 7 + [0] * 3, "ccc": [1] * 6 + [0] * 4},
            "my": {"dense": [1] * 9 + [0], "pca": [1] * 5 + [0] * 5, "svd": [1] * 5 + [0] * 5,
                   "bbb": [1] * 3 + [0] * 7, "ccc": [1] * 7 + [0] * 3},
            "mz": {"dense": [1] * 9 + [0], "pca": [1] * 7 + [0] * 3, "svd": [1] * 8 + [0] * 2},
            "mw": {"dense": [1] * 9 + [0], "svd": [1] * 2 + [0] * 8}}
    cells = []
    for model, methods in lama.items():
        for method, correct in methods.items():
            cells.append(_cell(model, method, "lama", _acc(correct)))
            cells.append(_cell(model, method, "ppl-token", _nll([3 + 0.1 * sum(correct) + 0.01 * i for i in range(4)])))
    cells.append(_cell("mz", "ccc", "ppl-token", _nll([3.5, 3.6, 3.7, 3.8])))
    return cells


def test_pooled_rows_take_each_model_that_can_be_paired_and_skip_the_rest():
    from acbench.leaderboard.across_models import pooled_rows
    from acbench.leaderboard.tables import Column

    grouped = _hand_grouped()
    models = ["mw", "mx", "my", "mz"]
    cols = [Column("no direction", "lama", "p@1", None), Column("lama p@1", "lama", "p@1", True),
            Column("ppl", "ppl-token", "ppl", False)]
    rows = pooled_rows(grouped, ("rank", 0.5), models, cols, "pca", set())
    got = [(r["method"], r["column"].task, sorted(r["per_model"])) for r in rows]
    assert got == [("bbb", "lama", ["mx", "my"]), ("ccc", "lama", ["mx", "my"]), ("svd", "lama", ["mx", "my", "mz"]),
                   ("bbb", "ppl-token", ["mx", "my"]), ("ccc", "ppl-token", ["mx", "my", "mz"]),
                   ("svd", "ppl-token", ["mx", "my", "mz"])]
    svd = rows[2]
    assert svd["per_model"]["my"]["diff"] == 0 and svd["better"] == 1  # mz only: mx worse, my the same
    # a model at chance on a task is left out of that task's rows only
    rows = pooled_rows(grouped, ("rank", 0.5), models, cols, "pca", {("mx", "lama")})
    assert [(r["method"], sorted(r["per_model"])) for r in rows if r["column"].task == "lama"] == [
        ("svd", ["my", "mz"])]


def test_pooled_table_marks_a_difference_of_exactly_zero():
    from acbench.leaderboard.across_models import pooled_rows, pooled_table
    from acbench.leaderboard.tables import Column

    models = ["mx", "my", "mz"]
    rows = pooled_rows(_hand_grouped(), ("rank", 0.5), models, [Column("lama p@1", "lama", "p@1", True)], "pca", set())
    line = next(l for l in pooled_table(rows, models, "pca").splitlines() if l.startswith("| svd "))
    assert "| 1 of 3 (− = +) |" in line
    bbb = next(l for l in pooled_table(rows, models, "pca").splitlines() if l.startswith("| bbb "))
    assert "| 1 of 2 (+ − ·) |" in bbb
    header = pooled_table(rows, models, "pca").splitlines()[0]
    assert "random-effects Δ (DerSimonian-Laird, HKSJ interval)" in header  # svd pools three models
    two = pooled_rows(_hand_grouped(), ("rank", 0.5), models[:2], [Column("lama p@1", "lama", "p@1", True)], "pca",
                      set())
    head = pooled_table(two, models[:2], "pca").splitlines()[0]
    assert "random-effects" not in head and head.rstrip(" |").endswith("all items (stratified exact)")


def test_scenarios_name_the_methods_left_out_for_lacking_one():
    from acbench.leaderboard.across_models import scenarios
    from acbench.leaderboard.tables import Column

    cols = [Column("lama p@1", "lama", "p@1", True)]
    scen, left, mixed = scenarios(_hand_grouped(), ("rank", 0.5), ["mx", "my"], cols, set())
    assert [label for label, _, _ in scen] == ["mx / lama p@1", "my / lama p@1"]
    assert sorted(scen[0][1]) == ["bbb", "ccc", "pca", "svd"] and left == ["aaa"] and mixed == []


def _scen(values: list[dict]) -> list:
    return [(f"s{i}", v, True) for i, v in enumerate(values)]


def test_ranking_lines_order_by_win_rate_and_say_the_verdict(monkeypatch, tmp_path):
    from acbench.leaderboard import across_models

    assert across_models.ranking_lines(("rank", 0.5), [], [], "t", tmp_path, []) == []
    one = across_models.ranking_lines(("rank", 0.5), _scen([{"zz": 0.9, "aa": 0.1}]), ["mm"], "t", tmp_path, [])
    body = [l for l in "\n".join(one).splitlines() if l.startswith("| ")]
    assert body[1].startswith("| zz ") and body[2].startswith("| aa ")  # the better first, not the first by name
    assert one[-4:] == ["- left out of the ranking for lacking a scenario the others have: mm", "",
                        "- Friedman's test needs at least 3 methods; with 2, read the pooled differences above", ""]

    titles = []
    monkeypatch.setattr(across_models.plots, "critical_difference",
                        lambda mean, cd, cl, title, path: titles.append(title) or path)
    clear = _scen([{"c": 0.9, "b": 0.5, "a": 0.1}] * 6)  # every scenario ranks c > b > a
    lines = across_models.ranking_lines(("rank", 0.5), clear, [], "rank 0.5", tmp_path, [])
    fr = friedman([{"c": 1, "b": 2, "a": 3}] * 6)
    assert fr["p"] < 0.05
    assert lines[-4:] == [
        f"- Friedman χ² = {fr['statistic']:.2f} (df 2, n = 6 scenarios), p = {fr['p']:.2g}: the mean ranks differ at "
        f"the 0.05 level; Nemenyi critical difference at 0.05: {nemenyi_cd(3, 6):.2f} mean ranks", "",
        "![critical difference diagram](plots/across_models_cd_rank_0.5.png)", ""]
    assert titles == ["rank 0.5: mean rank over 6 scenarios"]

    mixed = _scen([{"c": 0.9, "b": 0.5, "a": 0.1}, {"c": 0.1, "b": 0.9, "a": 0.5}, {"c": 0.5, "b": 0.1, "a": 0.9}])
    lines = across_models.ranking_lines(("rank", 0.5), mixed, [], "rank 0.5", tmp_path, [])  # exactly 3: a figure
    assert "no difference between the mean ranks is shown at the 0.05 level" in lines[-4]
    assert lines[-2:] == ["![critical difference diagram](plots/across_models_cd_rank_0.5.png)", ""]
    two = across_models.ranking_lines(("rank", 0.5), mixed[:2], [], "rank 0.5", tmp_path, [])
    assert not any("critical difference diagram" in l for l in two) and two[-1] == ""


def test_the_section_names_models_at_chance_and_flat_rows_per_pooled_verdict(tmp_path):
    """The section itself on hand-built cells: the models at chance in one line, a budget where nothing pairs with the
    reference said so, and one flat row per pooled verdict with its keys (what LEADERBOARD.json and .csv hold)."""
    from acbench.leaderboard.across_models import across_models_section
    from acbench.leaderboard.tables import Display, group_cells

    cells = []
    for model, dense in (("ma", [1] + [0] * 9), ("mb", [0] * 9 + [1]), ("mc", [1] * 9 + [0])):
        cells.append(_cell(model, "dense", "lama", _acc(dense)))
        cells.append(_cell(model, "pca", "lama", _acc([1] * 5 + [0] * 5)))
        cells.append(_cell(model, "svd", "lama", _acc([1] * 3 + [0] * 7)))
        cells.append(_cell(model, "svd", "ppl-token", _nll([3.0, 3.1, 3.2])))  # no pca to pair with
    flat, written = [], []
    md = across_models_section(group_cells(cells), "pca", Display(), tmp_path, written, flat)
    assert "- at chance, so left out of the pooled verdicts and the ranking: lama on ma, lama on mb" in md
    i = md.index("- no method can be paired with `pca` on the same items in two or more models")
    assert md[i + 1] == "" and md[0] == "## Across models"
    assert flat == []  # lama pairs on mc alone, ppl-token nowhere

    cells = [c for c in cells if c.cell.model != "ma"] + [_cell("ma", m, "lama", _acc(v)) for m, v in
                                                          (("dense", [1] * 9 + [0]), ("pca", [1] * 4 + [0] * 6),
                                                           ("svd", [1] * 6 + [0] * 4))]
    flat = []
    across_models_section(group_cells(cells), "pca", Display(), tmp_path, [], flat)
    assert [(r["model"], r["budget"], r["rank"], r["scope"], r["method"], r["task"], r["reference"], r["models"])
            for r in flat] == [("across models", "rank", 0.5, "all", "svd", "lama", "pca", 2)]
    assert set(flat[0]) == {"model", "budget", "rank", "scope", "method", "task", "reference", "models", "better in",
                            "significantly better in (Holm)", "significantly worse in (Holm)", "common Δ",
                            "common Δ lo", "common Δ hi", "common Δ p",
                            "pooled Δ", "pooled Δ lo", "pooled Δ hi", "pooled Δ p", "tau2", "I2", "stratified Δ",
                            "stratified p", "Hartung-Knapp lo", "Hartung-Knapp hi", "Hartung-Knapp p"}
    assert flat[0]["better in"] == 1 and flat[0]["common Δ lo"] < flat[0]["common Δ"] < flat[0]["common Δ hi"]
    assert flat[0]["pooled Δ"] is None and flat[0]["Hartung-Knapp p"] is None  # two models: no random effects


def test_the_section_keeps_every_line_and_every_row_and_column_when_methods_left_out(monkeypatch, tmp_path):
    """On the hand-built four models: a body row has exactly the header's columns (with four models, no
    Hartung-Knapp cell either), a method lacking a scenario is named in the section, and the figure is titled by
    the budget."""
    from acbench.leaderboard import across_models
    from acbench.leaderboard.tables import Display, group_cells

    titles = []
    monkeypatch.setattr(across_models.plots, "critical_difference",
                        lambda mean, cd, cl, title, path: titles.append(title) or path)
    md = across_models.across_models_section(_hand_grouped(), "pca", Display(), tmp_path, [], [])
    table = next(block for block in md if block.startswith("| method "))
    widths = {line.count("|") for line in table.splitlines()}
    assert len(widths) == 1, table  # every row as wide as the header
    assert "HKSJ interval" in table  # four models: random effects, with the Hartung-Knapp-Sidik-Jonkman interval
    assert md[0] == "## Across models" and any(line.startswith("### rank ratio 0.5: 4 models") for line in md)
    # two of those models: every method but aaa (on mx alone) is ranked over their four scenarios
    two = group_cells([c for c in _hand_cells() if c.cell.model in ("mx", "my")])
    md = across_models.across_models_section(two, "pca", Display(), tmp_path, [], [])
    assert "- left out of the ranking for lacking a scenario the others have: aaa" in md
    assert titles == ["rank ratio 0.5: mean rank over 4 scenarios"]


def test_ranking_lines_name_every_method_left_out():
    from acbench.leaderboard import across_models

    lines = across_models.ranking_lines(("rank", 0.5), _scen([{"zz": 0.9, "aa": 0.1}]), ["mm", "nn"], "t",
                                        Path("."), [])
    assert "- left out of the ranking for lacking a scenario the others have: mm, nn" in lines


def test_the_flat_rows_carry_the_stratified_test_and_the_common_effect(tmp_path):
    """Two models (ma: svd right on 2 items pca misses; mc: pca right on 2 items svd misses): over the 20 items
    the stratified difference is 9/20 - 9/20 = 0 with 2 discordant pairs each way (p = 1), the common effect sits
    between the two models' own, and with two models there is no random-effects estimate."""
    from acbench.leaderboard.across_models import across_models_section
    from acbench.leaderboard.tables import Display, group_cells

    cells = []
    for model, pca, svd in (("ma", [1] * 4 + [0] * 6, [1] * 6 + [0] * 4), ("mc", [1] * 5 + [0] * 5, [1] * 3 + [0] * 7)):
        cells += [_cell(model, "dense", "lama", _acc([1] * 9 + [0])), _cell(model, "pca", "lama", _acc(pca)),
                  _cell(model, "svd", "lama", _acc(svd))]
    flat = []
    across_models_section(group_cells(cells), "pca", Display(), tmp_path, [], flat)
    (row,) = flat
    assert row["stratified Δ"] == 0.0 and row["stratified p"] == 1.0
    assert row["common Δ lo"] < row["common Δ"] < row["common Δ hi"] and -0.2 < row["common Δ"] < 0.2
    assert row["pooled Δ"] is None and row["Hartung-Knapp lo"] is None
    assert row["significantly better in (Holm)"] == 0 and row["significantly worse in (Holm)"] == 0


def test_every_scenario_scored_on_other_items_is_named_and_the_rest_of_the_section_stays(tmp_path, three_models):
    import shutil

    _, out, _ = three_models
    root = tmp_path / "results"
    shutil.copytree(out / "results", root)
    for model in ("model-x", "model-y"):
        _pca_rerun_on_five_windows(root, model)
    build_report([root], tmp_path / "L.md")
    text = (tmp_path / "L.md").read_text()
    assert ("- left out of the ranking, its methods scored on different items (a rerun at other sizes): "
            "model-x / ppl-token ppl, model-y / ppl-token ppl\n\n") in text
    section = text[text.index("## Across models"):]
    assert "### rank ratio 0.5: 3 models" in section and "| method " in section
