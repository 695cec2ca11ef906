"""The 2025 baselines at their edges, with numbers worked out by hand: each setting's refusal names the authors'
value, each bound is where the paper puts it, the numeric fallbacks are recorded as they happen, and the prices
`bench plan` reads are the budget formulas written out."""

import math

import pytest
import torch

from acbench import methods
from acbench.testing import FakeGroup, random_stats, random_weights
from acbench.core.linalg import NumericError
from acbench.core.stats import SparsitySpec
from acbench.methods.larosa import LaRoSaSettings
from acbench.methods.r_sparse import RSparse, RSparseSettings, budget
from acbench.methods.sparsegpt import SparseGPTSettings, inverse_hessian_factor
from acbench.methods.wina import Wina, WinaSettings


@pytest.mark.parametrize("make,bad,says", [
    (lambda v: SparseGPTSettings(damping=v), 1, "in (0, 1): the authors use 0.01"),
    (lambda v: SparseGPTSettings(block_size=v), 0, "positive whole number: the authors use 128"),
    (lambda v: RSparseSettings(sparse_ratio=v), 1.5, "1 is pure sparsity, 0.95 the uniform setting"),
    (lambda v: LaRoSaSettings(out_factor=v), 10.5, "the authors use 0.8 (in) and 1.2 (out)"),
    (lambda v: WinaSettings(weighted=v), "some", "or all (every matrix by its own)"),
])
def test_each_refusal_names_the_authors_setting(make, bad, says):
    with pytest.raises(ValueError) as e:
        make(bad)
    assert str(e.value).endswith(says)  # the whole line, to its last word


def test_the_bounds_are_inclusive_where_the_papers_allow_the_value():
    assert SparseGPTSettings(block_size=1).block_size == 1
    assert RSparseSettings(sparse_ratio=1).sparse_ratio == 1
    assert LaRoSaSettings(in_factor=10).in_factor == 10


def test_a_damping_raised_is_recorded_with_what_was_asked():
    """H = [[1, 1.05], [1.05, 1]] has the eigenvalue -0.05: Cholesky fails at 0.01 of its mean diagonal and holds
    at 0.1 (one tenfold step)."""
    H = torch.tensor([[1.0, 1.05], [1.05, 1.0]], dtype=torch.float64)
    _, _, fallbacks = inverse_hessian_factor(H, 0.01)
    assert fallbacks == [{"fallback": "sparsegpt damping raised", "damping": pytest.approx(0.1), "asked": 0.01}]


def test_a_hessian_singular_at_damping_1_is_refused_in_one_line():
    H = torch.tensor([[1.0, 3.0], [3.0, 1.0]], dtype=torch.float64)  # eigenvalue -2: no damping up to 1 mends it
    with pytest.raises(NumericError, match=r"^sparsegpt: H = E\[x x\^T\] stays singular with damping 1: recalibrate "
                                           r"on more tokens$"):
        inverse_hessian_factor(H, 0.01)


def test_sparsegpt_blocks_round_up_to_whole_n_m_groups():
    """block_size 6 under 2:4 works in blocks of 8: every row keeps exactly 2 of each 4 consecutive weights."""
    weights, stats = random_weights((7, 5), 16), random_stats(16)
    res = methods.build("sparsegpt:block_size=6").compress(FakeGroup(weights), stats, SparsitySpec.parse("2:4"))
    for mask in res.masks.values():
        assert (mask.reshape(mask.shape[0], -1, 4).sum(-1) == 2).all()
    assert res.summary()["dead_inputs"] == 0


def test_r_sparse_budget_by_hand():
    assert budget(4, 3, 0.1, 1.0) == (1, 0)  # floor(0.3) channels: at least one
    assert budget(48, 64, 0.5, 0.5) == (16, 6)  # k = floor(64 * 0.5 * 0.5); r = floor((1536 - 768) / 112)


