"""Speed you can measure: the gathered decode product against the masked dense reference, the dense/variant switch
the interleaved latency rides on, the speedup interval, and the leaderboard's frontier line."""

import itertools
import math
import os

import pytest
import torch
from scipy import stats as sps

import acbench.core.compressed_layers as layers
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.deploy.compression import compressed, deploy
from acbench.model.groups import find_input_groups
from acbench.measure.latency import LatencySpec, compare_latency, latency, ratio_interval
from acbench.core.compressed_layers import InputSparsifier, SparseInputLinear
from acbench.core.sparsity import sparse_input, sparsify, top_indices, topk_mask
from acbench.core.stats import RankSpec, SparsitySpec
from acbench.leaderboard.formatting import FRONTIER_NLL, frontier_line
from acbench.leaderboard.tables import Column

from conftest import tiny_model

ALL_STATS = frozenset({"C", "F", "mean", "abs_mean"})
PATTERNS = [(2, 4), (8, 16), (16, 32), (32, 0), (16, 0)]  # 2:4, 8:16, 16:32, unstructured 0.5 and 0.25 of 64
MITIGATIONS = ["none", "variance", "shift", "median"]


def _site(n, m, mitigation, scaled, bias, d=64, d_out=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(d, d_out, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(d_out, d, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(d_out, generator=gen))
    scale = torch.rand(d, generator=gen) + 0.5 if scaled else None
    mu = torch.randn(d, generator=gen) if mitigation == "shift" else None
    sp = InputSparsifier(n, m, mitigation, scale, mu)
    return lin, sp, SparseInputLinear(lin, sp, owner=True), gen


@pytest.fixture(params=[1, 3, "triton"], ids=["one-bag", "split-in-3", "triton-interpreted"])
def bag_parts(request, monkeypatch):
    """The gathered product in one bag, and cut into 3 bags per row (as it is on a 3-thread CPU for large sites;
    3 does not divide the kept counts, so the last bag is shorter); and CUDA's Triton kernel, run by triton's
    interpreter on CPU, with tiles small enough that the tests' sites have a partial output tile and cut their
    kept channels into several splits."""
    if request.param == "triton":
        use_triton_interpreter(monkeypatch)
        yield "triton"
    elif request.param > 1:
        monkeypatch.setattr(layers, "SPLIT_MIN_PRODUCT", 0)
        threads = torch.get_num_threads()
        torch.set_num_threads(request.param)
        yield request.param
        torch.set_num_threads(threads)
    else:
        monkeypatch.setattr(layers, "SPLIT_MIN_PRODUCT", 1 << 62)
        yield 1


def use_triton_interpreter(monkeypatch, block_n=16, block_k=8):
    """The Triton kernel on CPU tensors, in triton's interpreter (conftest turns it on where CUDA is absent)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CUDA is present, so triton's interpreter is off: test_the_compiled_triton_kernel_on_cuda "
                    "tests the kernel there")
    pytest.importorskip("triton", reason="triton is not installed (the triton extra: pip install -e '.[triton]'; "
                                         ".ci/run installs it)")
    monkeypatch.setitem(layers._CHOSEN, "cpu", "triton")
    monkeypatch.setattr(layers, "TRITON_BLOCK_N", block_n)
    monkeypatch.setattr(layers, "TRITON_BLOCK_K", block_k)


@pytest.mark.parametrize("pattern,mitigation,scaled,bias", list(itertools.product(PATTERNS, MITIGATIONS, [False, True],
                                                                                  [False, True])))
def test_gathered_decode_product_equals_the_masked_dense_product(pattern, mitigation, scaled, bias, bag_parts):
    """One token: the fused gather-multiply over the kept channels' weight rows gives what the dense product of W
    with the masked x gives (plus the shift bias W mu, the median's eta W 1), to 1e-5 relative in float32."""
    n, m = pattern
    lin, sp, site, gen = _site(n, m, mitigation, scaled, bias)
    x = torch.randn(1, 1, 64, generator=gen) * 3 + 0.5
    with torch.no_grad():
        got = site(x)
        # the reference, written out: W (s(x)) + b, plus what the mitigation moved out of x
        xs, eta = sparsify(x, n, m, sp.scale, mitigation, sp.mu)
        want = lin(xs + (sp.mu if mitigation == "shift" else 0) + (eta[..., None] if eta is not None else 0))
    assert got.shape == want.shape == (1, 1, 24)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_the_gathered_form_is_taken_at_decode_and_the_masked_form_for_more_tokens(monkeypatch):
    calls = []
    real = layers.torch.embedding_bag
    monkeypatch.setattr(layers.torch, "embedding_bag", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, sp, site, gen = _site(8, 16, "none", False, True)
    with torch.no_grad():
        site(torch.randn(1, 1, 64, generator=gen))
        assert len(calls) == 1
        site(torch.randn(1, 5, 64, generator=gen))
        site(torch.randn(2, 1, 64, generator=gen))
        assert len(calls) == 1
        sp.gather = False
        site(torch.randn(1, 1, 64, generator=gen))
        assert len(calls) == 1


def test_bag_offsets_cut_each_row_into_at_most_parts_bags():
    offsets, per = layers.bag_offsets(2, 10, 3, "cpu")  # bags of 4, 4, 2 in each of two rows
    assert per == 3 and offsets.tolist() == [0, 4, 8, 10, 14, 18]
    offsets, per = layers.bag_offsets(1, 0, 2, "cpu")  # nothing kept: one empty bag, the output is zeros
    assert per == 1 and offsets.tolist() == [0]
    offsets, per = layers.bag_offsets(2, 2, 3, "cpu")  # fewer kept than parts: a bag per kept channel
    assert per == 2 and offsets.tolist() == [0, 1, 2, 3] and offsets.dtype == torch.long


@pytest.mark.parametrize("n,m", [(1, 4), (2, 4), (3, 8), (5, 0)])
def test_top_indices_name_exactly_the_masks_channels(n, m):
    score = torch.rand(6, 32, generator=torch.Generator().manual_seed(n + m))
    idx = top_indices(score, n, m)
    assert idx.shape == (6, n * 32 // m if m else n)
    got = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, idx, True)
    assert torch.equal(got, topk_mask(score, n, m))
    # the values sparse_input hands over are x at those channels, rescaled only by variance
    x = torch.randn(6, 32, generator=torch.Generator().manual_seed(7))
    i, v, eta = sparse_input(x, n, m)
    assert eta is None and torch.equal(v, x.gather(-1, i))


def test_one_weight_copy_input_major():
    lin, sp, site, _ = _site(2, 4, "none", False, True)
    params = dict(site.named_parameters())
    assert list(params) == ["weight_t"] and params["weight_t"].shape == (64, 24)
    assert params["weight_t"].is_contiguous() and torch.equal(params["weight_t"], lin.weight.t())


@pytest.mark.parametrize("variant", ["act-sparse", "act-sparse:mitigation=median", "act-sparse:mitigation=variance",
                                     "act-sparse:mitigation=shift,score=fisher"])
@pytest.mark.parametrize("kernel", ["embedding_bag", "triton"])
def test_a_cached_decode_step_of_a_whole_model_matches_the_masked_reference(windows, variant, kernel, monkeypatch):
    if kernel == "triton":
        use_triton_interpreter(monkeypatch)
    model = tiny_model("llama", hidden=32, inter=48)
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(), progress=False)
    with compressed(model, variant, SparsitySpec.parse("2:4"), stats, progress=False) as (m, _):
        sparsifiers = [mod for mod in m.modules() if isinstance(mod, InputSparsifier)]
        logits = {}
        with torch.no_grad():
            for gather in (True, False):
                for s in sparsifiers:
                    s.gather = gather
                out = m(windows[:1, :10], use_cache=True)
                step = m(windows[:1, 10:11], past_key_values=out.past_key_values, use_cache=True)
                logits[gather] = step.logits
    ref = logits[False]
    assert float((logits[True] - ref).abs().max()) <= 1e-5 * float(ref.abs().max())


@pytest.mark.parametrize("variant,budget", [("pca", RankSpec(0.5)), ("act-sparse", SparsitySpec.parse("2:4")),
                                            ("wanda", SparsitySpec.parse("2:4"))])
def test_dense_switch_trades_places_by_reference(windows, variant, budget):
    """use_dense(True) gives the dense model's logits bit for bit, use_dense(False) the variant's again, as often
    as wanted; leaving the block restores dense whichever state it was in."""
    model = tiny_model("llama", hidden=32, inter=48)
    stats = calibrate(model, find_input_groups(model), windows, ALL_STATS, CalibSpec(), progress=False)
    with torch.no_grad():
        dense = model(windows).logits
        dep = deploy(model, variant, budget, stats, progress=False)
        m = dep.model
        variant_logits = m(windows).logits
        assert not torch.equal(variant_logits, dense)
        use_dense = dep.dense_switch()
        for _ in range(2):
            use_dense(True)
            assert torch.equal(m(windows).logits, dense)
            assert not hasattr(m.config, "acbench_compression")
            use_dense(False)
            assert torch.equal(m(windows).logits, variant_logits)
        use_dense(True)
        dep.restore()
        dep.restore()  # a second restore does nothing
        assert torch.equal(model(windows).logits, dense)
        with pytest.raises(RuntimeError, match="restored"):
            dep.dense_switch()
    assert not hasattr(model.config, "acbench_compression")


def test_compare_latency_stores_ratios_intervals_and_conditions(windows):
    model = tiny_model("llama", hidden=32, inter=48)
    spec = LatencySpec(prompt_len=8, new_tokens=3, prefill_len=8, batch=2, min_rounds=3, seconds=0.5)
    with torch.no_grad():
        dep = deploy(model, "act-sparse", SparsitySpec.parse("2:4"), {}, progress=False)
        want = dep.model(windows).logits
        got = compare_latency(dep.model, dep.dense_switch(), spec)
        assert torch.equal(dep.model(windows).logits, want)  # left in the variant's state
        dep.restore()
    assert got["protocol"] == "interleaved" and got["rounds"] >= 3
    assert got["conditions"]["threads"] == torch.get_num_threads() and got["conditions"]["new_tokens"] == 3
    assert got["conditions"]["decode_kernel"] == "embedding_bag"
    for name in ("decode_body", "decode", "prefill_body"):
        s = got["speedup"][name]
        assert s["n"] == got["rounds"] and s["ci95"][0] <= s["ratio"] <= s["ci95"][1]
    for side in ("dense", "variant"):
        d = got[side]
        assert d["decode_ms_per_token"] == pytest.approx(d["decode_body_ms_per_token"] +
                                                         d["decode_outside_ms_per_token"], rel=0.5)
        assert d["decode_body_ms_per_token"] > 0 and d["prefill_body_tokens_per_s"] > 0
    with torch.no_grad():
        dep = deploy(model, "svd", RankSpec(0.5), {}, progress=False)
        assert compare_latency(dep.model, dep.dense_switch(), spec)["conditions"]["decode_kernel"] is None  # no sparse
        dep.restore()
    alone = latency(model, spec)
    assert alone["protocol"] == "alone" and "speedup" not in alone and alone["rounds"] == 3


def test_ratio_interval_is_the_t_interval_of_the_log_ratios():
    ratios = [1.5, 1.6, 1.55, 1.7, 1.45]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1))
    half = sps.t.ppf(0.975, len(logs) - 1) * sd / math.sqrt(len(logs))
    got = ratio_interval(ratios)
    assert got["ratio"] == pytest.approx(math.exp(mean), rel=1e-12)
    assert got["ci95"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)], rel=1e-12)
    assert ratio_interval([1.2])["ci95"] is None


