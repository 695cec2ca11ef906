"""The Compressor interface: what a method needs, its settings, and its typed result per input group.

A method returns one of three small results, each of which knows its parameter, compute and activation ratios
(docs/design.md, sections 1 and 7) and is deployed by its own handler (acbench.deploy.apply dispatches on the type):
- `GroupCompression`: factors per site, W_i ~ A_i B_i (projections and factorisations; the low-rank family);
- `SparseActivation`: a per-token mask rule on the group input, N:M or top-k (activation sparsity);
- `MaskedWeights`: a 0/1 mask per site weight (weight sparsity, the control);
- `ActivationThreshold`: a threshold on the activation function an MLP's last group reads (CATS), or the rows of
  the group's sites that the threshold's mask lets a kernel skip.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from acbench.core.errors import UserError
from acbench.core.registry import NoSettings, Plugin  # noqa: F401 (the method API)
from acbench.core.sparsity import MITIGATIONS
from acbench.core.stats import (ACTIVATION_STATS, CALIBRATION_MODES, GRADIENT_STATS, LOW_RANK_FAMILY,  # noqa: F401 (API)
                        ONE_PASS, SEQUENTIAL, SPARSITY_FAMILY, GroupStats, RankSpec, SparsitySpec,
                        check_pattern_widths)


@dataclass(frozen=True)
class AuthorsCalibration:
    """The calibration a method's authors ran it with, as data: windows, tokens per window and mode, and the set
    they drew them from and where they say so. `--calibration authors` gives the method this many windows of this
    length, in this mode, drawn from acbench's own calibration text (not the authors' set)."""

    samples: int
    seq_len: int
    mode: str  # one-pass or sequential (acbench.core.stats.CALIBRATION_MODES)
    data: str  # the authors' calibration set
    source: str  # where they state it

    def __post_init__(self):
        for name in ("samples", "seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (2 if name == "seq_len" else 1):
                raise ValueError(f"authors' calibration {name} {v!r} is not a positive whole number")
        if self.mode not in CALIBRATION_MODES:
            raise ValueError(f"authors' calibration mode {self.mode!r} is not one of {', '.join(CALIBRATION_MODES)}")

    @property
    def tokens(self) -> int:
        return self.samples * self.seq_len

    @property
    def label(self) -> str:
        return f"{self.samples} x {self.seq_len} {self.mode}"

    def as_dict(self) -> dict:
        return {"samples": self.samples, "seq_len": self.seq_len, "mode": self.mode, "data": self.data,
                "source": self.source}


def factorised_params(d_in: int, d_outs, ks, shared: bool) -> int:
    """Parameters of a group's factors: one shared B (k x d_in) or one B per site, plus each site's A."""
    outs = sum(k * d for k, d in zip(ks, d_outs))
    return (ks[0] if shared else sum(ks)) * d_in + outs


@dataclass
class GroupCompression:
    """One method's answer for one input group: per site, factors with W_i ~= A_i @ B_i."""

    group: str
    method: str
    k: int  # the shared k of a projection; for per-site factorisations the largest site k (see k_sites)
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    shared_projection: bool  # True: every site uses the same B (one z = B x for the group)
    d_in: int
    d_outs: tuple[int, ...]
    fallbacks: list[dict] = field(default_factory=list)
    extras: dict = field(default_factory=dict)
    form: str = ""

    def __post_init__(self):
        if not self.form:
            self.form = "factorised" if self.params_factorised < self.params_dense else "merged"

    @property
    def k_sites(self) -> dict[str, int]:
        return {n: int(A.shape[1]) for n, (A, _) in self.factors.items()}

    @property
    def params_dense(self) -> int:
        return self.d_in * sum(self.d_outs)

    @property
    def params_factorised(self) -> int:
        return factorised_params(self.d_in, self.d_outs, [A.shape[1] for A, _ in self.factors.values()],
                                 self.shared_projection)

    @property
    def params_deployed(self) -> int:
        return self.params_factorised if self.form == "factorised" else self.params_dense

    @property
    def compute_ratio(self) -> float:
        """Multiply-adds per token / dense: k (d_in + sum d_out) / (d_in sum d_out) factorised (the factorised
        parameter count, as every factor weight is used once per token), 1.0 merged (dense shape)."""
        return self.params_deployed / self.params_dense

    @property
    def activation_ratio(self) -> float:
        """Numbers per token the group input becomes: k / d_in for one shared projection; per-site factors each
        read the whole x, and a merged group reads x itself, so 1.0."""
        return self.k / self.d_in if self.form == "factorised" and self.shared_projection else 1.0

    def summary(self) -> dict:
        return {
            "group": self.group,
            "result": "factors",
            "k": self.k,
            "k_sites": self.k_sites,
            "d_in": self.d_in,
            "form": self.form,
            "params_dense": self.params_dense,
            "params_deployed": self.params_deployed,
            "param_ratio": self.params_deployed / self.params_dense,
            "compute_ratio": self.compute_ratio,
            "activation_ratio": self.activation_ratio,
            "fallbacks": self.fallbacks,
            **{k: v for k, v in self.extras.items() if isinstance(v, (int, float, str))},
        }


