"""The harness's public compression step: one method at one rank over a model's input groups (or some of them).

Analyses compress through `compress` too, so a method's settings and numeric fallbacks mean the same wherever a
compressed model comes from.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from contextlib import contextmanager

from tqdm.auto import tqdm

from acbench import methods
from acbench.core.errors import UserError, exception_line
from acbench.core.interruptible import interruptible
from acbench.core.linalg import NumericError
from acbench.core.record import ALL_GROUPS, UNIFORM
from acbench.core.registry import code_provenance
from acbench.core.stats import GroupStats, RankSpec, SparsitySpec, solve_torch_dtype
from acbench.methods.base import GroupCompression

from acbench.deploy.apply import apply_compression, restore, swap
from acbench.model.groups import find_input_groups
from acbench.model.modes import restore_modes, training_modes


class _StatsOf:
    """`stats[name]` for a method's site_ranks: a group calibration never reached reads as empty statistics."""

    def __init__(self, stats: Mapping[str, GroupStats]):
        self._stats = stats

    def get(self, name: str) -> GroupStats:
        return self._stats.get(name) or GroupStats()


# model -> deployments in it not yet restored (weakly held: a dropped model leaves no entry)
_LIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_deployed(model) -> bool:
    """Whether `model` holds a compression not yet restored, whatever its kind (replaced modules or masked weights)."""
    return _LIVE.get(model, 0) > 0


class Deployment:
    """A variant deployed in a model, in place: the model (the same object, now compressed), each group's summary,
    and what undoes it. `restore()` puts the dense modules and weights back (kept by reference, so bit for bit);
    `dense_switch()` lets latency alternate between dense and deployed in one process. A deployed model is in eval
    mode; restore() puts back each module's training flag as it was before (`modes`, from `training_modes`)."""

    def __init__(self, model, summaries: list[dict], undo: list, modes: dict | None = None):
        self.model, self.summaries, self._undo = model, summaries, undo
        self._restored, self._modes = False, modes or {}
        _LIVE[model] = _LIVE.get(model, 0) + 1

    @property
    def restored(self) -> bool:
        return self._restored

    def restore(self) -> None:
        """The dense model again (a second call does nothing)."""
        if self._restored:
            return
        self._restored = True
        for u in reversed(self._undo):
            restore(self.model, u)
        restore_modes(self._modes)
        _LIVE[self.model] -= 1
        if not _LIVE[self.model]:
            del _LIVE[self.model]

    def dense_switch(self):
        """`use_dense(flag)`: True puts the dense modules back in place, False the deployed ones (both kept by
        reference)."""
        if self._restored:
            raise RuntimeError("this deployment was restored: deploy the variant again to switch it")
        undo, model = self._undo, self.model
        state = {"dense": False, "redo": []}

        def use_dense(flag: bool) -> None:
            if flag == state["dense"]:
                return
            if flag:
                state["redo"] = [swap(model, u) for u in reversed(undo)]
            else:
                for r in reversed(state["redo"]):
                    swap(model, r)
                state["redo"] = []
            state["dense"] = flag
        return use_dense


# d x d matrices (in the solve precision) a group's solve holds at its peak: measured as extra resident memory at
# d = 2048 (2026-12-06, 2 cores): pca 4.7, asvd / fwsvd 6.8, espace-nl 8.7, fasc-kfac 9.2, svd-llm-v2 9.9,
# whitened-svd 12.2, fasc 12.3; a sparsity method that reads C or F (SparseGPT's Hessian, LaRoSa's rotation) fewer
SOLVE_SQUARES = {methods.LOW_RANK_FAMILY: 13, "sparsity": 4}


def solve_bytes(comp, group, solve_dtype: str) -> int:
    """About the most memory one group's solve holds: its d x d working matrices and its sites' weights (and the
    factors replacing them) in the solve precision."""
    width = solve_torch_dtype(solve_dtype).itemsize
    d = group.d_in
    square = comp.family == methods.LOW_RANK_FAMILY or bool(set(comp.required_stats()) & {"C", "F"})
    squares = SOLVE_SQUARES.get(comp.family, SOLVE_SQUARES["sparsity"]) if square else 0
    return (squares * d * d + 2 * d * sum(group.d_outs)) * width


def free_bytes(device: str | None) -> int:
    """What the solve device can hold now: free GPU memory on a CUDA device, the system's available memory else."""
    import torch

    dev = torch.device(device or "cpu")
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    from acbench.core.io import available_bytes

    return available_bytes()


def check_solve_fits(comp, group, solve_dtype: str, device: str | None = None) -> None:
    """Before a group's solve starts: refused in one line, naming the group and how to leave it out, where its
    working memory would not fit (a solve that swaps or is killed part way holds the run for nothing)."""
    need, free = solve_bytes(comp, group, solve_dtype), free_bytes(device)
    if need > free:
        raise UserError(f"group {group.name} (d_in {group.d_in:,}): {comp.name}'s solve needs about "
                        f"{need / 2**30:.1f} GiB in {solve_dtype} and {device or 'cpu'} has {free / 2**30:.1f} GiB "
                        f"free: leave its kind out with --groups (the other kinds than {group.kind}) or its block "
                        "with --blocks, use --solve-dtype float32, or a machine with more memory")


