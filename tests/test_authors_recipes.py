"""The authors' recipes as settings, each shown to change the deployed model, and the perplexity protocols the papers
score with: magnitude pruning compared per matrix (Wanda's baseline), TEAL's prefill half and its greedy densities
(also WINA's), ppl-token's sliding windows (TEAL's evaluation), and the key of every stored result unchanged at the
settings' defaults."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from acbench import methods
from acbench.core.stats import SparsitySpec
from acbench.deploy.compression import compressed

from conftest import one_block_with_c, tiny_model


@pytest.fixture(scope="module")
def block():
    return one_block_with_c()


@pytest.fixture(scope="module")
def block_with_hist():
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups

    model = tiny_model("llama", hidden=32, inter=48, layers=2)
    windows = torch.randint(0, 101, (4, 32), generator=torch.Generator().manual_seed(2))
    groups = find_input_groups(model)
    return model, groups, calibrate(model, groups, windows, frozenset({"abs_hist"}), CalibSpec(), progress=False)


def _weights(model, groups):
    return {n: model.get_submodule(n).weight.detach().clone() for g in groups for n in g.site_names}


def test_magnitude_per_layer_keeps_one_share_of_each_matrix_and_differs_from_per_row(block):
    model, groups, stats = block
    half = SparsitySpec.parse("0.5")
    deployed = {}
    for variant in ("magnitude-prune", "magnitude-prune:comparison=layer"):
        with compressed(model, variant, half, stats, progress=False) as (m, _):
            deployed[variant] = _weights(m, groups)
    per_row, per_layer = deployed["magnitude-prune"], deployed["magnitude-prune:comparison=layer"]
    dense = _weights(model, groups)
    assert any(not torch.equal(per_row[n], per_layer[n]) for n in dense)
    for n, W in dense.items():
        kept = per_layer[n] != 0
        assert int(kept.sum()) == round(0.5 * W.numel())
        # per matrix: every kept |W| at least every dropped one (by hand, over the whole matrix)
        assert W.abs()[kept].min() >= W.abs()[~kept].max()
        rows = (per_row[n] != 0).sum(1)
        assert bool((rows == rows[0]).all())  # per row: the same count in every row


def test_magnitude_per_layer_refuses_an_n_m_pattern_in_one_line():
    problem = methods.pattern_problem("magnitude-prune:comparison=layer", SparsitySpec.parse("2:4"))
    assert "comparison=layer" in problem and "--sparsity 0.5" in problem
    assert methods.pattern_problem("magnitude-prune", SparsitySpec.parse("2:4")) is None


def test_teal_prefill_half_leaves_the_first_half_dense_and_sparsifies_the_rest(block_with_hist):
    model, groups, stats = block_with_hist
    g = groups[0]
    x = torch.randn(1, 8, g.d_in, generator=torch.Generator().manual_seed(3))
    outs = {}
    for variant in ("teal", "teal:prefill_half=true"):
        with compressed(model, variant, SparsitySpec.parse("0.5"), stats, progress=False) as (m, _):
            with torch.no_grad():
                outs[variant] = m.get_submodule(g.site_names[0])(x)
    with torch.no_grad():
        dense = g.sites[0](x)
    every, half = outs["teal"], outs["teal:prefill_half=true"]
    assert torch.allclose(half[:, :4], dense[:, :4], atol=1e-6)  # the prompt half as the dense model computes it
    assert torch.allclose(half[:, 4:], every[:, 4:], atol=1e-6)  # the rest as TEAL sparsifies every token
    assert not torch.allclose(every[:, :4], dense[:, :4], atol=1e-4)


def test_a_checkpoint_keeps_teals_prefill_half(block_with_hist, tmp_path):
    from acbench.deploy.apply import LAYOUT_KEY

    model, groups, stats = block_with_hist
    with compressed(model, "teal:prefill_half=true", SparsitySpec.parse("0.5"), stats, progress=False) as (m, _):
        layout = getattr(m.config, LAYOUT_KEY)
        assert {spec.get("dense_prefix") for spec in layout.values()} == {0.5}
        assert "first 0.5 of each sequence dense" in repr(m.get_submodule(groups[0].site_names[0]))
    with compressed(model, "teal", SparsitySpec.parse("0.5"), stats, progress=False) as (m, _):
        assert all("dense_prefix" not in spec for spec in getattr(m.config, LAYOUT_KEY).values())


def test_a_dense_prefix_without_a_threshold_is_refused():
    from acbench.methods.base import SparseActivation

    problem = SparseActivation(pattern=SparsitySpec.parse("0.5"), dense_prefix=0.5).deployment_problem()
    assert problem and "threshold" in problem


def test_greedy_densities_change_teal_and_wina_as_their_authors_allocate(block_with_hist):
    from acbench.deploy.allocation import allocate_density

    model, groups, stats = block_with_hist
    pattern = SparsitySpec.parse("0.5")
    alloc = allocate_density("greedy", groups, stats, pattern)
    assert len(set(alloc.densities.values())) > 1  # the groups do not all keep half
    for method in ("teal", "wina"):
        assert methods.get_method(method).takes_group_density
        with compressed(model, method, pattern, stats, progress=False, densities=alloc.densities) as (m, s):
            greedy = [x["density"] for x in s]
        with compressed(model, method, pattern, stats, progress=False) as (m, s):
            uniform = [x["density"] for x in s]
        assert greedy != uniform and set(uniform) == {0.5}


def test_teals_authors_calibration_is_declared_with_its_source():
    own = methods.get_method("teal").authors_calibration
    assert (own.samples, own.seq_len, own.mode) == (10, 2048, "one-pass") and "grab_acts" in own.source


# ----------------------------------------------------------------------------------- the evaluation protocols


def test_sliding_windows_advance_by_the_scored_tokens_and_score_only_them():
    from acbench.tasks.data import text_data

    class Words:
        bos_token_id = 0

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [int(w) for w in text.split()]}

    ids = torch.arange(1, 101)
    original = text_data.text_ids
    try:
        text_data.text_ids = lambda tok, text, bos: ids if bos != "stream" else torch.cat([torch.tensor([0]), ids])
        rows = text_data.sliding_windows(Words(), "x", 20, 5, None, "none")
    finally:
        text_data.text_ids = original
    assert rows.shape == (17, 20)  # (100 - 20) // 5 + 1
    assert rows[0].tolist() == list(range(1, 21)) and rows[1].tolist() == list(range(6, 26))
    # every token after the first window's context is scored exactly once: each window's last 5
    scored = [t for r in rows for t in r[-5:].tolist()]
    assert scored == list(range(16, 101))


def test_ppl_token_sliding_scores_the_last_tokens_of_each_window(monkeypatch):
    from acbench.tasks import perplexity

    model = tiny_model("llama")
    text = " ".join(f"word{i % 37} and {i}" for i in range(80))

    class Tok:
        bos_token_id = None

    monkeypatch.setattr(perplexity, "load_text", lambda source, part: text)
    ids = torch.randint(0, 101, (200,), generator=torch.Generator().manual_seed(0))
    from acbench.tasks.data import text_data

    monkeypatch.setattr(text_data, "text_ids", lambda tok, t, bos: ids)
    task = perplexity.PPLToken.from_options({"seq_len": 24, "scored": 8, "max_windows": 5, "bos": "none"})
    got = task.evaluate(model, Tok(), progress=False)
    assert got.details["n_windows"] == 5 and got.details["n_tokens"] == 40 and got.details["scored_per_window"] == 8
    with torch.no_grad():
        for w, rec in enumerate(got.records):
            window = ids[w * 8: w * 8 + 24].unsqueeze(0)
            logp = torch.log_softmax(model(window).logits[0, :-1].double(), -1)
            nll = -logp[torch.arange(23), window[0, 1:]]
            assert rec["nll"] == pytest.approx(float(nll[-8:].mean()), rel=1e-4)
    assert got.config["scored"] == 8 and "sliding" in got.details["protocol"]
    assert got.metrics["ppl"] == pytest.approx(math.exp(sum(r["nll"] for r in got.records) / 5), rel=1e-9)


def test_settings_added_later_leave_the_stored_keys_as_they_were():
    from acbench.runner.cells import task_key
    from acbench.tasks import perplexity

    default = perplexity.PPLToken.from_options({})
    assert "scored" not in default.settings_dict()
    assert task_key(default) == task_key(perplexity.PPLToken.from_options({"scored": None}))
    assert task_key(default) != task_key(perplexity.PPLToken.from_options({"seq_len": 256, "scored": 64}))
    for variant, added in (("teal", "prefill_half"), ("magnitude-prune", "comparison")):
        assert added not in methods.build(variant).settings_dict()
    assert methods.build("teal:prefill_half=true").settings_dict() == {"prefill_half": True}


@settings(max_examples=60, deadline=None)
@given(scored=st.one_of(st.none(), st.integers(-3, 40), st.booleans(), st.text(max_size=3), st.floats()),
       seq_len=st.integers(-1, 40))
def test_hostile_scored_settings_are_refused_in_one_line_or_built(scored, seq_len):
    from acbench.tasks import perplexity

    try:
        task = perplexity.PPLToken.from_options({"scored": scored, "seq_len": seq_len})
    except (TypeError, ValueError) as e:
        assert "\n" not in str(e) and ("scored" in str(e) or "seq_len" in str(e))
        return
    assert isinstance(task.settings.scored, (int, type(None))) and not isinstance(task.settings.scored, bool)


@settings(max_examples=40, deadline=None)
@given(variant=st.sampled_from(["magnitude-prune", "teal"]), key=st.sampled_from(["comparison", "prefill_half"]),
       value=st.one_of(st.text(max_size=6), st.booleans(), st.integers(-2, 2), st.none()))
def test_hostile_recipe_settings_are_refused_in_one_line_or_built(variant, key, value):
    try:
        comp = methods.build(variant, {key: value})
    except (KeyError, TypeError, ValueError) as e:
        assert "\n" not in str(e).strip()
        return
    assert value is None or getattr(comp.settings, key) in ("row", "layer", True, False)  # None: the default


# ------------------------------------------------------------------------- the papers' texts (--literal)


class _Rows(dict):
    """A stand-in for a datasets split: its "text" column."""


def test_c4_reads_the_shards_sparsegpt_reads_from_a_local_stand_in(monkeypatch):
    import datasets

    from acbench.core.errors import UserError
    from acbench.tasks.data import text_data

    asked = []

    def stand_in(path, data_files=None, split=None, **kw):
        asked.append((path, data_files, split))
        return _Rows(text=[f"document {i} of the shard" for i in range(1500)])

    monkeypatch.setattr(datasets, "load_dataset", stand_in)
    calib, test = text_data.load_text("c4", "calib"), text_data.load_text("c4", "eval")
    assert asked == [("allenai/c4", {"train": "en/c4-train.00000-of-01024.json.gz"}, "train"),
                     ("allenai/c4", {"train": "en/c4-validation.00000-of-00008.json.gz"}, "train")]
    assert calib.count("\n\n") == 1499 and test.count("\n\n") == 1099  # validation: its first 1,100 documents

    def unreachable(*a, **kw):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(UserError) as e:
        text_data.load_text("c4", "calib")
    assert "C4 (en/c4-train" in str(e.value) and "file:<path>" in str(e.value) and "\n" not in str(e.value)


def test_literal_plan_calibrates_each_method_on_its_authors_set_and_scores_wikitext2(monkeypatch, tmp_path):
    """--literal: SparseGPT and Wanda on C4, SVD-LLM on WikiText-2 train, the perplexity on all of WikiText-2 test;
    a method whose authors' set the hub does not give (TEAL's Alpaca) keeps the embedded text, and its row says so."""
    import acbench
    from acbench.studies import reproductions

    calls = []
    monkeypatch.setattr(acbench, "sweep", lambda **kw: calls.append(kw))
    reproductions.run_part("m", tmp_path, progress=False, literal=True)
    by_method = {}
    for c in calls:
        for m in c["methods"]:
            by_method.setdefault(m, set()).add(c.get("calib_source"))
    assert by_method["sparsegpt"] == by_method["wanda"] == {"c4"}
    assert by_method["svd-llm-v2"] == {"wikitext2"}
    assert by_method["teal:prefill_half=true"] == {None}
    ppl = [c["task_options"]["ppl-token"] for c in calls if "ppl-token" in c.get("task_options", {})]
    assert ppl and all(o["source"] == "wikitext2" for o in ppl if o["seq_len"] == 2048)
    assert all(o.get("source") is None for o in ppl if o["seq_len"] == 2560)  # TEAL's Alpaca: not on the hub
    assert not any(c.get("task_options", {}).get("ppl-token", {}).get("seq_len") == 256 for c in calls)


def test_a_literal_cell_has_no_text_difference_left(monkeypatch):
    from acbench.studies.protocols import calibration_differences, evaluation_differences
    from acbench.studies.reproductions import CLAIMS

    from conftest import hand_cell

    claim = CLAIMS[0]  # Wanda's: SparseGPT level with Wanda
    cal = {"spec": {"samples": 128, "seq_len": 2048, "source": "c4", "mode": "sequential"},
           "authors": {"samples": 128, "seq_len": 2048, "mode": "sequential", "data": "C4 train segments"}}
    cell = hand_cell("m", "sparsegpt", "ppl-token", 0.5, [3.0], budget="unstructured", calibration=cal,
                     task_config=claim.task_options("ppl-token", literal=True))
    assert calibration_differences(cell) == []
    assert evaluation_differences(claim.protocol, cell) == []
    cell.calibration["spec"]["source"] = "wiki"
    cell.task_config["source"] = "wiki"
    assert [d.part for d in calibration_differences(cell)] == ["sparsegpt calibration text"]
    assert [d.part for d in evaluation_differences(claim.protocol, cell)] == ["evaluation text"]


# ------------------------------------------------------------------------------------- R-Sparse's search


@pytest.fixture(scope="module")
def block_with_tokens():
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups

    model = tiny_model("llama", hidden=32, inter=48, layers=2)
    windows = torch.randint(0, 101, (4, 32), generator=torch.Generator().manual_seed(4))
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, frozenset({"tokens"}), CalibSpec(pair_tokens=64), progress=False)
    return model, groups, stats


def test_the_token_sample_needs_no_gradient(block_with_tokens):
    from acbench import methods

    model, groups, stats = block_with_tokens
    s = stats[groups[0].name]
    assert s.xs is not None and s.xs.shape[1] == groups[0].d_in and s.gs is None and s.F is None
    assert 1 <= s.xs.shape[0] <= 64
    comp = methods.build("r-sparse:search=true")
    assert comp.required_stats() == {"tokens"} and comp.capabilities()["gradients"] is False
    assert methods.build("r-sparse").required_stats() == frozenset()


def test_r_sparse_search_picks_the_split_that_reproduces_the_sample_best_and_deploys_it(block_with_tokens):
    from acbench.methods.r_sparse import RHO_GRID, search_errors

    model, groups, stats = block_with_tokens
    half = SparsitySpec.parse("0.5")
    with compressed(model, "r-sparse:search=true", half, stats, progress=False) as (m, summaries):
        chosen = {s["group"]: s["sparse_ratio"] for s in summaries}
        for g in groups:
            weights = {n: w.weight.detach() for n, w in zip(g.site_names, g.sites)}
            errors = search_errors(weights, stats[g.name].xs, 0.5)
            assert chosen[g.name] == min(errors, key=errors.get) and set(errors) == set(RHO_GRID)
            # the search's model of the deployed form is the deployed form: the chosen split's error, recomputed
            # through the deployed sites on the same inputs, is the one the search read
            x = stats[g.name].xs
            with torch.no_grad():
                got = sum(float((m.get_submodule(n)(x).double() - x.double() @ w.double().T).pow(2).sum())
                          for n, w in weights.items())
            assert got == pytest.approx(errors[chosen[g.name]], rel=1e-4)
    assert set(chosen.values()) != {0.95}  # the search moved off the uniform setting somewhere
    with compressed(model, "r-sparse", half, stats, progress=False) as (m, summaries):
        assert {s["sparse_ratio"] for s in summaries} == {0.95}