@dataclass
class SparseResult:
    """What the two sparsity results share: the group, its shapes and the pattern (filled in by `compress`)."""

    pattern: SparsitySpec
    group: str = ""
    method: str = ""
    d_in: int = 0
    d_outs: tuple[int, ...] = ()
    fallbacks: list[dict] = field(default_factory=list)
    extras: dict = field(default_factory=dict)
    form: str = ""  # set by each result type

    @property
    def params_dense(self) -> int:
        return self.d_in * sum(self.d_outs)

    def _summary(self, params_deployed: int, compute: float, activation: float) -> dict:
        return {
            "group": self.group, "result": self.form, "form": self.form, "pattern": self.pattern.budget,
            "density": self.pattern.density, "kept_per_token": self.pattern.keep(self.d_in), "d_in": self.d_in,
            "params_dense": self.params_dense, "params_deployed": params_deployed,
            "param_ratio": params_deployed / self.params_dense, "compute_ratio": compute,
            "activation_ratio": activation, "fallbacks": self.fallbacks,
            **{k: v for k, v in self.extras.items() if isinstance(v, (int, float, str))},
        }


@dataclass
class SparseActivation(SparseResult):
    """Per token, keep `pattern` of the group input by score |x_j - s| * scale_j and zero the rest; every site of
    the group reads the one sparse x. scale: static per-channel factors (None: |x| alone); mu: the calibrated
    per-channel mean of the `shift` mitigation, deployed as a bias W_i mu on each site."""

    scale: torch.Tensor | None = None
    mitigation: str = "none"
    mu: torch.Tensor | None = None
    threshold: float | None = None  # keep |x_j| * scale_j > threshold instead of a top-k (density varies per token)
    # an orthogonal d_in x d_in Q: the mask is taken on z = x Q and each site deploys W Q (LaRoSa); stored and
    # applied per token, so it costs d_in^2 parameters and multiply-adds
    rotation: torch.Tensor | None = None
    # a mask per site instead of one per group: {site: its own score factors, or None for |x| alone}; the sites
    # with None share one mask (WINA as its authors run it weighs k_proj and gate_proj by their own column norms)
    site_scales: dict[str, torch.Tensor | None] | None = None
    # per site, low-rank factors the dropped channels still go through: y = W (m * x) + A (B ((1 - m) * x)), with
    # the whole W kept beside them (R-Sparse); a site left out has no low-rank branch
    residual_factors: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
    # with a threshold: the leading fraction of each evaluated sequence left dense (TEAL sparsifies the second half
    # of a prefill only); 0: every token sparsified
    dense_prefix: float = 0.0
    form: str = "sparse-activation"

    def mask_groups(self, site_names) -> list[tuple[tuple[str, ...], torch.Tensor | None]]:
        """The group's masks: (the sites reading it, its score factors), in site order."""
        if self.site_scales is None:
            return [(tuple(site_names), self.scale)]
        plain = tuple(n for n in site_names if self.site_scales.get(n) is None)
        own = [((n,), self.site_scales[n]) for n in site_names if self.site_scales.get(n) is not None]
        return ([(plain, None)] if plain else []) + own

    def deployment_problem(self) -> str | None:
        """Why a deployed layer could not honour every field of this result (one line naming the fix), or None: a
        layer never keeps part of a result and drops the rest in silence."""
        if self.mitigation not in MITIGATIONS:
            return f"mitigation {self.mitigation!r} is not one of {', '.join(MITIGATIONS)}"
        if self.threshold is not None and self.mitigation != "none":
            return (f"a threshold together with mitigation {self.mitigation!r}: a threshold keeps "
                    f"|x_j| * scale_j > threshold and applies no mitigation; return mitigation='none' with the "
                    f"threshold, or a top-k pattern without it")
        if self.dense_prefix and (self.threshold is None or not 0 < self.dense_prefix < 1):
            return (f"dense_prefix {self.dense_prefix!r}: a leading fraction in (0, 1) left dense applies to a "
                    "threshold sparsifier only; return it with a threshold, or 0")
        if self.mitigation == "shift" and self.mu is None:
            return "mitigation 'shift' without mu: return the calibrated per-channel mean as mu"
        for name in ("scale", "mu"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (self.d_in,):
                return f"{name} has shape {tuple(value.shape)}, not ({self.d_in},): one factor per input channel"
        if self.site_scales is not None:
            if self.scale is not None or self.rotation is not None or self.mitigation != "none" or \
                    self.threshold is not None:
                return "per-site masks with a group scale, rotation, mitigation or threshold: give per-site scales alone"
            for site, value in self.site_scales.items():
                if value is not None and tuple(value.shape) != (self.d_in,):
                    return f"site_scales[{site}] has shape {tuple(value.shape)}, not ({self.d_in},)"
        for site, (A, B) in (self.residual_factors or {}).items():
            if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0] or B.shape[1] != self.d_in:
                return f"residual_factors[{site}] are {tuple(A.shape)} and {tuple(B.shape)}: not A (d_out x r), B (r x d_in)"
            if self.rotation is not None or self.mitigation != "none" or self.threshold is not None:
                return "residual factors with a rotation, mitigation or threshold: the low-rank branch reads x - the kept x"
        if self.rotation is not None:
            if tuple(self.rotation.shape) != (self.d_in, self.d_in):
                return (f"rotation has shape {tuple(self.rotation.shape)}, not ({self.d_in}, {self.d_in}): one "
                        "orthogonal basis of the group input")
            if self.mitigation != "none" or self.threshold is not None:
                return "a rotation with a mitigation or a threshold: a rotated input takes a plain top-k"
        return None

    def summary(self) -> dict:
        # every weight is kept and n/m of them are read per token; the mask metadata is reported beside
        kept = self.pattern.keep(self.d_in) / self.d_in
        # a rotation is one more d_in x d_in product per token, stored once: priced beside the sites' products
        turn = self.d_in * self.d_in if self.rotation is not None else 0
        # R-Sparse's branch: r (d_in + d_out) numbers and multiply-adds per site, and it reads the whole x
        low = sum(A.shape[1] * (A.shape[0] + B.shape[1]) for A, B in (self.residual_factors or {}).values())
        out = self._summary(self.params_dense + turn + low, kept + (turn + low) / self.params_dense,
                            1.0 if low else kept)
        masks = 1 if self.site_scales is None else len(self.mask_groups(self.site_scales))
        out.update(mitigation=self.mitigation, index_bits_per_token=masks * self.pattern.index_bits(self.d_in))
        if self.rotation is not None:  # named only where present: every other method's summary stays as it was
            out["rotated"] = True
        if masks > 1:
            out["masks"] = masks
        return out


