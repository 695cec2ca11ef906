"""The contract every compression method meets, and the fixtures to test one, importable by a method author's own
tests (`from acbench.testing import check_method, random_stats`) and run by `bench check-method NAME`.

`check_method(name)` runs each check on any registered method, built-in or plugin, and returns one `Check` per
contract item (passed or not, with the reason); `assert_method_contract(name)` raises on the first failure with
every failure listed. The project's own tests run it over every built-in method.
"""

from __future__ import annotations

import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from acbench import methods
from acbench.model.groups import InputGroup
from acbench.core.errors import UserError
from acbench.core.linalg import NumericError
from acbench.core.stats import (ACTIVATION_STATS, GRADIENT_STATS, LOW_RANK_FAMILY, GroupStats, RankSpec, SparsitySpec,
                        magnitude_histogram)

EVERY_STAT = ACTIVATION_STATS | GRADIENT_STATS  # every statistic a method can ask for
# the GroupStats fields each statistic name fills (pairs: the token sample of x and of its gradient)
STAT_FIELDS = {"C": ("C",), "F": ("F",), "abs_mean": ("abs_mean",), "mean": ("mean",), "abs_hist": ("abs_hist",),
               "act_hist": ("act_hist",), "pairs": ("xs", "gs"), "tokens": ("xs",),
               "row_fisher": ("row_fisher",)}
PATTERNS = ("2:4", "8:16", "0.5")  # what the sparsity checks try: two N:M patterns and an unstructured density


class FakeGroup(InputGroup):
    """An input group without a model: named sites (nn.Linear, no bias) reading one input of width d_in."""

    def __init__(self, weights: dict[str, torch.Tensor], name: str = "g"):
        sites = []
        for W in weights.values():
            lin = nn.Linear(W.shape[1], W.shape[0], bias=False, dtype=W.dtype)
            with torch.no_grad():
                lin.weight.copy_(W)
            sites.append(lin)
        super().__init__(name, 0, "mlp_in", tuple(weights), tuple(sites))


