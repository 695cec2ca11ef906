"""The results store: one JSON file per (model, method, rank, task) cell, written atomically."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from acbench.core.io import atomic_write_json
from acbench.core.record import (ALL_GROUPS, UNIFORM, CellRecord, cell_problem, cell_relpath, nulls_for_nonfinite,
                         place_problem)


def settings_hash(*parts) -> str:
    blob = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def cell_path(root: Path, model: str, method: str, rank: float | None, budget: str, task: str, key: str,
              allocation: str = UNIFORM, scope: str = ALL_GROUPS) -> Path:
    """<root>/<model>/<method>[+<allocation>]/[<scope>/]<budget>-<ratio>/<task>-<key>.json (acbench.core.record)."""
    return Path(root) / cell_relpath(model, method, rank, budget, task, key, allocation, scope)


def model_identity(fingerprint: dict) -> str:
    """What tells two models apart, whatever they are called: their weights' digest, or a hub id at a revision. The
    dtype a run loads them in is not part of it (one model's float32 and bfloat16 cells share its folder)."""
    if fingerprint.get("sha256"):
        return str(fingerprint["sha256"])
    return f"{fingerprint.get('source')}:{fingerprint.get('id')}@{fingerprint.get('revision')}"


def stored_identities(folder: Path) -> set[str]:
    """The model identities of the cells stored under one model's results folder (unreadable files are the report's
    to name; a cell without a fingerprint says nothing here)."""
    out = set()
    for path in Path(folder).rglob("*.json"):
        if any(part.startswith(".") for part in path.relative_to(folder).parts):
            continue
        try:
            fp = json.loads(path.read_text(encoding="utf-8")).get("model_fingerprint")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(fp, dict) and fp:
            out.add(model_identity(fp))
    return out


def results_name(root: Path, name: str, fingerprint: dict, taken: dict[str, str] | None = None) -> str:
    """The name a model's cells are filed under: its display name, unless that folder holds another model's cells
    or another model of the same sweep (`taken`: {name: identity}) has it; then the name plus 8 hex digits of the
    model's identity. Two checkpoints both called checkpoint-1000 never share one folder."""
    ident = model_identity(fingerprint)
    taken = taken or {}

    def held_by_another(n: str) -> bool:
        return taken.get(n, ident) != ident or bool(stored_identities(Path(root) / n.replace("/", "__")) - {ident})

    if not held_by_another(name):
        return name
    return f"{name}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}"


def _nonfinite_scores(record: dict) -> str | None:
    """Where a task's scores hold NaN or inf (a metric, or a record's nll / loglikelihoods), in a few words."""
    import math

    def bad(v) -> bool:
        return isinstance(v, float) and not math.isfinite(v)

    if record["cell"].get("kind", "task") != "task":
        return None
    for name, v in (record.get("metrics") or {}).items():
        if isinstance(v, float) and math.isnan(v):  # an infinite perplexity is exp of a large finite NLL: stored null
            return f"metric {name} = {v}"
    for i, r in enumerate(record.get("records") or []):
        for key in ("nll", "loglikelihoods"):
            values = r.get(key) if isinstance(r, dict) else None
            if bad(values) or (isinstance(values, list) and any(map(bad, values))):
                return f"records[{i}].{key}"
    return None


def write_cell(path: Path, cell: CellRecord) -> None:
    from acbench.core.errors import UserError

    raw = cell.to_json()
    broken = _nonfinite_scores(raw)
    if broken:  # NaN or inf where a score belongs: the model computed it, the run's sizes did not
        raise UserError(f"result for {path.name}: the model produces non-finite values ({broken}), so no cell is "
                        f"stored: the model{'' if raw['cell']['method'] == 'dense' else ' as compressed'} is "
                        "numerically broken; check it outside acbench, or try another method or budget")
    record = nulls_for_nonfinite(raw)
    problem = cell_problem(json.loads(json.dumps(record, default=str)))
    if problem:  # never store a cell that readers would reject
        raise UserError(f"result for {path.name} is not valid ({problem}): this is a bug or a degenerate setting; "
                        "check the run's sizes")
    try:
        atomic_write_json(path, record)
    except OSError as e:
        raise UserError(f"cannot write result file {path} ({e.strerror or type(e).__name__}): make the results "
                        "directory writable or pass --output <writable dir>") from None


def cell_status(path: Path) -> str | None:
    """None when the cell is done (its file validates against the cell schema), else why it must be computed."""
    path = Path(path)
    if not path.exists():
        return "missing"
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"unreadable ({type(e).__name__})"
    return cell_problem(rec) or place_problem(rec, path)


_GIT = None


def git_commit() -> str | None:
    global _GIT
    if _GIT is None:
        try:
            _GIT = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                                  text=True, timeout=5).stdout.strip() or ""
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                   cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5).stdout
            if _GIT and dirty.strip():
                _GIT += "-dirty"
        except (OSError, subprocess.SubprocessError):
            _GIT = ""
    return _GIT or None


# CPU flags that decide how fast a batch-1 product can stream weights, as /proc/cpuinfo names them
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_description(cpuinfo: str) -> dict:
    """The processor model and its vector extensions from /proc/cpuinfo's text (the first processor's lines)."""
    fields = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "flags", "Features") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {"cpu_model": fields.get("model name") or platform.processor() or None,
            "cpu_vector_extensions": " ".join(f for f in VECTOR_FLAGS if f in flags) or None}