def test_frontier_line_names_the_fastest_row_within_the_quality_distance():
    cols = [Column(task="ppl-token", metric="ppl", label="PPL", higher=False)]
    dense_ppl = 20.0
    near = dense_ppl * math.exp(FRONTIER_NLL * 0.9)
    rows = [{"method": "dense", "PPL": dense_ppl, "decode speedup": 1.0, "decode speedup ci": None},
            {"method": "fast-but-bad", "PPL": dense_ppl * 3, "decode speedup": 2.0, "decode speedup ci": (1.9, 2.1)},
            {"method": "good", "PPL": near, "decode speedup": 1.3, "decode speedup ci": (1.2, 1.4),
             "decode speedup (body)": 1.6, "decode speedup (body) ci": (1.5, 1.7)},
            {"method": "noise", "PPL": dense_ppl, "decode speedup": 1.4, "decode speedup ci": (0.9, 1.9)}]
    line = " ".join(frontier_line(rows, cols))
    assert "**good**" in line and "1.30x [1.20, 1.40]" in line and "body 1.60x" in line
    rows[2]["PPL"] = dense_ppl * math.exp(FRONTIER_NLL * 1.1)
    assert "no row" in " ".join(frontier_line(rows, cols))
    assert frontier_line(rows[1:], cols) == [] and frontier_line([], cols) == []  # no dense row: no reference
    # dense without a perplexity: no reference either
    assert frontier_line([{"method": "dense", "decode speedup": 1.0}] + rows[1:], cols) == []
    # the fastest of several rows is named; an interval that starts at 1.0 is not measurably faster; a perfect
    # perplexity of 1 is a perplexity
    perfect = [{"method": "dense", "PPL": 1.0, "decode speedup": 1.0, "decode speedup ci": None},
               {"method": "a", "PPL": 1.0, "decode speedup": 1.2, "decode speedup ci": (1.1, 1.3)},
               {"method": "b", "PPL": 1.0, "decode speedup": 1.5, "decode speedup ci": (1.4, 1.6)},
               {"method": "c", "PPL": 1.0, "decode speedup": 1.1, "decode speedup ci": (1.05, 1.15)},
               {"method": "edge", "PPL": 1.0, "decode speedup": 1.9, "decode speedup ci": (1.0, 2.8)}]
    assert frontier_line(perfect, cols) == [
        "- frontier: the fastest row within 0.1 nats of dense's token NLL (PPL <= 1.11) is **b**, decode 1.50x "
        "[1.40, 1.60].", ""]  # no body speedup stored: none said


