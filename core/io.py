"""Where converted models, parsed data and calibration statistics live (never in the repository)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def _usable_folder(root: Path, variable: str) -> Path:
    """`root`, made if missing; a path that is a file, or that cannot be made or written, is one line naming the
    variable that set it."""
    from acbench.core.errors import UserError

    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except (OSError, ValueError) as e:
        why = "it is a file" if root.is_file() else (getattr(e, "strerror", None) or str(e))
        raise UserError(f"{variable} {str(root)!r} cannot serve as a folder ({why}): point it at a writable "
                               "folder, or unset it") from None
    return root


def cache_dir() -> Path:
    if os.environ.get("ACBENCH_CACHE"):
        return _usable_folder(Path(os.environ["ACBENCH_CACHE"]), "ACBENCH_CACHE")
    return _usable_folder(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "acbench",
                          "the cache folder ($XDG_CACHE_HOME/acbench or ~/.cache/acbench; ACBENCH_CACHE moves it)")


def stats_cache_dir() -> Path:
    """Calibration statistics: $ACBENCH_STATS_CACHE where set (the test suite gives each test its own), else the
    cache's stats/ folder."""
    if os.environ.get("ACBENCH_STATS_CACHE"):
        return _usable_folder(Path(os.environ["ACBENCH_STATS_CACHE"]), "ACBENCH_STATS_CACHE")
    return cache_dir() / "stats"


STATS_CACHE_LIMIT = "ACBENCH_STATS_CACHE_LIMIT"


def stats_cache_limit() -> int | None:
    """The bound on the statistics cache's size on disk ($ACBENCH_STATS_CACHE_LIMIT, e.g. 50GB), None where unset:
    a calibration that would take the cache past it is refused before it starts."""
    from acbench.core.units import parse_bytes

    text = os.environ.get(STATS_CACHE_LIMIT, "").strip()
    return parse_bytes(text, STATS_CACHE_LIMIT) if text else None


def folder_bytes(root: Path) -> int:
    """The bytes of every file under `root` (0 where it does not exist); a file removed while counted is skipped."""
    total = 0
    for f in root.rglob("*") if root.is_dir() else ():
        try:
            total += f.stat().st_size if f.is_file() else 0
        except OSError:
            continue
    return total


_HASHED: dict[tuple, str] = {}  # (path, inode, size, mtime_ns) -> digest: a file hashed once per process


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The file's sha256. A model's weight files are hashed for its fingerprint and again to check a checkpoint's
    digests: the second read of an unchanged file (same inode, size and modification time) is skipped."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(chunk):
                h.update(block)
        _HASHED[key] = h.hexdigest()
    return _HASHED[key]


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write_via(path, lambda tmp: tmp.write_bytes(data))


def _umask() -> int:
    mask = os.umask(0o022)  # read by setting it: done once, at import, before any thread starts
    os.umask(mask)
    return mask


_UMASK = _umask()


def readable_as_umask(path: Path) -> None:
    """A written file's mode as the user's umask allows (writers that go through a temp file leave 0600)."""
    Path(path).chmod(0o666 & ~_UMASK)


def atomic_write_via(path: Path, write) -> None:
    """`write(tmp)` fills a unique temp file in the same directory, which is fsynced, then renamed onto `path`:
    readers never see a partial file, and two processes writing the same path never share a temp file. (A writer
    that streams, such as safetensors' save_file, never holds the whole file in memory.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would make results unreadable to the user's group
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_user_text(path, what: str) -> str:
    """A user-supplied text file, strictly UTF-8: a missing file, a folder or binary content is one clear line."""
    from .errors import DataError, UserError

    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder, not a file: pass the file itself")
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist: pass an existing file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(path, None, f"not UTF-8 text (byte {e.start}): pass a UTF-8 text file") from None
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read ({e.strerror}): check its permissions") from None


def available_bytes() -> int:
    """The memory the system can give this process now (MemAvailable), or half of the physical memory where there
    is no procfs."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError, IndexError):
        return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // 2


def folder_problem(path, what: str) -> str | None:
    """Why `path` cannot be read as a folder, or None: a file where a folder is wanted is named as a file, never as
    missing."""
    path = Path(path).expanduser()
    if path.is_dir():
        return None
    return f"{what} {path} is a file, not a folder" if path.exists() else f"{what} {path} does not exist"


def unwritable(folder: Path) -> str | None:
    """Why files cannot be written in `folder`, or None if they can. An absent folder is not created (a refused run
    leaves no empty folders): its nearest existing parent must be a writable folder."""
    folder = Path(folder).expanduser().absolute()
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return "not a folder" if existing is not None else "no such folder"
    try:
        probe = existing / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None
