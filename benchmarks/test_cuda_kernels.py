"""The CUDA decode kernels at batch 1, as ratios in one run (skipped without a GPU; benchmarks/gpu_check.sh runs
them where one is lent): the gathered product of a density-0.5 site through the Triton kernel and through
embedding_bag, each against dense F.linear; and a wanda-style 2:4 weight as torch's semi-structured sparse tensor
against its dense-shaped form, at batch 1 and at a prefill's 512 tokens. bfloat16, the sizes of an 8B."""

import pytest
import torch

from acbench.measure.latency import ratio_interval

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (640, 2048)]
ROUNDS = 12
REPS = 50

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _cuda_time(fn, reps: int = REPS) -> float:
    """The mean over `reps` back-to-back calls, CUDA events around them (ms per call)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def _alternate(benchmark, ref, variant, what: str) -> None:
    with torch.no_grad():
        for fn in (ref, variant):
            fn()
        torch.cuda.synchronize()
        ratios = []
        for r in range(ROUNDS):
            order = (ref, variant) if r % 2 == 0 else (variant, ref)
            t = {id(fn): _cuda_time(fn) for fn in order}
            ratios.append(t[id(ref)] / t[id(variant)])
        benchmark.extra_info["speedup"] = ratio_interval(ratios)
        benchmark.extra_info["what"] = what
        benchmark.pedantic(variant, rounds=REPS, warmup_rounds=1)


@pytest.mark.parametrize("kernel", ["triton", "embedding_bag"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gathered_decode_on_cuda(benchmark, shape, kernel, monkeypatch):
    import acbench.core.compressed_layers as layers
    from acbench.deploy.apply import sparsifier_for
    from acbench.core.stats import SparsitySpec
    from acbench.methods.base import SparseActivation

    if kernel == "triton":
        pytest.importorskip("triton")
    monkeypatch.setitem(layers._CHOSEN, "cuda", kernel)
    d_in, d_out = shape
    dense = torch.nn.Linear(d_in, d_out, bias=False, device="cuda", dtype=torch.bfloat16)
    res = SparseActivation(pattern=SparsitySpec.parse("0.5"), d_in=d_in, d_outs=(d_out,))
    site = layers.SparseInputLinear(dense, sparsifier_for(res, torch.bfloat16, "cuda"), owner=True)
    x = torch.randn(1, 1, d_in, device="cuda", dtype=torch.bfloat16)
    _alternate(benchmark, lambda: dense(x), lambda: site(x), f"cuda site {d_in}x{d_out} top 0.5, {kernel}")


@pytest.mark.parametrize("tokens", [1, 512])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_semi_structured_2_4_on_cuda(benchmark, shape, tokens):
    import acbench.deploy.semi_structured as ss
    from acbench.core.sparsity import topk_mask

    d_in, d_out = shape
    w = torch.randn(d_out, d_in, device="cuda", dtype=torch.bfloat16)
    masked = w * topk_mask(w.abs(), 2, 4).to(w.dtype)  # magnitude-prune's 2:4: the larger 2 of every 4 inputs
    why = ss.refusal(masked, 2, 4)
    if why is not None:
        pytest.skip(why)
    sparse = ss.deploy_semi_structured(masked, 2, 4)
    x = torch.randn(tokens, d_in, device="cuda", dtype=torch.bfloat16)
    F = torch.nn.functional
    _alternate(benchmark, lambda: F.linear(x, masked), lambda: F.linear(x, sparse),
               f"cuda 2:4 semi-structured / dense-shaped, {d_in}x{d_out}, {tokens} token(s)")
