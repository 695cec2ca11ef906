"""Compressed checkpoints: written with save_pretrained (safetensors), loadable by transformers alone.

A factorised or sparse-activation model carries its modules' code (core/compressed_layers.py, experts.py, sparsity.py,
copied verbatim, a configuration file and a modeling file declaring the base architecture's compressed subclass)
under a model type of its own, and names it in the config's `auto_map`: `from_pretrained(path,
trust_remote_code=True)` then needs no acbench, and without trust_remote_code every tool refuses the folder
(rather than loading the dense architecture with the compressed sites freshly initialised). Merged and
masked-weight checkpoints are dense-shaped: any tool loads them as the base architecture, correctly.
acbench itself never runs a checkpoint's code: `load_checkpoint` builds the same modules from the installed
package. `compression.json` records where the model came from, the versions that wrote it and the digests of
every weight and code file; config.json records the layout and compression.json's own digest, so neither file is
edited, replaced or dropped alone without a one-line error on load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch

from acbench import core
from acbench.core.compressed_layers import LAYOUT_KEY, RUNTIME_FORMS, compressed_subclass
from acbench.core.errors import UserError
from acbench.core.io import atomic_write_json, readable_as_umask, sha256_file, unwritable

from acbench.core.version import __version__
from acbench.model.modes import restore_modes, training_modes

PROVENANCE_FILE = "compression.json"
PROVENANCE_SCHEMA = 2  # 2: a model type of its own, the record's digest in config.json, code digests, versions
MODELING_FILE = "modeling_acbench.py"
CONFIG_FILE = "configuration_acbench.py"
CARRIED = ("compressed_layers.py", "experts.py", "sparsity.py")  # from core/, copied verbatim
MODEL_TYPE_PREFIX = "acbench_"  # config.json's model_type of a factorised or sparse-activation checkpoint
BASE_TYPE_KEY = "acbench_base_model_type"
RECORD_KEY = "acbench_record_sha256"  # in config.json: compression.json's digest, so neither is edited alone
FIX = "re-save the checkpoint with bench compress"

_CONFIGURATION = '''"""The configuration of a {base} whose linear sites are compressed: the base configuration under a model
type of its own, so that a tool that cannot run the compressed modules refuses the checkpoint instead of loading
it as a dense {base} with freshly initialised weights. Written by acbench {version} (`bench compress`)."""

from transformers import {config_base}


class {config_name}({config_base}):
    model_type = "{model_type}"
'''

_MODELING = '''"""A {base} whose linear sites are the modules config.json's `{key}` lays out.

Written by acbench {version} (`bench compress`); needs torch and transformers only."""

from transformers import {base}

from .compressed_layers import compressed_subclass
from .configuration_acbench import {config_name}

{name} = compressed_subclass({base})
{name}.__module__ = __name__
{name}.config_class = {config_name}
'''



def _semi_structured(weight: torch.Tensor) -> bool:
    # what acbench.deploy.semi_structured deploys 2:4 weights as (the model room reads, never deploys, them)
    from torch.sparse import SparseSemiStructuredTensor

    return isinstance(weight, SparseSemiStructuredTensor)


@contextmanager
def densified(model: torch.nn.Module):
    """The model with its semi-structured weights as the plain tensors they stand for (what a checkpoint stores),
    put back after."""
    swapped = [(mod, mod.weight) for mod in model.modules()
               if isinstance(getattr(mod, "weight", None), torch.Tensor) and _semi_structured(mod.weight)]
    try:
        for mod, weight in swapped:
            mod.weight = torch.nn.Parameter(weight.to_dense(), requires_grad=False)
        yield model
    finally:
        for mod, weight in swapped:
            mod.weight = weight


def runtime_forms(config) -> list[str]:
    """The forms of a config's layout (a transformers config or config.json's mapping) that need modules beyond the
    base architecture (empty: dense-shaped)."""
    layout = (config.get(LAYOUT_KEY) if isinstance(config, dict) else getattr(config, LAYOUT_KEY, None)) or {}
    if not isinstance(layout, dict):
        return []
    return sorted({spec.get("form") for spec in layout.values() if isinstance(spec, dict)} & set(RUNTIME_FORMS))


def check_target(out: Path, overwrite: bool, source: Path | str | None = None) -> None:
    """--save: a folder that is absent, empty, or (with --overwrite) replaceable, under a writable parent, and
    neither the current folder (or one holding it) nor the source model's folder, inside it or holding it."""
    where = Path(out).expanduser().resolve()
    cwd = Path.cwd().resolve()
    if where == cwd or where in cwd.parents:
        raise UserError(f"--save {out} is the current folder or holds it: pass a new folder for the checkpoint "
                        "(for example --save ./compressed)")
    if source is not None and Path(source).expanduser().exists():
        src = Path(source).expanduser().resolve()
        if where == src or src in where.parents or where in src.parents:
            raise UserError(f"--save {out} is, lies inside or holds the source model's folder {src}: pass a folder "
                            "outside it")
    if out.exists() and not out.is_dir():
        raise UserError(f"--save {out} is a file: pass a folder for the checkpoint")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"--save {out} exists and is not empty: pass another folder, or --overwrite to replace it")
    parent = where.parent
    why = unwritable(parent)
    if why:
        raise UserError(f"--save {out}: cannot write in {parent} ({why}): pass a writable folder")


