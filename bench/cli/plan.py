"""`bench plan`: what a run costs (statistics, calibration passes, memory), from the model's config alone."""

from __future__ import annotations

from acbench.measure.costs import CostEstimate, estimate_run_costs, long_solve_line
from acbench.core.units import human


PLAN_FLAGS = ("model", "methods", "ranks", "sparsity", "budget", "rank_align", "dtype", "stats_memory",
              "calib_samples", "calib_seq_len", "batch_size", "pair_tokens", "allocate", "groups", "blocks", "device",
              "solve_device", "solve_dtype", "calibration_mode", "calibration")


def add_plan_parser(sub):
    from acbench.cli.run import RUN_FLAGS

    p = sub.add_parser("plan", help="what a run costs (statistics, passes, memory), from the model's config alone")
    for flag, dest, kw in RUN_FLAGS:
        if dest in PLAN_FLAGS:
            p.add_argument(flag, dest=dest, default=None, **kw)
    p.add_argument("--detect", nargs="+", default=None, metavar="TASK=DIFF",
                   help="size the evaluation: per task, the items each comparison needs for 80 %% power to detect this "
                        "paired difference (e.g. lama=0.05 ppl-token=0.05), from the stored cells of the model")
    p.add_argument("--results", nargs="+", default=None,
                   help="with --detect: results folders whose stored cells give the paired spreads (default results/)")
    p.add_argument("--vs", default=None, help="with --detect: the reference method of the comparisons (default pca)")
    p.set_defaults(**{dest: None for _, dest, _ in RUN_FLAGS if dest not in PLAN_FLAGS},
                   config=None, method_option=None, task_option=None, analysis_option=None, overwrite=None,
                   measure_latency=None, report=None, progress=None)


def plan_configs(args) -> list:
    """The RunConfigs a plan costs, one per model: bench run's, without its tasks (a plan evaluates nothing)."""
    import dataclasses

    from acbench.cli.run import configs_from_args

    return [dataclasses.replace(c, tasks=[]) for c in configs_from_args(args)]


def plan_config(args):
    """The one RunConfig of a single-model plan."""
    return plan_configs(args)[0]


def cmd_plan(args) -> int:
    """The run these flags describe, validated as `bench run` validates it (one validator), then costed; a model
    may be a bare config.json, which only the plan reads. Several models: each model's plan, then the sweep's
    total."""
    from acbench.runner.resolve import resolve_run
    from acbench.results.leaderboard_display import check_margins, check_reference_name
    from acbench.core.errors import UserError

    detect = check_margins(args.detect, "--detect", "difference") if args.detect is not None else None
    given = [flag for flag, value in (("--results", args.results), ("--vs", args.vs)) if value is not None]
    if given and not detect:  # they only size --detect's comparisons: alone they would change nothing
        raise UserError(f"{' and '.join(given)} only size{'' if len(given) > 1 else 's'} the comparisons of --detect: add --detect TASK=DIFF (e.g. "
                        f"--detect lama=0.05), or leave {' and '.join(given)} out")
    args.results = args.results if args.results is not None else ["results"]
    args.vs = check_reference_name(args.vs if args.vs is not None else "pca", "--vs")
    if detect:
        check_results_folders(args.results)
    runs = [resolve_run(c, writes=False) for c in plan_configs(args)]  # every model's settings before any costing
    for run in runs:
        check_against_model(run)
    totals = []
    for run in runs:
        c = run.config
        est = estimate_run_costs(run)
        if len(runs) > 1:
            print(f"## {c.model}\n")
        print(render(est))
        print(render_solve_memory(est, c.solve_dtype))
        times = plan_times(run, est)
        print(render_times(*times))
        long = long_solve_line(est.method_names, est.groups, est.ranks, est.pair_tokens, times[1].device,
                               c.solve_dtype, times[1])
        if long:
            print(f"warning: {long}")
        own = render_own_calibrations(run, est, times[2])
        if own:
            print(own)
        totals.append((c.model, times[0]["total"], est.calibration_peak, est.evaluation_peak))
        if detect:
            print(render_detection(c.model, detect, args.results, args.vs))
    if len(runs) > 1:
        print(render_sweep(totals))
    return 0


