"""acbench's messages go through one `acbench` logger: the status lines of a run (INFO) and its warnings (WARNING).

As the standard library asks of a library, the logger has only a NullHandler and propagates: the application
chooses the handlers. The CLI (and a Ray worker it starts) is that application: it writes the lines on stdout between
tqdm's progress bars (`console_lines`). A Python call does the same for its duration only when nothing else would
receive them (no handler on the logger or above it); a caller who configured logging (`logging.basicConfig()`, a
handler of its own) gets acbench's records through its own handlers, at the levels it set, and no lines besides.
An API call made with progress=False drops the status lines for its duration.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

from tqdm.auto import tqdm

logger = logging.getLogger("acbench")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
    logger.addHandler(logging.NullHandler())


class _AboveTheBars(logging.Handler):
    """Each message on a line of its own above any progress bar, on whatever stdout is at the time (a captured
    one included)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stdout)
        except Exception:  # logging's contract: a handler never raises into the caller
            self.handleError(record)


def has_receiver() -> bool:
    """Whether a handler other than a NullHandler would receive the logger's records (on it or an ancestor it
    propagates to)."""
    node = logger
    while node is not None:
        if any(not isinstance(h, logging.NullHandler) for h in node.handlers):
            return True
        node = node.parent if node.propagate else None
    return False


@contextmanager
def console_lines(only_if_unheard: bool = False):
    """Within: the logger's records written on stdout above the bars, status lines included (the level INFO,
    unless one was set on the logger). With only_if_unheard, nothing is changed where a handler already receives
    them. Everything is put back on the way out."""
    if only_if_unheard and has_receiver():
        yield
        return
    handler = _AboveTheBars()
    handler.setFormatter(logging.Formatter("%(message)s"))
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    if level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False  # an ancestor's handler added meanwhile would print every line twice
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def say(message: str) -> None:
    """A status line."""
    logger.info(message)


def warn(message: str) -> None:
    """A warning line, written as 'warning: ...'."""
    logger.warning(f"warning: {message}")


def shows_progress(progress: bool) -> bool:
    """Whether bars show: asked for, and not silenced (a caller who set the logger's level above INFO silenced the
    status lines and the bars)."""
    return bool(progress) and logger.level <= logging.INFO


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
