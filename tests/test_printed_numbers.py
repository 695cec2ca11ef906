"""The numbers the leaderboard prints, against hand computations on small cases: deployed bytes and measured
density (bench/measure/latency.py), and more as the mutation runs over the analyses, layers, allocation, costs and the
leaderboard's arithmetic show a gap. Each test is a reference computed in the test, not a stored value."""

import pytest
import torch

from acbench.measure.latency import measured_density, weight_bytes
from acbench.core.compressed_layers import InputSparsifier, SparseInputLinear


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


# ---------------------------------------------------------------- the rho section and its figure (analyses/rho_report.py)

def _rho_cell():
    from acbench.core.record import CellId, CellRecord

    sp = lambda r, lo, hi, p: {"r": r, "ci95": [lo, hi], "p": p}
    details = {
        "correlations": {
            "rho_vs_surrogate_gain_per_group": {"n": 8, "spearman": sp(0.5, 0.1, 0.8, 0.012),
                                                "pearson": sp(0.4, -0.05, 0.7, 0.3)},
            "rho_vs_loss_rise_per_group": {"n": 8, "spearman": sp(-0.25, -0.7, 0.3, 0.06), "pearson": None},
            "gain_vs_rank_per_group": {"n": 8, "spearman": sp(0.9, 0.8, 0.95, 0.0001)},  # not rho's: no headline
            "rho_vs_lama_drop": {"n": 2, "spearman": None, "note": "too few units"},
            "rho_vs_mmlu_drop": {"n": 2, "spearman": None},  # undefined without a note: an empty cell
        },
        "units": [{"blocks": [0, 1], "loss_rise_pca": 0.5, "loss_rise_fasc": 0.25},
                  {"blocks": [2, 3, 4], "loss_rise_pca": 0.75, "loss_rise_fasc": 0.5}],
        "per_group": [{"group": "g0", "block": 3, "kind": "mlp_in", "rho": 0.2},
                      {"group": "g1", "block": 1, "kind": "mlp_in", "rho": 0.1},
                      {"group": "g2", "block": 2, "kind": "attn_in", "rho": 0.3}],
        "highest_rho_groups": [{"group": "g2", "block": 0, "kind": "attn_in", "rho": 0.30049}],
    }
    return CellRecord(cell=CellId("m", "rho-analysis", 0.5, "rank", "rho", "k"), metrics={}, primary_metric="rho_mean",
                      details=details)


def test_rho_section_in_full():
    from tabulate import tabulate

    from acbench.analyses.rho_report import rho_section

    assert rho_section(_rho_cell()) == [
        "**Per group, n = 8: Spearman(rho, loss_rise) = -0.25 [-0.70, +0.30] p=0.06** (not significant at 0.05).",
        "**Per group, n = 8: Spearman(rho, surrogate_gain) = +0.50 [+0.10, +0.80] p=0.012** (significant at 0.05).",
        "",
        "Correlations (r [bootstrap 95% CI] p); per group (surrogate gain, and loss rise with "
        "`--analysis-option rho.per_group=true`) first, then per block range (2 ranges: a lead, not a finding):",
        "",
        tabulate([["gain vs rank_per_group", "+0.90 [+0.80, +0.95] p=0.0001", "", 8],
                  ["rho vs loss_rise_per_group", "-0.25 [-0.70, +0.30] p=0.06", "", 8],
                  ["rho vs surrogate_gain_per_group", "+0.50 [+0.10, +0.80] p=0.012", "+0.40 [-0.05, +0.70] p=0.3", 8],
                  ["rho vs lama_drop", "too few units", "", 2], ["rho vs mmlu_drop", "", "", 2]],
                 headers=["variables", "Spearman", "Pearson", "n"], tablefmt="github", disable_numparse=True),
        "",
        "Highest-rho groups:",
        "",
        "| group   | block   | type    | rho   |\n|---------|---------|---------|-------|\n| g2      | 0       | attn_in | 0.300 |",
    ]


def test_the_rho_figure_plots_rho_per_block_and_each_methods_loss_rise(tmp_path, monkeypatch):
    import acbench.analyses.rho_report as rho_report
    import acbench.core.figures

    seen = {}
    monkeypatch.setattr(acbench.core.figures, "save_figure", lambda fig, path: seen.update(fig=fig, path=path) or path)
    cell = _rho_cell()
    from acbench.analyses.rho import Rho

    lines, paths = Rho.report_section(cell, tmp_path, "rho-0.5", "Title here")  # the analysis hands it on
    assert paths == [tmp_path / "rho-0.5.png"] == [seen["path"]]
    assert lines[-1] == "![rho and sensitivity by block](plots/rho-0.5.png)" and lines[-2] == ""
    a, b = seen["fig"].axes
    got = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in a.lines}
    assert got == {"attn_in": ([2], [0.3]), "mlp_in": ([1, 3], [0.1, 0.2])}  # sorted by block within a kind
    assert [ln.get_label() for ln in a.lines] == ["attn_in", "mlp_in"]
    got = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in b.lines}
    assert got == {"loss rise, pca": ([0.5, 3.0], [0.5, 0.75]), "loss rise, fasc": ([0.5, 3.0], [0.25, 0.5])}
    assert (a.get_xlabel(), a.get_ylabel()) == ("block", "rho (relative Frobenius violation)")
    assert (b.get_xlabel(), b.get_ylabel()) == ("block (centre of the compressed range)",
                                                "held-out loss rise (nats/token)")
    assert seen["fig"]._suptitle.get_text() == "Title here" and seen["fig"]._suptitle.get_fontsize() == 10
    # the figure as designed: its size, markers, legends and grids
    assert tuple(seen["fig"].get_size_inches()) == pytest.approx((11, 3.8))
    assert {ln.get_marker() for ln in a.lines} == {"o"} and {ln.get_marker() for ln in b.lines} == {"s"}
    for ax in (a, b):
        assert {t.get_fontsize() for t in ax.get_legend().get_texts()} == {7}
        assert ax.xaxis.get_gridlines()[0].get_visible() and ax.xaxis.get_gridlines()[0].get_alpha() == 0.3
    assert a.get_position().x1 <= b.get_position().x0 and a.get_position().y0 == pytest.approx(b.get_position().y0)
    # a method missing from any unit is not drawn
    del cell.details["units"][1]["loss_rise_fasc"]
    rho_report.report_section(cell, tmp_path, "rho-0.5", "t")
    assert [ln.get_label() for ln in seen["fig"].axes[1].lines] == ["loss rise, pca"]


# ---------------------------------------------------------------- latency (bench/measure/latency.py) on a model whose times are known

class _Clock:
    def __init__(self):
        self.t = 0.0

    def perf_counter(self):
        return self.t