def check_results_folders(folders) -> None:
    """--results for --detect: each a folder or not there yet (nothing stored: spreads assumed), never empty or a
    file."""
    from pathlib import Path

    from acbench.core.errors import UserError

    for f in folders:
        if not f.strip():
            raise UserError("--results has an empty folder name: name the results folder whose cells give the spreads")
        if Path(f).exists() and not Path(f).is_dir():
            raise UserError(f"--results {f} is a file, not a results folder: give the folder `bench run --output` "
                            "wrote")


def task_holds(task: str, tokenizer) -> tuple[int | None, str]:
    """How many items the task's default source holds: LAMA's probes, MMLU's test questions, the evaluation
    text's perplexity windows at the default length (by this model's tokenizer)."""
    from acbench import tasks

    settings = tasks.get_task(task).Settings()
    if task == "lama":
        from acbench.tasks.data.lama_data import load_lama

        n = len(load_lama(settings.source).probes)
        return n, f"{n:,} probes"
    if task == "mmlu":
        from acbench.tasks.data.mmlu_data import load_mmlu

        n = len(load_mmlu(settings.source)[0])
        return n, f"{n:,} questions"
    if task == "ppl-token":
        from acbench.tasks.data.text_data import load_text, resolve_bos
        from acbench.tasks.perplexity import token_windows

        windows = token_windows(tokenizer, load_text(settings.source, "eval"), settings.seq_len, None,
                                resolve_bos(tokenizer, settings.bos))
        return len(windows), f"{len(windows):,} windows of {settings.seq_len}"
    return None, "?"


def render_detection(model: str, detect: dict[str, float], folders, ref: str) -> str:
    """`--detect`: per task and stored comparison, the items for 80 % power; assumed spreads where none is stored."""
    from acbench.measure.sizing import ASSUMED, Spread, render_detect, stored_spreads
    from acbench.model.sources import display_name, open_model

    name = display_name(model)
    tokenizer = open_model(model, progress=False).tokenizer if "ppl-token" in detect else None
    rows, missing, skipped = [], [], []
    for task, delta in detect.items():
        left: list[str] = []
        spreads = stored_spreads(folders, name, task, ref, left)
        skipped += [f"{task} {line}" for line in left]
        assumed = not spreads
        if assumed:
            missing.append(task)
            kind = "nll" if task.startswith("ppl") else "accuracy"
            spreads = [Spread("assumed", kind, v, 0, None) for v in ASSUMED[kind]]
        rows.append((task, delta, spreads, task_holds(task, tokenizer), assumed))
    head = (f"items for 80 % power (two-sided 5 %) to detect each difference, paired against {ref}, from the spreads "
            f"of {name}'s stored cells under {', '.join(map(str, folders))}")
    note = (f"\nno stored comparison with {ref} for {', '.join(missing)}: spreads assumed (run a small pilot, e.g. "
            "`bench run --lama-limit 5`, and plan again from its cells)" if missing else "")
    if skipped:  # a stored comparison left out is said, with why, never dropped without a word
        note += "\nstored comparisons not used: " + "; ".join(skipped)
    return f"{head}{note}\n\n{render_detect(rows)}\n"


def check_against_model(run) -> None:
    """What `bench run` refuses once it has opened the model, refused here from its config alone and by the same
    functions: sequences past the model's positions, --blocks past its blocks, a --rank-align past a group's width,
    a pattern a group cannot keep, --stats-memory below one group's statistics."""
    from acbench.calibration.memory import calibration_chunks
    from acbench.measure.costs import load_model_config
    from acbench.runner.prepare import check_groups, check_lengths, warn_short_calibrations
    from acbench.model.groups import find_input_groups, meta_model

    config = load_model_config(run.config.model)
    check_lengths(run, config)
    groups = find_input_groups(meta_model(config))
    run = run.for_blocks(len({g.block for g in groups}), tuple(dict.fromkeys(g.kind for g in groups)))
    selected = check_groups(run, groups)
    warn_short_calibrations(run, selected)  # said before any work: a calibration too small for a solve
    if run.stats_needs() and run.stats_memory:
        calibration_chunks(groups if run.analyses else selected, run.stats_needs(), run.config.pair_tokens,
                           run.stats_memory)


