"""`python -m pipeline` (what torchrun launches) is the same CLI as the `pipeline` script."""

from pipeline.cli import entry

entry()
