"""Knowledge emergence (docs/design.md, section 10): does rho rise only once a model has internalised facts?

`bench emerge` builds the synthetic fact corpus, trains a small Llama on it per seed (acbench.studies.emergence.train),
and runs the harness's own sweep on every checkpoint: dense, pca and fasc-kfac at one rank with LAMA on the held-
out probes, perplexity on held-out text, and the rho analysis, unchanged. The series is read back from those
cells and summarised here (onsets, correlations, the FASC-over-pca gap), stored as one cell of its own
(kind "analysis", task "emerge") and rendered by `report_section`. A study above the harness: it calls bench as
the CLI does (config -> resolve_run -> prepare -> execute); nothing below imports it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from acbench.core.record import ANALYSIS_CELL, DENSE, CellId, CellRecord
from acbench.core.significance import above_chance, compare

from acbench.analyses.dependence import correlations

from .train import TrainConfig

NAME = "emerge"  # the task of its summary cell, and the leaderboard section that renders it
VERSION = 1  # the summary's formulas: stored with the cell
METHODS = ("pca", "fasc-kfac")  # the variance baseline and the Fisher-aligned projection, paired per probe


@dataclass(frozen=True)
class EmergeConfig:
    train: TrainConfig = field(default_factory=TrainConfig)
    entities: int = 400
    seeds: tuple[int, ...] = (0,)
    spacing: str = "log"  # checkpoint steps: log (0, 16, 32, 64, ...) or linear
    rank: float = 0.5
    # LAMA protocol of the probes: candidates = the relation's values, so chance is 1/|values| (what knowing the
    # answer's type alone scores); under "vocab" that type knowledge alone is far above chance (1/|vocabulary|)
    protocol: str = "candidates"
    calib_samples: int = 8
    ppl_windows: int = 16
    control: bool = False  # facts shuffled at every mention: no association to learn (acbench.tasks.data.facts)

    def tag(self, seed: int) -> str:
        """Names a seed's checkpoints and their results (`emerge-<config hash>-s<seed>`)."""
        from acbench.results.store import settings_hash

        # what determines the checkpoints (corpus and training), not how they are evaluated
        body = {"train": {**asdict(self.train), "seed": None}, "entities": self.entities, "spacing": self.spacing,
                "control": self.control}
        return f"emerge-{settings_hash(body)[:6]}-s{seed}"


# ---------------------------------------------------------------- the series, read from the harness's cells