@dataclass
class MaskedWeights(SparseResult):
    """A 0/1 mask per site weight (d_out x d_in): `pattern` of every site's input weights kept per output row."""

    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    # the weights the masks apply to where a method also updates the kept ones (SparseGPT); a site left out keeps
    # its own weight
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    form: str = "masked-weights"

    def deployed_weight(self, name: str, original: torch.Tensor) -> torch.Tensor:
        """Site `name`'s deployed weight: its (updated) weight times its mask, in the original's dtype and device."""
        W = self.weights.get(name, original).to(device=original.device, dtype=original.dtype)
        return W * self.masks[name].to(device=original.device, dtype=original.dtype)

    def summary(self) -> dict:
        kept = sum(int(m.sum()) for m in self.masks.values())
        # stored as the kept weights (N:M compressed storage, as sparse tensor cores read it); x is read whole
        return self._summary(kept, kept / self.params_dense, 1.0)


@dataclass
class ActivationThreshold(SparseResult):
    """CATS's answer for one group. On the group that reads an MLP's activation (down_proj): zero every |act(z)_i|
    <= threshold, per token (act(z) * up(x) is then zero there, so a kernel skips down_proj's column i). On the
    group beside it (gate and up): `follows` names the sites whose rows that mask lets a kernel skip (up_proj's
    row i; the gate's output is needed to compute the mask). With neither, the group stays dense (attention)."""

    threshold: float | None = None
    follows: tuple[str, ...] = ()
    follow_rows: int = 0  # the output rows of the `follows` sites together
    form: str = "activation-threshold"

    @property
    def role(self) -> str:
        return "threshold" if self.threshold is not None else "follows" if self.follows else "dense"

    def summary(self) -> dict:
        if self.role == "threshold":
            kept = self.pattern.keep(self.d_in)
            out = self._summary(self.params_dense, kept / self.d_in, kept / self.d_in)
            out["index_bits_per_token"] = self.pattern.index_bits(self.d_in)
        else:
            # a followed site computes only the rows the threshold keeps: its density of them
            rows, skipped = sum(self.d_outs), self.follow_rows
            compute = (rows - skipped + skipped * self.pattern.density) / rows
            out = self._summary(self.params_dense, compute, 1.0)
            out.update(density=1.0, kept_per_token=self.d_in, index_bits_per_token=0)
        out["cats_role"] = self.role
        if self.follows:
            out["follows"] = ",".join(n.rsplit(".", 1)[-1] for n in self.follows)
        return out


