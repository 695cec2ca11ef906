"""The statistics and rank types shared by the calibration engine, the methods and the analyses."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace

import torch

from acbench.core.record import CALIBRATION_MODES, ONE_PASS, SEQUENTIAL  # noqa: F401 (the calibration modes)

# Statistics a method can ask for; the calibration engine collects only the union of what is asked.
# act_hist: the |a| histogram of the activation function whose output the group reads (an MLP down projection's
# act(gate x)); zeros where no activation module feeds the group. tokens: a sample of the group's input tokens (x
# alone, no gradient; with pairs asked for too, the pairs' x serve it)
ACTIVATION_STATS = frozenset({"C", "abs_mean", "mean", "abs_hist", "act_hist", "tokens"})
GRADIENT_STATS = frozenset({"F", "pairs", "row_fisher"})


@dataclass(frozen=True)
class RankSpec:
    """`ratio` is a rank ratio (budget="rank") or a parameter ratio (budget="params")."""

    ratio: float
    budget: str = "rank"
    align: int = 1

    def __post_init__(self):
        if not (isinstance(self.ratio, (int, float)) and 0 < self.ratio <= 1) or math.isnan(self.ratio):
            raise ValueError(f"rank ratio {self.ratio} is outside (0, 1]: pass e.g. --rank 0.5")
        if self.budget not in ("rank", "params"):
            raise ValueError(f"budget '{self.budget}' is unknown: use rank or params")
        if self.align < 1:
            raise ValueError("rank alignment must be >= 1")

    @property
    def label(self) -> str:
        return f"{self.ratio:g}"

    def k_group(self, d_in: int, d_outs: tuple[int, ...]) -> int:
        """k of one projection shared by a group: the activation goes from d_in to k numbers."""
        return self._k(full=d_in, d_in=d_in, d_out=sum(d_outs))

    def k_site(self, d_in: int, d_out: int) -> int:
        """k of one site's own factorisation W_i ~ A_i B_i, from that site's shape alone (so k_proj and v_proj
        of a grouped-query attention get their own, smaller k: SVD-LLM's int(m*n*r/(m+n)) per matrix)."""
        return self._k(full=min(d_in, d_out), d_in=d_in, d_out=d_out)

    def _k(self, full: int, d_in: int, d_out: int) -> int:
        if self.budget == "rank":
            k = round(self.ratio * full)
        else:
            k = math.floor(self.ratio * d_in * d_out / (d_in + d_out))
        k = max(1, k)
        if self.align > 1:
            k = math.ceil(k / self.align) * self.align
        return min(k, full)


SPARSITY_FAMILY, LOW_RANK_FAMILY = "sparsity", "low-rank"
UNSTRUCTURED = "unstructured"
_PATTERN = re.compile(r"(\d+):(\d+)")


def is_sparsity_budget(budget: str) -> bool:
    """A cell's budget names its family: 'rank'/'params' (low-rank) or an N:M pattern / 'unstructured'."""
    return budget == UNSTRUCTURED or bool(_PATTERN.fullmatch(str(budget)))


@dataclass(frozen=True)
class SparsitySpec:
    """A sparsity budget: keep `n` of every `m` consecutive input channels per token (N:M), or, with m = 0, the
    top round(density * d_in) channels of each token (unstructured). `ratio` is the density kept, as a rank ratio
    is the fraction of rank kept, so cells of both families sit at a ratio in (0, 1]."""

    n: int = 0
    m: int = 0
    density: float = 0.0

    @classmethod
    def parse(cls, text) -> "SparsitySpec":
        """'2:4' (N:M) or '0.5' (unstructured density); ValueError naming the problem and the fix."""
        if isinstance(text, bool):
            raise ValueError(f"sparsity {text!r} is neither an N:M pattern nor a density: pass e.g. 2:4 or 0.5")
        if isinstance(text, int) and text > 1:
            # YAML 1.1 reads an unquoted 2:4 as the base-60 number 124
            raise ValueError(f"sparsity {text} is not a density in (0, 1]: an N:M pattern in a YAML file must be "
                             "quoted ('2:4')")
        s = str(text).strip()
        m = _PATTERN.fullmatch(s)
        if m:
            n, mm = int(m.group(1)), int(m.group(2))
            if not 0 < n < mm:
                raise ValueError(f"sparsity {s}: N:M needs 0 < N < M (keep N of every M channels), e.g. 2:4 or 8:16")
            return cls(n=n, m=mm, density=n / mm)
        try:
            d = float(s)
        except ValueError:
            raise ValueError(f"sparsity '{s}' is neither an N:M pattern nor a density: pass e.g. 2:4, 16:32 or "
                             "0.5 (the fraction of channels kept per token)") from None
        if not (0 < d <= 1) or math.isnan(d):
            raise ValueError(f"sparsity density {s} is outside (0, 1]: it is the fraction of channels kept per "
                             "token, e.g. 0.5")
        return cls(density=d)

    @property
    def structured(self) -> bool:
        return self.m > 0

    @property
    def ratio(self) -> float:
        return self.density

    @property
    def budget(self) -> str:
        """How a cell names it: the pattern '2:4' or 'unstructured' (its density is the cell's ratio)."""
        return f"{self.n}:{self.m}" if self.structured else UNSTRUCTURED

    @property
    def label(self) -> str:
        return self.budget if self.structured else f"{UNSTRUCTURED} {self.density:g}"

    def topk_args(self, d_in: int) -> tuple[int, int]:
        """(n, m) for acbench.core.sparsity's top-k of a d_in-wide row: n of every m, or (kept, 0) over the whole row."""
        return (self.n, self.m) if self.structured else (self.keep(d_in), 0)

    def keep(self, d_in: int) -> int:
        """Channels kept per token of a d_in-wide input."""
        return d_in // self.m * self.n if self.structured else max(1, round(self.density * d_in))

    def index_bits(self, d_in: int) -> int:
        """Bits of mask metadata per token: ceil(log2 C(m, n)) per block of m (N:M), or the kept indices."""
        if self.structured:
            return d_in // self.m * math.ceil(math.log2(math.comb(self.m, self.n)))
        return math.ceil(math.log2(math.comb(d_in, self.keep(d_in)))) if d_in > 1 else 0

    def width_problem(self, group: str, d_in: int) -> str | None:
        if self.structured and d_in % self.m:
            return (f"sparsity {self.budget} cannot split group {group} (d_in = {d_in}) into blocks of {self.m}: "
                    f"pass a pattern whose M divides {d_in} (e.g. {_divisor_hint(d_in, self.n, self.m)}) or a density")
        return None


def check_pattern_widths(patterns, groups) -> None:
    """Every pattern splits every group's input (anything with .name and .d_in), else one line naming the first
    that does not: the same refusal for `bench run`, `bench plan` and a method's compress."""
    from .errors import UserError

    for p in patterns:
        for g in groups:
            problem = p.width_problem(g.name, g.d_in)
            if problem:
                raise UserError(problem)


def _divisor_hint(d_in: int, n: int, m: int) -> str:
    """A pattern of about the same density whose M divides d_in (N kept in [1, M - 1]: 7:8 once became 4:4, no
    sparsity at all), or a density where none does."""
    for mm in (4, 8, 16, 32, 2):
        if d_in % mm == 0:
            return f"{min(mm - 1, max(1, round(n / m * mm)))}:{mm}"
    return "0.5"


TOKEN_SAMPLE = ("xs", "gs")  # GroupStats' float32 (x, g) pairs
SOLVE_TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32}


