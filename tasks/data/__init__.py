"""Data sources for the tasks: embedded (from PyPI packages), local files in the original formats, and the hub."""