class _instance_or_default:
    """A method callable on an instance, or on the class (then on its default-settings instance)."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, cls):
        return functools.partial(self.fn, obj if obj is not None else cls())


class Compressor(Plugin):
    """Base class. A method sets `name`, `needs` (the statistics it reads) and `Settings`, and implements `solve`."""

    kind = "method"
    family: ClassVar[str] = LOW_RANK_FAMILY  # low-rank (budget --rank) or sparsity (budget --sparsity)
    needs: ClassVar[frozenset[str]] = frozenset()  # names of the statistics `solve` reads (see acbench.core.stats)
    # Rank semantics of a per-site weight factorisation: k is computed for each site from its own shape and
    # `solve` receives {site: k_i} instead of one int.
    per_site: ClassVar[bool] = False
    # A control (the random subspace): the floor other methods must beat, not a method expected to keep the model;
    # `bench smoke` reports its perplexity without calling it broken.
    control: ClassVar[bool] = False
    # The calibration its paper or reference code uses (None: the method reads no statistics, or its authors state
    # no size for a causal LM; it then runs at the run's own calibration under --calibration authors)
    authors_calibration: ClassVar[AuthorsCalibration | None] = None

    def required_stats(self) -> frozenset[str]:
        """The statistics this instance reads; a method whose needs depend on its settings overrides it."""
        return self.needs

    def full_rank_stats(self) -> frozenset[str]:
        """The d x d statistics this instance's solve inverts, factors or eigen-decomposes beyond their leading
        directions: from fewer calibration tokens than a group's width they are singular there (a projection or
        factorisation of the low-rank family reads C and F so; a sparsity method that does overrides it)."""
        return self.required_stats() & {"C", "F"} if self.family == LOW_RANK_FAMILY else frozenset()

    @property
    def data_free_twin(self) -> str:
        """The data-free method standing in where calibration gave a group no token (an expert its router never
        chose): plain SVD in the low-rank family, |W| pruning for a weight mask, per-token |x| top-k otherwise."""
        if self.family == LOW_RANK_FAMILY:
            return "svd"
        return "magnitude-prune" if getattr(self, "masks_weights", False) else "act-sparse"

    @_instance_or_default
    def capabilities(self) -> dict:
        needs = self.required_stats()
        return {
            "data_free": not needs,
            "activations": bool(needs & ACTIVATION_STATS),
            "gradients": bool(needs & GRADIENT_STATS),
        }

    @property
    def site_wise(self) -> bool:
        """Whether this instance factorises each site on its own (a setting may switch it, as whitened-svd's)."""
        return self.per_site

    def site_ranks(self, groups, stats, rank: RankSpec):
        """A method that splits its budget across groups itself (SVD-LLM V2) returns ({group: {site: k}}, fallbacks)
        from every selected group's statistics (`stats[group.name]`), before any group is compressed; None (the
        default): each group's k from `rank` alone."""
        return None

    def rank_for(self, group, rank: RankSpec) -> int | dict[str, int]:
        if self.site_wise:
            return {n: rank.k_site(group.d_in, d) for n, d in zip(group.site_names, group.d_outs)}
        return rank.k_group(group.d_in, group.d_outs)

    @property
    def projection(self) -> bool:
        """One subspace per input group (its k can be set per group by a rank allocation)."""
        return not self.site_wise

    def compress(self, group, stats: GroupStats, rank: RankSpec, k: int | None = None,
                 device=None, dtype: torch.dtype = torch.float64) -> GroupCompression:
        """`k`: the group's k from a rank allocation (projection methods only); else from `rank`. `device`: where
        the solve runs (default the host); the statistics and weights are moved there and the factors stay.
        `dtype`: the solve's precision, float64 (default) or float32 (docs/large-models.md, Solve precision, gives its measured agreement)."""
        if not isinstance(rank, RankSpec):
            raise TypeError(f"{self.name} is a low-rank method: it takes a rank ratio (--rank), not {rank!r}")
        if k is not None and not self.projection and not isinstance(k, dict):
            raise ValueError(f"{self.name} factorises each site on its own: a per-group k does not apply")
        if isinstance(k, dict):  # per site, from the method's own site_ranks
            if self.projection or set(k) != set(group.site_names):
                raise ValueError(f"{self.name}: per-site ks must name each site of group {group.name} once")
            k_arg = {n: min(max(1, int(k[n])), group.d_in, d) for n, d in zip(group.site_names, group.d_outs)}
        else:
            k_arg = self.rank_for(group, rank) if k is None else min(max(1, int(k)), group.d_in)
        k = max(k_arg.values()) if isinstance(k_arg, dict) else k_arg
        # Solved in `dtype` on `device` whatever dtype the model has; the factors are copied to each site's device
        # when deployed.
        weights, stats = _on_solve_device(group, stats, device, dtype)
        factors, shared, fallbacks, extras = self.solve(weights, stats, k_arg)
        factors = {n: (A.float(), B.float()) for n, (A, B) in factors.items()}
        return GroupCompression(
            group=group.name, method=self.name, k=k, factors=factors, shared_projection=shared,
            d_in=group.d_in, d_outs=group.d_outs, fallbacks=fallbacks, extras=extras,
        )

    def solve_ops(self, d_in: int, d_outs: tuple[int, ...], k, pair_tokens: int) -> list[tuple] | None:
        """What one group's solve costs, for `bench plan`'s time estimate: (memo key, op, *sizes) with op eigh (n),
        svd (m, n), flops (float64 multiply-add count x 2) or bytes (memory passes); an op with a memo key is counted
        once per group however many methods share it. None: not declared (the plan says so)."""
        return None

    def solve(self, weights: dict[str, torch.Tensor], stats: GroupStats, k):
        """Return (factors {site: (A, B)}, shared_projection, fallbacks, extras).
        k: an int (the group's k) or, for a per-site method, {site: k_i}."""
        raise NotImplementedError


def projection_factors(weights: dict[str, torch.Tensor], U_k: torch.Tensor, B: torch.Tensor):
    """Deploy a projection P = U_k B of the group input: A_i = W_i U_k, shared B."""
    return {n: (W @ U_k, B) for n, W in weights.items()}


class SparsityMethod(Compressor):
    """Base of the sparsity family: `solve(weights, stats, pattern)` returns a SparseActivation or MaskedWeights
    (shapes and names are filled in here). The budget is a SparsitySpec (--sparsity), never a rank."""

    family = SPARSITY_FAMILY
    # what `solve` returns: MaskedWeights (True: n/m of the weights deployed) or SparseActivation (every weight)
    masks_weights: ClassVar[bool] = False
    # whether a density per input group (--allocate greedy) deploys as asked: True where every group keeps its own
    # density of its own input; a method that splits the budget by kind, keeps some groups dense or masks weights
    # would meet another density than the one allocated, and is refused with the rule
    takes_group_density: ClassVar[bool] = False

    @property
    def projection(self) -> bool:
        return False

    def rank_for(self, group, rank):
        raise TypeError(f"{self.name} is a sparsity method: it has no rank")

    @classmethod
    def pattern_problem(cls, pattern: SparsitySpec) -> str | None:
        """Why this method cannot keep `pattern` (one line naming the fix), or None; checked before a run starts."""
        return None

    def budget_problem(self, pattern: SparsitySpec) -> str | None:
        """Why this method's settings cannot meet `pattern` (one line naming the setting and the fix), or None: the
        pattern's own rule is `pattern_problem`; a setting that turns the asked budget into another one is here."""
        return None

    def refuse_pattern(self, pattern: SparsitySpec) -> None:
        """ValueError with `pattern_problem`'s (or `budget_problem`'s) line where the method cannot keep `pattern`
        (a run refuses it earlier; this guards a direct call)."""
        problem = self.pattern_problem(pattern) or self.budget_problem(pattern)
        if problem:
            raise ValueError(problem)

    def group_pattern(self, kind: str, pattern: SparsitySpec) -> tuple[SparsitySpec, bool]:
        """What a group of `kind` keeps under the run's `pattern`, and whether its input is rotated first (one more
        d_in x d_in product per token): the run's pattern, unrotated, unless a method splits its budget by kind
        (LaRoSa). `bench plan` prices each group by it."""
        return pattern, False

    def group_cost(self, group, pattern: SparsitySpec) -> tuple[int, int, int]:
        """(multiply-adds per token, parameters deployed, mask index bits per token) of one group under `pattern`,
        from its shapes alone (`bench plan` prices a model it never loads with it)."""
        own, rotated = self.group_pattern(group.kind, pattern)
        out = sum(group.d_outs)
        turn = group.d_in * group.d_in if rotated and own.density < 1 else 0
        macs = own.keep(group.d_in) * out + turn
        if self.masks_weights:  # the kept weights, and a static mask: nothing per token
            return macs, own.keep(group.d_in) * out, 0
        return macs, group.d_in * out + turn, own.index_bits(group.d_in)

    def compress(self, group, stats: GroupStats, pattern: SparsitySpec, k: int | None = None,
                 device=None, dtype: torch.dtype = torch.float64) -> SparseResult:
        """`dtype` is accepted for the common signature: the family's scores are elementwise and always float64."""
        if not isinstance(pattern, SparsitySpec):
            raise TypeError(f"{self.name} is a sparsity method: it takes an N:M pattern or density (--sparsity), "
                            f"not {pattern!r}")
        if k is not None:
            raise ValueError(f"{self.name} keeps a pattern per token: a per-group k does not apply")
        self.refuse_pattern(pattern)
        check_pattern_widths([pattern], [group])
        weights, stats = _on_solve_device(group, stats, device)
        res = self.solve(weights, stats, pattern)
        res.group, res.method, res.d_in, res.d_outs = group.name, self.name, group.d_in, group.d_outs
        self.check_deployable(res)
        return res

    def check_deployable(self, res: SparseResult) -> None:
        """UserError naming what a layer could not honour in a (completed) result, else nothing."""
        problem = res.deployment_problem() if isinstance(res, SparseActivation) else None
        if problem:
            raise UserError(f"method {self.name} (group {res.group}) returned {problem}")


def projection_ops(d_in: int, d_outs: tuple[int, ...], k: int) -> list[tuple]:
    """A_i = W_i U_k for every site (the deployment of a shared projection)."""
    return [("", "flops", 2 * sum(d_outs) * d_in * k)]


def site_svd_ops(d_in: int, d_outs: tuple[int, ...]) -> list[tuple]:
    """One truncated SVD per site weight (the per-site factorisations)."""
    return [("", "truncated_svd", d, d_in) for d in d_outs]


def factor_svd_ops(m: int, d: int, keep: int) -> list[tuple]:
    """What acbench.core.linalg.weighted_subspace runs on an m x d factor R of F keeping `keep` directions: R^T R's eigh
    (m >= d; the SVD in float32), the thin SVD (keep inside R's row space), or the thin SVD plus forming the
    square V from its reflectors (about 4 d^2 m; measured at 640 x 2048: thin 0.21 s, full 0.33 s)."""
    if m >= d:
        return [("", "truncated_svd", m, d)]
    return [("", "svd", m, d)] + ([] if keep <= m else [("", "flops", 4 * d * d * m)])


def basis_ops(d: int) -> dict[str, tuple]:
    """The memoised per-group solves of acbench.core.linalg: C's eigenvectors, the whitening factor (Cholesky and its
    triangular inverse), and the K-FAC basis (S^T F S, its eigenvectors, U = S V and W^T = V^T S^-1)."""
    ops = [("pca_basis", "eigh", d), ("whitening", "flops", 2 * d ** 3 // 3),
           ("fisher_basis products", "flops", 8 * d ** 3), ("fisher_basis eigh", "eigh", d)]
    return {op[0]: op for op in ops}  # keyed by memo key


def _on_solve_device(group, stats: GroupStats, device,
                     dtype: torch.dtype = torch.float64) -> tuple[dict[str, torch.Tensor], GroupStats]:
    """The group's weights and its statistics in the solve precision, on the solve device (default: the host)."""
    device = torch.device(device or "cpu")
    weights = {n: s.weight.detach().to(device=device, dtype=dtype) for n, s in zip(group.site_names, group.sites)}
    return weights, stats.on(device, dtype)


def stacked_column_norms(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """||W[:, j]|| of the group's sites stacked (sum over sites of ||W_i[:, j]||^2, square-rooted): input channel
    j's reach into every output the group computes."""
    return torch.sqrt(sum(W.pow(2).sum(0) for W in weights.values()))