def deploy(model, method: str, rank: RankSpec | SparsitySpec, stats: Mapping[str, GroupStats],
           method_options: dict | None = None, only_groups: set[str] | None = None, progress: bool = True,
           ks: Mapping[str, int] | None = None, merge: bool = False, solve_device: str | None = None,
           solve_dtype: str = "float64", densities: Mapping[str, float] | None = None) -> Deployment:
    """The model itself, compressed in place one group at a time (each group's statistics and factors are freed
    before the next), as a Deployment to restore. Nothing is copied: the dense modules and weights are kept by
    reference, so a sweep holds one model plus the deployed factors instead of a copy per cell. An error part way
    restores the groups already deployed. `ks`: each group's k from a rank allocation (acbench.deploy.allocation),
    for a projection method; without it every group's k comes from `rank`. `densities`: each group's density from
    a density allocation (an unstructured sparsity budget's). `merge`: factors are deployed as dense-shaped weights
    W_i' = A_i B_i even where the factorised form is smaller. `solve_device`: where each group's statistics are
    moved and solved (default the host); `solve_dtype`: the low-rank solves' precision, float64 (default) or
    float32 (the sparsity family's scores stay float64). `method` is a name or a variant (`act-sparse:score=fisher`);
    `rank` is a RankSpec (low-rank family) or a SparsitySpec (sparsity)."""
    comp = methods.build(method, method_options)
    groups = [g for g in find_input_groups(model) if only_groups is None or g.name in only_groups]
    undo, summaries = [], []
    modes = training_modes(model)
    own_fallbacks: dict[str, list] = {}
    if ks is None and isinstance(rank, RankSpec):  # a method that allocates across groups itself
        try:
            own = interruptible(comp.site_ranks, groups, _StatsOf(stats), rank)
        except NumericError as e:
            raise UserError(str(e)) from None
        if own is not None:
            ks, fallbacks = own
            for f in fallbacks:
                group = next((g.name for g in groups if f.get("site") in g.site_names), groups[0].name)
                own_fallbacks.setdefault(group, []).append(f)
    try:
        for g in tqdm(groups, desc=f"compress {method}@{rank.label}", disable=not progress, leave=False):
            budget = rank if densities is None else SparsitySpec(density=densities[g.name])
            u, summary = _deploy_group(model, comp, g, stats.get(g.name), budget, None if ks is None else ks[g.name],
                                       own_fallbacks.get(g.name, []), merge, solve_device, solve_dtype)
            undo.append(u)
            summaries.append(summary)
    except BaseException:
        Deployment(model, summaries, undo, modes).restore()
        raise
    model.eval()
    return Deployment(model, summaries, undo, modes)


def _deploy_group(model, comp, g, own: GroupStats | None, budget, k, extra_fallbacks: list, merge: bool,
                  solve_device: str | None, solve_dtype: str):
    """One group solved from its statistics and swapped into the model: (its Undo, its summary)."""
    try:
        solver, unrouted = _solver_for(comp, own)
        check_solve_fits(solver, g, solve_dtype, solve_device)
        # in a helper thread: Ctrl-C and SIGTERM reach the run even inside a long factorisation
        res = interruptible(solver.compress, g, own or GroupStats(), budget, k=k, device=solve_device,
                            dtype=solve_torch_dtype(solve_dtype))
    except NumericError as e:
        raise UserError(str(e)) from None
    except Exception as e:
        plugin = methods.REGISTRY.origin(comp.name) if comp.name in methods.REGISTRY else None
        if plugin is None or isinstance(e, UserError):  # acbench's own method: a bug, shown with its traceback
            raise
        # someone else's code: one line naming it and the group, the traceback kept for `raise ... from`
        raise UserError(f"method {comp.name} ({plugin}) failed on group {g.name}: {exception_line(e)}; `bench "
                        f"check-method {comp.name}` runs it against the method contract") from e
    res.fallbacks = [*res.fallbacks, *extra_fallbacks, *unrouted]
    if merge and isinstance(res, GroupCompression):
        res.form = "merged"
    return apply_compression(model, g, res), res.summary()


def sequential_problem(comp) -> str | None:
    """Why a method cannot be calibrated sequentially (one line naming the fix), or None."""
    from acbench.calibration.sequential import gradient_problem

    if type(comp).site_ranks is not methods.Compressor.site_ranks:
        return (f"{comp.name} allocates its ranks across all groups at once from their statistics, and sequential "
                "calibration has one block's statistics at a time: run it with --calibration-mode one-pass")
    return gradient_problem(comp.required_stats(), comp.name)