def test_speed_notes_only_for_what_a_section_shows():
    from acbench.leaderboard.formatting import BOUND_NOTE, COMPUTE_NOTE, LATENCY_NOTE, speed_notes

    untimed = [{"method": "dense"}, {"method": "pca", "param ratio": 0.5}]  # a --no-latency run
    assert speed_notes(untimed, False) == [] and speed_notes(untimed, True) == [COMPUTE_NOTE]
    timed = untimed + [{"method": "svd", "decode speedup": 1.1}]
    assert speed_notes(timed, False) == [LATENCY_NOTE]
    assert speed_notes(timed + [{"method": "act-sparse", "bytes bound": 2.0}], True) == [LATENCY_NOTE, BOUND_NOTE,
                                                                                          COMPUTE_NOTE]


# ---------------------------------------------------------------- TEAL: static magnitude thresholds

def test_threshold_from_the_histogram_keeps_the_target_fraction():
    """Brute force: the fraction of the values themselves above the threshold is the density asked for, to the
    histogram's resolution (0.7 % in value), on a heavy-tailed sample with exact zeros."""
    from acbench.core.stats import magnitude_histogram, magnitude_threshold

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(200, 512, generator=gen) * torch.exp(torch.randn(200, 512, generator=gen))
    x[:, :8] = 0.0
    hist = magnitude_histogram(x)
    assert float(hist.sum()) == x.numel()
    for density in (0.1, 0.25, 0.5, 0.9):
        t = magnitude_threshold(hist, density)
        kept = float((x.abs() > t).float().mean())
        assert abs(kept - density) < 0.004, (density, kept)
        # the sorted values' own quantile agrees within a bin (0.29 % of a decade)
        q = float(x.abs().flatten().sort().values[int(round((1 - density) * x.numel()))])
        assert abs(math.log10(t) - math.log10(q)) < 12 / 4096 * 1.01