def test_r_sparse_prices_its_groups_by_the_budget_formula():
    group = FakeGroup({"a": torch.zeros(48, 64), "b": torch.zeros(32, 64)})
    cost = RSparse(RSparseSettings(sparse_ratio=0.5)).group_cost(group, SparsitySpec(density=0.5))
    # k = 16; ranks 6 and 5; macs 16 * 48 + 6 * 112 + 16 * 32 + 5 * 96, params 64 * 80 + 6 * 112 + 5 * 96
    assert cost == (2432, 6272, 2 * SparsitySpec(density=0.25).index_bits(64))
    assert RSparse().group_cost(group, SparsitySpec(density=1.0)) == (64 * 80, 64 * 80, 0)  # dense: no branch


def test_r_sparse_records_its_budget_and_refuses_n_m_in_compress():
    weights, stats = random_weights((7, 5), 16), random_stats(16)
    res = methods.build("r-sparse:sparse_ratio=0.5").compress(FakeGroup(weights), stats, SparsitySpec(density=0.5))
    summary = res.summary()
    assert summary["sparse_ratio"] == 0.5 and summary["k"] == 4
    with pytest.raises(ValueError, match="not an N:M pattern"):
        RSparse().compress(FakeGroup(weights), stats, SparsitySpec.parse("2:4"))


def test_wina_weighs_a_bare_site_name_and_counts_one_mask_per_weighted_matrix():
    assert Wina().weighs("k_proj") and not Wina().weighs("v_proj")
    group = FakeGroup({"q_proj": torch.zeros(8, 16), "k_proj": torch.zeros(4, 16)})
    p = SparsitySpec(density=0.5)
    bits = p.index_bits(16)
    assert Wina().group_cost(group, p)[2] == 2 * bits  # k_proj's own mask and q_proj's |x| one
    assert Wina(WinaSettings(weighted="all")).group_cost(group, p)[2] == 2 * bits  # one each, no plain mask


def test_cats_settings_free_and_its_threshold_is_recorded():
    weights, stats = random_weights((7, 5), 16), random_stats(16)
    res = methods.build("cats").compress(FakeGroup(weights), stats, SparsitySpec(density=0.5))
    s = res.summary()
    assert s["cats_role"] == "threshold" and s["threshold"] == res.threshold and math.isfinite(res.threshold)
    assert s["index_bits_per_token"] == SparsitySpec(density=0.5).index_bits(16)


def test_svd_llm_v2_types_take_out_the_block_index_only():
    from acbench.methods.svd_llm_v2 import matrix_type

    assert matrix_type("model.layers.3.mlp.experts.7.down_proj") == "model.layers.#.mlp.experts.7.down_proj"


