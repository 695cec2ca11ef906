"""The emergence experiment's leaderboard section: the verdict, onsets and correlations, and two figures."""

from __future__ import annotations

from pathlib import Path

from tabulate import tabulate


def _fmt(v, spec="{:+.2f}") -> str:
    return "" if v is None else spec.format(v)


def _interval(m: dict) -> str:
    if m.get("mean") is None:
        return ""
    ci, over = m.get("ci95"), "seeds"
    if not ci and m.get("ci95_checkpoints"):
        ci, over = m["ci95_checkpoints"], "one seed's checkpoints"
    return f"{m['mean']:+.2f}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}] over {over}" if ci else " (one seed: no interval)")


def _figure(summary: dict, path: Path, title: str) -> Path:
    from acbench.core.figures import pyplot, save_figure

    plt = pyplot()

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 3.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for seed, series in summary["series"].items():
        steps = [max(p["step"], 1) for p in series]  # step 0 drawn at 1 on the log axis
        blocks = sorted({b for p in series for b in p["rho_block"]}, key=int)
        for i, blk in enumerate(blocks):
            a.plot(steps, [p["rho_block"][blk] for p in series], color=colours[i % len(colours)], marker=".",
                   alpha=0.8, label=f"block {blk}" if seed == next(iter(summary["series"])) else None)
        b.plot(steps, [p["p1"] for p in series], marker="o", label=f"seed {seed}")
        if series and series[-1].get("chance") is not None:
            b.axhline(series[-1]["chance"], color="black", linestyle="--", linewidth=1)
        c.plot(steps, [p.get("gap") for p in series], marker="s", label=f"seed {seed}")
    c.axhline(0, color="black", linewidth=1)
    for ax, label in ((a, "rho (mean over the block's groups)"), (b, "dense P@1 (dashed: chance)"),
                      (c, "fasc-kfac P@1 - pca P@1")):
        ax.set_xscale("log")
        ax.set_xlabel("training step (0 at 1)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)


def report_section(summary: dict, config: dict, plot_dir: Path, stem: str, title: str) -> tuple[list[str], list[Path]]:
    v = summary["verdict"]
    train = config.get("train", {})
    lines = [f"**Does the paper's claim (high-rho layers emerge only once facts are internalised) hold in this "
             f"setting? It {v['state'] if v['state'] != 'inconclusive' else 'is inconclusive'}:** {v['why']}.", "",
             f"- {train.get('layers')} layers, d = {train.get('d_model')}, {config.get('entities')} entities, "
             f"{train.get('steps')} steps, seeds {', '.join(map(str, summary['per_seed']))}; LAMA "
             f"{config.get('protocol')} protocol on the held-out probe template; rank {config.get('rank')}"
             + ("; CONTROL: every mention of a fact drew a fresh value, so there was nothing to learn"
                if config.get("control") else ""),
             "- recall onset: the first checkpoint from which dense P@1 stays above chance (one-sided test, "
             "p < 0.05); rho onset: the first checkpoint from which a block's rho stays above its step-0 value by at "
             "least a quarter of its largest rise",
             ""]
    blocks = sorted({b for s in summary["per_seed"].values() for b in s["rho_onset"]}, key=int)
    rows = []
    for seed, s in summary["per_seed"].items():
        last = (summary["series"].get(seed) or [{}])[-1]
        rows.append([seed, _fmt(last.get("p1"), "{:.3f}"), _fmt(last.get("chance"), "{:.4f}"),
                     _fmt(last.get("ppl"), "{:.2f}"), _fmt(s["recall_onset"], "{}") or "never"]
                    + [f"{_fmt(s['rho_onset'].get(b), '{}') or '-'} / {_fmt(s['spearman'].get(b))}" for b in blocks])
    lines += ["Per seed: dense P@1, its chance level and held-out perplexity at the last checkpoint, the recall "
              "onset, and per block the rho onset / Spearman(rho, P@1) across checkpoints:", "",
              tabulate(rows, headers=["seed", "P@1", "chance", "ppl", "recall onset"] + [f"block {b}" for b in blocks],
                       tablefmt="github", disable_numparse=True), ""]
    lines += ["Spearman(rho, P@1) across checkpoints, mean over seeds [bootstrap 95% over seeds]:", "",
              tabulate([[f"block {b}", _interval(m)] for b, m in summary["spearman"].items()],
                       headers=["block", "Spearman"], tablefmt="github", disable_numparse=True), ""]
    if summary["gap"]:
        last = max(summary["gap"], key=int)
        lines += [f"FASC-over-pca P@1 gap at the last checkpoint (step {last}): {_interval(summary['gap'][last])} "
                  "(paired per probe within each seed; the interval is over seeds)", ""]
    p = _figure(summary, plot_dir / f"{stem}.png", title)
    return lines + [f"![rho, recall and the FASC-over-pca gap over training](plots/{p.name})"], [p]
