"""The runner: CLI, config, run directory, device and precision policy."""

__version__ = "0.1.0"