def solve_torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a --solve-dtype name (float64 or float32; the CLI refuses any other before this)."""
    return SOLVE_TORCH_DTYPES[name]


# The |x| histogram (abs_hist): log10|x| on HIST_BINS equal bins over [HIST_LO, HIST_HI] (0.3 % of a decade each,
# a value resolution of 0.7 %); smaller magnitudes (zeros included) count in the first bin, larger in the last.
HIST_LO, HIST_HI, HIST_BINS = -8.0, 4.0, 4096


def magnitude_histogram(flat: torch.Tensor) -> torch.Tensor:
    """Counts of |x| over the histogram's log-magnitude bins (float64)."""
    logs = flat.float().abs().clamp_min(10.0 ** HIST_LO).log10().clamp_(HIST_LO, HIST_HI)
    return torch.histc(logs, bins=HIST_BINS, min=HIST_LO, max=HIST_HI).double()


def magnitude_threshold(hist: torch.Tensor, density: float) -> float:
    """The magnitude t with a fraction `density` of the histogram's values above it: the bin where the upper tail
    reaches `density`, interpolated within the bin in log-magnitude (values spread evenly across a bin)."""
    p = (hist / hist.sum()).double().cpu()
    tail = p.flip(0).cumsum(0).flip(0)  # tail[i]: the fraction in bins i and above
    i = int((tail >= density - 1e-12).nonzero().max())
    above = float(tail[i + 1]) if i + 1 < len(p) else 0.0
    frac = min(1.0, max(0.0, (density - above) / float(p[i]))) if float(p[i]) > 0 else 0.0
    width = (HIST_HI - HIST_LO) / len(p)
    return 10.0 ** (HIST_LO + (i + 1 - frac) * width)


