"""The leaf every other package stands on: errors, the run directory and its file names, the config machinery, the
device and the Core ML runtime, views, quiet imports. It imports nothing of this project outside itself."""

__version__ = "0.1.0"