def test_svd_llm_v2_loss_is_the_norm_of_the_dropped_singular_values():
    from acbench.methods.svd_llm_v2 import truncation_loss

    W = torch.diag(torch.tensor([5.0, 3.0, 2.0], dtype=torch.float64))
    eye, ones = torch.eye(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    assert truncation_loss(W, eye, ones, 1) == pytest.approx(math.sqrt(9 + 4))  # not (27 + 8) ** 0.5


def _site(kind, loss, k=4, m=16, n=16):
    return {"type": kind, "loss": loss, "k": k, "m": m, "n": n}


def test_svd_llm_v2_allocation_by_hand():
    from acbench.methods.svd_llm_v2 import allocate_ranks

    # two weights at ratio 0.5 each (k = 4 of 16 x 16); 1 / log L = 1 and 1/2: R_i = 2/3 and 1/3 of the doubled mean
    ks, fb = allocate_ranks({"b.0.q": _site("b.#.q", math.e), "b.1.q": _site("b.#.q", math.e ** 2)})
    assert ks == {"b.0.q": 2, "b.1.q": 5} and fb == []  # floor(8/3), floor(16/3)
    # L = 1.5 has a log: reallocated too (the undefined case is L <= 1 only)
    assert allocate_ranks({"c.0.q": _site("c.#.q", 1.5), "c.1.q": _site("c.#.q", math.e)})[0] != {"c.0.q": 4, "c.1.q": 4}


def test_svd_llm_v2_fallbacks_are_recorded_as_they_happen():
    from acbench.methods.svd_llm_v2 import allocate_ranks

    ks, fb = allocate_ranks({"a.0.q": _site("a.#.q", 1.0), "a.1.q": _site("a.#.q", 5.0)})
    assert ks == {"a.0.q": 4, "a.1.q": 4}
    assert fb == [{"fallback": "svd-llm-v2 uniform ranks", "type": "a.#.q", "site": "a.0.q",
                   "reason": "a least truncation loss <= 1 (1 / log L is undefined)"}]
    assert allocate_ranks({"s.0.q": _site("s.#.q", 0.5)}) == ({"s.0.q": 4}, [])  # one weight: nothing to move, no fallback
    ks, fb = allocate_ranks({"x.0.q": _site("x.#.q", math.exp(0.01)), "x.1.q": _site("x.#.q", math.exp(10))})
    assert ks == {"x.0.q": 1, "x.1.q": 7}
    assert fb == [{"fallback": "svd-llm-v2 rank clipped", "site": "x.0.q", "k": 0, "clipped_to": 1}]


def test_svd_llm_v2_truncation_does_not_depend_on_the_scale_of_c():
    """W' = W U_s diag(root) truncated, times diag(root)^-1 U_s^T: a C a millionth of another's gives the same W'
    (no direction dropped for being small in absolute terms)."""
    weights, stats = random_weights((7, 5), 16), random_stats(16)
    comp, group = methods.build("svd-llm-v2:allocate=false"), FakeGroup(weights)
    tiny = type(stats)(n_tokens=stats.n_tokens, C=stats.C * 1e-24)
    a, b = (comp.compress(group, s, methods.RankSpec(0.4)) for s in (stats, tiny))
    for n in weights:
        wa, wb = (r.factors[n][0].double() @ r.factors[n][1].double() for r in (a, b))
        assert torch.allclose(wa, wb, rtol=1e-4, atol=1e-6)


def test_svd_llm_v2_refuses_non_finite_statistics_before_allocating():
    from acbench.testing import poisoned

    group = FakeGroup(random_weights((7,), 16))
    with pytest.raises(NumericError, match="^non-finite C statistics in svd-llm-v2: "):
        methods.build("svd-llm-v2").site_ranks([group], {"g": poisoned(random_stats(16), "C")}, methods.RankSpec(0.4))


def test_sparsegpt_and_svd_llm_v2_refuse_statistics_they_cannot_solve_from_in_their_own_words():
    g = FakeGroup(random_weights((8,), d=16))
    bad = random_stats(16, seed=0)
    bad.C[0, 0] = float("nan")
    for name in ("sparsegpt", "larosa"):
        with pytest.raises(NumericError, match=f"^non-finite C statistics in {name}: recalibrate") as e:
            methods.build(name).compress(g, bad, SparsitySpec.parse("0.5"))
        assert "\n" not in str(e.value)
        # the statistic whose full rank its solve relies on (a calibration shorter than the width is said so)
        assert methods.build(name).full_rank_stats() == frozenset({"C"})
    silent = random_stats(16, seed=0)
    silent.C.zero_()
    with pytest.raises(NumericError) as e:
        methods.build("svd-llm-v2").compress(g, silent, methods.RankSpec(0.5))
    assert str(e.value) == ("svd-llm-v2: the group's input has no variance (C = 0: it never fired in calibration); "
                            "calibrate on text that reaches it, or leave its kind out with --groups")


def test_svd_llm_v2_leaves_a_type_at_full_rank_as_it_is():
    """Every weight of a type already at full rank: nothing to move, and nothing recorded."""
    from acbench.methods.svd_llm_v2 import allocate_ranks

    ks, fallbacks = allocate_ranks({"b.0.q": _site("b.#.q", math.e, k=16), "b.1.q": _site("b.#.q", math.e ** 2, k=16)})
    assert ks == {"b.0.q": 16, "b.1.q": 16} and fallbacks == []