def layout_digest(layout: dict) -> str:
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _carry_code(model, folder: Path) -> dict:
    """The modeling files and the config's own model type and auto_map, so transformers builds the compressed
    modules itself where its code may run (trust_remote_code=True), and refuses the checkpoint where it may not.
    A model type of its own is what makes the refusal: transformers 5 ignores auto_map without
    trust_remote_code whenever the model type has a built-in class, and then loads the dense architecture with the
    compressed sites' weights missing (freshly initialised). Returns the config.json entries to set."""
    import transformers

    base, config_base = type(model).__name__, type(model.config).__name__
    if getattr(transformers, base, None) is not type(model) or getattr(transformers, config_base, None) is not type(
            model.config):
        raise UserError(f"the model's class {base} is not one of transformers' own: its compressed checkpoint "
                        "cannot name it in custom code; save with --merged (dense-shaped weights)")
    name, config_name = f"Compressed{base}", f"Compressed{config_base}"
    model_type = MODEL_TYPE_PREFIX + model.config.model_type
    (folder / CONFIG_FILE).write_text(_CONFIGURATION.format(base=base, config_base=config_base, version=__version__,
                                                            config_name=config_name, model_type=model_type))
    (folder / MODELING_FILE).write_text(_MODELING.format(base=base, name=name, key=LAYOUT_KEY, version=__version__,
                                                         config_name=config_name))
    for f in CARRIED:
        shutil.copyfile(Path(core.__file__).parent / f, folder / f)
    return {"model_type": model_type, BASE_TYPE_KEY: model.config.model_type,
            "auto_map": {"AutoConfig": f"{CONFIG_FILE[:-3]}.{config_name}",
                         "AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.{name}"},
            "architectures": [name]}  # a tool that reads the architecture must not take it for the dense one


def _code_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py"))


