"""Which transformers causal-LM architectures acbench compresses: a tiny random model of every causal-LM config class
of the installed transformers (2 blocks, a few hundred parameters per site; the mechanics only, no download), each
put through acbench's checks, written as docs/architectures.md.

    python -m acbench.studies.architectures [--only llama gpt2 ...] [--out docs/architectures.md]   (make architectures)
    python -m acbench.studies.architectures --only llama gpt2 --models DIR --bench-run   (tiny model folders, bench run on each)
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from dataclasses import dataclass, field
import textwrap
from pathlib import Path

import torch

from acbench.model.tiny import shrink

ROOT = Path(__file__).resolve().parent.parent
MAX_PARAMS = 20_000_000
def tiny_model(model_type: str, seed: int = 0):
    """A tiny random causal LM of `model_type`, built from its config class's defaults, shrunk."""
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    cfg = shrink(CONFIG_MAPPING[model_type]())
    with torch.device("meta"):  # sized before any memory is spent: a config this shrinking misses stays large
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    if n > MAX_PARAMS:
        raise TooLarge(f"{n:,} parameters after shrinking (its size fields are named in a way this script does not know)")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


class TooLarge(Exception):
    pass


def tiny_tokenizer():
    """A BPE of exactly the tiny models' vocabulary (acbench.model.tiny.VOCAB words, <s> prepended, <pad>), trained on the
    embedded Wikipedia calibration text: `bench run` reads a model folder's own tokenizer, and any real one has
    words past a tiny model's embedding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from acbench.model.tiny import VOCAB
    from acbench.tasks.data.text_data import wiki_split

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>", "<pad>"], limit_alphabet=80,
                                  show_progress=False)
    text = wiki_split("calib")[:300_000]
    tok.train_from_iterator([p for p in text.split("\n\n") if p.strip()], trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    # every special token named, so no model type's tokenizer class adds its own past the vocabulary on loading
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")
    if len(fast) != VOCAB:
        raise RuntimeError(f"the tiny tokenizer has {len(fast)} words, not {VOCAB}")
    return fast


def save_tiny(model_type: str, folder: Path, tokenizer=None, seed: int = 0) -> Path:
    """The tiny random `model_type` with a tokenizer of its vocabulary, saved as a model folder `bench run` opens."""
    model = tiny_model(model_type, seed)
    model.save_pretrained(folder)
    (tokenizer or tiny_tokenizer()).save_pretrained(folder)
    return folder


def bench_run(folder: Path, results: Path, seconds: int) -> str:
    """`bench plan` then `bench run --model folder --methods all --rank 0.5 --sparsity 0.5` (attention only where the
    experts are fused 3-D parameters, as the refusal advises): "ok", or the failing command's last line."""
    import subprocess

    from acbench.model.groups import find_input_groups, fused_experts_problem
    from transformers import AutoModelForCausalLM

    groups = find_input_groups(AutoModelForCausalLM.from_pretrained(folder))
    only = ["--groups", "attn_in", "attn_out"] if fused_experts_problem(groups, None) else []
    bench = [sys.executable, "-c", "import sys; from acbench.cli import main; sys.exit(main())"]
    budget = ["--model", str(folder), "--methods", "all", "--rank", "0.5", "--sparsity", "0.5", *only]
    for what, cmd in (("plan", [*bench, "plan", *budget]),  # its estimates, then the run itself
                      ("run", [*bench, "run", *budget, "--output", str(results), "--quiet"])):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
        except subprocess.TimeoutExpired:
            return f"bench {what} ran past {seconds} s"
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return f"bench {what} exit {done.returncode}: {lines[-1][:200] if lines else ''}"
    return "ok" + (" (attention only)" if only else "")


@dataclass
class Coverage:
    """What acbench did with one architecture: each check's outcome ("ok" or one line why not)."""

    model_type: str
    kinds: list[str] = field(default_factory=list)
    scope: str = "all"  # "attention" where fused experts keep the MLP out of reach
    checks: dict[str, str] = field(default_factory=dict)
    refused: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        """Every check ok, or a method refusing in one line what it cannot do here (CATS where no activation module
        feeds the down projection): a refusal is an answer; a crash or a wrong number is not."""
        return self.refused is None and bool(self.checks) and all(v == "ok" or v.startswith(REFUSED)
                                                                  for v in self.checks.values())

    @property
    def refusals(self) -> dict[str, str]:
        return {k: v.removeprefix(REFUSED) for k, v in self.checks.items() if v.startswith(REFUSED)}


