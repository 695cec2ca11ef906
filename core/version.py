"""acbench's version: recorded in every result, checkpoint and statistics-cache key (a module of its own, at the bottom,
so that no part of the package imports the package's door to read it)."""

__version__ = "0.1.0"