def render_sweep(totals: list[tuple[str, float, int, int]]) -> str:
    """The sweep over several models: each model's estimated seconds and peak memory, and their sum and maximum
    (models run one after another)."""
    from tabulate import tabulate

    rows = [[m, f"{s:.0f}", human(cal), human(ev)] for m, s, cal, ev in totals]
    rows.append(["sweep (models in turn)", f"{sum(t[1] for t in totals):.0f}", human(max(t[2] for t in totals)),
                 human(max(t[3] for t in totals))])
    return "\n".join(["", f"the sweep over {len(totals)} models (evaluation not included):", "",
                      tabulate(rows, headers=["model", "seconds", "peak memory, calibration",
                                              "peak memory, evaluation"], tablefmt="github", disable_numparse=True)])


def plan_times(run, est: CostEstimate):
    """Calibration and solve time, from a micro-benchmark of the model's device and of the solve device (measured
    once per device and process)."""
    from acbench.measure.costs import estimate_times, measure_speed

    c = run.config
    model_speed = measure_speed(c.device)
    speed = measure_speed(c.device if c.solve_device == "auto" else c.solve_device, solve_dtype=c.solve_dtype)
    return estimate_times(est, speed, calib_speed=model_speed), speed, model_speed


def render_times(times: dict, speed, model_speed) -> str:
    """The estimate under the run's own stage names ("calibration", "compress <method>")."""
    from tabulate import tabulate

    rows = [["calibration", f"{times['calibration']:.0f}"]] if times["calibration"] else []  # none shared: no row
    rows += [[f"compress {m}", f"{s:.0f}"] for m, s in times["methods"].items() if m not in times["undeclared"]]
    rows.append(["total (evaluation not included)", f"{times['total']:.0f}"])
    bench = (f"float32 matmul {model_speed.matmul32 / 1e9:.0f} GFLOP/s on {model_speed.device}; on {speed.device} "
             f"{speed.solve_dtype} matmul {speed.solve_matmul / 1e9:.0f} GFLOP/s, eigh at n = {speed.eigh_n} in "
             f"{speed.eigh_s:.2f} s")
    lines = ["", f"estimated time, seconds (an estimate: a micro-benchmark of this machine, {bench}, scaled by each "
             "stage's operation counts, n^3 for the eigen-solves):", "",
             tabulate(rows, headers=["stage", "seconds"], tablefmt="github", disable_numparse=True)]
    if not times.get("memo_shared", True):
        lines.append("the statistics and their memoised solves exceed --stats-memory: each method re-reads every "
                     "group and solves its bases afresh (raise --stats-memory to share them across methods)")
    if times["undeclared"]:
        lines.append(f"not estimated (their solves declare no cost): {', '.join(times['undeclared'])}")
    return "\n".join(lines)


def render_own_calibrations(run, est: CostEstimate, model_speed) -> str:
    """The calibrations some methods get apart from the shared one (sequential, or their authors' sizes): their
    windows, mode, how often they run, estimated seconds and peak memory."""
    from tabulate import tabulate

    from acbench.measure.costs import own_calibration_costs

    rows = [[c["method"], c["windows"], f"{c['tokens']:,}", c["mode"], c["runs"], f"{c['seconds']:.0f}",
             human(c["peak"])] for c in own_calibration_costs(run, est, model_speed)]
    if not rows:
        return ""
    return "\n".join(["", "calibrations of their own (not in the table above; a sequential one runs once per budget, "
                      "its statistics depending on the blocks compressed before, and holds the windows' hidden "
                      "states once):", "", tabulate(rows, headers=["method", "windows", "tokens", "mode", "runs",
                                                                     "seconds", "peak memory"],
                                                   tablefmt="github", disable_numparse=True)])