REFUSED = "refused: "


def vocab_rows(model) -> int:
    return model.get_input_embeddings().weight.shape[0]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def _close(a, b, tol: float = 1e-5) -> bool:
    return bool(torch.isfinite(a).all()) and float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


def check_architecture(model_type: str, save_to: Path | None = None, seed: int = 0) -> Coverage:
    """Every check of issue 63's list on a tiny random `model_type`: input groups found; every low-rank method at
    full rank and every sparsity method at density 1 deploys dense's logits (1e-5 relative to the largest logit);
    every method runs at rank 0.5 / density 0.5 with finite logits; the dense model comes back bit for bit; with
    `save_to`, a fasc-kfac checkpoint at rank 0.5 reloads with its logits, in acbench and in plain transformers
    (trust_remote_code)."""
    from acbench import methods
    from acbench.calibration.engine import CalibSpec, calibrate
    from acbench.deploy.compression import deploy
    from acbench.model.groups import find_input_groups, fused_experts_problem
    from acbench.core.errors import UserError
    from acbench.core.stats import ACTIVATION_STATS, GRADIENT_STATS, RankSpec, SparsitySpec

    cov = Coverage(model_type)
    t0 = time.perf_counter()
    try:
        model = tiny_model(model_type, seed)
    except Exception as e:  # noqa: BLE001 - the config class itself cannot be built small: said, not fatal
        cov.refused = f"no tiny model ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
        return cov
    try:
        groups = find_input_groups(model)
    except UserError as e:
        cov.refused = str(e)
        return cov
    if fused_experts_problem(groups, None):
        cov.scope = "attention"
        groups = [g for g in groups if g.kind.startswith("attn") and g.kind != "attn_mlp_in"]
    if not groups:  # nothing acbench compresses here: no check may pass vacuously
        cov.refused = "no input group acbench can compress: fused experts keep the MLP out of reach and no attention group is left"
        return cov
    cov.kinds = list(dict.fromkeys(g.kind for g in groups))
    only = {g.name for g in groups}
    # ids that both embed and are predicted (CPM-Ant embeds prompt tokens past the vocabulary it predicts)
    vocab = min(vocab_rows(model), getattr(model.get_output_embeddings(), "out_features", None) or vocab_rows(model))
    ids = torch.randint(3, vocab, (2, 16), generator=torch.Generator().manual_seed(seed))
    dense = _logits(model, ids)
    try:
        stats = calibrate(model, groups, ids, ACTIVATION_STATS | GRADIENT_STATS, CalibSpec(pair_tokens=16),
                          progress=False)
    except Exception as e:  # noqa: BLE001 - the architecture's own loss or backward failing is the table's to say
        cov.checks["calibration"] = f"{type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"
        cov.seconds = time.perf_counter() - t0
        return cov
    for name in methods.known_methods():
        family = methods.family_of(name)
        full, half = ((RankSpec(1.0), RankSpec(0.5)) if family == methods.LOW_RANK_FAMILY
                      else (SparsitySpec(density=1.0), SparsitySpec(density=0.5)))
        try:
            for budget, want_dense in ((full, True), (half, False)):
                dep = deploy(model, name, budget, stats, only_groups=only, progress=False)
                try:
                    got = _logits(model, ids)
                finally:
                    dep.restore()
                if want_dense and not _close(got, dense):
                    raise AssertionError(f"at {budget.label} its logits differ from dense's by "
                                         f"{float((got - dense).abs().max()):.2e}")
                if not torch.isfinite(got).all():
                    raise AssertionError(f"non-finite logits at {budget.label}")
            if not torch.equal(_logits(model, ids), dense):
                raise AssertionError("the dense model did not come back bit for bit")
            cov.checks[name] = "ok"
        except UserError as e:  # the method's own one-line refusal (what it cannot do on this architecture)
            cov.checks[name] = REFUSED + str(e).splitlines()[0][:160]
        except Exception as e:  # noqa: BLE001 - one method's failure is the table's to say
            cov.checks[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"
    if save_to is not None:
        cov.checks["save and reload"] = _save_and_reload(model, groups, stats, ids, save_to)
    cov.seconds = time.perf_counter() - t0
    return cov


def _save_and_reload(model, groups, stats, ids, folder: Path) -> str:
    from acbench.deploy.compression import deploy
    from acbench.model.checkpoint import load_checkpoint, write_checkpoint
    from acbench.core.stats import RankSpec

    dep = deploy(model, "fasc-kfac", RankSpec(0.5), stats, only_groups={g.name for g in groups}, progress=False)
    try:
        want = _logits(model, ids)
        write_checkpoint(model, None, folder, {"method": "fasc-kfac", "budget": "rank 0.5"}, overwrite=True)
    except Exception as e:  # noqa: BLE001
        return f"save: {type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"
    finally:
        dep.restore()
    try:
        loaded = load_checkpoint(folder)
        if not _close(_logits(loaded, ids), want):
            return "reloaded logits differ"
    except Exception as e:  # noqa: BLE001
        return f"reload: {type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"
    try:  # and in plain transformers, through the modeling code the checkpoint carries
        from transformers import AutoModelForCausalLM

        plain = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
        return "ok" if _close(_logits(plain, ids), want) else "logits differ reloaded in plain transformers"
    except Exception as e:  # noqa: BLE001
        return f"plain transformers reload: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def passing_types(doc: str) -> dict[str, bool]:
    """{type: attention only} of the types the coverage table (docs/architectures.md's text) lists as passing, in
    its order: attention only where their experts are fused in a layout acbench does not split."""
    import re

    section = doc.split("## Passing, by their group kinds", 1)[-1].split("\n## ", 1)[0]
    out = {}
    for item in re.split(r"\n- ", section):
        only = "attention only" in item.split(":", 1)[0]
        out.update({t: only for t in re.findall(r"`([a-z0-9_\-]+)`", item)})
    return out


AUDIO = {"musicgen", "musicgen_melody", "moshi", "moss_transcribe_diarize", "whisper"}


def out_of_scope(model_type: str) -> str | None:
    """Why a causal-LM type is not a decoder-only text model acbench targets, or None. Read from the installed
    transformers' own mappings and the config class's defaults."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto import modeling_auto as ma

    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception:  # noqa: BLE001 - defaults that do not build: its own check says so
        config = None
    if model_type in AUDIO or model_type in ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES:
        return "audio model"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model (its causal-LM class is the decoder of a sequence-to-sequence pair)"
    if model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES and model_type not in ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return "encoder model (masked-LM family) with a causal head"
    if model_type == "trocr":
        return "the text decoder of a vision encoder-decoder (it reads image features through cross-attention)"
    return None


def _row(cov: Coverage, scope_note: str | None) -> str:
    if scope_note:
        return f"| `{cov.model_type}` | out of scope | | {scope_note} |"
    if cov.refused:
        return f"| `{cov.model_type}` | refused | | {cov.refused.replace('|', '/')} |"
    failed = {k: v for k, v in cov.checks.items() if v != "ok" and not v.startswith(REFUSED)}
    kinds = ", ".join(cov.kinds)
    if failed:
        name, why = next(iter(failed.items()))
        return (f"| `{cov.model_type}` | {len(cov.checks) - len(failed)} of {len(cov.checks)} checks | {kinds} | "
                f"{name}: {why.replace('|', '/')} |")
    note = "attention only: the experts are fused 3-D parameters (`--groups attn_in attn_out`)" \
        if cov.scope == "attention" else ""
    return f"| `{cov.model_type}` | passes | {kinds} | {note} |"


def _listing(title: str, names: list[str]) -> list[str]:
    """One bullet naming every type of a class, wrapped (a row each would make the page a list of names)."""
    text = f"- {title} ({len(names)}): " + ", ".join(f"`{n}`" for n in names) + "."
    return textwrap.wrap(text, width=116, subsequent_indent="  ", break_on_hyphens=False)


def write_table(rows: list[tuple[Coverage, str | None]], seconds: float, out: Path) -> tuple[int, int]:
    """The page: the passing types listed by their group kinds, a table row for each refused or failing type
    with its reason, and the out-of-scope types listed by why."""
    import transformers

    target = [c for c, why in rows if why is None]
    passing = [c for c in target if c.passed]
    full = [c for c in passing if c.scope == "all"]

    about = (f"Generated by `make architectures` (`python -m acbench.studies.architectures`) with transformers "
             f"{transformers.__version__}, in {seconds / 60:.1f} minutes on 2 CPU cores. Each of the {len(rows)} "
             "causal-LM types the installed transformers builds, as a tiny random model from its config class's "
             "defaults (2 blocks, sizes shrunk; the mechanics only, nothing downloaded), put through acbench's checks: "
             "input groups found by tracing; every method deploys dense's logits at full rank (low-rank) or density 1 "
             "(sparsity) to 1e-5, runs at rank or density 0.5 with finite logits, and restores the dense model bit for "
             "bit; a fasc-kfac checkpoint at rank 0.5 reloads with its logits in acbench and in plain transformers "
             "(trust_remote_code). What acbench compresses is every nn.Linear "
             "site in the decoder blocks (transformers' Conv1D, GPT-2's transposed linear layer, included); routers, "
             "sparse-attention indexers, linear sites the forward never calls as modules (Mamba's dt_proj, whose "
             "weight the scan reads directly), and weights that are no linear site (embeddings, norms, the head, "
             "convolution kernels, per-head recurrent gates) stay dense.")
    count = (f"**{len(passing)} of the {len(target)} decoder-only text types pass** "
             f"({100 * len(passing) / max(1, len(target)):.0f} %): {len(full)} with every group, "
             f"{len(passing) - len(full)} attention only (their experts are fused 3-D parameters in a layout "
             "transformers' experts decorator does not describe: `--groups attn_in attn_out`). Mixture-of-experts "
             "layers whose experts the decorator describes are split into one group pair per expert, each calibrated "
             "on the tokens routed to it.")
    lines = ["# Architectures", "", *textwrap.wrap(about, 116), "", *textwrap.wrap(count, 116), "",
             "## Passing, by their group kinds", ""]
    kinds = {}
    for c in sorted(passing, key=lambda c: c.model_type):
        title = ", ".join(c.kinds) + (" (attention only: fused experts)" if c.scope == "attention" else "")
        kinds.setdefault(title, []).append(c.model_type)
    for title, names in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        lines += _listing(title, names)
    lines += ["", "## Refused or failing a check, with the reason", "",
              "| model_type | result | group kinds | note |", "|---|---|---|---|"]
    lines += [_row(c, None) for c in sorted(target, key=lambda c: c.model_type) if not c.passed]
    refusing = [c for c in sorted(passing, key=lambda c: c.model_type) if c.refusals]
    if refusing:
        lines += ["", "## Passing types where a method refuses in one line", "",
                  "| model_type | method | its line |", "|---|---|---|"]
        lines += [f"| `{c.model_type}` | {m} | {why.replace('|', '/')} |" for c in refusing
                  for m, why in c.refusals.items()]
    reasons = {}
    for c, why in sorted(rows, key=lambda r: r[0].model_type):
        if why is not None:
            reasons.setdefault(why, []).append(c.model_type)
    lines += ["", "## Out of scope", ""]
    for why, names in sorted(reasons.items()):
        lines += _listing(why[0].upper() + why[1:], names)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(passing), len(target)


def _worker(jobs, results, folder: str) -> None:
    """A process that checks the types it is sent, one at a time (the parent replaces it when one hangs)."""
    import dataclasses
    import warnings

    import transformers

    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    while (model_type := jobs.get()) is not None:
        results.put(("start", model_type))  # the type's clock starts here, not at the worker's imports
        cov = check_architecture(model_type, save_to=Path(folder) / model_type)
        results.put(dataclasses.asdict(cov))


STARTUP_S = 120  # a fresh checking process's imports (transformers, torch), before its first type's clock starts


def _next_message(results, worker, seconds: float):
    """The worker's next message within `seconds` (a result it put before it ended included), or None."""
    import queue

    deadline = time.monotonic() + seconds
    while worker.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            return results.get(timeout=min(1.0, left))
        except queue.Empty:
            continue
    try:
        return results.get(timeout=1)
    except queue.Empty:
        return None


def check_all(types: list[str], seconds: int, folder: Path):
    """(type, Coverage) for each type, checked in a worker process; a type that runs past `seconds` (a hang in an
    architecture's own kernels, which no signal interrupts) is stopped, said, and the worker replaced."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pending = list(types)
    while pending:
        jobs, results = ctx.Queue(), ctx.Queue()
        worker = ctx.Process(target=_worker, args=(jobs, results, str(folder)), daemon=True)
        worker.start()
        for model_type in pending:
            jobs.put(model_type)
        jobs.put(None)
        while pending:
            model_type = pending[0]
            # the worker says when it starts a type (a fresh one imports transformers first, for up to STARTUP_S);
            # from then on the type has `seconds`, measured on the clock, not in polling steps
            started = _next_message(results, worker, STARTUP_S)
            got = _next_message(results, worker, seconds) if started is not None else None
            if got is None:
                died = not worker.is_alive()
                worker.kill()
                pending.pop(0)
                why = (f"its checks ended the checking process (exit code {worker.exitcode})" if died else
                       f"its checks ran past {seconds} s on this machine's CPU and were stopped")
                yield model_type, Coverage(model_type, refused=why)
                break
            pending.pop(0)
            yield model_type, Coverage(**got)
        worker.join(timeout=5)


def _positive_seconds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} s: give a positive number of seconds")
    return value


def _save_and_run(types: list[str], folder: Path, run: bool, seconds: int) -> dict[str, str]:
    """Each type's tiny model saved under `folder`; with `run`, `bench run`'s outcome on it, printed as it comes."""
    tokenizer = tiny_tokenizer()
    outcomes = {}
    for model_type in types:
        path = save_tiny(model_type, folder / model_type, tokenizer)
        if run:
            outcomes[model_type] = bench_run(path, folder / "_results", seconds)
            print(f"bench run {path}: {outcomes[model_type]}", flush=True)
    return outcomes


def main(argv=None) -> int:
    import tempfile
    import warnings

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from tqdm.auto import tqdm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", default=None, help="these model types only (the table is not written)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "architectures.md")
    ap.add_argument("--seconds", type=_positive_seconds, default=120, help="a type's checks are stopped after this "
                    "long (a table row says so)")
    ap.add_argument("--models", type=Path, default=None, help="also save each passing type's tiny model, with a "
                    "tokenizer of its vocabulary, as a folder `bench run --model` opens: MODELS/<model_type>")
    ap.add_argument("--bench-run", action="store_true", help="with --models: run `bench run --methods all --rank 0.5 "
                    "--sparsity 0.5` on each saved folder and print its outcome")
    args = ap.parse_args(argv)
    if args.bench_run and args.models is None:
        ap.error("--bench-run runs bench on the folders --models saves: pass --models DIR")
    if args.models is not None and (args.models.exists() and (not args.models.is_dir() or any(args.models.iterdir()))):
        ap.error(f"--models {args.models}: pass a new or empty folder (the tiny models are written there)")
    from acbench.studies import output_problem

    problem = None if args.only else output_problem(args.out, "--out")
    if problem:  # the table is written after every type ran: its page is checked before
        ap.error(problem)
    unknown = [t for t in args.only or () if t not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
    if unknown:
        near = difflib.get_close_matches(unknown[0], MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, n=1)
        ap.error(f"--only {unknown[0]!r} is not a causal-LM model_type of transformers {transformers.__version__}"
                 + (f" (did you mean {near[0]!r}?)" if near else ""))
    warnings.filterwarnings("ignore")
    transformers.logging.set_verbosity_error()
    types = args.only or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    t0, rows = time.perf_counter(), []
    scoped = {t: out_of_scope(t) for t in types}
    with tempfile.TemporaryDirectory() as tmp:
        checked = check_all([t for t in types if scoped[t] is None], args.seconds, Path(tmp))
        for _, cov in tqdm(checked, total=sum(v is None for v in scoped.values()), desc="architectures"):
            rows.append((cov, None))
            tqdm.write(_row(cov, None)[:200])
    rows += [(Coverage(t), why) for t, why in scoped.items() if why is not None]
    if args.models is not None:
        ran = _save_and_run([c.model_type for c, why in rows if why is None and c.passed], args.models,
                            args.bench_run, 10 * args.seconds)
        if args.bench_run and not all(v.startswith("ok") for v in ran.values()):
            return 1
    if args.only:
        for cov, why in rows:  # a type the table would list as out of scope is named with its reason, not skipped
            if why is not None:
                print(f"{cov.model_type}: not checked: {why}")
        return 0 if all(c.passed or why for c, why in rows) else 1
    passing, target = write_table(rows, time.perf_counter() - t0, args.out)
    print(f"{args.out}: {passing} of {target} decoder-only text types pass")
    return 0


if __name__ == "__main__":
    from acbench.core.log import console_lines

    with console_lines():  # a script: acbench's lines on its stdout
        sys.exit(main())