def random_weights(d_outs: tuple[int, ...] = (7, 5), d: int = 16, seed: int = 2) -> dict[str, torch.Tensor]:
    """Float32 site weights {s0: d_outs[0] x d, ...} from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return {f"s{i}": torch.randn(o, d, generator=gen) for i, o in enumerate(d_outs)}


def random_stats(d: int = 16, n: int = 400, seed: int = 0, coupled: bool = True,
                 sites: dict[str, int] | None = None) -> GroupStats:
    """Every statistic of one group from n correlated random tokens (float64 moments, float32 token sample, as
    calibration makes them): C, F, the (x, g) sample, abs_mean, mean, abs_hist, act_hist (of SiLU(x)), and row_fisher for `sites`
    ({name: d_out}). `coupled`: the gradients depend on x (the case FASC's coupling term is for)."""
    gen = torch.Generator().manual_seed(seed)
    xs = torch.randn(n, d, generator=gen, dtype=torch.float64) @ torch.randn(d, d, generator=gen, dtype=torch.float64)
    gs = torch.randn(n, d, generator=gen, dtype=torch.float64) @ torch.randn(d, d, generator=gen, dtype=torch.float64)
    if coupled:
        a, b = torch.randn(d, generator=gen, dtype=torch.float64), torch.randn(d, generator=gen, dtype=torch.float64)
        gs = gs + (xs @ a)[:, None] * b[None, :]
    hist = magnitude_histogram(xs.reshape(-1))
    act = magnitude_histogram(torch.nn.functional.silu(xs).reshape(-1))  # as if x were an MLP's gate output
    rows = {s: torch.rand(o, generator=gen, dtype=torch.float64) + 0.1 for s, o in (sites or {}).items()}
    return GroupStats(n_tokens=n, C=xs.T @ xs / n, F=gs.T @ gs / n, xs=xs.float(), gs=gs.float(),
                      abs_mean=xs.abs().mean(0), mean=xs.mean(0), abs_hist=hist / hist.sum(), act_hist=act / act.sum(),
                      row_fisher=rows or None)


def tiny_llama(hidden: int = 32, inter: int = 48, layers: int = 2, vocab: int = 101, seed: int = 0):
    """A random 2-block Llama built from a config (no download), in eval mode."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def calibrated_tiny_llama(needs=EVERY_STAT, windows: int = 4, seq_len: int = 24, pair_tokens: int = 64, **kw):
    """A tiny random Llama and the statistics `needs` names for every input group, from seeded random windows."""
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.model.groups import find_input_groups

    model = tiny_llama(**kw)
    ids = torch.randint(0, model.config.vocab_size, (windows, seq_len), generator=torch.Generator().manual_seed(0))
    stats = calibrate(model, find_input_groups(model), ids, frozenset(needs), CalibSpec(pair_tokens=pair_tokens),
                      progress=False)
    return model, stats


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: does not apply to this method (the reason says why)
    detail: str = ""

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[self.passed]
        return f"{mark} {self.name}" + (f": {self.detail}" if self.detail else "")


def budgets(name: str) -> list[RankSpec | SparsitySpec]:
    """The budgets the contract compresses with: rank 0.4 (low-rank), or every pattern of PATTERNS the method
    keeps (sparsity)."""
    if methods.family_of(name) == LOW_RANK_FAMILY:
        return [RankSpec(0.4)]
    return [p for p in map(SparsitySpec.parse, PATTERNS) if methods.pattern_problem(name, p) is None]


def _compress(name, weights, stats, budget, **kw):
    return methods.build(name).compress(FakeGroup(weights), stats, budget, **kw)


def poisoned(st: GroupStats, field: str) -> GroupStats:
    """A copy of `st` with a NaN in one statistic (the first entry of `field`)."""
    if field == "row_fisher":
        bad = {n: t.clone() for n, t in st.row_fisher.items()}
        next(iter(bad.values()))[0] = float("nan")
        return replace(st, row_fisher=bad)
    t = getattr(st, field).clone()
    t.view(-1)[0] = float("nan")
    return replace(st, **{field: t})


def check_declarations(name: str) -> Check:
    cls = methods.get_method(methods.base_name(name))
    needs = methods.build(name).required_stats()
    unknown = sorted(set(needs) - EVERY_STAT)
    if unknown:
        return Check("declarations", False, f"needs names unknown statistics {unknown}: pick from {sorted(EVERY_STAT)}")
    caps = cls.capabilities()
    want = {"data_free": not cls().required_stats(), "activations": bool(cls.needs & ACTIVATION_STATS),
            "gradients": bool(cls.needs & GRADIENT_STATS)}
    if caps != want:
        return Check("declarations", False, f"capabilities() says {caps}, its needs say {want}")
    if cls.family not in (LOW_RANK_FAMILY, "sparsity"):
        return Check("declarations", False, f"family {cls.family!r} is neither low-rank nor sparsity")
    return Check("declarations", True, f"{cls.family}, needs {sorted(needs) or 'nothing (data-free)'}")


def check_non_finite_refused(name: str, d: int = 16) -> Check:
    """A NaN in any statistic the method reads is refused with one line naming the statistic, never solved."""
    needs = methods.build(name).required_stats()
    weights = random_weights((7,), d)
    stats = random_stats(d, sites={"s0": 7})
    for stat in sorted(needs):
        for field in STAT_FIELDS[stat]:
            for budget in budgets(name)[:1]:
                try:
                    res = _compress(name, weights, poisoned(stats, field), budget)
                except (NumericError, UserError, ValueError) as e:
                    if "non-finite" not in str(e) or "\n" in str(e):
                        return Check("non-finite statistics refused", False,
                                     f"NaN in {field}: refused, but not with one line naming non-finite {field}: {e}")
                    continue
                what = "a finite" if _finite_result(res) else "a non-finite"
                return Check("non-finite statistics refused", False,
                             f"NaN in {field} gave {what} result instead of a refusal: call "
                             f"acbench.core.linalg.check_finite('{name}', {field}=...) on what the solve reads")
    if not needs:
        return Check("non-finite statistics refused", None, "data-free: reads no statistics")
    return Check("non-finite statistics refused", True, f"a NaN in each of {sorted(needs)}")


def _tensors(res) -> list[torch.Tensor]:
    """Every tensor a result holds (its fields, the factors' and masks' dicts)."""
    out = []
    for v in vars(res).values():
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                out += [t for t in (x if isinstance(x, tuple) else (x,)) if isinstance(t, torch.Tensor)]
    return out


def _finite_result(res) -> bool:
    floats = [torch.tensor(v) for v in vars(res).values() if isinstance(v, float)]
    return all(bool(torch.isfinite(t.double()).all()) for t in _tensors(res) + floats)


def check_solve_precision(name: str, d: int = 16) -> Check:
    """A float32 solve gives the float64 solve's product to float32 precision (low-rank; the sparsity family's
    scores are always float64)."""
    if methods.family_of(name) != LOW_RANK_FAMILY:
        return Check("float32 solve = float64 solve", None, "sparsity methods score in float64 always")
    weights, stats = random_weights((7,), d), random_stats(d, sites={"s0": 7})
    got = {}
    for dtype in (torch.float64, torch.float32):
        A, B = _compress(name, weights, stats, RankSpec(0.4), dtype=dtype).factors["s0"]
        got[dtype] = A.double() @ B.double()
    err = float((got[torch.float32] - got[torch.float64]).norm() / got[torch.float64].norm())
    return Check("float32 solve = float64 solve", err <= 1e-3, f"relative difference {err:.1e} (limit 1e-3)")


def check_device_safe(name: str, d: int = 16) -> Check:
    """Every tensor the solve creates is made on its inputs' device: with torch's default device set to meta, a
    factory call without `device=` makes a meta tensor, and mixing it with the CPU inputs fails."""
    group, stats = FakeGroup(random_weights((7,), d)), random_stats(d, sites={"s0": 7})
    comp = methods.build(name)
    torch.set_default_device("meta")
    try:
        for budget in budgets(name):
            stray = sorted({str(t.device) for t in _tensors(comp.compress(group, stats, budget))} - {"cpu"})
            if stray:
                raise RuntimeError(f"the result holds tensors on {', '.join(stray)}, not on the inputs' cpu")
    except Exception as e:  # the failure is what is reported
        return Check("tensors made on the inputs' device", False,
                     f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}: pass device= (and dtype=) "
                     f"from the solve's inputs to every tensor it creates")
    finally:
        torch.set_default_device(None)
    return Check("tensors made on the inputs' device", True)


def check_patterns(name: str, d: int = 16) -> Check:
    """A sparsity method keeps every pattern it does not refuse, and refuses the others in one line before a run
    (`pattern_problem`); a pattern it accepts gives a result a layer can deploy whole."""
    if methods.family_of(name) == LOW_RANK_FAMILY:
        return Check("patterns", None, "low-rank methods take a rank")
    said = []
    for text in PATTERNS:
        pattern = SparsitySpec.parse(text)
        problem = methods.pattern_problem(name, pattern)
        if problem is not None:
            if not isinstance(problem, str) or "\n" in problem or not problem:
                return Check("patterns", False, f"pattern_problem({text}) must be one line or None, got {problem!r}")
            said.append(f"refuses {text}")
            continue
        res = _compress(name, random_weights((7, 5), d), random_stats(d, sites={"s0": 7, "s1": 5}), pattern)
        problem = getattr(res, "deployment_problem", lambda: None)()
        if problem:
            return Check("patterns", False, f"{text}: {problem}")
        said.append(f"keeps {text}")
    return Check("patterns", True, ", ".join(said))


def _round_trip(name: str, budget, d: int = 16) -> str | None:
    """Why the deployed form of one group's result differs from what it stands for, or None."""
    from acbench.deploy.apply import apply_compression, restore
    from acbench.core.compressed_layers import InputSparsifier
    from acbench.methods.base import ActivationThreshold, GroupCompression, MaskedWeights, SparseActivation

    weights = random_weights((7, 5), d, seed=3)
    group = FakeGroup(weights)
    res = methods.build(name).compress(group, random_stats(d, sites={"s0": 7, "s1": 5}), budget)
    if isinstance(res, ActivationThreshold):  # deployed on an MLP's activation module, which a bare group lacks
        return _threshold_round_trip(res, d)
    holder = nn.Module()
    for n, site in zip(group.site_names, group.sites):
        holder.add_module(n, site)
    holder.config = type("Config", (), {})()
    x = torch.randn(3, d, generator=torch.Generator().manual_seed(4))
    undo = apply_compression(holder, group, res)
    try:
        with torch.no_grad():
            for n in group.site_names:
                site = holder.get_submodule(n)
                if isinstance(res, GroupCompression):
                    A, B = res.factors[n]
                    want = x @ (A.float() @ B.float()).T
                elif isinstance(res, MaskedWeights):
                    want = x @ res.deployed_weight(n, weights[n]).T
                elif isinstance(res, SparseActivation):
                    sps = [m for m in holder.modules() if isinstance(m, InputSparsifier)]  # one, or one per mask
                    for sp in sps:
                        sp.gather = False
                    want = torch.cat([site(x[i:i + 1]) for i in range(len(x))])  # the masked dense form
                    for sp in sps:
                        sp.gather = True
                    got = torch.cat([site(x[i:i + 1]) for i in range(len(x))])  # decode: the gathered form
                    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                        return f"site {n}: the gathered decode product differs from the masked product"
                    continue
                else:
                    return f"no round trip is known for a {type(res).__name__} result"
                got = site(x)
                if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
                    return f"site {n}: the deployed module's output differs from the product it stands for"
    finally:
        restore(holder, undo)
    return None


