"""Malformed or missing data files: one line naming the file, the row and what is wrong."""

from pathlib import Path

from core.errors import UserError


class DataError(UserError):
    def __init__(self, path, row, problem: str):
        where = f"{path}" + (f", row {row}" if row is not None else "")
        super().__init__(f"malformed data in {where}: {problem}")


def read_user_text(path, what: str) -> str:
    """A user-supplied text file, strictly UTF-8: a missing file, a folder or binary content is one clear line."""
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
