"""The rho analysis's leaderboard section: its correlations, its highest-rho groups and a figure by block."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate


def rho_section(cell) -> list[str]:
    d = cell.details

    def show(v):
        if not v:
            return ""
        return f"{v['r']:+.2f} [{v['ci95'][0]:+.2f}, {v['ci95'][1]:+.2f}] p={v['p']:.2g}"

    corr = d["correlations"]
    # The headline is per group (n = every input group): the block-range table has a handful of points, a lead.
    per_group = sorted((k, c) for k, c in corr.items() if k.endswith("_per_group"))
    per_unit = sorted((k, c) for k, c in corr.items() if not k.endswith("_per_group"))
    head = []
    for name, c in per_group:
        if name.startswith("rho_vs_") and c.get("spearman"):
            sp = c["spearman"]
            verdict = "significant" if sp["p"] < 0.05 else "not significant"
            head.append(f"**Per group, n = {c['n']}: Spearman({name.replace('_vs_', ', ').replace('_per_group', '')}) "
                        f"= {show(sp)}** ({verdict} at 0.05).")
    rows = [[name.replace("_vs_", " vs "), show(c.get("spearman")) or c.get("note", ""), show(c.get("pearson")), c["n"]]
            for name, c in per_group + per_unit]
    n_units = len(d.get("units") or [])
    return head + ([""] if head else []) + [
        f"Correlations (r [bootstrap 95% CI] p); per group (surrogate gain, and loss rise with "
        f"`--analysis-option rho.per_group=true`) "
        f"first, then per block range ({n_units} ranges: a lead, not a finding):", "",
        tabulate(rows, headers=["variables", "Spearman", "Pearson", "n"], tablefmt="github", disable_numparse=True),
        "", "Highest-rho groups:", "",
        tabulate([[g["group"], g["block"], g["kind"], f"{g['rho']:.3f}"] for g in d["highest_rho_groups"]],
                 headers=["group", "block", "type", "rho"], tablefmt="github", disable_numparse=True),
    ]


def rho_by_block(per_group: list[dict], units: list[dict], title: str, path: Path) -> Path:
    """Left: rho per block for each group type; right: unit sensitivity (loss rise) under pca and fasc."""
    from acbench.core.figures import pyplot, save_figure

    plt = pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    kinds = sorted({r["kind"] for r in per_group})
    for kind in kinds:
        rows = sorted((r["block"], r["rho"]) for r in per_group if r["kind"] == kind)
        a.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=kind)
    a.set_xlabel("block")
    a.set_ylabel("rho (relative Frobenius violation)")
    a.legend(fontsize=7)
    a.grid(alpha=0.3)
    x = [sum(u["blocks"]) / len(u["blocks"]) for u in units]
    for method in ("pca", "fasc"):
        key = f"loss_rise_{method}"
        if all(key in u for u in units):
            b.plot(x, [u[key] for u in units], marker="s", label=f"loss rise, {method}")
    b.set_xlabel("block (centre of the compressed range)")
    b.set_ylabel("held-out loss rise (nats/token)")
    b.legend(fontsize=7)
    b.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def report_section(cell, plot_dir: Path, stem: str, title: str) -> tuple[list[str], list[Path]]:
    p = rho_by_block(cell.details["per_group"], cell.details["units"], title, plot_dir / f"{stem}.png")
    return rho_section(cell) + ["", f"![rho and sensitivity by block](plots/{p.name})"], [p]
