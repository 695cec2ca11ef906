"""The `rho` analysis: the Dependence Violation Score per input group, knowledge sensitivity per range of blocks,
and their correlations (per group, the headline, and per range)."""

from __future__ import annotations

import math
import time

from dataclasses import dataclass

from tqdm.auto import tqdm

from acbench.core.linalg import direction_scores, fisher_scores, pca_basis
from acbench.core.stats import RankSpec
from acbench.tasks.base import TaskResult

from .base import Analysis
from .dependence import correlations, cost_flops, rho_scores

VARIANTS = ("rho", "rho_cos", "rho_dir")


def group_rho(stats, groups, rank: RankSpec) -> list[dict]:
    """rho variants per group, and FASC's gain over pca on the per-token surrogate E[(g^T (I-P) x)^2]."""
    rows = []
    for g in groups:
        st = stats[g.name]
        k = rank.k_group(g.d_in, g.d_outs)
        pca = pca_basis(st)
        t0 = time.perf_counter()
        r = rho_scores(st.xs, st.gs, discard=pca["U"][:, k:])
        seconds = time.perf_counter() - t0
        def surrogate(z):
            return float((z[:, k:].sum(1) ** 2).mean())  # z[:, k:]: the discarded directions' shares

        # fasc-kfac's scores as fasc memoised them (with the basis) where the store kept the group
        s_pca, s_fasc = surrogate(direction_scores(pca, st.xs, st.gs)), surrogate(fisher_scores(st))
        rows.append({"group": g.name, "block": g.block, "kind": g.kind, "d": g.d_in, "k": k, **r,
                     "surrogate_pca": s_pca, "surrogate_fasc_kfac": s_fasc,
                     "surrogate_gain": (s_pca - s_fasc) / s_pca if s_pca > 0 else 0.0, "seconds": seconds})
    return rows


def _mean(values) -> float:
    """Mean over the finite values (a group whose estimate is undefined is left out, and reported per group)."""
    ok = [v for v in values if v is not None and math.isfinite(v)]
    return sum(ok) / len(ok) if ok else float("nan")


