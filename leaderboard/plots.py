"""PNG plots written next to the leaderboard markdown."""

from __future__ import annotations

from pathlib import Path

from acbench.core.figures import pyplot, save_figure as _save

plt = pyplot()


def accuracy_vs_rank(series: dict[str, dict[str, list[tuple[float, float]]]], dense: dict[str, float], title: str,
                     path: Path) -> Path:
    """series: {metric label: {method: [(rank, value)]}}; one panel per metric, dense as a dashed line."""
    fig, axes = plt.subplots(1, max(1, len(series)), figsize=(5.2 * max(1, len(series)), 3.8), squeeze=False)
    for ax, (label, per_method) in zip(axes[0], series.items()):
        for method, pts in sorted(per_method.items()):
            pts = sorted(pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        if dense.get(label) is not None:
            ax.axhline(dense[label], color="black", linestyle="--", linewidth=1, label="dense")
        ax.set_xlabel("rank ratio")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def ppl_vs_params(points: dict[str, list[tuple[float, float]]], dense_ppl: float | None, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for method, pts in sorted(points.items()):
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
    if dense_ppl:
        ax.axhline(dense_ppl, color="black", linestyle="--", linewidth=1, label="dense")
    ax.set_yscale("log")
    ax.set_xlabel("parameter ratio (compressed groups)")
    ax.set_ylabel("perplexity (log scale)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def k_by_block(ks: dict[str, list[dict]], title: str, path: Path) -> Path:
    """ks: {row: [{block, kind, k, d_in}]}; one panel per group kind, k / d_in by block, a line per row."""
    kinds = sorted({g["kind"] for per in ks.values() for g in per})
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(3.6 * max(1, len(kinds)), 3.4), squeeze=False,
                             sharey=True)
    for ax, kind in zip(axes[0], kinds):
        for name, per in sorted(ks.items()):
            pts = sorted((g["block"], g["k"] / g["d_in"]) for g in per if g["kind"] == kind)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=name,
                        linestyle="-" if "+" in name else ":")  # uniform rows dotted
        ax.set_title(kind, fontsize=9)
        ax.set_xlabel("block")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("k / d_in")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def metric_vs_compute(points: dict[str, list[tuple[float, float]]], dense: float | None, ylabel: str, log: bool,
                      title: str, path: Path) -> Path:
    """Both families on one figure: a task's metric against the theoretical compute ratio, one line per method
    (a low-rank method over its ranks, a sparsity method over its densities; an N:M pattern is a point)."""
    fig, ax = plt.subplots(figsize=(8.6, 4.4))
    colors = plt.get_cmap("tab20").colors  # up to 20 rows without a repeated colour
    for i, (name, pts) in enumerate(sorted(points.items())):
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if "@" not in name else "s",
                linestyle="-" if len(pts) > 1 else "none", label=name, color=colors[i % len(colors)])
    if dense is not None:
        ax.axhline(dense, color="black", linestyle="--", linewidth=1, label="dense")
    if log:
        ax.set_yscale("log")
    ax.set_xlim(0, 1.02)  # compute ratios lie in (0, 1]: the whole range, so one matched ratio is not a zoom
    ax.set_xlabel("compute ratio (theoretical multiply-adds per token / dense)")
    ax.set_ylabel(ylabel + (" (log scale)" if log else ""))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def quality_vs_speed(panels: dict[str, dict[str, list[tuple]]], title: str, path: Path) -> Path:
    """panels: {quality label: {family: [(row label, speedup, lo, hi, quality)]}}; one panel per quality measure,
    measured decode speedup on x with its interval as a horizontal bar, dense at (1, its value)."""
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.4 * max(1, len(panels)), 4.0), squeeze=False)
    markers = {"low-rank": "o", "sparsity": "s"}
    for ax, (label, fams) in zip(axes[0], panels.items()):
        for fam, pts in sorted(fams.items()):
            xs = [p[1] for p in pts]
            ax.errorbar(xs, [p[4] for p in pts], xerr=[[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]],
                        fmt=markers.get(fam, "^"), capsize=2, label=fam, linestyle="none")
            for name, x, _, _, y in pts:
                ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="dense speed")
        if label.startswith("Δ NLL"):  # broken rows sit tens of nats up: keep the near-dense ones readable
            ax.set_yscale("symlog", linthresh=0.1)
        ax.set_xlabel("measured decode speedup vs dense (batch 1, end to end)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def critical_difference(mean_ranks: dict[str, float], cd: float, bars: list[list[str]], title: str,
                        path: Path) -> Path:
    """Demsar's diagram: methods on an axis of mean rank (1, the best, on the left), the critical difference as a
    bar above it, and a thick line joining each run of methods the test does not tell apart (`bars`)."""
    order = sorted(mean_ranks, key=lambda m: (mean_ranks[m], m))
    k = len(order)
    left, right = order[: (k + 1) // 2], order[(k + 1) // 2:][::-1]  # the worst outermost on the right
    depth = max(len(left), len(right)) + len(bars) * 0.25 + 1
    fig, ax = plt.subplots(figsize=(8.0, 1.4 + 0.32 * depth))
    ax.set_xlim(0.5, k + 0.5)
    ax.set_ylim(depth, -1.6)  # rows go down
    ax.axis("off")
    ax.plot([1, k], [0, 0], color="black", linewidth=1)  # the rank axis
    for r in range(1, k + 1):
        ax.plot([r, r], [0, -0.15], color="black", linewidth=1)
        ax.text(r, -0.25, str(r), ha="center", va="bottom", fontsize=8)
    ax.plot([1, 1 + cd], [-1.0, -1.0], color="black", linewidth=2)
    ax.text(1 + cd / 2, -1.1, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=8)
    first = 1 + len(bars) * 0.25
    for i, m in enumerate(left):  # the better half, labelled on the left
        y = first + i
        ax.plot([mean_ranks[m], mean_ranks[m], 0.5], [0, y, y], color="black", linewidth=0.8)
        ax.text(0.45, y, f"{m} ({mean_ranks[m]:.2f})", ha="right", va="center", fontsize=8, clip_on=False)
    for i, m in enumerate(right):
        y = first + i
        ax.plot([mean_ranks[m], mean_ranks[m], k + 0.5], [0, y, y], color="black", linewidth=0.8)
        ax.text(k + 0.55, y, f"({mean_ranks[m]:.2f}) {m}", ha="left", va="center", fontsize=8, clip_on=False)
    for j, bar in enumerate(bars):
        y = 0.35 + 0.25 * j
        ax.plot([mean_ranks[bar[0]] - 0.05, mean_ranks[bar[-1]] + 0.05], [y, y], color="tab:red", linewidth=3)
    ax.set_title(title, fontsize=9)
    fig.subplots_adjust(left=0.22, right=0.78)
    return _save(fig, path)