def _threshold_round_trip(res, d: int) -> str | None:
    """Why the activation module a threshold result deploys differs from SiLU with |a| <= threshold zeroed."""
    from acbench.core.compressed_layers import ThresholdedActivation

    if res.threshold is None:
        return None  # nothing deployed: the group's sites stay as they are
    z = torch.randn(3, d, generator=torch.Generator().manual_seed(4))
    a = nn.functional.silu(z)
    want = torch.where(a.abs() > res.threshold, a, torch.zeros(()))
    with torch.no_grad():
        got = ThresholdedActivation(nn.SiLU(), res.threshold)(z)
    return None if torch.equal(got, want) else "the thresholded activation differs from act(z) with |a| <= t zeroed"


def check_deployment(name: str) -> Check:
    """Each deployed form computes what it stands for: factorised sites A (B x), masked weights (W * mask) x, and
    the gathered decode product of a sparse activation equal to its masked dense product."""
    for budget in budgets(name):
        problem = _round_trip(name, budget)
        if problem:
            return Check("deployed form = its product", False, f"{budget.label}: {problem}")
    return Check("deployed form = its product", True, ", ".join(b.label for b in budgets(name)))


def check_checkpoint(name: str) -> Check:
    """Compressed in a tiny model, saved as `bench compress` saves it, reloaded by the loader: equal logits."""
    from acbench.model.checkpoint import load_checkpoint, write_checkpoint
    from acbench.deploy.compression import compressed

    needs = methods.build(name).required_stats()
    model, stats = calibrated_tiny_llama(needs)
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(5))
    budget = budgets(name)[-1]
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a check's report is its lines, not the loader's bars
    try:
        with tempfile.TemporaryDirectory(prefix="acbench-check-") as tmp:
            with compressed(model, name, budget, stats, progress=False) as (m, _), torch.no_grad():
                want = m(ids).logits
                write_checkpoint(m, None, Path(tmp) / "ckpt", {"method": name, "budget": budget.label})
            with torch.no_grad():
                got = load_checkpoint(Path(tmp) / "ckpt")(ids).logits
    finally:
        if bars:  # the caller's setting, as it was (an author's test session keeps its bars)
            hf_logging.enable_progress_bar()
    err = float((got - want).abs().max())
    return Check("checkpoint reloads with equal logits", err <= 1e-4, f"{budget.label}: max |difference| {err:.1e}")


