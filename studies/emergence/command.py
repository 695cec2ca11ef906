"""`bench emerge`: train a small model on synthetic facts, checkpoint it, and track rho, recall and the
FASC-over-pca gap over training (or over a user's own checkpoint series). Plugged into the CLI as the entry point
`emerge` of `acbench.commands` (pyproject.toml): the CLI, below the studies, never imports this module."""

from __future__ import annotations

import re
from pathlib import Path

from acbench.results.plugged import Command
from acbench.core.errors import UserError


def add_arguments(p):
    p.add_argument("--layers", type=int, default=4)
    # d = 128 and 32 x 64-token batches: one seed in about 9 minutes on 2 cores (d = 256 with 16 x 128 tokens
    # trains at 0.38 s a step there, 19 minutes for 3000 steps before any checkpoint is evaluated)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--entities", type=int, default=400, help="entities of the synthetic fact corpus")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=32, help="training sequences per step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--checkpoints", choices=["log", "linear"], default="log", help="checkpoint spacing")
    p.add_argument("--rank", type=float, default=0.5, help="rank ratio of the pca / fasc-kfac comparison")
    p.add_argument("--protocol", choices=["candidates", "vocab"], default="candidates",
                   help="LAMA protocol: candidates (the relation's values; chance = knowing the type) or vocab")
    p.add_argument("--control", action="store_true", help="the control run: every mention of a fact draws a fresh "
                                                          "value, so the corpus holds no association to learn")
    p.add_argument("--checkpoints-from", nargs="+", default=None,
                   help="a series of your own checkpoint folders, in training order (their step: the number after "
                        "'step' or 'checkpoint-' in the name, else their position)")
    p.add_argument("--lama-source", dest="probes", default="embedded", help="with --checkpoints-from: the probes")
    p.add_argument("--output", default="emerge/results", help="results directory (default emerge/results/, apart "
                   "from a sweep's results/)")
    p.add_argument("--work", default="emerge", help="where corpora and checkpoints go (default emerge/)")
    p.add_argument("--quiet", dest="progress", action="store_false", default=True)


