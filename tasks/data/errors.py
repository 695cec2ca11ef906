"""Malformed data: one line naming the file, the row and what is wrong."""

from bench.errors import UserError


class DataError(UserError):
    def __init__(self, path, row, problem: str):
        where = f"{path}" + (f", row {row}" if row is not None else "")
        super().__init__(f"malformed data in {where}: {problem}")
