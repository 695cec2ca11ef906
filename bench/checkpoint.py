"""Compressed checkpoints: written with save_pretrained (safetensors), loadable by transformers alone.

A factorised or sparse-activation model carries its modules' code (core/compressed_layers.py and
core/sparsity.py, copied verbatim, plus a modeling file declaring the base architecture's compressed subclass) and names it in the
config's `auto_map`, transformers' convention for custom models: `from_pretrained(path, trust_remote_code=True)`
then needs no acbench. acbench itself never runs a checkpoint's code: `load_checkpoint` builds the same modules
from the installed package. `compression.json` records where the model came from and the digests that make a
changed layout or weight file a one-line error on load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

import core
from core.compressed_layers import LAYOUT_KEY, RUNTIME_FORMS, compressed_subclass
from core.errors import UserError
from core.io import atomic_write_json, sha256_file, unwritable

from . import __version__

PROVENANCE_FILE = "compression.json"
PROVENANCE_SCHEMA = 1
MODELING_FILE = "modeling_acbench.py"
CARRIED = ("compressed_layers.py", "sparsity.py")  # from core/, copied verbatim

_MODELING = '''"""A {base} whose linear sites are the modules config.json's `{key}` lays out.

Written by acbench {version} (`bench compress`); needs torch and transformers only."""

from transformers import {base}

from .compressed_layers import compressed_subclass

{name} = compressed_subclass({base})
{name}.__module__ = __name__
'''


def runtime_forms(config) -> list[str]:
    """The forms of a config's layout that need modules beyond the base architecture (empty: dense-shaped)."""
    layout = getattr(config, LAYOUT_KEY, None) or {}
    return sorted({spec.get("form") for spec in layout.values() if isinstance(spec, dict)} & set(RUNTIME_FORMS))


def check_target(out: Path, overwrite: bool) -> None:
    """--save: a folder that is absent, empty, or (with --overwrite) replaceable, under a writable parent."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--save {out} is a file: pass a folder for the checkpoint")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"--save {out} exists and is not empty: pass another folder, or --overwrite to replace it")
    parent = out.resolve().parent
    why = unwritable(parent)
    if why:
        raise UserError(f"--save {out}: cannot write in {parent} ({why}): pass a writable folder")


def layout_digest(layout: dict) -> str:
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def _carry_code(model, folder: Path) -> None:
    """The modeling files and the config's auto_map, so transformers builds the factorised modules itself."""
    import transformers

    base = type(model).__name__
    if getattr(transformers, base, None) is not type(model):
        raise UserError(f"the model's class {base} is not one of transformers' own: its compressed checkpoint "
                        "cannot name it in custom code; save with --merged (dense-shaped weights)")
    name = f"Compressed{base}"
    (folder / MODELING_FILE).write_text(_MODELING.format(base=base, name=name, key=LAYOUT_KEY, version=__version__))
    for f in CARRIED:
        shutil.copyfile(Path(core.__file__).parent / f, folder / f)
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": f"{MODELING_FILE[:-3]}.{name}"}
    cfg["architectures"] = [name]  # a tool that reads the architecture must not take it for the dense one
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def write_checkpoint(model, tokenizer, out: Path, provenance: dict, overwrite: bool = False) -> dict:
    """Save the (compressed, in place) model, its tokenizer and compression.json into `out`, atomically: the
    folder appears whole or not at all. Returns the written weight files' bytes."""
    check_target(out, overwrite)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if runtime_forms(model.config):
            _carry_code(model, tmp)
        layout = getattr(model.config, LAYOUT_KEY, None) or {}
        files = _weight_files(tmp)
        atomic_write_json(tmp / PROVENANCE_FILE, {
            "schema": PROVENANCE_SCHEMA, "acbench": __version__, **provenance,
            "layout_sha256": layout_digest(layout), "weights": {p.name: sha256_file(p) for p in files}})
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"weight_bytes": sum(p.stat().st_size for p in _weight_files(out)), "files": sorted(os.listdir(out))}


# ---------------------------------------------------------------- reading one back

def read_provenance(folder: Path, check_weights: bool = True) -> dict | None:
    """compression.json of an acbench checkpoint, checked against the config's layout and the weight files it
    lists (None: not an acbench checkpoint). Any mismatch is one line naming the file."""
    folder = Path(folder)
    path = folder / PROVENANCE_FILE
    if not path.exists():
        return None
    fix = "re-save the checkpoint with bench compress"
    try:
        prov = json.loads(path.read_text(encoding="utf-8"))
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"checkpoint {folder}: {path.name} or config.json is not readable JSON ({e}): {fix}") from None
    if not isinstance(prov, dict) or not isinstance(prov.get("weights"), dict) or "layout_sha256" not in prov:
        raise UserError(f"checkpoint {folder}: {path.name} is not an acbench compression record: {fix}")
    if not isinstance(cfg, dict) or layout_digest(cfg.get(LAYOUT_KEY) or {}) != prov["layout_sha256"]:
        raise UserError(f"checkpoint {folder}: the compression layout in config.json does not match {path.name} "
                        f"(one of them was edited): {fix}")
    for name, digest in prov["weights"].items():
        if Path(name).name != name or not name.endswith(".safetensors"):  # a file of this folder, nothing else
            raise UserError(f"checkpoint {folder}: {path.name} lists {name!r} as a weight file: {fix}")
        f = folder / name
        if not f.is_file():
            raise UserError(f"checkpoint {folder}: the weight file {name} that {path.name} lists is missing: "
                            "copy the whole folder, or " + fix)
        if check_weights and sha256_file(f) != digest:
            raise UserError(f"checkpoint {folder}: {name} differs from the file bench compress wrote (sha256): {fix}")
    return prov


def load_checkpoint(folder: Path | str, dtype=torch.float32, **kwargs):
    """A compressed checkpoint as a model, built from the installed acbench (its custom code is never run); a
    weight the layout expects and the files lack (or the reverse) is one line."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    folder = Path(folder)
    read_provenance(folder)
    config = AutoConfig.from_pretrained(folder)
    base = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    model, info = compressed_subclass(base).from_pretrained(folder, config=config, dtype=dtype,
                                                         output_loading_info=True, **kwargs)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        what, keys = next(iter(bad.items()))
        raise UserError(f"checkpoint {folder} does not match its compression layout ({what.replace('_', ' ')}: "
                        f"{sorted(map(str, keys))[:3]}): re-save it with bench compress")
    return model.eval()


def describe_provenance(prov: dict) -> str:
    """One line: what a checkpoint is compressed from, as the leaderboard header shows it."""
    src = prov.get("source_model") if isinstance(prov.get("source_model"), dict) else {}
    fp = src.get("fingerprint") if isinstance(src.get("fingerprint"), dict) else {}
    sha = str(fp.get("sha256", ""))[:12]
    return (f"{prov.get('method')} at {prov.get('budget')} ({prov.get('form')}) of {src.get('name')}"
            + (f" [{sha}]" if sha else "") + f", acbench {prov.get('acbench')}")