def deploy_sequential(model, method: str, rank: RankSpec | SparsitySpec, windows, spec,
                      method_options: dict | None = None, only_groups: set[str] | None = None,
                      progress: bool = True, merge: bool = False, solve_device: str | None = None,
                      solve_dtype: str = "float64", batch_size: int = 2) -> tuple[Deployment, dict]:
    """`deploy` under sequential calibration (acbench.calibration.sequential): each block's groups solved from the
    statistics of the calibration windows as the blocks before it, already compressed, pass them on. Returns the
    Deployment and the calibration's counts (tokens, blocks, seconds, held bytes); statistics are not cached (they
    depend on the method and budget that compressed the blocks before)."""
    from acbench.calibration.cache import check_statistics_finite
    from acbench.calibration.sequential import sequential_pass

    comp = methods.build(method, method_options)
    problem = sequential_problem(comp)
    if problem:
        raise UserError(problem)
    groups = [g for g in find_input_groups(model) if only_groups is None or g.name in only_groups]
    undo, summaries = [], []
    modes = training_modes(model)

    def compress_block(block_groups, stats):
        for g in block_groups:
            u, summary = _deploy_group(model, comp, g, stats.get(g.name), rank, None, [], merge, solve_device,
                                       solve_dtype)
            undo.append(u)
            summaries.append(summary)

    try:
        counts = sequential_pass(model, groups, windows, comp.required_stats(), spec, compress_block, batch_size,
                                 progress, check=check_statistics_finite)
    except BaseException:
        Deployment(model, summaries, undo, modes).restore()
        raise
    model.eval()
    return Deployment(model, summaries, undo, modes), counts


def _solver_for(comp, group_stats: GroupStats | None) -> tuple:
    """(the method that compresses a group, the fallback record): the method itself, or, where calibration routed
    no token to the group (an expert its router never chose) and the method reads statistics, its data-free twin,
    recorded in the cell."""
    if group_stats is None or group_stats.n_tokens > 0 or not comp.required_stats():
        return comp, []
    twin = comp.data_free_twin
    return methods.build(twin), [{"fallback": f"{twin} (data-free): no calibration token was routed here",
                                  "method": comp.name}]


@contextmanager
def compressed(model, method: str, rank: RankSpec | SparsitySpec, stats: Mapping[str, GroupStats],
               method_options: dict | None = None, only_groups: set[str] | None = None, progress: bool = True,
               ks: Mapping[str, int] | None = None, merge: bool = False, solve_device: str | None = None,
               solve_dtype: str = "float64", densities: Mapping[str, float] | None = None):
    """`with compressed(...) as (model, summaries):` `deploy`'s model and summaries, restored to the dense model
    on exit, error or not (the settings as `deploy`'s)."""
    dep = deploy(model, method, rank, stats, method_options, only_groups, progress, ks, merge, solve_device,
                 solve_dtype, densities)
    try:
        yield dep.model, dep.summaries
    finally:
        dep.restore()


def compression_summary(summaries: list[dict], rank: RankSpec | SparsitySpec, method: str,
                        method_options: dict | None, allocation: dict | None = None, scope: str = ALL_GROUPS,
                        solve_device: str = "cpu", solve_dtype: str = "float64") -> dict:
    dense = sum(s["params_dense"] for s in summaries)
    deployed = sum(s["params_deployed"] for s in summaries)
    fallbacks = [dict(f, group=s["group"]) for s in summaries for f in s["fallbacks"]]
    comp = methods.build(method, method_options)
    # totals: multiply-adds weighted by each group's dense multiply-adds (its dense parameters, once per token);
    # activation numbers kept over the groups' input widths
    macs = sum(s["compute_ratio"] * s["params_dense"] for s in summaries)
    kept = sum(s["activation_ratio"] * s["d_in"] for s in summaries)
    width = sum(s["d_in"] for s in summaries)
    budget = ({"rank_ratio": rank.ratio, "budget": rank.budget, "align": rank.align} if isinstance(rank, RankSpec)
              else {"rank_ratio": rank.ratio, "budget": rank.budget, "pattern": rank.budget, "density": rank.density})
    return {
        **budget, "family": comp.family,
        "params_dense": dense, "params_deployed": deployed, "param_ratio": deployed / dense if dense else None,
        "compute_ratio": macs / dense if dense else None, "activation_ratio": kept / width if width else None,
        "groups_factorised": sum(s["form"] == "factorised" for s in summaries), "groups": summaries,
        "fallbacks": fallbacks, "n_fallbacks": len(fallbacks), "method_settings": comp.settings_dict(),
        "method_version": comp.version, "method_code": code_provenance(type(comp)), "capabilities": comp.capabilities(), "scope": scope,
        "allocation": allocation or {"rule": UNIFORM}, "solve_device": solve_device,
        "solve_dtype": solve_dtype if comp.family == methods.LOW_RANK_FAMILY else "float64",
    }