def _other_files(folder: Path) -> list[Path]:
    """The tokenizer's and generation config's files: everything but the weights, the code and the two records
    (and documentation a user may add beside them)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix not in (".safetensors", ".py")
                  and p.name not in ("config.json", PROVENANCE_FILE) and not _is_documentation(p.name))


def _is_documentation(name: str) -> bool:
    return name.upper().startswith(("README", "LICENSE")) or name.endswith(".md") or name.startswith(".")


def _versions() -> dict:
    import transformers

    from acbench.results.store import git_commit

    return {"acbench": __version__, "git_commit": git_commit(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def record_digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def write_checkpoint(model, tokenizer, out: Path, provenance: dict, overwrite: bool = False) -> dict:
    """Save the (compressed, in place) model, its tokenizer and compression.json into `out`, atomically: the
    folder appears whole or not at all. Returns the written weight files' bytes."""
    check_target(out, overwrite)
    out = Path(out).expanduser().resolve()
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with densified(model):  # 2:4 weights on sparse tensor cores are stored as the plain tensors they stand for
            # Compressed layers are stored under the installed transformers' own module names: the conversions to an
            # architecture's original key format (a fused query_key_value, per-expert keys) cannot split or fuse
            # low-rank factors. A dense-shaped checkpoint keeps the original format other tools read.
            model.save_pretrained(tmp, save_original_format=not runtime_forms(model.config))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        cfg_path = tmp / "config.json"
        cfg = json.loads(cfg_path.read_text())
        if runtime_forms(model.config):
            cfg.update(_carry_code(model, tmp))
        layout = cfg.get(LAYOUT_KEY) or {}
        if not layout:
            raise ValueError("write_checkpoint: the model records no compression layout (compress it first)")
        record = {"schema": PROVENANCE_SCHEMA, "written_by": _versions(), **provenance,
                  "layout_sha256": layout_digest(layout),
                  "weights": {p.name: sha256_file(p) for p in _weight_files(tmp)},
                  "code": {p.name: sha256_file(p) for p in _code_files(tmp)},
                  "other": {p.name: sha256_file(p) for p in _other_files(tmp)}}
        cfg[RECORD_KEY] = record_digest(record)
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        atomic_write_json(tmp / PROVENANCE_FILE, record)
        for f in tmp.iterdir():
            readable_as_umask(f)  # save_pretrained's safetensors writer leaves 0600
        verified = verify_reload(model, tmp, out)  # before the folder takes its name: a bad save leaves nothing
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"weight_bytes": sum(p.stat().st_size for p in _weight_files(out)), "files": sorted(os.listdir(out)),
            "verified": verified}


VERIFY_TOKENS = 8  # the prompt a save is checked on: token ids 1..8, fixed so the check is the same everywhere


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    device = model.get_input_embeddings().weight.device
    with torch.no_grad():
        return model(input_ids=ids.to(device), use_cache=False).logits.float().cpu()


def verify_reload(model, folder: Path, shown: Path) -> str:
    """Load the folder just written as `bench run --model` will (load_checkpoint) and compare its logits with the
    model in memory on VERIFY_TOKENS tokens: a checkpoint that does not reload to the same model (an architecture
    whose save and load disagree) or a model that computes non-finite values is one UserError line, and nothing is
    saved. Where a second copy of the weights would not fit in memory, the check is skipped and said."""
    from acbench.core.io import available_bytes

    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if 2 * size > available_bytes():
        return f"not verified: a second copy of the weights ({size / 2**30:.1f} GiB) would not fit in memory"
    vocab = model.get_input_embeddings().num_embeddings
    ids = (torch.arange(VERIFY_TOKENS) % max(vocab - 1, 1) + 1).unsqueeze(0)
    modes = training_modes(model)
    model.eval()
    try:
        expected = _logits(model, ids)
    except Exception as e:  # noqa: BLE001 - the architecture's own forward: refused in one line, nothing saved
        raise UserError(f"{shown} is not saved: the compressed model cannot run {VERIFY_TOKENS} tokens to be checked "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})") from None
    finally:
        restore_modes(modes)
    if not torch.isfinite(expected).all():
        raise UserError(f"the compressed model produces non-finite logits on {VERIFY_TOKENS} tokens (NaN or inf), so "
                        f"{shown} is not saved: try another method or a higher budget, or --solve-dtype float64")
    dtype = next(model.parameters()).dtype
    try:
        reloaded = load_checkpoint(folder, dtype=dtype)
        got = _logits(reloaded, ids)
    except UserError as e:
        raise UserError(f"{shown} is not saved: the checkpoint written does not reload ({e})") from None
    except Exception as e:  # noqa: BLE001 - whatever the architecture's loader raises, the save is refused
        raise UserError(f"{shown} is not saved: the checkpoint written does not reload in transformers "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})") from None
    del reloaded
    scale = max(1.0, float(expected.abs().max()))
    diff = float((got - expected).abs().max()) if got.shape == expected.shape and torch.isfinite(got).all() \
        else float("inf")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    if not diff <= tol * scale:
        raise UserError(f"{shown} is not saved: the checkpoint written reloads to another model (logits differ by "
                        f"{diff:.3g} on {VERIFY_TOKENS} tokens, allowed {tol * scale:.3g}); this architecture's save "
                        "and load disagree for compressed sites: evaluate the compressed model in the same process "
                        "(bench run) instead")
    return f"reloaded and checked: logits within {diff:.2g} of the model in memory on {VERIFY_TOKENS} tokens"