def _config(args):
    from . import EmergeConfig
    from .train import TrainConfig

    for name in ("layers", "d_model", "entities", "steps", "batch_size", "seq_len"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.entities < 2 or args.seq_len < 8:
        raise UserError("--entities must be at least 2 and --seq-len at least 8")
    if not (0 < args.rank <= 1):
        raise UserError(f"--rank {args.rank} is outside (0, 1]: pass e.g. --rank 0.5")
    if not args.lr > 0:
        raise UserError(f"--lr must be positive, got {args.lr}")
    heads = max(1, args.d_model // 64)  # as TrainConfig.model_config builds the model
    if args.d_model % heads or (args.d_model // heads) % 2:
        raise UserError(f"--d-model {args.d_model} splits into {heads} head(s) of width {args.d_model / heads:g}, and "
                        "rotary attention needs an even whole width: pass an even number below 128 or a multiple of "
                        "128 (for example 128)")
    train = TrainConfig(layers=args.layers, d_model=args.d_model, steps=args.steps, batch_size=args.batch_size,
                        seq_len=args.seq_len, lr=args.lr)
    return EmergeConfig(train=train, entities=args.entities, seeds=tuple(dict.fromkeys(args.seeds)),
                        spacing=args.checkpoints, rank=args.rank, protocol=args.protocol, control=args.control)


def _steps_of(paths: list[str]) -> tuple[list[Path], list[int]]:
    """The checkpoint folders in training order with their steps: by the step their names carry (step<N>,
    checkpoint-<N>), whatever order they were given in; names without steps keep the given order. A folder given
    twice, or two folders of one step, is refused (either would change the onset the verdict rests on)."""
    folders = [Path(p) for p in paths]
    seen: dict[Path, str] = {}
    for given, folder in zip(paths, folders):
        if folder.resolve() in seen:
            raise UserError(f"--checkpoints-from names {seen[folder.resolve()]} twice (as {given}): pass each "
                            "checkpoint once")
        seen[folder.resolve()] = given
    found = [re.search(r"(?:step|checkpoint-)(\d+)", folder.name) for folder in folders]
    if not all(found):
        return folders, list(range(len(folders)))
    steps = [int(m.group(1)) for m in found]
    if len(set(steps)) < len(steps):
        step = next(s for s in steps if steps.count(s) > 1)
        names = [str(f) for f, s in zip(folders, steps) if s == step]
        raise UserError(f"--checkpoints-from: {' and '.join(names)} are both step {step}: pass one checkpoint per "
                        "step")
    order = sorted(range(len(steps)), key=steps.__getitem__)
    return [folders[i] for i in order], [steps[i] for i in order]


# what a training run keeps fixed across its checkpoints: two checkpoints that differ in one are two models
SERIES_KEYS = ("model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
               "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings")


def _one_series(folders: list[Path]) -> None:
    """Checkpoints of one training run: the same architecture and sizes (config.json) and the same tokenizer
    (tokenizer.json's bytes, where present). A mixed list would be read as one model's onset."""
    import hashlib
    import json

    def shape(folder: Path):
        try:
            cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise UserError(f"checkpoint {folder}: config.json is not valid JSON: pass transformers checkpoint "
                            "folders") from None
        if not isinstance(cfg, dict):
            raise UserError(f"checkpoint {folder}: config.json is not a JSON object: pass transformers checkpoint "
                            "folders")
        tok = folder / "tokenizer.json"
        return ({k: cfg.get(k) for k in SERIES_KEYS},
                hashlib.sha256(tok.read_bytes()).hexdigest() if tok.is_file() else None)

    first, (cfg0, tok0) = folders[0], shape(folders[0])
    for folder in folders[1:]:
        cfg, tok = shape(folder)
        differ = [k for k in SERIES_KEYS if cfg[k] != cfg0[k]]
        if differ:
            k = differ[0]
            raise UserError(f"--checkpoints-from mixes models: {folder} has {k} {cfg[k]!r}, {first} has "
                            f"{cfg0[k]!r}: pass the checkpoints of one training run")
        if tok != tok0:
            raise UserError(f"--checkpoints-from mixes models: {folder} and {first} have different tokenizers: pass "
                            "the checkpoints of one training run")


def cmd_emerge(args) -> int:
    from . import Sources, report_section, run_emergence, run_on_checkpoints
    from acbench.results.store import check_writable
    from acbench.core.io import atomic_write_text, unwritable
    from acbench.core.record import CellRecord

    cfg = _config(args)
    output = Path(args.output)
    check_writable(output)
    if args.checkpoints_from:
        for p in args.checkpoints_from:
            if not (Path(p) / "config.json").is_file():
                raise UserError(f"checkpoint {p} has no config.json: pass transformers checkpoint folders")
        folders, steps = _steps_of(args.checkpoints_from)
        _one_series(folders)
        sources = Sources(args.probes, "wiki", "wiki")
        summary, path = run_on_checkpoints(folders, steps, cfg, sources, output, args.progress)
    else:
        why = unwritable(Path(args.work))
        if why:
            raise UserError(f"--work {args.work} is not writable ({why}): pass a writable folder for the corpora "
                            "and checkpoints")
        summary, path = run_emergence(cfg, output, Path(args.work), args.progress)
    print(f"emerge: {summary['verdict']['state']}: {summary['verdict']['why']}")
    print(f"emerge cell: {path}")
    import json

    cell = CellRecord.from_json(json.loads(path.read_text()))
    lines, _ = report_section(cell, output / "plots", f"{cell.cell.model}_emerge",
                                f"{cell.cell.model}: rho, recall and FASC over training")
    md = output / "EMERGENCE.md"
    atomic_write_text(md, "\n".join([f"# acbench: knowledge emergence ({cell.cell.model})", ""] + lines) + "\n")
    print(f"report: {md} (and in `bench report`'s leaderboard)")
    return 0


def _report_sections() -> dict:
    from . import NAME, report_section

    return {NAME: report_section}


COMMAND = Command(name="emerge", help="knowledge emergence: rho and recall over training checkpoints",
                  add_arguments=add_arguments, run=cmd_emerge, report_sections=_report_sections)
