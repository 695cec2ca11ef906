"""Compressing and deploying a variant: solving each group with a method (compression), per-group budgets
(allocation), swapping the result into the model and back (apply), and the 2:4 weight kernels (semi_structured)."""
