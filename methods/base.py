"""The Compressor interface: what a method needs, its settings, and its one uniform result per input group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from core.registry import NoSettings, Plugin  # noqa: F401 (the method API)
from core.stats import ACTIVATION_STATS, GRADIENT_STATS, GroupStats, RankSpec  # noqa: F401 (the method API)


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

    def summary(self) -> dict:
        return {
            "group": self.group,
            "k": self.k,
            "k_sites": self.k_sites,
            "d_in": self.d_in,
            "form": self.form,
            "params_dense": self.params_dense,
            "params_deployed": self.params_deployed,
            "fallbacks": self.fallbacks,
            **{k: v for k, v in self.extras.items() if isinstance(v, (int, float, str))},
        }


class Compressor(Plugin):
    """Base class. A method sets `name`, `needs` (the statistics it reads) and `Settings`, and implements `solve`."""

    kind = "method"
    needs: ClassVar[frozenset[str]] = frozenset()  # names of the statistics `solve` reads (see core.stats)
    # Rank semantics of a per-site weight factorisation: k is computed for each site from its own shape and
    # `solve` receives {site: k_i} instead of one int.
    per_site: ClassVar[bool] = False

    @classmethod
    def capabilities(cls) -> dict:
        return {
            "data_free": not cls.needs,
            "activations": bool(cls.needs & ACTIVATION_STATS),
            "gradients": bool(cls.needs & GRADIENT_STATS),
        }

    @property
    def site_wise(self) -> bool:
        """Whether this instance factorises each site on its own (a setting may switch it, as whitened-svd's)."""
        return self.per_site

    def rank_for(self, group, rank: RankSpec) -> int | dict[str, int]:
        if self.site_wise:
            return {n: rank.k_site(group.d_in, d) for n, d in zip(group.site_names, group.d_outs)}
        return rank.k_group(group.d_in, group.d_outs)

    @property
    def projection(self) -> bool:
        """One subspace per input group (its k can be set per group by a rank allocation)."""
        return not self.site_wise

    def compress(self, group, stats: GroupStats, rank: RankSpec, k: int | None = None) -> GroupCompression:
        """`k`: the group's k from a rank allocation (projection methods only); else from `rank`."""
        if k is not None and not self.projection:
            raise ValueError(f"{self.name} factorises each site on its own: a per-group k does not apply")
        k_arg = self.rank_for(group, rank) if k is None else min(max(1, int(k)), group.d_in)
        k = max(k_arg.values()) if isinstance(k_arg, dict) else k_arg
        # Solved on the host in float64, beside the statistics, whatever device and dtype the model has; the
        # factors are copied to each site's device when deployed.
        weights = {n: s.weight.detach().double().cpu() for n, s in zip(group.site_names, group.sites)}
        factors, shared, fallbacks, extras = self.solve(weights, stats, k_arg)
        factors = {n: (A.float(), B.float()) for n, (A, B) in factors.items()}
        return GroupCompression(
            group=group.name, method=self.name, k=k, factors=factors, shared_projection=shared,
            d_in=group.d_in, d_outs=group.d_outs, fallbacks=fallbacks, extras=extras,
        )

    def solve(self, weights: dict[str, torch.Tensor], stats: GroupStats, k):
        """Return (factors {site: (A, B)}, shared_projection, fallbacks, extras).
        k: an int (the group's k) or, for a per-site method, {site: k_i}."""
        raise NotImplementedError


def projection_factors(weights: dict[str, torch.Tensor], U_k: torch.Tensor, B: torch.Tensor):
    """Deploy a projection P = U_k B of the group input: A_i = W_i U_k, shared B."""
    return {n: (W @ U_k, B) for n, W in weights.items()}
