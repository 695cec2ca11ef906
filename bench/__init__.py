"""acbench: calibration, the sweep runner, the results store and measurement."""

__version__ = "0.1.0"
