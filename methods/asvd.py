"""ASVD: per site, SVD of W diag(s)^alpha with s = E|x| per input channel, then undo the scaling."""

from dataclasses import dataclass

from acbench.core.linalg import check_finite

from .base import AuthorsCalibration, Compressor, ONE_PASS, site_svd_ops
from .svd import scaled_truncated_factors


@dataclass(frozen=True)
class ASVDSettings:
    alpha: float = 0.5


class ASVD(Compressor):
    name = "asvd"
    description = "SVD of W diag(E|x|)^alpha, B <- B diag(.)^-1 (alpha = 0.5)"
    needs = frozenset({"abs_mean"})
    authors_calibration = AuthorsCalibration(32, 2048, ONE_PASS, "WikiText-2 train windows", "ASVD code (n_calib_samples 32)")
    per_site = True
    Settings = ASVDSettings

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return site_svd_ops(d_in, d_outs)

    def solve(self, weights, stats, k):
        s = stats.abs_mean.to(stats.solve_dtype)
        check_finite("asvd", abs_mean=s)
        scale = s.clamp_min(0) ** self.settings.alpha + 1e-6
        return {n: scaled_truncated_factors(W, k[n], inputs=scale) for n, W in weights.items()}, False, [], {}