def check_reference(name: str, reference, d: int = 16) -> Check:
    """The method against the author's reference on random statistics. Low-rank: reference(weights, stats, k)
    returns {site: W_hat}, the matrix each site's factors stand for (k from rank 0.4 of the method's own rank
    rule). Sparsity: reference(x, stats, pattern) returns x as kept (zeros where dropped) for x (tokens x d)."""
    from acbench.deploy.apply import sparsifier_for
    from acbench.methods.base import SparseActivation

    weights, stats = random_weights((7, 5), d), random_stats(d, sites={"s0": 7, "s1": 5})
    comp = methods.build(name)
    budget = budgets(name)[0]
    res = comp.compress(FakeGroup(weights), stats, budget)
    if isinstance(budget, RankSpec):
        k = comp.rank_for(FakeGroup(weights), budget)
        want = reference({n: W.double() for n, W in weights.items()}, stats, k)
        errs = {n: float((A.double() @ B.double() - want[n].double()).norm() / want[n].double().norm())
                for n, (A, B) in res.factors.items()}
        worst = max(errs, key=errs.get)
        return Check("equals the author's reference", errs[worst] <= 1e-4,
                     f"largest relative difference {errs[worst]:.1e} at site {worst}")
    if not isinstance(res, SparseActivation):
        return Check("equals the author's reference", None, f"no reference check for {type(res).__name__}")
    x = torch.randn(6, d, generator=torch.Generator().manual_seed(6))
    sp = sparsifier_for(res)
    sp.gather = False
    got = sp(x)[1]
    want = reference(x, weights, stats, budget)
    same = bool(torch.allclose(got, want.to(got.dtype), rtol=1e-5, atol=1e-6))
    return Check("equals the author's reference", same, "" if same else "the kept x differs from the reference's")


