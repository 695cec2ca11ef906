"""acbench: a benchmark harness for post-training activation compression, as a library and a CLI (`bench`).

The Python calls (bench/api.py): `load_model`, `compress`, `evaluate`, `sweep`, `load_results`. They are loaded on
first use, so `import bench` (and the CLI's start) stays light. `bench.UserError` is what every call raises for a
problem with what it was given (one line naming it and the fix), so a program can catch it.
"""

__version__ = "0.1.0"

_API = ("Compressed", "LoadedModel", "compare", "compress", "evaluate", "load_model", "load_results", "methods",
        "statistics_cache", "sweep", "tasks", "to_frame")
__all__ = ["__version__", "UserError", *_API]


def __getattr__(name: str):
    if name == "UserError":
        from core.errors import UserError

        return UserError
    if name in _API:
        from bench import api

        return getattr(api, name)
    raise AttributeError(f"module 'bench' has no attribute '{name}'")
