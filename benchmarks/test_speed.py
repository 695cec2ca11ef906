"""Decode speed at batch 1, as ratios measured in one run: each site form against the dense product of the same
shape, and a whole decoder body against dense, alternating (acbench.measure.latency's protocol). conftest.py prints the
speedups with their 95 % intervals at the end of `make bench`."""

import statistics
import time

import pytest
import torch

from acbench import methods

from acbench.measure.latency import LatencySpec, compare_latency, ratio_interval

# (d_in, d_out): Gemma-3-270m's MLP (640 -> 2048 -> 640) and an 8B's attention and MLP (4096, 14336)
SHAPES = [(640, 2048), (2048, 640), (4096, 4096), (4096, 14336), (14336, 4096)]
FORMS = ["2:4", "8:16", "16:32", "0.5", "0.25", "threshold 0.5", "low-rank params 0.5"]
# the input every site reads: its median magnitude is the threshold that keeps half of it (teal at density 0.5)
_X_SEED = 1
ROUNDS = 12  # alternating dense / variant rounds per site


def _site(d_in: int, d_out: int, form: str):
    """The deployed module for `form` at one site, and the dense nn.Linear it replaces (same weights)."""
    from acbench.deploy.apply import sparsifier_for
    from acbench.core.compressed_layers import LowRankLinear, SparseInputLinear
    from acbench.core.stats import SparsitySpec
    from acbench.methods.base import SparseActivation

    torch.manual_seed(0)
    dense = torch.nn.Linear(d_in, d_out, bias=False)
    if form.startswith("low-rank"):
        k = round(0.5 * d_in * d_out / (d_in + d_out))  # k (d_in + d_out) = half the dense parameters
        return dense, LowRankLinear(d_in, d_out, k, bias=False)
    if form.startswith("threshold"):
        t = float(_input(d_in).abs().median())
        res = SparseActivation(pattern=SparsitySpec.parse("0.5"), d_in=d_in, d_outs=(d_out,), threshold=t)
        return dense, SparseInputLinear(dense, sparsifier_for(res, torch.float32, "cpu"), owner=True)
    res = SparseActivation(pattern=SparsitySpec.parse(form), d_in=d_in, d_outs=(d_out,))
    return dense, SparseInputLinear(dense, sparsifier_for(res, torch.float32, "cpu"), owner=True)


def _input(d_in: int) -> torch.Tensor:
    return torch.randn(1, 1, d_in, generator=torch.Generator().manual_seed(_X_SEED))


def _median_time(fn, x, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _alternate(benchmark, ref, site, shape, what: str) -> None:
    """ref's time / site's on one token, the two alternating (order flipped each round), into extra_info."""
    x = _input(shape[0])
    reps = 20 if shape[0] * shape[1] < 10**7 else 5
    with torch.no_grad():
        for fn in (ref, site):
            fn(x)
        ratios = []
        for r in range(ROUNDS):
            order = (ref, site) if r % 2 == 0 else (site, ref)
            t = {id(fn): _median_time(fn, x, reps) for fn in order}
            ratios.append(t[id(ref)] / t[id(site)])
        benchmark.extra_info["speedup"] = ratio_interval(ratios)
        benchmark.extra_info["what"] = what
        benchmark.pedantic(lambda: site(x), rounds=reps, warmup_rounds=1)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_site_decode(benchmark, shape, form):
    """One token through one site: the variant's module (selection included) against dense F.linear."""
    dense, site = _site(*shape, form)
    _alternate(benchmark, dense, site, shape, f"site {shape[0]}x{shape[1]} {form}")


@pytest.mark.parametrize("model,method,pattern", [("gemma-3-270m", "act-sparse", "0.5"),
                                                  ("gemma-3-270m", "act-sparse", "8:16"),
                                                  ("gemma-3-270m", "teal", "0.5"),
                                                  ("smollm2-135m", "act-sparse", "0.5"),
                                                  ("smollm2-135m", "act-sparse", "8:16")])
def test_body_decode(benchmark, model, method, pattern):
    """A whole decoder body at batch 1 with the KV cache, decoding the calibration text: a sparsity method at
    density 0.5 against dense, alternating (as a run measures it, with a 30 s cap)."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.deploy.compression import deploy
    from acbench.model.groups import find_input_groups
    from acbench.model.sources import open_and_load_model
    from acbench.calibration.cache import calibration_windows
    from acbench.core.stats import SparsitySpec

    lm = open_and_load_model(model, progress=False)
    text = calibration_windows(lm.tokenizer, CalibSpec())
    needs = methods.build(method).required_stats()
    stats = calibrate(lm.model, find_input_groups(lm.model), text[:4], needs, CalibSpec(), progress=False) \
        if needs else {}
    spec = LatencySpec(seconds=30.0, min_rounds=6)
    dep = deploy(lm.model, method, SparsitySpec.parse(pattern), stats, progress=False)
    try:
        got = compare_latency(dep.model, dep.dense_switch(), spec, text=text)
        benchmark.extra_info["speedup"] = got["speedup"]["decode_body"]
        benchmark.extra_info["speedup_end_to_end"] = got["speedup"]["decode"]
        benchmark.extra_info["what"] = f"{model} body decode, {method} {pattern}"
        # what bounds it (as a run's cell stores it): the overhead floor, the bytes bound and the ceiling
        from acbench.leaderboard.tables import ceiling

        over, bound = got["body_overhead"], 1 / SparsitySpec.parse(pattern).density
        benchmark.extra_info["bounds"] = {
            "dense_body_ms": over["dense_body_ms"], "floor_ms": over["floor_ms"], "bound": bound,
            "ceiling": ceiling(over["dense_body_ms"], over["floor_ms"], bound),
            "converged": got["converged"], "rounds": got["rounds"], **{k: got["conditions"][k] for k in
                                                                       ("memory_bandwidth", "dense_product")}}
        ids = torch.randint(3, 1000, (1, 1))
        benchmark.pedantic(lambda: dep.model.get_decoder()(input_ids=ids, use_cache=False), rounds=3,
                           warmup_rounds=1)
    finally:
        dep.restore()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_low_rank_overhead(benchmark, shape):
    """A factorised site at decode against its two bare products F.linear(F.linear(x, B), A): the module's own
    cost (the shared-B read-once cache, the bias) is what the ratio shows (1.0: none)."""
    import torch.nn.functional as Fn

    _, site = _site(*shape, "low-rank params 0.5")
    A, B = site.A.weight, site.B.weight
    bare = lambda x: Fn.linear(Fn.linear(x, B), A)
    _alternate(benchmark, bare, site, shape,
               f"low-rank module / its two bare products, {shape[0]}x{shape[1]} (1.0 = no overhead)")