CHECKS = (check_declarations, check_non_finite_refused, check_solve_precision, check_device_safe, check_patterns,
          check_deployment, check_checkpoint)


TITLES = {check_declarations: "declarations", check_non_finite_refused: "non-finite statistics refused",
          check_solve_precision: "float32 solve = float64 solve", check_device_safe: "tensors made on the inputs' device",
          check_patterns: "patterns", check_deployment: "deployed form = its product",
          check_checkpoint: "checkpoint reloads with equal logits"}


def check_method(name: str, reference=None) -> list[Check]:
    """Every contract check on method `name` (a registered name or variant), each reported, none stopping the
    others: a check that raises fails with the error's first line."""
    from acbench.core.errors import UserError

    try:
        methods.build(name)  # an unknown name is refused here, with the closest known one
    except (KeyError, ValueError, TypeError) as e:  # a variant's bad setting: the words bench run uses
        raise UserError(f"method '{name}': {e}") from None
    out = []
    for check in CHECKS + ((lambda n: check_reference(n, reference)),) * (reference is not None):
        title = TITLES.get(check, "equals the author's reference")
        try:
            out.append(check(name))
        except Exception as e:  # the contract's report: any error is a failed check, with where it came from
            where = traceback.extract_tb(e.__traceback__)[-1]
            out.append(Check(title, False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                                           f"({Path(where.filename).name}:{where.lineno})"))
    return out


def assert_method_contract(name: str, reference=None) -> None:
    """check_method, raising AssertionError with every failed check's line (for a method author's pytest)."""
    failed = [c.line() for c in check_method(name, reference) if c.passed is False]
    assert not failed, f"{name} breaks the method contract:\n" + "\n".join(failed)
