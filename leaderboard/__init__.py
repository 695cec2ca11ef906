"""Leaderboards built only from stored result files (never from the runner)."""