@dataclass
class GroupStats:
    """Calibration statistics of one input group (all float64 except the token sample)."""

    n_tokens: int = 0
    C: torch.Tensor | None = None  # E[x x^T]
    abs_mean: torch.Tensor | None = None  # E|x| per channel
    mean: torch.Tensor | None = None  # E[x] per channel (the shift of activation sparsity)
    abs_hist: torch.Tensor | None = None  # fraction of the group's |x| values per log-magnitude bin (HIST_*)
    # the same of |act(z)|, the activation output the group's input is made of (CATS); all zeros where none is
    act_hist: torch.Tensor | None = None
    F: torch.Tensor | None = None  # E[g g^T], g = dL/dx at the group input
    xs: torch.Tensor | None = None  # (N, d) token sample of x
    gs: torch.Tensor | None = None  # (N, d) the same tokens' g
    row_fisher: dict[str, torch.Tensor] | None = None  # per site: sum over batches of (dL/dW)^2 row sums
    memo: dict = field(default_factory=dict, repr=False)  # solves shared by methods (whitening, Fisher basis)
    # the precision the solves on these statistics run in: float64, or float32 where `on` was asked for it
    solve_dtype: torch.dtype = field(default=torch.float64, repr=False)

    def on(self, device, dtype: torch.dtype = torch.float64) -> "GroupStats":
        """These statistics on `device`, solved in `dtype`: self where every tensor is there already and the
        precision is the default float64, else a copy whose tensors are moved (the moments cast to `dtype`; the
        float32 token sample stays float32), with a memo of that device's and precision's own kept inside this one
        (solves memoised there serve every method solving there, and no solve mixes a host basis with device
        tensors or float64 factors with float32 ones)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if dtype not in SOLVE_TORCH_DTYPES.values():
            raise ValueError(f"solves run in float64 or float32, not {dtype}")

        # float64 is what every solve casts to anyway: only a float32 solve recasts the moments (the (x, g) token
        # sample is float32 already and stays so)
        recast = dtype != torch.float64

        def target(name, t):
            return dtype if recast and name not in TOKEN_SAMPLE else t.dtype

        def off(name, t):
            return t.device != device or t.dtype != target(name, t)

        def cast(name, t):
            return t.to(device=device, dtype=target(name, t))

        moved, changed = {}, dtype != self.solve_dtype
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor) and off(f.name, v):
                moved[f.name], changed = cast(f.name, v), True
            elif f.name == "row_fisher" and v and any(off(f.name, t) for t in v.values()):
                moved[f.name], changed = {n: cast(f.name, t) for n, t in v.items()}, True
        if not changed:
            return self
        out = replace(self, **moved, solve_dtype=dtype)
        out.memo = self.memo.setdefault(f"on {device}" + ("" if dtype == torch.float64 else f" {dtype}"), {})
        return out

    def cached(self, key: str, compute):
        """Methods that share a factorisation of the same statistics compute it once per group."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]