def test_calibrated_histogram_equals_a_direct_count(windows):
    """abs_hist of each group: numpy's histogram of log10|x| over every input the group's first site saw."""
    import numpy as np

    from acbench.core.stats import HIST_BINS, HIST_HI, HIST_LO

    model = tiny_model("llama", hidden=32, inter=48)
    groups = find_input_groups(model)
    seen = {g.name: [] for g in groups}
    hooks = [g.sites[0].register_forward_pre_hook(lambda mod, a, n=g.name: seen[n].append(a[0].detach().clone()))
             for g in groups]
    with torch.no_grad():
        model(windows)
    for h in hooks:
        h.remove()
    stats = calibrate(model, groups, windows, frozenset({"abs_hist"}), CalibSpec(), progress=False, batch_size=8)
    for g in groups:
        v = np.abs(torch.cat(seen[g.name]).reshape(-1).numpy().astype(np.float64))
        logs = np.clip(np.log10(np.maximum(v, 10.0 ** HIST_LO)), HIST_LO, HIST_HI)
        want, _ = np.histogram(logs, bins=HIST_BINS, range=(HIST_LO, HIST_HI))
        got = stats[g.name].abs_hist.numpy()
        assert got.shape == (HIST_BINS,)
        # float32 log10 in the hook vs float64 here: a value on a bin edge may fall either side
        assert np.abs(got * v.size - want).sum() <= 0.002 * v.size
        assert got.sum() == pytest.approx(1.0)


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
@pytest.mark.parametrize("threshold", [0.0, 0.7, 1e9])
def test_threshold_site_gathered_equals_masked(threshold, scaled, bag_parts):
    """One token through a threshold site: the gathered bag of the channels whose score |x_j| * s_j is above t
    equals W (x masked) + b, for every channel kept, about half, and none (then the bias alone); with score
    factors, the channels kept are the scored ones, not those of |x| alone."""
    gen = torch.Generator().manual_seed(5)
    lin = torch.nn.Linear(64, 24)
    scale = torch.rand(64, generator=gen) * 4 if scaled else None
    sp = InputSparsifier(0, 0, "none", scale, None, threshold=threshold)
    site = SparseInputLinear(lin, sp, owner=True)
    x = torch.randn(1, 1, 64, generator=gen)
    score = x.abs() if scale is None else x.abs() * scale
    if scaled and 0 < threshold < 1e8:  # the factors change which channels pass
        assert not torch.equal(score > threshold, x.abs() > threshold)
    with torch.no_grad():
        got = site(x)
        want = lin(torch.where(score > threshold, x, torch.zeros(())))
        sp.gather = False
        masked = site(x)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    assert float((masked - want).abs().max()) <= 1e-5 * float(want.abs().max())
    # counted on the masked (evaluation) path only: the decode step above is not
    assert int(sp.seen) == 64 and int(sp.kept) == int((score > threshold).sum())
    if threshold > 1e8:
        assert torch.allclose(got.reshape(-1), lin.bias)


def test_teal_deploys_its_threshold_and_measures_its_density(windows):
    from acbench.measure.latency import measured_density

    model = tiny_model("llama", hidden=32, inter=48)
    groups = find_input_groups(model)
    stats = calibrate(model, groups, windows, frozenset({"abs_hist"}), CalibSpec(), progress=False)
    with compressed(model, "teal", SparsitySpec.parse("0.5"), stats, progress=False) as (m, summaries):
        sps = [s for s in m.modules() if isinstance(s, InputSparsifier)]
        assert len(sps) == len(groups) and all(s.threshold is not None for s in sps)
        for s in sps:
            s.reset_counts()
        with torch.no_grad():
            m(windows)
        # calibrated on the dense model's inputs, applied to a model sparsified before them: near, not equal
        assert 0.4 < measured_density(m) < 0.6
        assert all(s["threshold"] > 0 and s["compute_ratio"] == 0.5 for s in summaries)
        layout = m.config.acbench_compression
        assert all(spec["threshold"] for spec in layout.values())