def torch_build(config: str) -> dict:
    """The BLAS torch was built with and its oneDNN version, from `torch.__config__.show()`'s text."""
    import re

    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    onednn = re.search(r"(?:oneDNN|MKL-DNN) (v[\d.]+)", config)
    return {"torch_blas": blas.group(1) if blas else None, "torch_onednn": onednn.group(1) if onednn else None}


@contextmanager
def run_process_state(threads: int | None, seed: int):
    """A run's torch threads and seed set for its duration, and the caller's put back after it (torch's thread
    count and random state, numpy's and Python's random states): a run from Python changes none of them."""
    import random

    import numpy as np
    import torch

    kept = (torch.get_num_threads(), torch.get_rng_state(), np.random.get_state(), random.getstate())
    torch.set_num_threads(threads or available_cpus())
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_num_threads(kept[0])
        torch.set_rng_state(kept[1])
        np.random.set_state(kept[2])
        random.setstate(kept[3])


def available_cpus() -> int:
    """The CPUs this process may run on (a container's or a scheduler's share, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_MACHINE = None


def machine() -> dict:
    """What a speed depends on besides the code: the processor, its vector extensions, the CPUs this process may use,
    torch's kernel capability, BLAS and oneDNN. Read once per process."""
    global _MACHINE
    if _MACHINE is None:
        import torch

        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
        cpus = available_cpus()
        capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: None)()
        _MACHINE = {**cpu_description(cpuinfo), "cpus_available": cpus, "torch_cpu_capability": capability,
                    **torch_build(torch.__config__.show())}
    return dict(_MACHINE)


def environment(device: str) -> dict:
    import torch
    import transformers

    from acbench.core.version import __version__

    try:
        import lm_eval

        lm_eval_version = getattr(lm_eval, "__version__", None)
    except ImportError:
        lm_eval_version = None
    return {
        "acbench": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "lm_eval": lm_eval_version, "python": platform.python_version(), "git_commit": git_commit(),
        "device": device, "cpu_threads": torch.get_num_threads(), "host": platform.node(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **machine(),
    }


def check_writable(root: Path) -> None:
    from acbench.core.errors import UserError
    from acbench.core.io import unwritable

    why = unwritable(Path(root))
    if why:
        raise UserError(f"output directory {root} is not writable ({why}): pass --output <writable dir>")


# ---------------------------------------------------------------- cell claims (parallel runs split the work)

DEFAULT_LOCK_TTL_S = 6 * 3600.0


def lock_ttl(strict: bool = True) -> float:
    """ACBENCH_LOCK_TTL (seconds, finite, > 0), else six hours: a claim older than this is presumed dead. A bad
    value is one line when a command starts (`strict`); read at import, it falls back to the default for that
    check to name."""
    from acbench.core.errors import UserError

    raw = os.environ.get("ACBENCH_LOCK_TTL")
    if raw is None or raw.strip() == "":
        return DEFAULT_LOCK_TTL_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value
    if strict:
        raise UserError(f"ACBENCH_LOCK_TTL={raw!r} is not a number of seconds > 0: set it to e.g. 21600 (six hours, "
                        "after which a claim is presumed dead), or unset it")
    return DEFAULT_LOCK_TTL_S


LOCK_TTL_S = lock_ttl(strict=False)  # a claim older than this is presumed dead


def _lock_path(path: Path) -> Path:
    return Path(path).with_name(f".{Path(path).name}.lock")


def _holder_alive(lock: Path, owner: str | None = None) -> bool:
    """Whether the process that wrote a claim may still be computing it. `owner`: the claimant's own tag (a Ray
    task's id), so a retried task breaks the claim its killed attempt left, on whichever node it runs now."""
    try:
        age = time.time() - lock.stat().st_mtime
        info = json.loads(lock.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return age < 60  # a claim being written right now, or garbage: give it a minute
    if owner is not None and info.get("owner") == owner:
        return False
    if info.get("host") == platform.node():
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            return False  # killed (kill -9 leaves its claim behind): its successor breaks it
        except (PermissionError, ValueError, KeyError, TypeError):
            pass
    return age < LOCK_TTL_S


def claim_cell(path: Path, owner: str | None = None) -> bool:
    """Take an exclusive claim on a cell before computing it; False when a live process holds it.

    The claim is written in full to a private file and then hard-linked into place (atomic, and refused when the
    claim exists), so a process killed at any moment never leaves an empty claim that would look alive."""
    from acbench.core.errors import UserError

    lock = _lock_path(path)
    body = json.dumps({"pid": os.getpid(), "host": platform.node(), "since": time.time(), "owner": owner})
    for _ in range(2):
        tmp = lock.with_name(f"{lock.name}.{os.getpid()}.tmp")
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(body)
            try:
                os.link(tmp, lock)
            except FileExistsError:
                if _holder_alive(lock, owner):
                    return False
                lock.unlink(missing_ok=True)  # a dead process's claim: break it and try once more
                continue
            return True
        except FileNotFoundError:
            continue  # the folder was removed (emptied by a run releasing its last claim) after it was made
        except OSError as e:
            raise UserError(f"cannot write in results folder {lock.parent} ({e.strerror or type(e).__name__}): "
                            "make it writable or pass --output <writable dir>") from None
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # its folder could not be made: nothing was written
    return False


def release_cell(path: Path) -> None:
    """Drop the claim; a folder it leaves empty (the cell was refused or interrupted before being written) goes too,
    up to two levels (the method's and the model's folders), so a stopped run leaves no empty folders."""
    lock = _lock_path(path)
    lock.unlink(missing_ok=True)
    for folder in (lock.parent, lock.parent.parent):
        try:
            folder.rmdir()  # only if empty
        except OSError:
            break
