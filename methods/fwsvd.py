"""FWSVD: per site, SVD of diag(r) W with r_i = sqrt(sum_j I_ij), I the diagonal weight Fisher."""


from acbench.core.linalg import check_finite

from .base import Compressor, site_svd_ops
from .svd import floored, scaled_truncated_factors


class FWSVD(Compressor):
    name = "fwsvd"
    description = "SVD of diag(r) W, r = row sums of the diagonal weight Fisher, then diag(r)^-1"
    needs = frozenset({"row_fisher"})
    per_site = True

    def solve_ops(self, d_in, d_outs, k, pair_tokens):
        return site_svd_ops(d_in, d_outs)

    def solve(self, weights, stats, k):
        factors, fallbacks = {}, []
        for n, W in weights.items():
            I_row = stats.row_fisher[n].to(W.dtype)
            check_finite("fwsvd", row_fisher=I_row)
            r = floored(I_row.clamp_min(0).sqrt(), "fwsvd", "row-weight-floor", "rows", fallbacks)
            factors[n] = scaled_truncated_factors(W, k[n], outputs=r)
        return factors, False, fallbacks, {}