def test_teal_refuses_an_nm_pattern_in_one_line(capsys, tmp_path):
    from acbench.cli import main

    rc = main(["run", "--model", "nowhere", "--methods", "teal", "--sparsity", "2:4", "--output", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "teal" in err[0] and "--sparsity 0.5" in err[0]


def test_histogram_statistics_survive_the_cache(tmp_path):
    from acbench.calibration.group_files import group_problem, read_group, write_group
    from acbench.core.stats import HIST_BINS, GroupStats

    hist = torch.rand(HIST_BINS, dtype=torch.float64)
    write_group(tmp_path, "g", GroupStats(n_tokens=5, abs_hist=hist / hist.sum()), d_in=7)
    assert group_problem(tmp_path, "g", 7) is None
    back = read_group(tmp_path, "g")
    assert torch.allclose(back.abs_hist, hist / hist.sum(), rtol=1e-6)


def test_the_triton_kernel_equals_a_loop_over_rows_and_splits(monkeypatch):
    """The kernel itself, interpreted: several rows, an output width no tile divides, kept counts cut into splits
    with a short last one, none kept (zeros), and half precision (float32 accumulation, rounded once)."""
    use_triton_interpreter(monkeypatch, block_n=32, block_k=8)
    gen = torch.Generator().manual_seed(3)
    for d_in, d_out, rows, keep, dtype in [(300, 70, 3, 37, torch.float32), (64, 24, 1, 0, torch.float16),
                                           (96, 40, 1, 48, torch.float16), (50, 33, 2, 20, "a row-strided view"),
                                           (40, 20, 2, 5, "a column-major view")]:  # 5 kept: one split
        if dtype == "a row-strided view":  # the outputs of a wider matrix: rows d_out + 7 apart
            dtype, W = torch.float32, torch.randn(d_in, d_out + 7, generator=gen)[:, :d_out]
        elif dtype == "a column-major view":  # W^T as the transpose of an output-major W: copied for the kernel
            dtype, W = torch.float32, torch.randn(d_out, d_in, generator=gen).t()
        else:
            W = torch.randn(d_in, d_out, generator=gen).to(dtype)
        idx = torch.stack([torch.randperm(d_in, generator=gen)[:keep] for _ in range(rows)])
        vals = torch.randn(rows, keep, generator=gen).to(dtype)
        got = layers.triton_gathered_product(idx.reshape(-1), vals.reshape(-1), W, rows, keep)
        want = torch.stack([vals[r].double() @ W[idx[r]].double() for r in range(rows)])
        assert got.dtype == dtype and got.shape == (rows, d_out)
        tol = 1e-5 if dtype == torch.float32 else 1e-3
        assert float((got.double() - want).abs().max()) <= tol * max(float(want.abs().max()), 1.0)
        if keep == 0:
            assert not got.any()


def test_triton_splits_fill_the_sms_in_whole_tiles_and_none_is_empty():
    assert (layers.TRITON_BLOCK_K, layers.TRITON_PROGRAMS_PER_SM) == (32, 4)
    # an 8B's 4096 outputs (32 tiles) at density 0.5 on an H200 (132 SMs): 17 parts wanted, of 121 channels;
    # rounded up to whole tiles of 32 that is 128 channels, so 16 parts
    assert layers.triton_splits(32, 2048, 132) == (16, 128)
    assert layers.triton_splits(32, 96, 132) == (3, 32)  # no part shorter than a tile
    assert layers.triton_splits(32, 100, 132) == (4, 32)  # the last part short (4 channels)
    assert layers.triton_splits(1000, 2048, 132) == (1, 2048)  # enough output tiles already
    assert layers.triton_splits(1, 2048, 4) == (16, 128)  # one output tile: all 16 programs from the splits
    for programs in (1, 7, 32, 200):
        for per_row in (1, 31, 33, 100, 2048, 7168):
            parts, per_part = layers.triton_splits(programs, per_row, 132)
            assert per_part % 32 == 0 and (parts - 1) * per_part < per_row <= parts * per_part


def test_the_triton_grid_counts_every_output_tile_of_every_row(monkeypatch):
    """The splits are chosen for rows x output tiles programs (3 tiles of 16 for 40 outputs), on the interpreter's
    4 SMs; the result is the same whatever they are, so the grid is checked where it is decided."""
    use_triton_interpreter(monkeypatch)
    seen, real = [], layers.triton_splits
    monkeypatch.setattr(layers, "triton_splits", lambda *a: seen.append(a) or real(*a))
    gen = torch.Generator().manual_seed(3)
    W, idx = torch.randn(64, 40, generator=gen), torch.randperm(64, generator=gen)[:20]
    vals = torch.randn(20, generator=gen)
    got = layers.triton_gathered_product(idx, vals, W, 1, 20)
    assert seen == [(3, 20, 4)]
    torch.testing.assert_close(got, (vals[:, None] * W[idx]).sum(0, keepdim=True), rtol=1e-5, atol=1e-5)


def test_a_channel_exactly_at_the_threshold_is_dropped():
    """TEAL keeps |x_j| > t: a channel whose score equals t is not kept, in the decode bag or the masked product."""
    from acbench.core.compressed_layers import InputSparsifier, SparseInputLinear

    lin = torch.nn.Linear(4, 3)
    site = SparseInputLinear(lin, InputSparsifier(0, 0, "none", None, None, threshold=0.5), owner=True)
    x = torch.tensor([[[0.5, -0.5, 0.75, 0.25]]])
    want = lin(torch.tensor([[[0.0, 0.0, 0.75, 0.0]]]))
    with torch.no_grad():
        torch.testing.assert_close(site(x), want)  # one token: the gathered bag
        torch.testing.assert_close(site(x.expand(2, 1, 4).clone()), want.expand(2, 1, 3))  # two: masked


def test_the_decode_kernel_is_chosen_per_device_and_refused_in_one_line(monkeypatch):
    monkeypatch.delenv("ACBENCH_DECODE_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(layers, "triton_importable", lambda: True)
    assert layers.choose_decode_kernel("cpu") == "embedding_bag"
    assert layers.choose_decode_kernel("cuda") == "triton"
    assert layers.choose_decode_kernel("cuda", "embedding_bag") == "embedding_bag"
    monkeypatch.setenv("ACBENCH_DECODE_KERNEL", "embedding_bag")
    assert layers.choose_decode_kernel("cuda") == "embedding_bag"
    monkeypatch.setenv("ACBENCH_DECODE_KERNEL", "tritn")
    with pytest.raises(ValueError, match=r"^ACBENCH_DECODE_KERNEL='tritn' is not a decode kernel: set it to one of "
                                         r"auto, embedding_bag, triton, or unset it$"):
        layers.choose_decode_kernel("cpu")
    with pytest.raises(ValueError, match=r"^ACBENCH_DECODE_KERNEL=triton needs a CUDA device \(this model is on "
                                         r"cpu\), or TRITON_INTERPRET=1"):
        layers.choose_decode_kernel("cpu", "triton")
    assert layers.choose_decode_kernel("cuda", "triton") == "triton"  # a CUDA device needs no interpreter
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert layers.choose_decode_kernel("cpu", "triton") == "triton"
    monkeypatch.setattr(layers, "triton_importable", lambda: False)
    assert layers.choose_decode_kernel("cuda", "auto") == "embedding_bag"
    with pytest.raises(ValueError, match=r"^ACBENCH_DECODE_KERNEL=triton, but triton does not import: install it "
                                         r"\(a CUDA build of torch brings it\) or set "
                                         r"ACBENCH_DECODE_KERNEL=embedding_bag$"):
        layers.choose_decode_kernel("cuda", "triton")


def test_the_chosen_kernel_is_the_one_that_runs(monkeypatch):
    """Per device type, once: the Triton kernel where chosen (embedding_bag never called), embedding_bag else."""
    use_triton_interpreter(monkeypatch)
    bags, kernels = [], []
    real_bag, real_triton = layers.torch.embedding_bag, layers.triton_gathered_product
    monkeypatch.setattr(layers.torch, "embedding_bag", lambda *a, **k: bags.append(1) or real_bag(*a, **k))
    monkeypatch.setattr(layers, "triton_gathered_product", lambda *a: kernels.append(1) or real_triton(*a))
    _, _, site, gen = _site(8, 16, "none", False, True)
    with torch.no_grad():
        site(torch.randn(1, 1, 64, generator=gen))
        assert (len(bags), len(kernels)) == (0, 1)
        monkeypatch.setitem(layers._CHOSEN, "cpu", "embedding_bag")
        site(torch.randn(1, 1, 64, generator=gen))
        assert (len(bags), len(kernels)) == (1, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the kernel is tested in triton's "
                                                         "interpreter above (benchmarks/gpu_check.sh runs this)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_triton_kernel_on_cuda(dtype, monkeypatch):
    """One token at an 8B's and Gemma's shapes on the GPU: the compiled kernel equals embedding_bag and the masked
    dense product (to 1e-5 relative in float32; bfloat16 rounds the output once)."""
    pytest.importorskip("triton", reason="a CUDA build of torch brings triton")
    monkeypatch.setitem(layers._CHOSEN, "cuda", "triton")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for d_in, d_out in [(640, 2048), (2048, 640), (4096, 14336), (14336, 4096)]:
        lin = torch.nn.Linear(d_in, d_out, bias=True, device="cuda", dtype=dtype)
        for keep, block in [(d_in // 2, 0), (2, 4)]:
            sp = InputSparsifier(keep, block, "none", None, None, dtype=dtype, device="cuda")
            site = SparseInputLinear(lin, sp, owner=True)
            x = torch.randn(1, 1, d_in, generator=gen, device="cuda", dtype=dtype)
            with torch.no_grad():
                got = site(x)
                monkeypatch.setitem(layers._CHOSEN, "cuda", "embedding_bag")
                bag = site(x)
                monkeypatch.setitem(layers._CHOSEN, "cuda", "triton")
                want = lin(sparsify(x, keep, block, None, "none", None)[0])
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            scale = float(want.abs().max())
            assert float((got - want).abs().max()) <= tol * scale, (d_in, d_out, keep, block)
            assert float((got - bag).abs().max()) <= tol * scale, (d_in, d_out, keep, block)


def test_a_threshold_site_decodes_tokens_of_different_kept_counts(monkeypatch):
    """A threshold keeps a different number of channels each token: every token's product reads its own count's bag
    offsets (kept per shape on the site), equal to the masked dense product, the large site's split in bags too."""
    from acbench.deploy.apply import sparsifier_for
    from acbench.methods.base import SparseActivation

    monkeypatch.setattr(layers, "SPLIT_MIN_PRODUCT", 64)  # 24 outputs x 3 or more kept channels: split
    gen = torch.Generator().manual_seed(5)
    lin = torch.nn.Linear(64, 24)
    res = SparseActivation(pattern=SparsitySpec.parse("0.5"), d_in=64, d_outs=(24,), threshold=1.0)
    site = SparseInputLinear(lin, sparsifier_for(res, torch.float32, "cpu"), owner=True)
    with torch.no_grad():
        for kept in (40, 7, 40, 0):  # many kept, few, many again, none
            x = torch.full((64,), 0.5) * torch.randn(64, generator=gen).sign()
            x[torch.randperm(64, generator=gen)[:kept]] *= 4  # these pass |x| > 1
            x = x.reshape(1, 1, 64)
            want = lin(torch.where(x.abs() > 1.0, x, torch.zeros(())))
            assert torch.allclose(site(x), want, atol=1e-5)
    assert len(site._plans) >= 3  # one entry per kept count seen


def test_hooks_on_a_sparsifier_still_fire():
    """The sites call the sparsifier's forward directly for speed, but not past a hook someone registered on it
    (a profiler, a statistics collector): forward hooks and pre-hooks fire at each site's read, as a module call
    would (the sparse input itself is still computed once per group)."""
    from acbench.core.compressed_layers import InputSparsifier, SparseInputLinear

    gen = torch.Generator().manual_seed(2)
    sp = InputSparsifier(2, 4, "none", None, None)
    a, b = SparseInputLinear(torch.nn.Linear(8, 3), sp, owner=True), SparseInputLinear(torch.nn.Linear(8, 5), sp, owner=False)
    x = torch.randn(1, 1, 8, generator=gen)
    with torch.no_grad():
        plain = (a(x), b(x))
        seen = []
        hook = sp.register_forward_hook(lambda mod, args, out: seen.append(("post", args[0] is x)))
        torch.testing.assert_close((a(x), b(x)), plain)
        assert seen == [("post", True), ("post", True)]  # one per site
        hook.remove()
        pre = sp.register_forward_pre_hook(lambda mod, args: seen.append(("pre", args[0] is x)))
        x2 = x.clone()
        a(x2)
        assert seen == [("post", True), ("post", True), ("pre", False)]
        pre.remove()


def test_a_product_cut_into_two_bags_sums_them(monkeypatch):
    """On a 2-thread CPU a large site's kept channels go into two bags per row, summed after (3 bags are the
    bag_parts fixture's)."""
    monkeypatch.setattr(layers, "SPLIT_MIN_PRODUCT", 0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        lin, sp, site, gen = _site(8, 16, "none", False, True)
        x = torch.randn(1, 1, 64, generator=gen)
        with torch.no_grad():
            got = site(x)
            sp.gather = False
            want = site(x.clone())  # a new tensor: the read-once cache would hand back the gathered value
        assert site._plans and all(per == 2 for _, per in site._plans.values())
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(threads)


def test_a_bfloat16_sites_buffers_and_outputs_keep_its_dtype():
    """Scores, means and thresholds come from float64 statistics; in a bfloat16 model they are stored in bfloat16,
    so the sparse product runs in the model's dtype (a float32 mean would turn the masked input float32, which a
    bfloat16 weight refuses). The decode weight is a frozen parameter; the median's row sums exist only for it."""
    from acbench.core.compressed_layers import InputSparsifier, SparseInputLinear

    gen = torch.Generator().manual_seed(4)
    scale, mu = torch.rand(8, generator=gen, dtype=torch.float64) + 0.5, torch.randn(8, generator=gen, dtype=torch.float64)
    sp = InputSparsifier(2, 4, "shift", scale, mu, dtype=torch.bfloat16)
    th = InputSparsifier(0, 0, "none", None, None, dtype=torch.bfloat16, threshold=0.5)
    assert (sp.scale.dtype, sp.mu.dtype, th.threshold.dtype) == (torch.bfloat16,) * 3
    lin = torch.nn.Linear(8, 3).to(torch.bfloat16)
    site = SparseInputLinear(lin, sp, owner=True)
    assert not site.weight_t.requires_grad and site.row_sum is None
    assert SparseInputLinear(lin, InputSparsifier(2, 4, "median", None, None), owner=True).row_sum is not None
    with torch.no_grad():
        for tokens in (1, 3):  # the gathered decode, the masked product
            x = torch.randn(1, tokens, 8, generator=gen).to(torch.bfloat16)
            assert site(x).dtype == torch.bfloat16 and site(x).shape == (1, tokens, 3)


@pytest.mark.parametrize("value,expect", [
    (None, 256 * 2**20), ("", 256 * 2**20), ("  ", 256 * 2**20), ("16", 16 * 2**20), (" 8 ", 8 * 2**20),
    ("1", 2**20),
])
def test_the_bandwidth_probe_size_is_read_from_the_environment(monkeypatch, value, expect):
    from acbench.measure.bandwidth import array_bytes

    if value is None:
        monkeypatch.delenv("ACBENCH_BANDWIDTH_MB", raising=False)
    else:
        monkeypatch.setenv("ACBENCH_BANDWIDTH_MB", value)
    assert array_bytes() == expect


@pytest.mark.parametrize("value,needle", [
    ("abc", "ACBENCH_BANDWIDTH_MB='abc' is not a whole number of MB >= 1: set it to e.g. 256 (the size of each "
            "memory-bandwidth array), or unset it"),
    ("0", "ACBENCH_BANDWIDTH_MB='0' is not a whole number of MB >= 1"),
    ("-1", "ACBENCH_BANDWIDTH_MB='-1' is not a whole number of MB >= 1"),
    ("1.5", "ACBENCH_BANDWIDTH_MB='1.5' is not a whole number"),
])
def test_a_bandwidth_probe_size_that_is_not_a_size_is_one_line(monkeypatch, value, needle):
    from acbench.measure.bandwidth import array_bytes
    from acbench.core.errors import UserError

    monkeypatch.setenv("ACBENCH_BANDWIDTH_MB", value)
    with pytest.raises(UserError) as e:
        array_bytes()
    assert str(e.value).startswith(needle), str(e.value)


def test_a_bandwidth_probe_past_half_the_memory_is_refused_and_one_that_fits_is_not(monkeypatch):
    import os

    from acbench.measure.bandwidth import array_bytes
    from acbench.core.errors import UserError

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    most = total // 2 // 3 // 2**20  # three arrays in half the memory
    monkeypatch.setenv("ACBENCH_BANDWIDTH_MB", str(most))
    assert array_bytes() == most * 2**20
    monkeypatch.setenv("ACBENCH_BANDWIDTH_MB", str(most + 1))
    with pytest.raises(UserError) as e:
        array_bytes()
    assert str(e.value) == (f"ACBENCH_BANDWIDTH_MB={most + 1}: three arrays of {most + 1} MB do not fit in half of "
                            f"this machine's {total / 2**30:.1f} GiB of memory: set it to at most {most}, or unset it")


# ---------------------------------------------------------------- bench/measure/bandwidth.py against a fake clock

def test_best_of_several_rounds_skips_the_first_touch_and_keeps_the_least(monkeypatch):
    import acbench.measure.bandwidth as bw

    ticks = iter([0.0, 5.0, 10.0, 12.0, 20.0, 27.0])  # three timed rounds: 5, 2 and 7 s
    monkeypatch.setattr(bw.time, "perf_counter", lambda: next(ticks))
    calls = []
    assert bw._best(lambda: calls.append(1), repeats=3) == 2.0
    assert len(calls) == 4  # the untimed first touch, then three rounds


def _closure(fn) -> dict:
    return {name: cell.cell_contents for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())}


def test_stream_bandwidth_is_bytes_over_the_best_time_and_runs_copy_and_triad(monkeypatch):
    """copy moves 2 arrays, triad 3; each kernel is checked by what it writes (a = b + 3 c); the result is cached
    per whole MB of array size, and another size measures again."""
    import acbench.measure.bandwidth as bw

    monkeypatch.setattr(bw, "_STREAM", None)
    seen = []

    def fake_best(fn, repeats=bw.REPEATS):
        arrays = _closure(fn)
        if "c" in arrays:  # the triad
            arrays["a"].zero_()
            fn()
            assert (arrays["a"] == 4.0).all() and len(arrays["a"]) == want["n"]
        else:  # the copy
            arrays["b"].zero_()
            fn()
            assert (arrays["b"] == 1.0).all()
        seen.append(repeats)
        return 0.5 if len(seen) % 2 else 0.25

    monkeypatch.setattr(bw, "_best", fake_best)
    size = 3 * 2**20 + 4  # not a whole number of MB: the cache is keyed by whole MB
    want = {"n": size // 4}  # float32 elements per array
    out = bw.stream_bandwidth(size)
    assert out == {"copy_gb_s": 2 * size / 0.5 / 1e9, "triad_gb_s": 3 * size / 0.25 / 1e9, "array_mb": 3,
                   "threads": torch.get_num_threads()}
    assert seen == [bw.REPEATS, bw.REPEATS]
    assert bw.stream_bandwidth(size) == out and len(seen) == 2  # cached
    want["n"] = 2**21 // 4
    assert bw.stream_bandwidth(2**21)["array_mb"] == 2 and len(seen) == 4  # another size: measured


@pytest.mark.parametrize("dtype,cold,copies", [(torch.float16, 3 * 2**20 + 5, 13), (torch.float32, 1, 2)])
def test_gemv_bandwidth_is_one_products_weight_bytes_over_its_share_of_the_best_sweep(monkeypatch, dtype, cold,
                                                                                   copies):
    """Copies of W enough to pass `cold` bytes (at least 2) are cycled; a sweep's best time over 3 rounds, divided
    by the copies, is one product's time; the result is cached per shape, dtype and cold size."""
    import acbench.measure.bandwidth as bw

    monkeypatch.setattr(bw, "_GEMV", {})
    products = []
    real_linear = torch.nn.functional.linear

    def counted(x, w, *a):
        assert x.dtype == w.dtype == dtype and w.shape == (256, 512) and x.shape == (1, 512)  # batch 1
        products.append(1)
        return real_linear(x, w, *a)

    monkeypatch.setattr(torch.nn.functional, "linear", counted)

    def fake_best(fn, repeats=bw.REPEATS):
        assert repeats == 3
        fn()
        return 0.6

    monkeypatch.setattr(bw, "_best", fake_best)
    per = 256 * 512 * torch.tensor([], dtype=dtype).element_size()
    out = bw.gemv_bandwidth(256, 512, dtype, cold_bytes=cold)
    assert len(products) == copies
    assert out == {"shape": [256, 512], "dtype": str(dtype).replace("torch.", ""), "gb_s": per / (0.6 / copies) / 1e9,
                   "cold_mb": cold // 2**20, "threads": torch.get_num_threads()}
    assert bw.gemv_bandwidth(256, 512, dtype, cold_bytes=cold) == out and len(products) == copies  # cached
    other = torch.float32 if dtype == torch.float16 else torch.float16
    monkeypatch.setattr(torch.nn.functional, "linear", real_linear)
    assert bw.gemv_bandwidth(256, 512, other, cold_bytes=cold)["dtype"] == str(other).replace("torch.", "")


def test_the_largest_linear_is_the_first_of_the_most_weights():
    from acbench.measure.bandwidth import largest_linear

    tie = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 8))  # 32 weights each: the first stays
    assert largest_linear(tie) == (4, 8, torch.float32)
    grows = torch.nn.Sequential(torch.nn.Linear(8, 2), torch.nn.Linear(6, 4))  # 16, then 24 weights
    assert largest_linear(grows) == (4, 6, torch.float32)
    assert largest_linear(torch.nn.Sequential(torch.nn.ReLU())) is None


def test_a_bandwidth_probe_that_exactly_fills_half_the_memory_fits(monkeypatch):
    import acbench.measure.bandwidth as bw

    real = bw.os.sysconf
    monkeypatch.setattr(bw.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 2**20, "SC_PHYS_PAGES": 6}.get(name) or
                        real(name))
    monkeypatch.setenv("ACBENCH_BANDWIDTH_MB", "1")  # three 1 MB arrays in half of 6 MB: exactly full
    assert bw.array_bytes() == 2**20
