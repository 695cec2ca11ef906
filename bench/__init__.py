"""acbench: a benchmark harness for post-training activation compression, as a library and a CLI (`bench`).

The Python calls (bench/api/): `load_model`, `compress`, `evaluate`, `sweep`, `load_results`. They are loaded on
first use, so `import acbench` (and the CLI's start) stays light. `acbench.UserError` is what every call raises for a
problem with what it was given (one line naming it and the fix), so a program can catch it.

Everything acbench installs is under this one name: `acbench.methods`, `acbench.tasks`, `acbench.core`, ... are its
subpackages (the repository's methods/, tasks/, core/ folders), so a user's own `tasks.py` or `methods/` beside a
notebook shadows none of it.
"""

from acbench.core.version import __version__

_API = ("Compressed", "LoadedModel", "compare", "compress", "evaluate", "list_methods", "list_tasks", "load_model",
        "load_results", "statistics_cache", "sweep", "to_frame")
__all__ = ["__version__", "UserError", *_API]


def __getattr__(name: str):
    if name == "UserError":
        from acbench.core.errors import UserError

        return UserError
    if name in _API:
        from acbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'acbench' has no attribute '{name}'")
