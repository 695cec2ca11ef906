"""`bench compress`: one method at one budget, saved as a checkpoint that transformers, lm-eval and acbench load."""

from __future__ import annotations

from pathlib import Path

from acbench.core.errors import UserError
from acbench.core.units import human

from acbench.cli.run import RUN_FLAGS, config_from_args

# the run's flags that shape one compressed model (the rest are the sweep's: tasks, executors, results)
COMPRESS_FLAGS = ("model", "ranks", "sparsity", "budget", "rank_align", "allocate", "groups", "blocks",
                  "calib_source", "calib_samples", "calib_seq_len", "pair_tokens", "bos", "seed", "device",
                  "solve_device", "solve_dtype", "dtype", "batch_size", "stats_memory", "threads", "calibration_mode",
                  "calibration")


def add_compress_parser(sub):
    p = sub.add_parser("compress", help="compress a model with one method at one budget and save the checkpoint")
    p.add_argument("--method", required=True, help="one method or variant (see `bench ls methods`)")
    p.add_argument("--save", required=True, help="folder for the checkpoint (absent or empty)")
    p.add_argument("--merged", action="store_true",
                   help="dense-shaped weights W' = A B (no custom code; for tools that take standard architectures)")
    p.add_argument("--overwrite", dest="replace", action="store_true", help="replace a non-empty --save folder")
    for flag, dest, kw in RUN_FLAGS:
        if dest in COMPRESS_FLAGS:
            p.add_argument(flag, dest=dest, default=None, **kw)
    p.add_argument("--method-option", action="append", help="method.setting=value, e.g. fasc.max_swaps=100")
    p.add_argument("--quiet", dest="progress", action="store_false", default=None, help="no progress bars")
    p.set_defaults(**{dest: None for _, dest, _ in RUN_FLAGS if dest not in COMPRESS_FLAGS},
                   config=None, task_option=None, analysis_option=None, overwrite=None, measure_latency=False,
                   report=False)
    return p


def compress_config(args):
    """The RunConfig of a one-variant sweep with no tasks: bench run's checks, refusals and statistics cache."""
    import dataclasses

    args.methods = [args.method]
    config = config_from_args(args)
    out = Path(args.save)
    config = dataclasses.replace(config, tasks=[], output=str(out.resolve().parent))
    for what, values in (("--rank", config.ranks), ("--sparsity", config.sparsity), ("--allocate", config.allocate)):
        if values is not None and len(values) > 1:
            raise UserError(f"{what} {' '.join(map(str, values))}: bench compress saves one model, so give one value")
    if config.ranks and config.sparsity:
        raise UserError("bench compress saves one model: give --rank (low-rank method) or --sparsity, not both")
    return config, out


def cmd_compress(args) -> int:
    from acbench import methods

    from acbench.model.checkpoint import check_target
    from acbench.runner.one_variant import save_compressed
    from acbench.runner.resolve import resolve_run
    from acbench.methods.base import SparsityMethod

    config, out = compress_config(args)
    check_target(out, args.replace, config.model)  # --save is named before the run's own checks
    run = resolve_run(config)
    if len(run.methods) != 1:
        raise UserError(f"--method {args.method} names {len(run.methods)} methods: bench compress saves one model, "
                        "so name one (see `bench ls methods`)")
    comp = methods.build(run.methods[0], run.method_options(run.methods[0]))
    if args.merged and isinstance(comp, SparsityMethod) and not comp.masks_weights:
        raise UserError(f"--merged: {run.methods[0]} sparsifies activations as the model runs, which no dense weight "
                        "can hold; save it without --merged (the checkpoint carries its code)")
    info = save_compressed(run, out, merge=args.merged, overwrite=args.replace)
    c = info["provenance"]["compression"]
    ratio = info["weight_bytes"] / info["dense_bytes"]
    print(f"saved {out}/: {run.methods[0]} at {info['provenance']['budget']}, {c['groups_factorised']} of "
          f"{len(c['groups'])} groups factorised, parameters {c['param_ratio']:.3f}x of the compressed groups'")
    print(f"weights on disk {human(info['weight_bytes'])} vs dense {human(info['dense_bytes'])} ({ratio:.3f}x, "
          f"embeddings included); calibrate + compress {info['seconds']:.0f} s")
    if info["custom_code"]:
        print(f"load: AutoModelForCausalLM.from_pretrained('{out}', trust_remote_code=True), or bench run --model "
              f"{out} --methods dense")
    else:
        print(f"load: AutoModelForCausalLM.from_pretrained('{out}') (a standard architecture), or bench run "
              f"--model {out}")
    return 0