def _units(n_blocks: int, n_units: int) -> list[list[int]]:
    n_units = max(1, min(n_units, n_blocks))
    bounds = [round(i * n_blocks / n_units) for i in range(n_units + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(n_units)]


def sensitivity(ctx, rank: RankSpec, settings: "RhoSettings", unit_blocks: list[list[int]],
                per_group_rise: dict | None = None) -> tuple[list[dict], dict]:
    """Per unit and method: compress only that unit's groups; drops in LAMA P@1 / MMLU accuracy, rise in loss.
    With settings.per_group, also fills `per_group_rise` with the loss rise of compressing each group alone."""
    per_group_rise = {} if per_group_rise is None else per_group_rise
    probes = {
        "loss": ctx.task("ppl-token", max_windows=settings.loss_windows, batch_size=1),
        "lama": ctx.task("lama", per_relation=settings.lama_limit) if settings.lama_limit else None,
        "mmlu": ctx.task("mmlu", limit=settings.mmlu_limit, shots=0) if settings.mmlu_limit else None,
    }

    def measure(model):
        out = {"loss": probes["loss"].evaluate(model, ctx.tokenizer, progress=False).metrics["nll"]}
        if probes["lama"]:
            out["lama"] = probes["lama"].evaluate(model, ctx.tokenizer, progress=False).metrics["p@1"]
        if probes["mmlu"]:
            out["mmlu"] = probes["mmlu"].evaluate(model, ctx.tokenizer, progress=False).metrics["acc"]
        return out

    dense = measure(ctx.model)
    groups = ctx.groups
    if settings.per_group:
        loss = probes["loss"]
        for g in tqdm(groups, desc="rho per group", disable=not ctx.progress, leave=False):
            with ctx.compressed("pca", rank, only_groups={g.name}) as model:
                per_group_rise[g.name] = loss.evaluate(model, ctx.tokenizer, progress=False).metrics["nll"] - dense["loss"]
    rows = []
    jobs = [(u, m) for u in range(len(unit_blocks)) for m in ("pca", "fasc")]
    for u, method in tqdm(jobs, desc="rho sensitivity", disable=not ctx.progress, leave=False):
        names = {g.name for g in groups if g.block in unit_blocks[u]}
        with ctx.compressed(method, rank, only_groups=names) as model:
            got = measure(model)
        row = {"unit": u, "blocks": unit_blocks[u], "method": method, "loss_rise": got["loss"] - dense["loss"]}
        if "lama" in got:
            row["lama_drop"] = dense["lama"] - got["lama"]
        if "mmlu" in got:
            row["mmlu_drop"] = dense["mmlu"] - got["mmlu"]
        rows.append(row)
    return rows, dense


def rho_task(ctx, rank: RankSpec, settings: "RhoSettings") -> TaskResult:
    groups = ctx.groups
    per_group = group_rho(ctx.stats, groups, rank)
    units = _units(len({g.block for g in groups}), settings.units)
    rises: dict[str, float] = {}
    sens, dense = sensitivity(ctx, rank, settings, units, rises)
    for r in per_group:
        if r["group"] in rises:
            r["loss_rise_pca_alone"] = rises[r["group"]]

    # Unit-level table: mean rho of the unit's groups beside its sensitivities.
    table = []
    for u, blocks in enumerate(units):
        gs = [r for r in per_group if r["block"] in blocks]
        row = {"unit": u, "blocks": blocks, **{v: _mean([r.get(v) for r in gs]) for v in VARIANTS}}
        for s in sens:
            if s["unit"] == u:
                for key in ("loss_rise", "lama_drop", "mmlu_drop"):
                    if key in s:
                        row[f"{key}_{s['method']}"] = s[key]
        for key in ("loss_rise", "lama_drop", "mmlu_drop"):
            if f"{key}_pca" in row:
                row[f"fasc_gain_{key}"] = row[f"{key}_pca"] - row[f"{key}_fasc"]
        table.append(row)

    corr = {}
    targets = [k for k in table[0] if k.startswith(("loss_rise", "lama_drop", "mmlu_drop", "fasc_gain"))]
    for v in VARIANTS:
        for t in targets:
            corr[f"{v}_vs_{t}"] = correlations([r[v] for r in table], [r[t] for r in table], seed=ctx.seed)
        corr[f"{v}_vs_surrogate_gain_per_group"] = correlations([r.get(v) for r in per_group],
                                                                [r["surrogate_gain"] for r in per_group], seed=ctx.seed)
        if rises:
            corr[f"{v}_vs_loss_rise_per_group"] = correlations([r.get(v) for r in per_group],
                                                               [r.get("loss_rise_pca_alone") for r in per_group],
                                                               seed=ctx.seed)
    top = sorted((r for r in per_group if math.isfinite(r["rho"])), key=lambda r: -r["rho"])[:10]
    d_small = min(r["d"] for r in per_group)
    d_big = max(r["d"] for r in per_group)
    metrics = {f"{v}_mean": _mean([r.get(v) for r in per_group]) for v in VARIANTS}
    s = corr.get("rho_vs_loss_rise_pca", {}).get("spearman")
    if s:
        metrics["spearman_rho_loss_rise"] = s["r"]
    metrics["surrogate_gain_mean"] = sum(r["surrogate_gain"] for r in per_group) / len(per_group)
    return TaskResult(
        metrics=metrics,
        details={
            "per_group": per_group, "units": table, "dense": dense, "correlations": corr,
            "highest_rho_groups": [{"group": r["group"], "block": r["block"], "kind": r["kind"], "rho": r["rho"]}
                                   for r in top],
            "cost": {"formula": "2 N^2 d + 2 N d m multiply-adds per group (N sampled tokens, m discarded directions)",
                     "flops_smallest_group": cost_flops(per_group[0]["n_tokens"], d_small, d_small // 2),
                     "flops_largest_group": cost_flops(per_group[0]["n_tokens"], d_big, d_big // 2),
                     "seconds_total": sum(r["seconds"] for r in per_group)},
            "rank": {"ratio": rank.ratio, "budget": rank.budget},
        },
        config=dict(vars(settings)),
    )


@dataclass(frozen=True)
class RhoSettings:
    units: int = 4  # contiguous block ranges compressed together for the sensitivity table
    lama_limit: int = 1  # LAMA probes per relation measured per range (0: none)
    mmlu_limit: int = 0  # MMLU questions per subject measured per range (0: none)
    loss_windows: int = 2  # perplexity windows measured per range and per group
    per_group: bool = False  # also compress each group alone with pca and measure its loss rise (one pass per group)

    def minimums(self):
        return {"units": (self.units, 1), "loss_windows": (self.loss_windows, 1)}


class Rho(Analysis):
    name = "rho"
    version = 2  # 2: exact permutation p-values up to 8 points (the asymptotic ones said p = 0 at n = 4)
    description = "Dependence Violation Score per group and its correlation with knowledge loss"
    needs = frozenset({"C", "F", "pairs"})
    uses_tasks = ("ppl-token", "lama", "mmlu")
    primary_metric = "rho_mean"
    Settings = RhoSettings

    def run(self, ctx, rank: RankSpec) -> TaskResult:
        result = rho_task(ctx, rank, self.settings)
        result.higher_is_better = {k: None for k in result.metrics}  # descriptive numbers, no better direction
        return result

    @classmethod
    def report_section(cls, cell, plot_dir, stem, title):
        from .rho_report import report_section

        return report_section(cell, plot_dir, stem, title)

    def summary_line(self, result: TaskResult) -> str:
        c = result.details["correlations"].get("rho_vs_surrogate_gain_per_group", {}).get("spearman")
        return f"mean rho={result.metrics['rho_mean']:.3f}" + (
            f", per group Spearman(rho, FASC surrogate gain)={c['r']:.2f} (p={c['p']:.2g})" if c else "")
