"""User-facing errors: one line naming the problem and the fix, exit status 2, never a traceback."""


class UserError(Exception):
    """A problem with the user's input; the message names the problem and how to fix it."""

    exit_code = 2


def did_you_mean(name: str, known) -> str:
    import difflib

    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"{hint} Known: {', '.join(known)}."


class DataError(UserError):
    """Malformed or missing data: one line naming the file, the row and what is wrong."""

    def __init__(self, path, row, problem: str):
        where = f"{path}" + (f", row {row}" if row is not None else "")
        super().__init__(f"malformed data in {where}: {problem}")


def exception_line(e: BaseException) -> str:
    """'Type: the first line of its message', for a line that names someone else's failure."""
    text = str(e).splitlines()[0] if str(e) else "(no message)"
    return f"{type(e).__name__}: {text}"
