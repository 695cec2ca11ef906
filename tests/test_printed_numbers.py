"""The numbers the leaderboard prints, against hand computations on small cases: deployed bytes and measured
density (bench/measure.py), and more as the mutation runs over the analyses, layers, allocation, costs and the
leaderboard's arithmetic show a gap. Each test is a reference computed in the test, not a stored value."""

import pytest
import torch

from bench.measure import measured_density, weight_bytes
from core.compressed_layers import InputSparsifier, SparseInputLinear


def test_weight_bytes_counts_each_tensor_once_with_its_element_size():
    emb = torch.nn.Embedding(10, 4)  # 40 float32 = 160 bytes
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied: counted once
    half = torch.nn.Linear(4, 3).to(torch.float16)  # 12 + 3 halves = 30 bytes
    model = torch.nn.ModuleList([emb, head, half])
    model.register_buffer("steps", torch.zeros(5, dtype=torch.int64))  # 40 bytes
    assert weight_bytes(model) == 160 + 30 + 40


def test_measured_density_is_kept_over_seen_pooled_over_the_threshold_sparsifiers():
    x1 = torch.tensor([[0.1, 2.0, -3.0, 0.0]])  # 2 of 4 above 1.0
    x2 = torch.tensor([[5.0, 5.0], [0.5, -6.0], [0.0, 0.0]])  # 3 of 6 above 1.0
    sites = []
    for d, x in ((4, x1), (2, x2)):
        sp = InputSparsifier(0, 0, "none", None, None, threshold=1.0)
        sp.gather = False  # counted on the masked path (evaluation)
        site = SparseInputLinear(torch.nn.Linear(d, 3), sp, owner=True)
        sites.append(site)
        with torch.no_grad():
            site(x)
    topk = SparseInputLinear(torch.nn.Linear(4, 3), InputSparsifier(2, 4, "none", None, None), owner=True)
    model = torch.nn.ModuleList([*sites, topk])
    assert measured_density(model) == pytest.approx((2 + 3) / (4 + 6))
    assert measured_density(torch.nn.ModuleList([topk])) is None  # no threshold: its density is the pattern's
    for s in model.modules():
        if isinstance(s, InputSparsifier):
            s.reset_counts()
    assert measured_density(model) is None  # nothing seen since the reset