class _Body(torch.nn.Module):
    """A decoder body whose calls advance a fake clock: a decode step and a prefill cost what `costs` says for the
    current state (dense or the variant) and round."""

    def __init__(self, clock, costs):
        super().__init__()
        self.clock, self.costs, self.dense, self.prefills, self.order = clock, costs, None, 0, []
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.proj = _Proj(clock)  # a step spends LINEAR_SHARE of its cost in this linear product

    def forward(self, inputs_embeds=None, input_ids=None, use_cache=False, past_key_values=None):
        from types import SimpleNamespace

        if input_ids is not None:  # prefill: one per model per round
            self.clock.t += self.costs("prefill", self.dense, self.prefills // 2)
            self.prefills += 1
            self.order.append(self.dense)
        elif past_key_values is not None:  # a decode step reads the prompt's cache (else it costs nothing here)
            cost = self.costs("step", self.dense, self.prefills // 2)
            self.clock.t += (1 - LINEAR_SHARE) * cost
            self.proj.pending = LINEAR_SHARE * cost
            self.proj(torch.zeros(1, 1, 4))
        # a cache only where one is asked for, as a transformers model returns it
        return SimpleNamespace(last_hidden_state=torch.zeros(1, 1, 4), past_key_values=[] if use_cache is True else None)


LINEAR_SHARE = 0.75


class _Proj(torch.nn.Linear):
    """The body's linear product: its share of a step's cost, charged only when it runs."""

    def __init__(self, clock):
        super().__init__(4, 4)
        self.clock, self.pending = clock, 0.0

    def forward(self, x):
        self.clock.t += self.pending
        return super().forward(x)


class _Head(torch.nn.Linear):
    def __init__(self, clock):
        super().__init__(4, 10)
        self.clock = clock

    def forward(self, x):
        self.clock.t += 1e-3  # 1 ms outside the body per round and model
        return super().forward(x)


class _Model(torch.nn.Module):
    def __init__(self, costs):
        super().__init__()
        self.clock = _Clock()
        self.body, self.embed, self.head = _Body(self.clock, costs), torch.nn.Embedding(1000, 4), _Head(self.clock)
        self.config = type("Config", (), {"vocab_size": 1000})()

    def get_decoder(self):
        return self.body

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def use_dense(self, state):
        self.body.dense = state


def _latency(costs, spec, monkeypatch):
    import acbench.measure.latency as measure

    model = _Model(costs)
    monkeypatch.setattr(measure, "time", model.clock)
    return measure.compare_latency(model, model.use_dense, spec), model


def test_compare_latency_against_hand_computed_ratios_intervals_and_medians(monkeypatch):
    import math
    import statistics

    from scipy.stats import t as student_t

    from acbench.measure.latency import LatencySpec

    # round 0 is the warm-up (ten times slower, dropped); then the variant's decode step is 2 ms * (1, 1.02, 0.98, 1.01)
    wobble = [10.0, 1.0, 1.02, 0.98, 1.01, 1.0]
    prefill = {True: 8e-3, False: 5e-3}

    def costs(kind, dense, rnd):
        if kind == "prefill":
            return prefill[dense] * (10.0 if rnd == 0 else 1.0)
        return (4e-3 if dense else 2e-3 * wobble[rnd]) * (10.0 if rnd == 0 else 1.0)

    spec = LatencySpec(prompt_len=4, new_tokens=3, prefill_len=5, batch=2, halfwidth=0.03, min_rounds=4, seconds=60)
    got, model = _latency(costs, spec, monkeypatch)
    # who prefills first alternates by round (the warm-up dense first), so a drift loads both alike
    assert model.body.order == [True, False, True, False, False, True, True, False, False, True]
    assert model.body.dense is False  # the variant left in place
    ratios = [4e-3 / (2e-3 * w) for w in wobble[1:5]]  # per round, dense step over the variant's
    logs = [math.log(r) for r in ratios]
    half = student_t.ppf(0.975, 3) * statistics.stdev(logs) / 2
    mean = statistics.fmean(logs)
    assert got["rounds"] == 4 and got["converged"] is True  # within +-3 % at the fourth round
    body = got["speedup"]["decode_body"]
    assert body["n"] == 4 and body["ratio"] == pytest.approx(math.exp(mean))
    assert body["ci95"] == pytest.approx([math.exp(mean - half), math.exp(mean + half)])
    # end to end: the body plus the pooled 1 ms outside (the head, identical in both)
    e2e = [(4.0 + 1.0) / (2.0 * w + 1.0) for w in wobble[1:5]]
    assert got["speedup"]["decode"]["ratio"] == pytest.approx(math.exp(statistics.fmean(map(math.log, e2e))))
    assert got["speedup"]["prefill_body"]["ratio"] == pytest.approx(8 / 5)  # a rate: the variant's over dense's
    assert got["speedup"]["prefill_body"]["ci95"] == pytest.approx([8 / 5, 8 / 5])
    assert got["dense"]["decode_body_ms_per_token"] == pytest.approx(4.0)
    assert got["variant"]["decode_body_ms_per_token"] == pytest.approx(2.0 * statistics.median(wobble[1:5]))
    assert got["dense"]["decode_outside_ms_per_token"] == pytest.approx(1.0)
    assert got["variant"]["decode_ms_per_token"] == pytest.approx(2.0 * statistics.median(wobble[1:5]) + 1.0)
    assert got["variant"]["prefill_body_tokens_per_s"] == pytest.approx(10 / 5e-3)  # 2 x 5 tokens in 5 ms
    assert got["prefill_ms_per_token"] == pytest.approx(0.5) and got["decode_ms_per_token"] == \
        got["variant"]["decode_ms_per_token"]
    assert (got["protocol"], got["version"], got["conditions"]["fed_tokens"]) == ("interleaved", 2, "random ids")
    assert got["conditions"]["decode_kernel"] is None and got["conditions"]["weight_kernel"] is None
    # after the rounds, dense's overhead floor: 3 rounds of 3 steps with the products and 3 without, alternating
    over = got["body_overhead"]
    assert over["dense_body_ms"] == pytest.approx(4.0) and over["floor_ms"] == pytest.approx(1.0)
    assert over["linear_share"] == pytest.approx(LINEAR_SHARE) and over["rounds"] == 3
    assert model.body.proj.forward.__func__ is _Proj.forward  # the product restored after the floor's rounds
    floor = 3 * ((3 * 4e-3 + 1e-3) + (3 * 1e-3 + 1e-3))
    total = sum(3 * (costs("step", d, r)) + costs("prefill", d, r) + 1e-3 for r in range(5) for d in (True, False))
    assert got["seconds"] == pytest.approx(total + floor)  # the warm-up, four rounds, the floor: every call timed
    assert set(got["conditions"]["memory_bandwidth"]) == {"copy_gb_s", "triad_gb_s", "array_mb", "threads"}
    assert got["conditions"]["dense_product"]["shape"] == [4, 4]  # the body's largest (its only) linear


def test_compare_latency_stops_at_its_time_cap_and_says_it_did_not_converge(monkeypatch):
    from acbench.measure.latency import LatencySpec

    # the variant alternates 1 ms and 3 ms steps: the interval never narrows to +-3 %
    costs = lambda kind, dense, rnd: 1e-3 if kind == "prefill" or dense else (1e-3 if rnd % 2 else 3e-3)
    spec = LatencySpec(prompt_len=4, new_tokens=2, prefill_len=5, batch=2, min_rounds=4, seconds=0.05, cap_rounds=1)
    got, _ = _latency(costs, spec, monkeypatch)
    assert got["converged"] is False and got["rounds"] >= 4 and got["seconds"] > 0.05
    per_round = 2 * 1e-3 + 2 * 1e-3 + 2 * 1e-3 + 2 * 1e-3  # at least: 2 + 2 steps, 2 prefills, 2 heads
    assert got["rounds"] <= 0.05 / per_round  # stopped at the cap, not run on
    assert got["speedup"]["decode_body"]["ci95"][1] / got["speedup"]["decode_body"]["ratio"] - 1 > 0.03


def test_the_time_cap_scales_with_the_time_of_one_round(monkeypatch):
    """Rounds longer than `seconds` / `cap_rounds` move the cap to `cap_rounds` median rounds (the warm-up, three
    times slower here, moves nothing)."""
    import statistics

    from acbench.measure.latency import LatencySpec

    def costs(kind, dense, rnd):
        slow = 3.0 if rnd == 0 else 1.0
        return slow * (0.1 if kind == "prefill" or dense else (0.1 if rnd % 2 else 0.3))

    spec = LatencySpec(prompt_len=4, new_tokens=2, prefill_len=5, batch=2, min_rounds=4, seconds=0.5, cap_rounds=12)
    got, _ = _latency(costs, spec, monkeypatch)
    # the rule by hand: a round is 2 dense steps, 2 of the variant's (0.1 s in odd rounds, 0.3 s in even), 2
    # prefills and 2 heads; the clock starts before the warm-up, the cap counts median rounds after it
    elapsed, durations = 3 * (2 * 0.1 + 2 * 0.3 + 2 * 0.1) + 2 * 1e-3, []
    while True:
        durations.append(2 * 0.1 + 2 * (0.1 if (len(durations) + 1) % 2 else 0.3) + 2 * 0.1 + 2 * 1e-3)
        elapsed += durations[-1]
        cap = max(0.5, 12 * statistics.median(durations))
        if len(durations) >= 4 and elapsed > cap:
            break
    assert got["conditions"]["cap_seconds_used"] == pytest.approx(cap)
    assert got["converged"] is False and got["rounds"] == len(durations) > 4  # the cap, not min_rounds, stopped it
    assert got["conditions"]["cap_rounds"] == 12


def test_latency_spec_conditions_in_full():
    from acbench.measure.latency import LatencySpec

    assert LatencySpec(prompt_len=7, new_tokens=3, prefill_len=5, batch=2, halfwidth=0.04, min_rounds=6,
                       seconds=2.5).conditions() == {
        "prompt_len": 7, "new_tokens": 3, "prefill_len": 5, "prefill_batch": 2, "target_halfwidth": 0.04,
        "min_rounds": 6, "cap_seconds": 2.5, "cap_rounds": 16, "threads": torch.get_num_threads(),
        "compiled": False}


def test_latency_alone_is_the_median_of_its_rounds_after_a_warm_up(monkeypatch):
    import acbench.measure.latency as measure

    steps = [9e-3, 2e-3, 3e-3, 1e-3, 5e-3]  # the warm-up's, then four rounds'
    model = _Model(lambda kind, dense, rnd: 4e-3 if kind == "prefill" else steps[rnd])
    monkeypatch.setattr(measure, "time", model.clock)
    got = measure.latency(model, measure.LatencySpec(prompt_len=4, new_tokens=2, prefill_len=5, batch=2, min_rounds=4))
    # _Body counts a round per two prefills (dense's and the variant's); alone, one model prefills once a round, so
    # the warm-up and rounds 1-4 step at steps[0], steps[0], steps[1], steps[1], steps[2]: 9, 2, 2 and 3 ms measured
    assert (got["protocol"], got["rounds"], got["version"]) == ("alone", 4, 2)
    assert got["variant"]["decode_body_ms_per_token"] == pytest.approx(2.5)  # the median of 9, 2, 2, 3
    assert got["variant"]["decode_outside_ms_per_token"] == pytest.approx(1.0)
    assert got["variant"]["prefill_body_tokens_per_s"] == pytest.approx(10 / 4e-3)
    assert got["prefill_ms_per_token"] == pytest.approx(0.4)
    assert got["decode_ms_per_token"] == pytest.approx(got["variant"]["decode_body_ms_per_token"] + 1.0)
    # then the floor, at steps[2]: 3 rounds of 2 steps with the product and 2 with only the rest (a quarter)
    assert got["body_overhead"]["dense_body_ms"] == pytest.approx(3.0)
    assert got["body_overhead"]["floor_ms"] == pytest.approx((1 - LINEAR_SHARE) * 3.0)
    floor = 3 * ((2 * 3e-3 + 1e-3) + (2 * (1 - LINEAR_SHARE) * 3e-3 + 1e-3))
    assert got["seconds"] == pytest.approx(sum(2 * steps[r // 2] + 4e-3 + 1e-3 for r in range(5)) + floor)


def test_ratio_interval_with_one_and_with_two_rounds():
    import math

    from scipy.stats import t as student_t

    from acbench.measure.latency import ratio_interval

    assert ratio_interval([1.5]) == {"ratio": pytest.approx(1.5), "ci95": None, "n": 1}
    got = ratio_interval([1.0, 4.0])  # logs 0 and ln 4: mean ln 2, sd ln 4 / sqrt 2, half t(0.975, 1) * sd / sqrt 2
    half = student_t.ppf(0.975, 1) * math.log(4) / 2
    assert got["ratio"] == pytest.approx(2.0) and got["n"] == 2
    assert got["ci95"] == pytest.approx([2.0 * math.exp(-half), 2.0 * math.exp(half)])


def test_the_probe_feeds_text_windows_or_seeded_random_ids():
    from acbench.measure.latency import LatencySpec, _Probe

    spec = LatencySpec(prompt_len=4, new_tokens=3, prefill_len=5, batch=2)
    model = _Model(lambda *a: 0.0)
    text = torch.arange(50).reshape(5, 10)  # 5 windows of 10 >= prompt + new tokens and >= prefill_len
    probe = _Probe(model, spec, text)
    assert probe.fed == "text" and probe.cache_arg == "past_key_values"
    assert probe.prompt.tolist() == [[0, 1, 2, 3]] and probe.steps.tolist() == [[[4]], [[5]], [[6]]]
    assert probe.batch.tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 23, 24]]
    for short in (text[:2], text[:, :6]):  # too few windows for the batch, or windows too short: random ids
        assert _Probe(model, spec, short).fed == "random ids"
    probe = _Probe(model, spec, None)
    gen = torch.Generator().manual_seed(0)
    want = [torch.randint(3, 1000, shape, generator=gen) for shape in ((1, 4), (3, 1, 1), (2, 5))]
    assert probe.fed == "random ids"
    assert all(torch.equal(a, b) for a, b in zip((probe.prompt, probe.steps, probe.batch), want))
    model.config.vocab_size = 50  # a small vocabulary bounds the draw
    assert int(_Probe(model, spec, None).batch.max()) < 50
    model.config.vocab_size = 5000  # and a large one is drawn from below 1000 (ids any tokenizer has)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(_Probe(model, spec, None).prompt, torch.randint(3, 1000, (1, 4), generator=gen))
    exact = text[:3, :7]  # exactly prompt + new tokens long, and batch + 1 windows: text is used
    assert _Probe(model, spec, exact).fed == "text"

    class NamesItCache(_Body):  # transformers 5 names the KV cache argument `cache`
        def forward(self, inputs_embeds=None, input_ids=None, use_cache=False, cache=None):
            return super().forward(inputs_embeds, input_ids, use_cache, cache)

    model.body = NamesItCache(model.clock, lambda *a: 0.0)
    assert _Probe(model, spec, None).cache_arg == "cache"


def test_masked_weight_kernel_names_each_distinct_description_once(monkeypatch):
    import acbench.measure.latency as measure
    from acbench.core.compressed_layers import LAYOUT_KEY

    model = torch.nn.Module()
    for name in ("a", "b", "c"):
        model.add_module(name, torch.nn.Linear(8, 4))
    model.config = type("Config", (), {})()
    assert measure.masked_weight_kernel(model) is None  # no layout
    layout = {"a": {"form": "masked-weights", "pattern": "2:4"}, "b": {"form": "masked-weights", "pattern": "2:4"},
              "c": {"form": "masked-weights", "pattern": "unstructured"}}
    setattr(model.config, LAYOUT_KEY, {**layout, "d": {"form": "factorised"}})
    seen = []
    monkeypatch.setattr(measure.semi_structured, "describe",
                        lambda w, n, m: seen.append((tuple(w.shape), n, m)) or f"kernel {n}:{m}")
    assert measure.masked_weight_kernel(model) == "kernel 2:4; kernel 0:0"
    assert seen == [((4, 8), 2, 4), ((4, 8), 2, 4), ((4, 8), 0, 0)]


def test_latency_alone_with_a_single_round(monkeypatch):
    import acbench.measure.latency as measure

    model = _Model(lambda kind, dense, rnd: 4e-3 if kind == "prefill" else 3e-3)
    monkeypatch.setattr(measure, "time", model.clock)
    got = measure.latency(model, measure.LatencySpec(prompt_len=4, new_tokens=2, prefill_len=5, batch=2, min_rounds=1))
    assert got["rounds"] == 1 and got["variant"]["decode_body_ms_per_token"] == pytest.approx(3.0)


def test_rho_section_edges_p_at_the_threshold_a_bare_row_and_no_headline():
    from acbench.analyses.rho_report import rho_section

    cell = _rho_cell()
    corr = cell.details["correlations"]
    corr["rho_vs_loss_rise_per_group"]["spearman"]["p"] = 0.05
    corr["rho_vs_empty"] = {"n": 0}  # no Spearman and no note: an empty cell, not "None"
    lines = rho_section(cell)
    assert lines[0].endswith("p=0.05** (not significant at 0.05).")  # significant means below 0.05
    assert "| rho vs empty" in lines[5] and "None" not in lines[5]
    for name in [k for k in corr if k.endswith("_per_group")]:
        del corr[name]
    lines = rho_section(cell)
    assert lines[0].startswith("Correlations (r [bootstrap 95% CI] p)")  # no headline, no blank line before


# ---------------------------------------------------------------- density allocation (bench/deploy/allocation.py) by hand

def _two_bin_hist(i: int, j: int, pi: float = 0.5):
    from acbench.core.stats import HIST_BINS

    h = torch.zeros(HIST_BINS, dtype=torch.float64)
    h[i], h[j] = pi, 1 - pi
    return h


def _centre(i: int) -> float:
    from acbench.core.stats import HIST_BINS, HIST_HI, HIST_LO

    return 10.0 ** (HIST_LO + (i + 0.5) * (HIST_HI - HIST_LO) / HIST_BINS)


def test_lost_energy_by_hand_on_two_bins():
    from acbench.deploy.allocation import lost_energy
    from acbench.core.stats import HIST_BINS

    i, j = 1000, 3000  # values at the two bins' centres, half the mass each
    ei, ej = 0.5 * _centre(i) ** 2, 0.5 * _centre(j) ** 2
    assert lost_energy(_two_bin_hist(i, j) * 7, 0.5) == pytest.approx(ei / (ei + ej), rel=1e-9)  # any scale
    assert lost_energy(_two_bin_hist(i, j), 0.75) == pytest.approx(0.5 * ei / (ei + ej), rel=1e-9)  # half a bin
    assert lost_energy(_two_bin_hist(i, j), 0.25) == pytest.approx((ei + 0.5 * ej) / (ei + ej), rel=1e-9)
    assert lost_energy(_two_bin_hist(i, j), 1.0) == 0.0 and lost_energy(_two_bin_hist(i, j), 0.0) == \
        pytest.approx(1.0)
    last = HIST_BINS - 1  # mass in the last bin only: the total is there
    assert lost_energy(_two_bin_hist(last, 0, 1.0), 0.5) == pytest.approx(0.5, rel=1e-9)
    assert lost_energy(torch.zeros(HIST_BINS, dtype=torch.float64), 0.5) == 0.0  # nothing seen: nothing lost
    # mass in the very first bin: the interpolation starts from no energy below it
    e0 = 0.5 * _centre(0) ** 2
    assert lost_energy(_two_bin_hist(0, j), 0.75) == pytest.approx(0.5 * e0 / (e0 + ej), rel=1e-9)


def test_allocate_density_returns_what_it_allocated_in_full():
    from types import SimpleNamespace

    from acbench.deploy.allocation import DENSITY_STEP, allocate_density, lost_energy
    from acbench.core.stats import GroupStats, SparsitySpec

    # two groups of equal size: one whose values are all alike (costly to zero), one with a few large values
    groups = [SimpleNamespace(name=n, d_in=8, d_outs=(8,)) for n in ("flat", "peaked")]
    stats = {"flat": GroupStats(abs_hist=_two_bin_hist(2500, 2501)),
             "peaked": GroupStats(abs_hist=_two_bin_hist(500, 3500, 0.9))}
    a = allocate_density("greedy", groups, stats, SparsitySpec(density=0.5))
    assert (a.rule, a.target) == ("greedy", 0.5)
    assert a.allocated == pytest.approx(0.5)  # reachable exactly: the greedy stops there, not a step below
    assert sum(a.densities.values()) / 2 == pytest.approx(0.5) and a.densities["peaked"] < a.densities["flat"]
    assert a.lost_energy == {g: pytest.approx(lost_energy(stats[g].abs_hist, a.densities[g])) for g in stats}
    assert set(a.seconds) == {"greedy_s"} and 0 <= a.seconds["greedy_s"] < 60
    # what the cell stores of it, and what compression is given
    assert a.summary() == {"rule": "greedy", "target_density": 0.5, "allocated_density": a.allocated,
                           "density": a.densities, "lost_energy": a.lost_energy, "seconds": a.seconds}
    assert a.summary()["density"] is not a.densities  # a copy: the stored summary does not follow later edits
    assert a.compress_args() == {"densities": a.densities}
    # a target below one step per group ends every group at one step: the floor, never a dense-free group
    low = allocate_density("greedy", groups, stats, SparsitySpec(density=0.001))
    assert low.densities == {"flat": DENSITY_STEP, "peaked": DENSITY_STEP} and low.allocated == DENSITY_STEP


def test_allocate_density_refusals_in_full():
    from types import SimpleNamespace

    from acbench.deploy.allocation import allocate_density
    from acbench.core.errors import UserError
    from acbench.core.stats import HIST_BINS, GroupStats, SparsitySpec

    groups = [SimpleNamespace(name="g", d_in=8, d_outs=(8,))]
    with pytest.raises(UserError) as e:
        allocate_density("greedy", groups, {"g": GroupStats()}, SparsitySpec.parse("2:4"))
    assert str(e.value) == ("--allocate greedy sets a density per group; 2:4 keeps one N:M pattern in every group: "
                            "pass a density (--sparsity 0.5)")
    for hist in (None, torch.zeros(HIST_BINS, dtype=torch.float64)):  # absent, or all zero
        with pytest.raises(UserError) as e:
            allocate_density("greedy", groups, {"g": GroupStats(abs_hist=hist)}, SparsitySpec(density=0.5))
        assert str(e.value) == ("--allocate greedy: group g has no |x| histogram (abs_hist) in its statistics: "
                                "recalibrate (delete its statistics cache folder)")


# ---------------------------------------------------------------- memory (bench/measure/latency.py): what the peak columns read

def test_proc_status_fields_in_bytes_and_the_high_water_mark_reset():
    from acbench.measure.latency import _proc_status_bytes, _reset_rss_hwm, peak_memory

    want = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            want[key] = int(value.split()[0]) * 1024  # reported in kB
    rss = _proc_status_bytes("VmRSS")
    assert abs(rss - want["VmRSS"]) < 64 << 20 and rss % 1024 == 0
    assert _proc_status_bytes("NoSuchField") is None
    assert _reset_rss_hwm() is True  # Linux: the high-water mark restarts from the current RSS
    assert _proc_status_bytes("VmHWM") <= rss + (64 << 20)
    with peak_memory(torch.device("cpu")) as mem:
        block = bytearray(64 << 20)
        block[::4096] = b"x" * len(block[::4096])  # touched: resident
    assert mem["kind"] == "rss_high_water" and mem["bytes"] >= mem["working_bytes"] >= 0
    del block


# ---------------------------------------------------------------- rank allocation (bench/deploy/allocation.py) by hand

def test_allocation_floors_and_the_minimum_budget_by_hand():
    from acbench.deploy.allocation import _floors, _paid_minimum
    from acbench.core.errors import UserError

    shapes = {"a": (4, 4), "b": (300, 600), "c": (150, 50), "d": (50, 50)}
    kmax, min_k = _floors(shapes)
    # the largest k whose factors are smaller than dense: ceil(d D / (d + D)) - 1; at least 1 % of d, at least one
    assert kmax == {"a": 1, "b": 199, "c": 37, "d": 24}
    assert min_k == {"a": 1, "b": 3, "c": 2, "d": 1}
    floor = 1 * 8 + 3 * 900 + 2 * 200 + 1 * 100
    assert _paid_minimum(shapes, min_k, floor, 0.5) == floor  # a budget exactly at the floor pays it
    with pytest.raises(UserError) as e:
        _paid_minimum(shapes, min_k, floor - 1, 0.01)
    assert str(e.value) == (f"--rank 0.01: a parameter budget of {floor - 1:,} is below the minimum ranks of the "
                            f"selected groups ({floor:,} parameters at 1 % of each group's directions): raise --rank")


def test_allocation_summary_in_full():
    from acbench.deploy.allocation import Allocation

    a = Allocation("fisher", {"g0": 3, "g1": 8}, 600, 550, 1000, {"values_s": 0.5, "greedy_s": 0.25})
    assert a.summary() == {"rule": "fisher", "budget_params": 600, "allocated_params": 550, "dense_params": 1000,
                           "budget_ratio": 0.6, "allocated_ratio": 0.55,
                           "seconds": {"values_s": 0.5, "greedy_s": 0.25}, "k": {"g0": 3, "g1": 8}}
    assert a.compress_args() == {"ks": {"g0": 3, "g1": 8}}


@pytest.mark.parametrize("rule", ["fisher", "variance"])
def test_a_non_finite_statistic_stops_an_allocation_in_one_line(rule):
    from types import SimpleNamespace

    from acbench.deploy.allocation import allocate
    from acbench.testing import random_stats
    from acbench.core.errors import UserError
    from acbench.core.stats import RankSpec

    st = random_stats(8)
    st.C[0, 0] = float("nan")
    with pytest.raises(UserError) as e:
        allocate(rule, [SimpleNamespace(name="g", d_in=8, d_outs=(8,))], {"g": st}, RankSpec(0.5, "params"))
    assert str(e.value).startswith("non-finite C statistics in ") and "\n" not in str(e.value)


def test_greedy_rank_split_by_hand():
    """Two groups at their minimum k = 1 = kmax: each can only merge (keep everything) for the rest of dense.
    a: (4, 4), merging costs 16 - 8 = 8 for the value 9; b: (6, 2), 12 - 8 = 4 for 6. Value per parameter: b 1.5,
    a 1.125."""
    from acbench.deploy.allocation import _greedy
    from acbench.core.errors import UserError

    shapes = {"a": (4, 4), "b": (6, 2)}
    values = {"a": torch.tensor([5.0, 3.0, 3.0, 3.0], dtype=torch.float64),
              "b": torch.tensor([5.0, 2.0, 2.0, 1.0, 0.5, 0.5], dtype=torch.float64)}
    assert _greedy(shapes, values, 24, 0.9) == ({"a": 1, "b": 6}, 20)  # b first; then a's 8 does not fit
    assert _greedy(shapes, values, 28, 1.0) == ({"a": 4, "b": 6}, 28)  # both, exactly at the budget
    assert _greedy(shapes, values, 20, 0.7) == ({"a": 1, "b": 6}, 20)  # b exactly fits
    flipped = {"a": values["a"] * 2, "b": values["b"]}  # now a first (2.25 per parameter); b still fits after it
    assert _greedy(shapes, flipped, 28, 1.0) == ({"a": 4, "b": 6}, 28)
    assert _greedy(shapes, flipped, 24, 0.9) == ({"a": 4, "b": 1}, 24)
    assert _greedy(shapes, flipped, 22, 0.8) == ({"a": 1, "b": 6}, 20)  # a does not fit, b still does
    with pytest.raises(UserError, match=r"^--rank 0.5: a parameter budget of 15 is below"):
        _greedy(shapes, values, 15, 0.5)


def test_uniform_allocation_and_the_budget_check_by_hand():
    from types import SimpleNamespace

    from acbench.deploy.allocation import allocate, check_budget
    from acbench.core.errors import UserError
    from acbench.core.stats import RankSpec

    groups = [SimpleNamespace(name="a", d_in=20, d_outs=(10, 10)), SimpleNamespace(name="b", d_in=4, d_outs=(4,))]
    a = allocate("uniform", groups, {}, RankSpec(0.5))
    # k = round(0.5 * 20) = 10 costs 10 * 40 = 400 (dense 400: capped there); b: k 2 costs 16 (dense 16)
    assert a.ks == {"a": 10, "b": 2} and (a.budget_params, a.allocated_params, a.dense_params) == (416, 416, 416)
    a = allocate("uniform", groups, {}, RankSpec(0.25))
    assert a.ks == {"a": 5, "b": 1} and (a.allocated_params, a.dense_params) == (5 * 40 + 8, 416)
    with pytest.raises(UserError, match=r"^--rank 0.05: a parameter budget of 20 is below"):
        check_budget(groups, RankSpec(0.05, "params"))


# ---------------------------------------------------------------- speed beside its bound and ceiling (leaderboard/)

def test_bytes_bound_fraction_and_ceiling_on_hand_rows():
    from acbench.leaderboard.tables import ceiling, speed_bounds

    # act-sparse at density 0.5: bound 2; dense body 40 ms of which 16 ms outside the products:
    # ceiling 40 / (16 + 24 / 2) = 40 / 28
    row = {"decode speedup (body)": 1.25, "decode speedup (body) ci": (1.2, 1.3), "compute ratio": 0.5}
    speed_bounds(row, {"dense_body_ms": 40.0, "floor_ms": 16.0})
    assert row["bytes bound"] == pytest.approx(2.0) and row["of bound"] == pytest.approx(0.625)
    assert row["ceiling (body)"] == pytest.approx(40 / 28) and row["of ceiling"] == pytest.approx(1.25 * 28 / 40)
    # a threshold's measured density wins over its compute ratio; a low-rank row's param ratio stands in for an
    # absent compute ratio; no overhead measured: no ceiling
    teal = {"decode speedup (body)": 1.1, "decode speedup (body) ci": (1.0, 1.2), "compute ratio": 0.5,
            "measured density": 0.4}
    speed_bounds(teal, None)
    assert teal["bytes bound"] == pytest.approx(2.5) and "ceiling (body)" not in teal
    lowrank = {"decode speedup (body)": 1.0, "decode speedup (body) ci": (0.9, 1.1), "param ratio": 0.8}
    speed_bounds(lowrank, {"dense_body_ms": 10.0, "floor_ms": 10.0})  # everything outside the products
    assert lowrank["bytes bound"] == pytest.approx(1.25) and lowrank["ceiling (body)"] == pytest.approx(1.0)
    for untimed in ({"compute ratio": 0.5}, {"decode speedup (body)": 1.2, "compute ratio": 0.5},  # no interval
                    {"decode speedup (body)": 1.2, "decode speedup (body) ci": (1.1, 1.3), "compute ratio": 1.0},
                    {"decode speedup (body)": 1.2, "decode speedup (body) ci": (1.1, 1.3)},  # no ratio at all
                    {"decode speedup (body)": 1.2, "decode speedup (body) ci": (1.1, 1.3), "measured density": 0.0}):
        speed_bounds(untimed, {"dense_body_ms": 10.0, "floor_ms": 5.0})
        assert "bytes bound" not in untimed
    assert ceiling(10.0, 0.0, 4.0) == pytest.approx(4.0) and ceiling(10.0, 12.0, 4.0) == pytest.approx(10 / 12)
    # a sub-millisecond body still gets its ceiling; a dense time of 0 is no measurement
    fast = {"decode speedup (body)": 1.2, "decode speedup (body) ci": (1.1, 1.3), "compute ratio": 0.5}
    speed_bounds(fast, {"dense_body_ms": 0.5, "floor_ms": 0.25})
    assert fast["ceiling (body)"] == pytest.approx(0.5 / (0.25 + 0.25 / 2))
    zero = {"decode speedup (body)": 1.2, "decode speedup (body) ci": (1.1, 1.3), "compute ratio": 0.5}
    speed_bounds(zero, {"dense_body_ms": 0.0, "floor_ms": 0.0})
    assert zero["bytes bound"] == 2.0 and "ceiling (body)" not in zero
    # a floor measured above the dense body it is part of (timing noise on a tiny model): no ceiling, no "174 %"
    noisy = {"decode speedup (body)": 1.2, "decode speedup (body) ci": (1.1, 1.3), "compute ratio": 0.5}
    speed_bounds(noisy, {"dense_body_ms": 0.5, "floor_ms": 0.87})
    assert noisy["bytes bound"] == 2.0 and "ceiling (body)" not in noisy and "of ceiling" not in noisy


def test_the_read_once_cache_frees_after_its_last_reader_and_counts_what_it_computed():
    from acbench.core.compressed_layers import ReadOnce

    r, calls = ReadOnce(), []
    r.n_readers = 3
    x, y = torch.ones(2), torch.zeros(2)
    f = lambda t: calls.append(1) or t + 1
    first, second = r.shared(x, f), r.shared(x, f)
    assert first is second and r._memo.entry is not None  # two of x's three readers: still held
    r.shared(x, f)  # the third reader: the value is handed over and freed
    assert r._memo.entry is None and r.n_computed == 1 and len(calls) == 1
    r.shared(y, f)
    r.shared(y, f)
    assert r.n_computed == 2 and r._memo.entry is not None  # two of y's three readers so far
    x.add_(1)  # an in-place change is a new input, even for the same tensor
    r.shared(x, f)
    assert r.n_computed == 3


def test_a_cells_identity_holds_the_weights_hash_when_known():
    from acbench.core.record import CellId

    c = CellId("org/m", "pca", 0.5, "rank", "lama", "k1")
    assert c.identity("abc") == ("org/m", "abc", "pca", "uniform", "all", "rank", 0.5, "lama", "k1")
    assert c.identity() == ("org/m", "org/m", "pca", "uniform", "all", "rank", 0.5, "lama", "k1")


def test_a_comparison_that_did_not_converge_says_so_beside_its_number():
    from acbench.leaderboard.formatting import _fmt_speedup

    row = {"decode speedup": 1.05, "decode speedup ci": (0.97, 1.13), "decode converged": False}
    assert _fmt_speedup(row, "decode speedup") == "= dense (1.05x [0.97, 1.13]) (not converged)"
    row["decode converged"] = True
    assert _fmt_speedup(row, "decode speedup") == "= dense (1.05x [0.97, 1.13])"
    # an interval that ends at 1.0, at either side, contains it
    assert _fmt_speedup({"s": 0.95, "s ci": (0.9, 1.0)}, "s") == "= dense (0.95x [0.90, 1.00])"
    assert _fmt_speedup({"s": 1.05, "s ci": (1.0, 1.1)}, "s") == "= dense (1.05x [1.00, 1.10])"
    assert _fmt_speedup({"s": 1.2, "s ci": (1.1, 1.3)}, "s") == "1.20x [1.10, 1.30]"
    assert _fmt_speedup({"s": 1.2, "s ci": None}, "s") == "1.20x" and _fmt_speedup({"s": None}, "s") == ""


def test_the_header_names_what_bounds_decode():
    from acbench.core.record import CellRecord
    from acbench.leaderboard.sections import bounds_line

    lat = {"conditions": {"memory_bandwidth": {"copy_gb_s": 14.04, "triad_gb_s": 15.96, "array_mb": 256, "threads": 2},
                          "dense_product": {"shape": [640, 2048], "dtype": "float32", "gb_s": 12.34}},
           "body_overhead": {"dense_body_ms": 42.0, "floor_ms": 17.25}}
    cell = CellRecord.__new__(CellRecord)
    cell.latency = lat
    assert bounds_line([cell]) == [
        "- what bounds decode here: memory copy 14.0 GB/s, triad 16.0 GB/s (256 MB arrays, 2 threads); a dense "
        "batch-1 product of the largest site (640 x 2048 float32, weights cold) streams 12.3 GB/s; dense body decode "
        "42.00 ms/token, of which 17.25 ms outside the linear products (the overhead floor)"]
    cell.latency = {"conditions": {}}
    assert bounds_line([cell]) == []


def test_bandwidth_probes_and_the_skipped_products():
    from acbench.measure.bandwidth import gemv_bandwidth, largest_linear, linear_products_skipped, stream_bandwidth

    got = stream_bandwidth(8 * 2**20)
    assert got["array_mb"] == 8 and got["copy_gb_s"] > 0 and got["triad_gb_s"] > 0
    g = gemv_bandwidth(64, 32, cold_bytes=2**20)
    assert g["shape"] == [64, 32] and g["dtype"] == "float32" and g["gb_s"] > 0
    body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    body.get_decoder = lambda: body
    assert largest_linear(body) == (16, 8, torch.float32)
    x = torch.randn(3, 8)
    with linear_products_skipped(body) as n:
        assert n == 2 and torch.equal(body(x), torch.zeros(3, 4))
    assert not torch.equal(body(x), torch.zeros(3, 4))  # restored


# ---------------------------------------------------------------- rho's sensitivity rows and their sign, end to end

# what compressing one block's group with each method costs, by hand: the loss (nats) it adds, and the LAMA and MMLU
# accuracy it takes away; fasc loses less than pca in blocks 1-3 and more in block 0
COST = {"pca": {"loss": [0.10, 0.20, 0.40, 0.80], "lama": [0.01, 0.02, 0.04, 0.08], "mmlu": [0.0, 0.01, 0.02, 0.03]},
        "fasc": {"loss": [0.15, 0.10, 0.10, 0.20], "lama": [0.02, 0.01, 0.01, 0.02], "mmlu": [0.0, 0.0, 0.01, 0.01]}}
DENSE = {"loss": 2.0, "lama": 0.5, "mmlu": 0.4}


class _SensitivityCtx:
    """What the rho analysis reads of the harness: tasks whose scores follow COST for the groups compressed."""

    def __init__(self):
        from types import SimpleNamespace

        self.groups = [SimpleNamespace(name=f"model.{b}.mlp_in", block=b, kind="mlp_in", d_in=8, d_outs=(8,))
                       for b in range(4)]
        self.model, self.tokenizer, self.progress, self.seed, self.stats = (), object(), False, 0, {}
        self.asked = []

    def task(self, name, **settings):
        from types import SimpleNamespace

        self.asked.append((name, settings))
        kind = {"ppl-token": "loss", "lama": "lama", "mmlu": "mmlu"}[name]
        metric = {"loss": "nll", "lama": "p@1", "mmlu": "acc"}[kind]
        sign = 1 if kind == "loss" else -1  # a loss rises, an accuracy drops

        def evaluate(model, tokenizer, progress=False):
            assert tokenizer is self.tokenizer, f"{name} evaluated without the model's tokenizer"
            value = DENSE[kind] + sign * sum(COST[m][kind][b] for m, b in model)
            return SimpleNamespace(metrics={metric: value})

        return SimpleNamespace(evaluate=evaluate)

    def compressed(self, method, rank, only_groups):
        import contextlib

        blocks = [g.block for g in self.groups if g.name in only_groups]
        return contextlib.nullcontext(tuple((method, b) for b in blocks))


def test_sensitivity_rows_against_hand_differences():
    from acbench.analyses.rho import RhoSettings, sensitivity
    from acbench.core.stats import RankSpec

    ctx = _SensitivityCtx()
    rises = {}
    rows, dense = sensitivity(ctx, RankSpec(0.5), RhoSettings(units=2, lama_limit=1, mmlu_limit=2, per_group=True),
                              [[0, 1], [2, 3]], rises)
    assert dense == pytest.approx(DENSE)
    by = {(r["unit"], r["method"]): r for r in rows}
    assert len(rows) == 4 and by[(1, "fasc")]["blocks"] == [2, 3]
    for (u, m), r in by.items():
        blocks = [0, 1] if u == 0 else [2, 3]
        assert r["loss_rise"] == pytest.approx(sum(COST[m]["loss"][b] for b in blocks))  # compressed - dense
        assert r["lama_drop"] == pytest.approx(sum(COST[m]["lama"][b] for b in blocks))  # dense - compressed
        assert r["mmlu_drop"] == pytest.approx(sum(COST[m]["mmlu"][b] for b in blocks))
    assert rises == pytest.approx({f"model.{b}.mlp_in": COST["pca"]["loss"][b] for b in range(4)})  # pca alone
    assert ("mmlu", {"limit": 2, "shots": 0}) in ctx.asked and ("lama", {"per_relation": 1}) in ctx.asked
    no_acc = sensitivity(_SensitivityCtx(), RankSpec(0.5), RhoSettings(units=2, lama_limit=0), [[0, 1], [2, 3]])[0]
    assert all("lama_drop" not in r and "mmlu_drop" not in r for r in no_acc)


def test_rho_correlates_with_loss_rise_with_the_sign_the_claim_reads(monkeypatch):
    """Groups whose rho is higher lose more when pca compresses them, and fasc gains more there: both correlations
    come out +1, and the gain is pca's loss minus fasc's (positive: fasc better)."""
    import acbench.analyses.rho as rho

    ctx = _SensitivityCtx()
    rhos = [0.1, 0.2, 0.3, 0.4]  # rising with pca's loss rise and with fasc's gain over pca (blocks 1-3)
    monkeypatch.setattr(rho, "group_rho", lambda stats, groups, rank: [
        {"group": g.name, "block": g.block, "kind": g.kind, "d": 8, "k": 4, "rho": rhos[g.block],
         "rho_cos": rhos[g.block], "rho_dir": -rhos[g.block], "n_tokens": 16, "surrogate_pca": 1.0,
         "surrogate_fasc_kfac": 1.0 - rhos[g.block], "surrogate_gain": rhos[g.block], "seconds": 0.0}
        for g in groups])
    from acbench.core.stats import RankSpec

    real = rho.correlations  # the point estimates are what is pinned here: 50 bootstrap draws, not 1000
    monkeypatch.setattr(rho, "correlations", lambda x, y, seed=0: real(x, y, n_boot=50, seed=seed))
    out = rho.Rho(rho.RhoSettings(units=4, lama_limit=1, mmlu_limit=1)).run(ctx, RankSpec(0.5))
    assert out.higher_is_better == dict.fromkeys(out.metrics) and out.higher_is_better  # no better direction
    units = out.details["units"]
    assert [u["unit"] for u in units] == [0, 1, 2, 3]
    for u in units:
        b = u["blocks"][0]
        assert u["rho"] == pytest.approx(rhos[b])
        assert u["fasc_gain_mmlu_drop"] == pytest.approx(COST["pca"]["mmlu"][b] - COST["fasc"]["mmlu"][b])
        assert u["fasc_gain_loss_rise"] == pytest.approx(COST["pca"]["loss"][b] - COST["fasc"]["loss"][b])
        assert u["fasc_gain_lama_drop"] == pytest.approx(COST["pca"]["lama"][b] - COST["fasc"]["lama"][b])
    corr = out.details["correlations"]
    assert corr["rho_vs_loss_rise_pca"]["spearman"]["r"] == pytest.approx(1.0)
    assert corr["rho_dir_vs_loss_rise_pca"]["spearman"]["r"] == pytest.approx(-1.0)
    # fasc's gain in loss: -0.05, 0.10, 0.30, 0.60, rising with rho
    assert corr["rho_vs_fasc_gain_loss_rise"]["spearman"]["r"] == pytest.approx(1.0)
    assert corr["rho_vs_surrogate_gain_per_group"]["spearman"]["r"] == pytest.approx(1.0)
    assert out.metrics["spearman_rho_loss_rise"] == pytest.approx(1.0)
    assert out.metrics["rho_mean"] == pytest.approx(0.25) and out.metrics["surrogate_gain_mean"] == pytest.approx(0.25)


def _rho_group(d: int = 12, n: int = 64, scale: float = 0.3):
    """One group's token sample (x and g dependent, small enough that the surrogates are below 1)."""
    from types import SimpleNamespace

    from acbench.core.stats import GroupStats
    from coupling_synthetic import Distribution

    x, g = Distribution("B", d, 2).sample(n)
    x, g = x * scale, g * scale
    st = GroupStats(n_tokens=n, C=x.T @ x / n, F=g.T @ g / n, xs=x.float(), gs=g.float())
    return st, SimpleNamespace(name="g", block=3, kind="mlp_in", d_in=d, d_outs=(20,))


def test_group_rho_row_against_a_hand_computation():
    """A group's rho row: k from the rank, rho_dir over pca's discarded eigenvectors of C (found here with eigh),
    the surrogates E[(g^T (I - P) x)^2] for pca's projection and for fasc-kfac's oblique one (U_k W_k^T), and the
    gain (pca's - fasc's) / pca's."""
    from acbench.analyses.dependence import rho_scores
    from acbench.analyses.rho import group_rho
    from acbench.core.linalg import fisher_basis
    from acbench.core.stats import RankSpec

    st, group = _rho_group()
    row = group_rho({"g": st}, [group], RankSpec(0.25))[0]
    k = 3  # round(0.25 * 12)
    lam, V = torch.linalg.eigh(st.C.double())
    U = V[:, lam.argsort(descending=True)]
    assert row["k"] == k and (row["group"], row["block"], row["kind"], row["d"]) == ("g", 3, "mlp_in", 12)
    want = rho_scores(st.xs, st.gs, discard=U[:, k:])
    assert row["rho_dir"] == pytest.approx(want["rho_dir"], rel=1e-9)
    assert row["rho_dir"] != pytest.approx(rho_scores(st.xs, st.gs, discard=U[:, k + 1:])["rho_dir"], rel=1e-6)
    assert row["rho"] == pytest.approx(want["rho"], rel=1e-9)
    X, G = st.xs.double(), st.gs.double()
    full = (G * X).sum(1)  # g^T x per token
    s_pca = float(((full - ((G @ U[:, :k]) * (X @ U[:, :k])).sum(1)) ** 2).mean())
    fb = fisher_basis(st)
    Uf, Wf = fb["U"].double(), fb["Wt"].double()
    s_fasc = float(((full - ((G @ Uf[:, :k]) * (X @ Wf[:k].T)).sum(1)) ** 2).mean())
    assert 0 < s_pca < 1 and 0 < s_fasc < 1 and abs(s_fasc - s_pca) > 0.1 * s_pca  # two different numbers
    assert row["surrogate_pca"] == pytest.approx(s_pca, rel=1e-6)
    assert row["surrogate_fasc_kfac"] == pytest.approx(s_fasc, rel=1e-6)
    assert row["surrogate_gain"] == pytest.approx((s_pca - s_fasc) / s_pca, rel=1e-6)
    assert 0 <= row["seconds"] < 60
    # nothing discarded (rank 1): both surrogates 0, the gain 0 rather than 0 / 0
    whole = group_rho({"g": _rho_group()[0]}, [group], RankSpec(1.0))[0]
    assert (whole["k"], whole["surrogate_pca"], whole["surrogate_gain"]) == (12, 0.0, 0.0)


def test_rho_means_skip_undefined_groups():
    import math

    from acbench.analyses.rho import _mean

    assert _mean([1.0, None, float("nan"), 3.0, float("inf")]) == 2.0
    assert math.isnan(_mean([None, float("nan")])) and math.isnan(_mean([]))


def test_rho_settings_refuse_fewer_than_one_unit_or_loss_window():
    from acbench.analyses.rho import RhoSettings
    from acbench.core.settings import check_settings

    for name in ("units", "loss_windows"):
        with pytest.raises(ValueError, match=rf"^analysis 'rho': setting {name} must be >= 1, got 0$"):
            check_settings(RhoSettings(**{name: 0}), "analysis 'rho'")
    check_settings(RhoSettings(units=1, loss_windows=1), "analysis 'rho'")


# ---------------------------------------------------------------- matched compute (leaderboard/tables.py) on hand rows
def test_compute_of_prefers_the_compute_ratio_and_falls_back_to_the_parameter_ratio():
    from acbench.leaderboard.tables import compute_of

    assert compute_of({"compute ratio": 0.3, "param ratio": 0.7}) == 0.3
    assert compute_of({"compute ratio": None, "param ratio": 0.7}) == 0.7  # a low-rank cell stored before it
    assert compute_of({"compute ratio": "n/a", "param ratio": "n/a"}) is None and compute_of({}) is None


def test_matched_compute_takes_density_target_and_each_low_rank_method_nearest_it(monkeypatch):
    """Sparsity rows at exactly the target density; each low-rank method once, at the budget whose compute ratio is
    nearest the target (the first such budget on a tie); a scoped section and a row without a compute ratio never."""
    import acbench.leaderboard.tables as tables
    from acbench.core.record import ALL_GROUPS

    monkeypatch.setattr(tables, "variant_row", lambda cells, _: cells[0])  # a cell here is its row
    sections = {
        ("rank", 0.5, "groups=mlp_in"): {"pca": [{"compute ratio": 0.5}], "svd": [{"compute ratio": 0.5}]},
        ("2:4", 0.5, ALL_GROUPS): {"wanda": [{"compute ratio": 0.5}], "act-sparse": [{"compute ratio": 0.5}]},
        ("unstructured", 0.5 + 1e-10, ALL_GROUPS): {"teal": [{"compute ratio": 0.5}]},
        ("unstructured", 0.25, ALL_GROUPS): {"teal": [{"compute ratio": 0.25}]},
        ("rank", 0.5, ALL_GROUPS): {"random": [{"param ratio": None}], "pca": [{"compute ratio": 0.62}],
                                     "svd": [{"compute ratio": 0.5}]},  # a row without a ratio skips itself only
        ("params", 0.4, ALL_GROUPS): {"pca": [{"compute ratio": 0.45}], "svd": [{"compute ratio": 0.4}]},
        ("rank", 0.25, ALL_GROUPS): {"pca": [{"compute ratio": 0.55}], "svd": [{"compute ratio": 0.25}]},
        ("params", 0.5, ALL_GROUPS): {"svd": [{"compute ratio": 0.5, "a tie": "later"}]},
    }
    got = tables.matched_compute(sections, 0.5)
    assert got == {"wanda @ 2:4": [{"compute ratio": 0.5}], "act-sparse @ 2:4": [{"compute ratio": 0.5}],
                   "teal @ unstructured": [{"compute ratio": 0.5}],
                   "pca @ params 0.4": [{"compute ratio": 0.45}], "svd @ rank 0.5": [{"compute ratio": 0.5}]}
    # the sparsity row at density 0.25 when that is the target, and no low-rank row without a compute ratio
    assert "teal @ unstructured" in tables.matched_compute(sections, 0.25)
    assert tables.matched_compute(sections, 0.25)["teal @ unstructured"] == [{"compute ratio": 0.25}]
    assert tables.matched_compute(sections) == got  # the default target is the half the report compares at
    # a density 1e-9 from the target is not the target (the tolerance is strict)
    assert tables.matched_compute({("unstructured", 1e-9, ALL_GROUPS): {"teal": [{}]}}, 0.0) == {}


# ---------------------------------------------------------------- core/record.py: what older cells left unstored
def test_chance_levels_of_the_first_schemas():
    from acbench.core.record import _legacy_chance

    assert _legacy_chance("mmlu", {}, {}) == 0.25
    assert _legacy_chance("lama", {"n_candidates": 4}, {}) == 0.25
    assert _legacy_chance("lama", {"n_candidates": 1}, {}) == 1.0  # one candidate: always right
    # the probe's own count missing or 0: its relation's, as the earliest details stored it
    assert _legacy_chance("lama", {"n_candidates": 0, "relation": "P1"}, {"n_candidates": {"P1": 5}}) == 0.2
    assert _legacy_chance("lama", {"relation": "P1"}, {"n_candidates": {"P1": 5}}) == 0.2
    assert _legacy_chance("lama", {"relation": "P2"}, {"n_candidates": {"P1": 5}}) is None
    assert _legacy_chance("lama", {"relation": "P1"}, {"n_candidates": [5]}) is None
    assert _legacy_chance("lama", {}, {"n_candidates": {None: 0}}) is None  # no count is no chance level


def test_scopes_read_as_words():
    from acbench.core.record import ALL_GROUPS, describe_scope

    assert describe_scope(ALL_GROUPS) == "every input group"
    assert describe_scope("groups=mlp_in,mlp_out;blocks=0-5,12") == "groups mlp_in, mlp_out; blocks 0-5, 12"


class _TwelveGroupsCtx(_SensitivityCtx):
    """Three groups per block, a seed of its own, and tasks that record the progress flag they are evaluated with."""

    def __init__(self):
        from types import SimpleNamespace

        super().__init__()
        self.groups = [SimpleNamespace(name=f"model.{b}.g{i}", block=b, kind="mlp_in", d_in=8 + 2 * i, d_outs=(8,))
                       for b in range(4) for i in range(3)]
        self.seed, self.progress_seen = 7, []

    def task(self, name, **settings):
        t = super().task(name, **settings)
        inner = t.evaluate

        def evaluate(model, tokenizer, progress=None):  # no default the analysis could lean on
            self.progress_seen.append(progress)
            return inner(model, tokenizer)

        t.evaluate = evaluate
        return t


def test_rho_task_stores_its_details_in_full(monkeypatch):
    """What a rho cell stores beside its correlations: the ten highest-rho groups in order, dense's scores, the cost
    formula with both groups' flops and the summed seconds, the rank, the settings; the tasks it asks for, with the
    run's seed in every correlation and no progress bars inside it; per-group rises with per_group on."""
    import acbench.analyses.rho as rho
    from acbench.analyses.dependence import cost_flops
    from acbench.core.stats import RankSpec

    ctx = _TwelveGroupsCtx()
    rhos = {g.name: 0.01 * (k + 1) for k, g in enumerate(ctx.groups)}
    monkeypatch.setattr(rho, "group_rho", lambda stats, groups, rank: [
        {"group": g.name, "block": g.block, "kind": g.kind, "d": g.d_in + 1, "k": 4, "rho": rhos[g.name],
         "rho_cos": rhos[g.name], "rho_dir": rhos[g.name], "n_tokens": 16, "surrogate_pca": 1.0,
         "surrogate_fasc_kfac": 0.5, "surrogate_gain": 0.5, "seconds": 0.25} for g in groups])
    seeds = []
    real = rho.correlations
    monkeypatch.setattr(rho, "correlations", lambda x, y, seed=0: seeds.append(seed) or real(x, y, n_boot=20, seed=seed))
    settings = rho.RhoSettings(units=2, lama_limit=1, mmlu_limit=1, loss_windows=3, per_group=True)
    out = rho.Rho(settings).run(ctx, RankSpec(0.5))
    det = out.details
    assert seeds and set(seeds) == {7} and set(ctx.progress_seen) == {False}
    assert ("ppl-token", {"max_windows": 3, "batch_size": 1}) in ctx.asked
    top = det["highest_rho_groups"]
    assert [r["rho"] for r in top] == pytest.approx([0.12 - 0.01 * i for i in range(10)])
    assert top[0] == {"group": "model.3.g2", "block": 3, "kind": "mlp_in", "rho": pytest.approx(0.12)}
    assert det["dense"] == DENSE
    assert det["cost"] == {"formula": "2 N^2 d + 2 N d m multiply-adds per group (N sampled tokens, m discarded "
                                      "directions)", "flops_smallest_group": cost_flops(16, 9, 4),  # odd widths: k = d // 2
                           "flops_largest_group": cost_flops(16, 13, 6), "seconds_total": pytest.approx(3.0)}
    assert all(isinstance(det["cost"][k], int) for k in ("flops_smallest_group", "flops_largest_group"))
    assert det["rank"] == {"ratio": 0.5, "budget": "rank"} and out.config == dict(vars(settings))
    assert [u["blocks"] for u in det["units"]] == [[0, 1], [2, 3]]
    for t in ("loss_rise_pca", "lama_drop_fasc", "mmlu_drop_pca", "fasc_gain_mmlu_drop"):
        assert f"rho_vs_{t}" in det["correlations"]
    # each group compressed alone with pca: its rise is its block's pca loss cost
    assert [r["loss_rise_pca_alone"] for r in det["per_group"]] == pytest.approx(
        [COST["pca"]["loss"][g.block] for g in ctx.groups])


def test_rho_units_cut_the_blocks_into_contiguous_ranges():
    from acbench.analyses.rho import _units

    assert _units(4, 8) == [[0], [1], [2], [3]]  # never more ranges than blocks
    assert _units(3, 1) == [[0, 1, 2]] and _units(5, 2) == [[0, 1], [2, 3, 4]]
    assert _units(2, 0) == [[0, 1]]  # at least one range


def test_sensitivity_per_group_without_a_dict_of_its_own():
    from acbench.analyses.rho import RhoSettings, sensitivity
    from acbench.core.stats import RankSpec

    rows, dense = sensitivity(_SensitivityCtx(), RankSpec(0.5), RhoSettings(units=2, per_group=True), [[0, 1], [2, 3]])
    assert dense["loss"] == DENSE["loss"] and len(rows) == 4


def test_weight_bytes_count_shared_storage_once():
    m = torch.nn.Linear(4, 3, bias=False)  # 12 floats
    m.register_buffer("alias", m.weight.detach())  # the same storage again: not counted twice
    m.register_buffer("extra", torch.zeros(5))  # after it, counted
    assert weight_bytes(m) == (12 + 5) * 4


def test_rss_peak_reset_says_when_the_kernel_refuses(monkeypatch):
    import builtins

    from acbench.measure.latency import _reset_rss_hwm

    def refuse(*a, **k):
        raise OSError("no /proc here")

    monkeypatch.setattr(builtins, "open", refuse)
    assert _reset_rss_hwm() is False


def test_what_bounds_on_a_probe_whose_times_are_known(monkeypatch):
    """The floor is the body without its products; the share is 1 - floor / dense, None for a 0 ms body; the dense
    product's bandwidth is measured on CPU only, at the largest site's shape."""
    from types import SimpleNamespace

    import acbench.measure.latency as measure

    monkeypatch.setattr(measure, "stream_bandwidth", lambda: {"copy_gb_s": 1.0})
    asked = []
    monkeypatch.setattr(measure, "gemv_bandwidth", lambda *site: asked.append(site) or {"gb_s": 2.0})
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 6))
    real = measure.linear_products_skipped
    for dense_ms, floor_ms, share in [(0.8, 0.2, 0.75), (0.0, 0.0, None), (0.5, 0.6, 0.0)]:
        skipped = []
        probe = SimpleNamespace(body=model, device=torch.device("cpu"), decode=lambda: {
            "decode_body_ms_per_token": floor_ms if skipped and skipped[-1] else dense_ms})

        class Skip:  # records whether the products are skipped while the probe decodes
            def __init__(self, body):
                self.inner = real(body)

            def __enter__(self):
                skipped.append(True)
                return self.inner.__enter__()

            def __exit__(self, *exc):
                skipped.append(False)
                return self.inner.__exit__(*exc)

        monkeypatch.setattr(measure, "linear_products_skipped", Skip)
        got = measure.what_bounds(model, probe)
        assert got["body_overhead"] == {"dense_body_ms": dense_ms, "floor_ms": floor_ms, "linear_share": share,
                                        "rounds": 3}
        assert got["machine"] == {"memory_bandwidth": {"copy_gb_s": 1.0}, "dense_product": {"gb_s": 2.0}}
    assert asked[-1] == (6, 3, torch.float32)
    probe.device = torch.device("meta")  # an accelerator: no CPU product bandwidth to measure
    assert "dense_product" not in measure.what_bounds(model, probe)["machine"]


def test_allocation_solves_in_the_runs_precision(monkeypatch):
    """The allocation's eigen-solves run in the precision the run solves in, so the compression after it finds them
    memoised there (a float32 run must not pay float64 solves first)."""
    from types import SimpleNamespace

    import acbench.deploy.allocation as alloc
    from acbench.testing import random_stats
    from acbench.core.stats import RankSpec

    seen, real = [], alloc.direction_values
    monkeypatch.setattr(alloc, "direction_values", lambda rule, st: seen.append(st.C.dtype) or real(rule, st))
    groups = [SimpleNamespace(name=n, d_in=8, d_outs=(8,)) for n in ("a", "b")]
    stats = {"a": random_stats(8), "b": random_stats(8)}
    alloc.allocate("variance", groups, stats, RankSpec(0.5, "params"), dtype=torch.float32)
    alloc.allocate("variance", groups, stats, RankSpec(0.5, "params"))
    assert seen == [torch.float32] * 2 + [torch.float64] * 2


# ---------------------------------------------------------------- core/compressed_layers.py: the factorised sites

def test_factorised_sites_compute_a_b_x_plus_bias_sharing_b_x_once():
    """What a saved low-rank checkpoint runs: y = A (B x) + b per site, B x computed once per input for the group
    (its owner's B), every factor in the model's dtype and frozen with it; a site alone skips the cache."""
    from acbench.core.compressed_layers import LowRankLinear

    gen = torch.Generator().manual_seed(6)
    owner = LowRankLinear(8, 5, 3, bias=True)
    other = LowRankLinear(8, 4, 3, bias=False, owner=owner)
    assert owner.A.bias is not None and other.A.bias is None and owner.B.bias is None and not hasattr(other, "B")
    assert [n for n, _ in other.named_parameters()] == ["A.weight"]  # the shared B is stored under the owner only
    with torch.no_grad():
        for lin in (owner.A, owner.B, other.A):
            for p in lin.parameters():
                p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(2, 8, generator=gen)
    z = x @ owner.B.weight.T
    with torch.no_grad():
        torch.testing.assert_close(owner(x), z @ owner.A.weight.T + owner.A.bias)
        assert owner.n_computed == 0  # one reader: the bare product, no cache
        owner.n_readers = 2
        got = (owner(x), other(x))
    torch.testing.assert_close(got[1], z @ other.A.weight.T)
    assert owner.n_computed == 1  # B x once for the two sites
    half = LowRankLinear(8, 5, 3, bias=True, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}


def test_a_hooked_factor_is_called_as_a_module():
    """The factors are applied as bare products for speed, but a factor something hooks (a forward hook, or
    accelerate's device and offload hook, which replaces the module's forward) is called as a module."""
    from acbench.core.compressed_layers import LowRankLinear

    site = LowRankLinear(8, 5, 3, bias=True)
    x = torch.randn(1, 8)
    calls = []
    with torch.no_grad():
        want = site(x)
        hook = site.A.register_forward_hook(lambda mod, args, out: calls.append("A post"))
        site(x)
        hook.remove()
        hook = site.B.register_forward_pre_hook(lambda mod, args: calls.append("B pre"))
        site(x)
        hook.remove()
        assert calls == ["A post", "B pre"]
        real = site.A.forward
        site.A.__dict__["_hf_hook"] = object()  # as accelerate leaves it
        site.A.forward = lambda t: calls.append("A offloaded") or real(t)
        torch.testing.assert_close(site(x), want)
        assert calls[-1] == "A offloaded"
        del site.A.__dict__["_hf_hook"]
        site(x)
        assert calls[-1] == "A offloaded" and len(calls) == 3  # no hook: the bare product again


def test_a_saved_low_rank_model_loads_back_as_it_ran(tmp_path):
    """What a low-rank checkpoint's loader rebuilds from its layout (every site factorised, the group's B under its
    owner and read by each of its sites, biases where the model has them) runs as the deployed model did, and in
    the dtype it is loaded in."""
    from transformers import AutoModelForCausalLM

    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.checkpoint import load_checkpoint, write_checkpoint
    from acbench.deploy.compression import compressed
    from acbench.model.groups import find_input_groups
    from acbench.core.compressed_layers import LowRankLinear
    from acbench.core.stats import RankSpec
    from tests.conftest import tiny_config

    cfg = tiny_config("llama")
    cfg.attention_bias = cfg.mlp_bias = True  # biases on every linear: the loader must rebuild them
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    ids = torch.randint(0, 101, (4, 16), generator=torch.Generator().manual_seed(1))
    stats = calibrate(model, find_input_groups(model), ids, frozenset({"C"}), CalibSpec(), progress=False)
    with torch.no_grad(), compressed(model, "pca", RankSpec(0.25), stats, progress=False) as (m, _):
        want = m(ids[:2]).logits, m(ids[:1, :1]).logits
        write_checkpoint(m, None, tmp_path / "ck", {"method": "pca"})
    again = load_checkpoint(tmp_path / "ck")
    sites = {n: mod for n, mod in again.named_modules() if isinstance(mod, LowRankLinear)}
    assert len(sites) == 2 * 7 and all(mod.A.bias is not None for mod in sites.values())
    owners = {n: mod for n, mod in sites.items() if mod._owner is mod}
    # one owner per group (attention in, attention out, MLP in, MLP out), read by each of its sites
    assert sorted(mod.n_readers for mod in owners.values()) == [1, 1, 1, 1, 2, 2, 3, 3]
    assert all(hasattr(mod, "B") == (n in owners) for n, mod in sites.items())
    assert all(mod._owner.n_readers == sum(o._owner is mod._owner for o in sites.values()) for mod in sites.values())
    with torch.no_grad():
        got = again(ids[:2]).logits, again(ids[:1, :1]).logits
    for g, w in zip(got, want):
        assert (g - w).abs().max() <= 1e-5 * w.abs().max()
    half = load_checkpoint(tmp_path / "ck", dtype=torch.bfloat16)
    assert {p.dtype for mod in half.modules() if isinstance(mod, LowRankLinear) for p in mod.parameters()} == {
        torch.bfloat16}


def test_what_print_model_and_the_run_log_say_of_the_compressed_pieces():
    """The module reprs a user reads in print(model), and the line the rho analysis logs during a run."""
    import importlib.util

    from acbench.analyses.rho import Rho, RhoSettings
    from acbench.core.compressed_layers import InputSparsifier, LowRankLinear, SparseInputLinear, triton_importable
    from acbench.tasks.base import TaskResult

    owner = LowRankLinear(8, 5, 3, bias=True)
    assert owner.extra_repr() == "in=8, k=3, out=5, shared_B=False"
    assert LowRankLinear(8, 4, 3, bias=False, owner=owner).extra_repr() == "in=8, k=3, out=4, shared_B=True"
    assert InputSparsifier(2, 4, "shift", None, torch.zeros(8)).extra_repr() == "keep 2 of 4, mitigation=shift, readers=1"
    sp = InputSparsifier(3, 0, "none", None, None)
    sp.n_readers = 2
    assert sp.extra_repr() == "keep 3 of all, mitigation=none, readers=2"
    assert InputSparsifier(0, 0, "none", None, None, threshold=0.123456).extra_repr() == "keep |x| > 0.1235, readers=1"
    assert InputSparsifier(0, 0, "none", torch.ones(8), None, threshold=2.0).extra_repr() == \
        "keep |x| * scale > 2, readers=1"
    assert SparseInputLinear(torch.nn.Linear(8, 3), sp, owner=True).extra_repr() == "in=8, out=3, input-major weight"
    assert triton_importable() is (importlib.util.find_spec("triton") is not None)
    rho = Rho(RhoSettings())
    spear = {"r": 0.25, "p": 0.0351, "ci95": [0.0, 0.5]}
    with_corr = TaskResult(metrics={"rho_mean": 0.12345},
                           details={"correlations": {"rho_vs_surrogate_gain_per_group": {"spearman": spear}}})
    assert rho.summary_line(with_corr) == "mean rho=0.123, per group Spearman(rho, FASC surrogate gain)=0.25 (p=0.035)"
    bare = TaskResult(metrics={"rho_mean": 0.5}, details={"correlations": {}})
    assert rho.summary_line(bare) == "mean rho=0.500"


def test_the_decode_kernel_is_chosen_for_the_device_asked(monkeypatch):
    """The choice is made for the model's device: triton asked for on a CPU without the interpreter names it."""
    from acbench.core import compressed_layers

    monkeypatch.setattr(compressed_layers, "_CHOSEN", {})
    monkeypatch.setattr(compressed_layers, "triton_importable", lambda: True)
    monkeypatch.setenv("ACBENCH_DECODE_KERNEL", "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"needs a CUDA device \(this model is on cpu\)"):
        compressed_layers.decode_kernel("cpu")
    monkeypatch.setenv("ACBENCH_DECODE_KERNEL", "embedding_bag")
    assert compressed_layers.decode_kernel("cpu") == "embedding_bag" and compressed_layers._CHOSEN == {"cpu": "embedding_bag"}
