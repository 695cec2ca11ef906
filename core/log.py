"""acbench's messages go through one `acbench` logger: the status lines of a run (INFO) and its warnings (WARNING).
By default they are written on stdout between tqdm's progress bars, as the CLI has always printed them; a caller
who configures the logger (its level, its handlers) owns them, and an API call made with progress=False drops the
status lines for its duration."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

from tqdm.auto import tqdm

logger = logging.getLogger("acbench")


class _AboveTheBars(logging.Handler):
    """Each message on a line of its own above any progress bar, on whatever stdout is at the time (a captured
    one included)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stdout)
        except Exception:  # logging's contract: a handler never raises into the caller
            self.handleError(record)


if not any(isinstance(h, _AboveTheBars) for h in logger.handlers):
    _handler = _AboveTheBars()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(_handler)
if logger.level == logging.NOTSET:  # a level the caller set before importing acbench stays
    logger.setLevel(logging.INFO)
logger.propagate = False  # the root logger's handlers would print every line twice


def say(message: str) -> None:
    """A status line."""
    logger.info(message)


def warn(message: str) -> None:
    """A warning line, written as 'warning: ...'."""
    logger.warning(f"warning: {message}")


def shows_progress(progress: bool) -> bool:
    """Whether bars show: asked for, and the logger lets status lines through (a caller who raised its level to
    WARNING silenced both)."""
    return bool(progress) and logger.isEnabledFor(logging.INFO)


def _status(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


@contextmanager
def status_lines(shown: bool):
    """Within: the status lines dropped unless `shown` (an API call's progress=False); warnings always pass."""
    if shown:
        yield
        return
    logger.addFilter(_status)
    try:
        yield
    finally:
        logger.removeFilter(_status)