def _cells_of(paths: list[Path]) -> list[CellRecord]:
    out = []
    for path in paths:
        try:
            out.append(CellRecord.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue  # a broken file: the sweep recomputes it, the series skips it
    return out


def checkpoint_point(cell_paths: list[Path], step: int, rank: float) -> dict | None:
    """One checkpoint's numbers from the cells of its sweep (exactly those: a cell of another protocol or setting
    in the same folder is not read): dense P@1 (and whether it is above chance), held-out perplexity, rho per
    group and per block, and pca / fasc-kfac P@1 with their paired difference."""
    cells = _cells_of(cell_paths)
    find = lambda method, task: next((c for c in cells if c.cell.method == method and c.cell.task == task
                                      and (method == DENSE or c.cell.rank == rank)), None)
    dense, ppl, rho = find(DENSE, "lama"), find(DENSE, "ppl-token"), find("rho-analysis", "rho")
    if dense is None or rho is None:
        return None
    chance = above_chance(dense) or {}
    per_group = {g["group"]: g["rho"] for g in rho.details["per_group"]}
    blocks: dict[int, list] = {}
    for g in rho.details["per_group"]:
        blocks.setdefault(int(g["block"]), []).append(g["rho"])
    point = {"step": step, "p1": dense.metrics["p@1"], "chance": chance.get("chance"), "p_above": chance.get("p"),
             "above": bool(chance.get("above")), "ppl": ppl.metrics["ppl"] if ppl else None, "rho": per_group,
             "rho_block": {b: float(np.mean(v)) for b, v in sorted(blocks.items())}}
    pca, fasc = find(METHODS[0], "lama"), find(METHODS[1], "lama")
    if pca and fasc:
        d = compare(pca, fasc) or {}
        point.update(pca_p1=pca.metrics["p@1"], fasc_p1=fasc.metrics["p@1"], gap=d.get("diff"),
                     gap_ci=d.get("ci95"), gap_p=d.get("p"))
    return point


def read_series(cell_paths: list[list[Path]], steps: list[int], rank: float) -> list[dict]:
    """The series of one seed from each checkpoint's cell paths (`sweep_checkpoints`), in step order."""
    return [p for paths, s in zip(cell_paths, steps) if (p := checkpoint_point(paths, s, rank)) is not None]


# ---------------------------------------------------------------- onsets, correlations, the verdict

def recall_onset(series: list[dict]) -> int | None:
    """The first step whose dense P@1 is above chance (one-sided test at ALPHA) and stays so at every later
    checkpoint."""
    for i, p in enumerate(series):
        if all(q["above"] for q in series[i:]):
            return p["step"]
    return None


RISE_FRACTION = 0.25


def rise_onset(steps: list[int], values: list[float], fraction: float = RISE_FRACTION) -> int | None:
    """The first step from which a curve stays risen over its start by at least `fraction` of its largest rise
    (a sustained rise, as the recall onset is a sustained lead over chance; None: it never rises)."""
    if not values:
        return None
    rise = [v - values[0] for v in values]
    top = max(rise)
    if not top > 0:
        return None
    return next((s for i, s in enumerate(steps) if all(r >= fraction * top for r in rise[i:])), None)


def bootstrap_mean(values: list[float], n_boot: int = 10_000, seed: int = 0) -> dict:
    """The mean over seeds with a bootstrap 95% interval over seeds (none with one seed)."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], float)
    if len(v) == 0:
        return {"mean": None, "ci95": None, "n": 0}
    if len(v) < 2:
        return {"mean": float(v[0]), "ci95": None, "n": 1}
    boots = v[np.random.default_rng(seed).integers(0, len(v), (n_boot, len(v)))].mean(1)
    return {"mean": float(v.mean()), "ci95": [float(x) for x in np.quantile(boots, [0.025, 0.975])], "n": len(v)}


def summarize(series_by_seed: dict[int, list[dict]]) -> dict:
    """Per seed: the recall onset, each block's rho half-rise step and Spearman(rho, P@1) across checkpoints;
    over seeds: those correlations' means with bootstrap intervals, the FASC-over-pca gap per step, and the
    verdict on the claim."""
    per_seed, spearman = {}, {}
    for seed, series in series_by_seed.items():
        steps = [p["step"] for p in series]
        blocks = sorted({b for p in series for b in p["rho_block"]})
        onsets = {b: rise_onset(steps, [p["rho_block"][b] for p in series]) for b in blocks}
        corr = {b: correlations([p["rho_block"][b] for p in series], [p["p1"] for p in series], seed=seed)
                for b in blocks}
        per_seed[seed] = {"recall_onset": recall_onset(series), "rho_onset": onsets,
                          "spearman": {b: (c.get("spearman") or {}).get("r") for b, c in corr.items()},
                          # over this seed's checkpoints: the interval a single seed can give
                          "spearman_ci": {b: (c.get("spearman") or {}).get("ci95") for b, c in corr.items()}}
        for b, c in corr.items():
            spearman.setdefault(b, []).append((c.get("spearman") or {}).get("r"))
    gap_steps = sorted({p["step"] for s in series_by_seed.values() for p in s if p.get("gap") is not None})
    gap = {s: bootstrap_mean([p["gap"] for ser in series_by_seed.values() for p in ser if p["step"] == s
                              and p.get("gap") is not None]) for s in gap_steps}
    summary = {"per_seed": per_seed, "spearman": {b: bootstrap_mean(v) for b, v in sorted(spearman.items())},
               "gap": gap, "series": series_by_seed}
    summary["verdict"] = verdict(summary)
    return summary


def verdict(summary: dict) -> dict:
    """The claim holds here if no block's rho rises before recall does (in any seed) and rho tracks recall across
    checkpoints (a block's mean Spearman over seeds positive with its interval above 0)."""
    early = []
    for seed, s in summary["per_seed"].items():
        onset = s["recall_onset"]
        for b, r in s["rho_onset"].items():
            if r is not None and (onset is None or r < onset):
                early.append(f"block {b} in seed {seed} (rho onset at step {r}, recall onset "
                             f"{'never' if onset is None else f'at step {onset}'})")
    seeds = list(summary["per_seed"].values())
    if len(seeds) == 1:  # one seed: the bootstrap over its checkpoints stands in for the one over seeds
        for b, ci in seeds[0]["spearman_ci"].items():
            summary["spearman"][b]["ci95_checkpoints"] = ci
    tracking = [b for b, m in summary["spearman"].items()
                if (m.get("ci95") or m.get("ci95_checkpoints") or [-1])[0] > 0]
    no_recall = [seed for seed, s in summary["per_seed"].items() if s["recall_onset"] is None]
    if no_recall:
        state = "inconclusive"
        why = f"recall never rose above chance in seed(s) {', '.join(map(str, no_recall))}"
    elif early:
        state = "does not hold"
        why = "rho rose before recall: " + "; ".join(early)
    elif tracking:
        state = "holds"
        onsets = ", ".join(f"seed {seed}: step {s['recall_onset']}" for seed, s in summary["per_seed"].items())
        why = (f"no block's rho rose before recall (recall onset {onsets}), and rho tracks recall across "
               "checkpoints in " + ", ".join(f"block {b} (Spearman {summary['spearman'][b]['mean']:+.2f}, 95% "
                                            f"[{_ci(summary['spearman'][b])[0]:+.2f}, "
                                            f"{_ci(summary['spearman'][b])[1]:+.2f}])" for b in tracking))
    else:
        state = "inconclusive"
        why = "no block's rho rose before recall, but no block's rho-recall correlation is above 0 across seeds"
    return {"state": state, "why": why, "early": early, "tracking_blocks": tracking}


def _ci(m: dict) -> list[float]:
    return m.get("ci95") or m.get("ci95_checkpoints")


def summary_cell(cfg: EmergeConfig, summary: dict, seconds: dict, checkpoints: list[str] | None = None) -> CellRecord:
    """The emerge cell: its key covers the configuration (and a user's checkpoint list)."""
    from acbench.results.store import environment, settings_hash

    first = next(iter(summary["per_seed"].values()), {})
    last_gap = summary["gap"][max(summary["gap"])]["mean"] if summary["gap"] else None
    sp = [m["mean"] for m in summary["spearman"].values() if m["mean"] is not None]
    metrics = {"recall_onset_step": first.get("recall_onset"), "mean_spearman_rho_p1": float(np.mean(sp)) if sp else None,
               "final_fasc_over_pca": last_gap}
    key = settings_hash(asdict(cfg), checkpoints)
    return CellRecord(cell=CellId(f"emerge-{key[:6]}", f"{NAME}-analysis", cfg.rank, "rank", NAME, key,
                                  kind=ANALYSIS_CELL),
                      metrics=metrics, primary_metric="mean_spearman_rho_p1",
                      higher_is_better={k: None for k in metrics},
                      details={"summary": _json_keys(summary), "config": asdict(cfg), "seconds": seconds,
                               "checkpoints": checkpoints},
                      versions={"analysis": VERSION}, env=environment("cpu"))


def _json_keys(obj):
    """Integer keys (seeds, blocks, steps) as strings, as JSON stores them, so a reread summary is the same."""
    if isinstance(obj, dict):
        return {str(k): _json_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_keys(v) for v in obj]
    return obj


def report_section(cell, plot_dir, stem, title):
    """The emerge cell's leaderboard section (the display of `bench report` names it by the cell's task)."""
    from .report import report_section as section

    return section(cell.details["summary"], cell.details.get("config", {}), plot_dir, stem, title)


# ---------------------------------------------------------------- the experiment

@dataclass(frozen=True)
class Sources:
    lama: str  # LAMA source of the probes
    train: str  # calibration text
    heldout: str  # perplexity text


def checkpoint_config(path: Path, sources: Sources, cfg: EmergeConfig, output: Path, seed: int, seq_len: int,
                      n_blocks: int, progress: bool):
    """The harness's run on one checkpoint: dense, pca and fasc-kfac at the rank, LAMA on the probes, perplexity
    on the held-out text, and the rho analysis over every block."""
    from acbench.runner.config import RunConfig

    return RunConfig(
        model=str(path), methods=list(METHODS), ranks=[cfg.rank], tasks=["lama", "ppl-token", "rho"],
        calib_source=sources.train, calib_samples=cfg.calib_samples, calib_seq_len=seq_len, seed=seed,
        task_options={"lama": {"source": sources.lama, "per_relation": 0, "max_candidates": 0,
                               "protocol": cfg.protocol},
                      "ppl-token": {"source": sources.heldout, "seq_len": seq_len, "max_windows": cfg.ppl_windows}},
        analysis_options={"rho": {"units": max(1, min(4, n_blocks)), "lama_limit": 0, "loss_windows": 2}},
        output=str(output), measure_latency=False, report=False, progress=progress)


def sweep_checkpoints(paths: list[Path], sources: Sources, cfg: EmergeConfig, output: Path, seed: int,
                      seq_len: int, n_blocks: int, progress: bool) -> list[list[Path]]:
    """The harness's sweep on every checkpoint; returns each checkpoint's cell paths (computed now or before)."""
    from acbench.runner.cells import ModelInfo, plan
    from acbench.runner.resolve import resolve_run
    from acbench.runner.execute import LocalExecutor, execute
    from acbench.runner.prepare import prepare

    out = []
    for path in paths:
        config = checkpoint_config(path, sources, cfg, output, seed, seq_len, n_blocks, progress)
        prepared = prepare(resolve_run(config))
        execute(prepared.cells, prepared.run, LocalExecutor(prepared.source, prepared.calib_windows))
        src = prepared.source
        every = plan(prepared.run, ModelInfo(src.name, src.fingerprint, prepared.run.n_blocks), overwrite=True)
        out.append([c.path for c in every])
    return out


def train_seed(cfg: EmergeConfig, seed: int, work: Path, progress: bool) -> tuple[list[Path], Sources, float | None]:
    """The seed's corpus, tokenizer and checkpoints (resumed where a killed run left them), and the seconds the
    training took when it ran."""
    from dataclasses import replace

    from acbench.tasks.data.facts import build_corpus

    from .train import train, word_tokenizer

    tag = cfg.tag(seed)
    folder = Path(work) / tag
    corpus = build_corpus(cfg.entities, seed, control=cfg.control)
    lama = corpus.write_lama(folder / "data")
    sources = Sources(lama, *corpus.write_text(folder / "data"))
    paths = train(folder / "checkpoints", tag, word_tokenizer(corpus.words), corpus.train_documents,
                  replace(cfg.train, seed=seed), cfg.spacing, progress)
    record = folder / "checkpoints" / f"{tag}-train.json"  # the training's own time, kept by the run that trained
    return paths, sources, json.loads(record.read_text())["seconds"] if record.exists() else None


def run_emergence(cfg: EmergeConfig, output: Path, work: Path, progress: bool = True) -> tuple[dict, Path]:
    """Every seed trained and swept, the series summarised and stored as the emerge cell; returns (summary, path)."""
    import time

    from acbench.results.store import cell_path, write_cell

    from .train import checkpoint_steps

    series, seconds = {}, {}
    for seed in cfg.seeds:
        t0 = time.perf_counter()
        paths, sources, train_s = train_seed(cfg, seed, work, progress)
        cell_paths = sweep_checkpoints(paths, sources, cfg, output, seed, cfg.train.seq_len, cfg.train.layers,
                                       progress)
        series[seed] = read_series(cell_paths, checkpoint_steps(cfg.train.steps, cfg.spacing), cfg.rank)
        seconds[seed] = {"train_s": train_s, "this_invocation_s": time.perf_counter() - t0}
    summary = summarize(series)
    cell = summary_cell(cfg, summary, seconds)
    c = cell.cell
    path = cell_path(output, c.model, c.method, c.rank, c.budget, c.task, c.key)
    write_cell(path, cell)
    return summary, path


def run_on_checkpoints(paths: list[Path], steps: list[int], cfg: EmergeConfig, sources: Sources, output: Path,
                       progress: bool = True) -> tuple[dict, Path]:
    """The same analysis over a user's checkpoint series (Pythia or OLMo revisions saved locally)."""
    from acbench.results.store import cell_path, write_cell

    from acbench.measure.costs import load_model_config, model_positions

    model_config = load_model_config(str(paths[0]))
    n_blocks = int(getattr(model_config, "num_hidden_layers", 4))
    # 256-token windows, or the checkpoints' own positions where they have fewer (bench run refuses longer ones)
    positions = model_positions(model_config)
    seq_len = min(256, positions) if positions and positions > 1 else 256
    cell_paths = sweep_checkpoints(paths, sources, cfg, output, cfg.seeds[0], seq_len, n_blocks, progress)
    summary = summarize({cfg.seeds[0]: read_series(cell_paths, steps, cfg.rank)})
    cell = summary_cell(cfg, summary, {}, [str(p) for p in paths])
    c = cell.cell
    path = cell_path(output, c.model, c.method, c.rank, c.budget, c.task, c.key)
    write_cell(path, cell)
    return summary, path