# ---------------------------------------------------------------- reading one back

def _read_json(path: Path, folder: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {folder}: {path.name} is not readable JSON ({e}): {FIX}") from None


def _check_files(folder: Path, listed, kind: str, present: list[Path], check_digests: bool) -> None:
    """Every file of `kind` the record lists is this folder's, present and (checked) as written; the record lists
    every such file the folder holds (`present`)."""
    if not isinstance(listed, dict) or (kind == "weight" and not listed):
        raise UserError(f"checkpoint {folder}: {PROVENANCE_FILE} lists no {kind} files: {FIX}")
    for name, digest in listed.items():
        if Path(name).name != name or name in ("", ".", ".."):  # a file of this folder, nothing else
            raise UserError(f"checkpoint {folder}: {PROVENANCE_FILE} lists {name!r} as a {kind} file: {FIX}")
        f = folder / name
        if not f.is_file():
            raise UserError(f"checkpoint {folder}: the {kind} file {name} that {PROVENANCE_FILE} lists is missing: "
                            "copy the whole folder, or " + FIX)
        if check_digests and sha256_file(f) != digest:
            raise UserError(f"checkpoint {folder}: {name} differs from the file bench compress wrote (sha256): {FIX}")
    extra = sorted({p.name for p in present} - set(listed))
    if extra:
        raise UserError(f"checkpoint {folder}: {extra[0]} is not a {kind} file bench compress wrote "
                        f"({PROVENANCE_FILE} does not list it): remove it, or {FIX}")


def has_own_model_type(cfg: dict) -> bool:
    """config.json (a mapping) names the model type bench compress gives a factorised or sparse checkpoint."""
    return str(cfg.get("model_type", "")).startswith(MODEL_TYPE_PREFIX)


def is_compressed_config(cfg: dict) -> bool:
    """config.json (a mapping) of a checkpoint acbench wrote: a compression layout or a model type of its own."""
    return LAYOUT_KEY in cfg or RECORD_KEY in cfg or BASE_TYPE_KEY in cfg or has_own_model_type(cfg)


def read_provenance(folder: Path, check_weights: bool = True) -> dict | None:
    """compression.json of an acbench checkpoint, checked against config.json (which records its digest and the
    layout) and against the weight and code files it lists (None: not an acbench checkpoint). Either file
    without the other, or any mismatch, is one line naming the file."""
    folder = Path(folder)
    path = folder / PROVENANCE_FILE
    cfg = _read_json(folder / "config.json", folder)
    if not isinstance(cfg, dict):
        raise UserError(f"checkpoint {folder}: config.json is not a JSON object: {FIX}")
    if not path.exists():
        if is_compressed_config(cfg):
            raise UserError(f"checkpoint {folder}: config.json records an acbench compression but {PROVENANCE_FILE} "
                            "is missing: copy the whole folder, or " + FIX)
        return None
    prov = _read_json(path, folder)
    if not isinstance(prov, dict) or "layout_sha256" not in prov:
        raise UserError(f"checkpoint {folder}: {path.name} is not an acbench compression record: {FIX}")
    if prov.get("schema") != PROVENANCE_SCHEMA:
        raise UserError(f"checkpoint {folder}: {path.name} has schema {prov.get('schema')!r}, this acbench reads "
                        f"{PROVENANCE_SCHEMA} (older checkpoints load as dense models elsewhere): {FIX}")
    if not cfg.get(LAYOUT_KEY):
        raise UserError(f"checkpoint {folder}: {path.name} is present but config.json records no compression layout "
                        f"(the config was replaced): {FIX}")
    if layout_digest(cfg[LAYOUT_KEY]) != prov["layout_sha256"]:
        raise UserError(f"checkpoint {folder}: the compression layout in config.json does not match {path.name} "
                        f"(one of them was edited): {FIX}")
    if cfg.get(RECORD_KEY) != record_digest(prov):
        raise UserError(f"checkpoint {folder}: {path.name} does not match the digest config.json records for it "
                        f"(one of them was edited): {FIX}")
    forms = runtime_forms(cfg)
    if bool(forms) != has_own_model_type(cfg):
        raise UserError(f"checkpoint {folder}: config.json's model_type {cfg.get('model_type')!r} does not fit its "
                        f"layout ({', '.join(forms) or 'dense-shaped'}): {FIX}")
    weights = prov.get("weights")
    if isinstance(weights, dict) and any(not str(n).endswith(".safetensors") for n in weights):
        raise UserError(f"checkpoint {folder}: {PROVENANCE_FILE} lists a weight file that is not .safetensors: {FIX}")
    _check_files(folder, weights, "weight", _weight_files(folder), check_weights)
    _check_files(folder, prov.get("code"), "code", _code_files(folder), True)
    _check_files(folder, prov.get("other"), "tokenizer or generation", _other_files(folder), True)
    return prov


def checkpoint_config(folder: Path | str):
    """The transformers config acbench builds a checkpoint with: the base architecture's own (a compressed
    checkpoint's model type is only for tools that run its carried code, which acbench never does)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    folder = Path(folder)
    cfg = _read_json(folder / "config.json", folder)
    if not isinstance(cfg, dict) or not has_own_model_type(cfg):
        return AutoConfig.from_pretrained(folder)
    base = cfg.get(BASE_TYPE_KEY)
    if base not in CONFIG_MAPPING or cfg["model_type"] != MODEL_TYPE_PREFIX + base:
        raise UserError(f"checkpoint {folder}: config.json's {BASE_TYPE_KEY} {base!r} is not an architecture this "
                        f"transformers knows, or does not fit model_type {cfg['model_type']!r}: {FIX}")
    plain = {k: v for k, v in cfg.items() if k not in ("model_type", "auto_map", "architectures", BASE_TYPE_KEY)}
    config_class = CONFIG_MAPPING[base]
    # transformers writes an infinite float as {"__float__": "Infinity"} (Mamba-2's time_step_limit) and reads it
    # back through its own file reader, which this dict bypasses
    decode = getattr(config_class, "_decode_special_floats", None)
    return config_class.from_dict(decode(plain) if decode else plain)


def load_checkpoint(folder: Path | str, dtype=torch.float32, **kwargs):
    """A compressed checkpoint as a model, built from the installed acbench (its custom code is never run); a
    weight the layout expects and the files lack (or the reverse) is one line."""
    folder = Path(folder)
    if read_provenance(folder) is None:
        raise UserError(f"{folder} is not a checkpoint bench compress wrote (no {PROVENANCE_FILE})")
    config = checkpoint_config(folder)
    from acbench.model.groups import causal_lm_class

    base = causal_lm_class(config)
    model, info = compressed_subclass(base).from_pretrained(folder, config=config, dtype=dtype,
                                                         output_loading_info=True, **kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        what, keys = next(iter(bad.items()))
        raise UserError(f"checkpoint {folder} does not match its compression layout ({what.replace('_', ' ')}: "
                        f"{sorted(map(str, keys))[:3]}): {FIX}")
    return model.eval()


def describe_provenance(prov: dict) -> str:
    """One line: what a checkpoint is compressed from, as the leaderboard header shows it."""
    src = prov.get("source_model") if isinstance(prov.get("source_model"), dict) else {}
    fp = src.get("fingerprint") if isinstance(src.get("fingerprint"), dict) else {}
    sha = str(fp.get("sha256", ""))[:12]
    return (f"{prov.get('method')} at {prov.get('budget')} ({prov.get('form')}) of {src.get('name')}"
            + (f" [{sha}]" if sha else "") + f", acbench {(prov.get('written_by') or {}).get('acbench')}")
