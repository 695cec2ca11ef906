"""The caller's process, left as it was: torch's thread count and random state, numpy's and Python's random states,
os.environ, the working directory, and transformers' progress bars and log handler are put back after each call (a run
sets threads and seeds for itself, torch and the hub probe set environment variables, a quiet load silences
transformers' bars); a refusal shared with the CLI is said in the call's keywords."""

from __future__ import annotations
import functools
import inspect
import os
import random
from contextlib import contextmanager
import torch

from acbench.core.errors import UserError
from acbench.core.log import console_lines, shows_progress, status_lines
from acbench.tasks.data.text_data import SHOWS_PARSE_BAR, WRITES_DATA_CACHE


@contextmanager
def kept_state():
    import numpy as np
    from transformers.utils import logging as hf_logging

    root = hf_logging._get_library_root_logger()
    handler = getattr(hf_logging, "_default_handler", None)
    saved = (torch.get_num_threads(), torch.get_rng_state(), np.random.get_state(), random.getstate(),
             dict(os.environ), os.getcwd(), hf_logging.is_progress_bar_enabled(), handler in root.handlers)
    try:
        yield
    finally:
        threads, torch_rng, np_rng, py_rng, env, cwd, bars, had_handler = saved
        torch.set_num_threads(threads)
        torch.set_rng_state(torch_rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        for key in set(os.environ) - set(env):
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        if os.getcwd() != cwd:
            os.chdir(cwd)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
        if had_handler and handler not in root.handlers:
            hf_logging.enable_default_handler()
        elif not had_handler and handler in root.handlers:
            hf_logging.disable_default_handler()


@contextmanager
def _reset_after(tokens):
    try:
        yield
    finally:
        for token in tokens:
            token.var.reset(token)


def keeps_caller_state(fn):
    """`fn` run inside kept_state, its refusals in the API's words (api_words). Its status lines go through the
    `acbench` logger, dropped for a call made with progress=False; a caller who set that logger above INFO gets no
    bars either."""
    params = inspect.signature(fn).parameters
    takes_progress = "progress" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())  # sweep's

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if takes_progress and not shows_progress(kwargs.get("progress", True)):
            kwargs["progress"] = False
        shown = kwargs.get("progress", True) is not False
        # the embedded text's parse is written to the cache folder only for a call that asked for the cache
        asked = (WRITES_DATA_CACHE.set(kwargs.get("cache") is True), SHOWS_PARSE_BAR.set(shown))
        with kept_state(), console_lines(only_if_unheard=True), status_lines(shown), _reset_after(asked):
            try:
                return fn(*args, **kwargs)
            except UserError as e:
                raise UserError(api_words(str(e), fn.__name__)) from None
    return wrapper

# a flag, as a refusal shared with the CLI names it -> the keyword of the call (the rest: its snake_case name)
_KEYWORDS = {"compress": {"method-option": "method_options"},
             "sweep": {"task-option": "task_options", "method-option": "method_options",
                       "analysis-option": "analysis_options", "no-latency": "measure_latency=False",
                       "quiet": "progress=False"},
             "evaluate": {"task-option": "task_options"}}


def api_words(message: str, call: str) -> str:
    """A refusal shared with the CLI, in the words of the Python call that met it: `--calib-samples` becomes
    `calib_samples=`, and the config file a Python caller never wrote is not mentioned."""
    import re

    names = _KEYWORDS.get(call, {})

    def keyword(m):
        flag, value = m.group(1), m.group(2)
        word = names.get(flag, flag.replace("-", "_"))
        return word if "=" in word else f"{word}={value or ''}"

    message = re.sub(r"(?:,? or (?:that|its) (?:key|block) (?:in|of) the --config file)", "", message)
    # "--rank 0.5" -> "rank=0.5"; "--calib-samples must be ..." -> "samples= must be ..."
    # a command quoted in backticks (`bench run --executor ray`) is one to type, and stays as it is
    words = r"(?:must|is|are|has|have|needs|and|or|with|to|for|of|in|exceeds|names|takes|cannot|does|only)\b"
    flag = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)(?: (?!" + words + r")([^\s:;,`]+))?")
    parts = message.split("`")
    return "`".join(part if i % 2 else flag.sub(keyword, part) for i, part in enumerate(parts))