def render_solve_memory(plan: CostEstimate, solve_dtype: str) -> str:
    """The largest group solve's memory, the estimate every solve is checked against before it starts
    (acbench.deploy.compression.check_solve_fits), and each estimated peak (the solve's, calibration's, evaluation's)
    judged against what the machine has free now: "it fits" is said only when every one of them does."""
    from acbench import methods
    from acbench.core.io import available_bytes

    from acbench.deploy.compression import solve_bytes

    comps = {m: methods.build(m) for m in plan.method_names}
    worst = max(((solve_bytes(comp, g, solve_dtype), m, g) for m, comp in comps.items() for g in plan.groups),
                default=None, key=lambda t: t[0])
    free = available_bytes()
    lines, over = [], []
    if worst is not None:
        need, method, group = worst
        lines.append(f"estimated peak memory, the largest solve: {human(need)} ({method} on {group.name}, d_in "
                     f"{group.d_in}, {solve_dtype}; each group's solve is checked against the solve device's free "
                     "memory before it starts)")
        if need > free:
            over.append(f"the largest solve ({human(need)}; that group would be refused before its solve)")
    if plan.calibration_peak > free:
        over.append(f"calibration ({human(plan.calibration_peak)}: lower --stats-memory, --calib-samples or "
                    "--pair-tokens)")
    if plan.evaluation_peak > free:
        over.append(f"evaluation ({human(plan.evaluation_peak)}: lower --batch-size, or the tasks' seq_len)")
    if not lines and not plan.calibration_peak and not plan.evaluation_peak:
        return ""
    verdict = "every estimated peak fits" if not over else "it does NOT fit: " + "; ".join(over)
    lines.append(f"memory available on this machine now: {human(free)}, so {verdict}")
    return "\n".join(lines)


def render(plan: CostEstimate) -> str:
    from tabulate import tabulate

    c = plan.config
    lines = [f"model {plan.model}: {c['model_type']}, {plan.n_blocks} blocks, hidden {c['hidden_size']}, "
             f"intermediate {c['intermediate_size']}, vocabulary {c['vocab_size']}; {plan.params / 1e9:.2f}B "
             f"parameters, weights {human(plan.weight_bytes)}", ""]
    stat_names = sorted(plan.stats_total)
    rows = [[k["kind"], k["count"], k["d_in"], "+".join(map(str, k["d_outs"]))] + [human(k["stats"][s]) for s in stat_names]
            for k in plan.kinds]
    rows.append(["total", sum(k["count"] for k in plan.kinds), "", ""] + [human(plan.stats_total[s]) for s in stat_names])
    lines += ["Input groups and the statistics the chosen methods need (float64 moments, float32 token pairs):", "",
              tabulate(rows, headers=["group", "n", "d_in", "d_out"] + stat_names, tablefmt="github",
                       disable_numparse=True), ""]
    body = []
    for name, per_rank in plan.methods.items():
        for r, v in per_rank.items():
            body.append([name, f"{r:g}"] + [f"{'/'.join(map(str, dict.fromkeys(pk['k'])))} {pk['form'][0]}"
                                             for pk in v["per_kind"].values()] + [f"{v['param_ratio']:.3f}"])
    kinds = [k["kind"] for k in plan.kinds]
    if body:
        lines += ["k per group kind (f = factorised, m = merged) and the linear layers' deployed parameter ratio:", "",
                  tabulate(body, headers=["method", "rank"] + kinds + ["param ratio"], tablefmt="github",
                           disable_numparse=True), ""]
    sparse = [[name, label, f"{v['param_ratio']:.3f}", f"{v['compute_ratio']:.3f}",
               "" if v["index_bits_per_token"] is None else v["index_bits_per_token"]]
              for name, per in plan.sparse.items() for label, v in per.items()]
    if sparse:
        lines += ["sparsity methods: deployed parameter ratio, theoretical compute ratio and, for activation "
                  "masks, the index bits per token of one block's group inputs:", "",
                  tabulate(sparse, headers=["method", "sparsity", "param ratio", "compute ratio", "index bits/token"],
                           tablefmt="github", disable_numparse=True), ""]
    total_stats = sum(plan.stats_total.values())
    if plan.passes:
        lines += [f"statistics in memory: {human(total_stats)} in all, {human(plan.stats_per_block)} per block; "
                  f"{plan.passes} calibration pass(es), the largest holding {human(plan.pass_bytes)}",
                  f"statistics cache on disk (float32): {human(plan.cache_bytes)}",
                  f"estimated peak memory, calibration: {human(plan.calibration_peak)} (weights + one pass's "
                  f"statistics + the largest group's float32 products and cache copy + {human(plan.activation_bytes)} "
                  "of activations and logits, which take their gradient in place)"]
    else:  # every method is data-free or calibrates on its own (its own table follows the times)
        lines += ["shared calibration: none (no method here reads the run's calibration statistics)"]
    lines += [f"estimated peak memory, evaluation: {human(plan.evaluation_peak)} (weights + the largest variant's "
              "factors, in place, + one batch of logits)"]
    return "\n".join(lines)
