"""coremltools without the lines it prints that are known not to matter here; everything else it says stays visible.

Filters, not log levels: raising the "coremltools" logger to ERROR would also hide its real warnings (an op lowered
with a fallback, a precision loss), which a user exporting a model must see.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import re

# Each pattern is one message coremltools logs on import, and why it does not matter to this project:
BENIGN_IMPORT_MESSAGES = (
    # Off macOS the native Core ML bridge does not exist, so every proxy class fails to load (eight lines). The
    # project never predicts through it there: validate runs its own reference evaluators (docs/export.md, validate).
    re.compile(r"^Failed to load _ML\w+Proxy: No module named 'coremltools\.libcoremlpython'"),
    # Only coremltools' scikit-learn *model converter* is disabled; the project converts torch programs, and uses
    # scikit-learn for linear evaluation only.
    re.compile(r"^scikit-learn version \S+ is not supported\."),
    # A torch newer than coremltools' test matrix: every converted artifact is checked against PyTorch by
    # `pipeline validate` (parity gates), which is the test that matters for this project's models.
    re.compile(r"^Torch version \S+ has not been tested with coremltools\."),
)

# The modules whose conversion loops draw a tqdm bar per pass ("Converting PyTorch Frontend ==> MIL Ops",
# "Running MIL ... pipeline", "Translating MIL ==> NeuralNetwork Ops"), by the name they import tqdm under.
CONVERSION_BARS = (
    ("coremltools.converters.mil.frontend.torch.ops", "_tqdm"),
    ("coremltools.converters.mil.mil.passes.pass_pipeline", "tqdm"),
    ("coremltools.converters.mil.backend.nn.op_mapping", "_tqdm"),
    ("coremltools.optimize.coreml._quantization_passes", "tqdm"),  # "Running compression pass ..." (--compress)
)


class _DropBenign(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in BENIGN_IMPORT_MESSAGES)


def import_coremltools():
    """`import coremltools`, with the benign import-time lines above filtered out. Every import of coremltools in
    the project goes through here (a bare import before this one would print them)."""
    logger = logging.getLogger("coremltools")  # every coremltools module logs through this one logger
    if not any(isinstance(f, _DropBenign) for f in logger.filters):
        logger.addFilter(_DropBenign())
    import coremltools

    return coremltools


@contextlib.contextmanager
def conversion_bars_off():
    """Inside: coremltools' per-pass progress bars are not drawn (a stage prints one line per artifact instead).
    tqdm reads TQDM_DISABLE once, when it is imported, and the pipeline's own training bar must stay, so the bars
    are turned off where coremltools creates them, for the duration of the conversion only."""
    import tqdm

    patched = []
    try:
        for module_name, attr in CONVERSION_BARS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # another coremltools layout: its bars show, nothing breaks
                continue
            if getattr(module, attr, None) is tqdm.tqdm:
                patched.append((module, attr))
                setattr(module, attr, functools.partial(tqdm.tqdm, disable=True))
        yield
    finally:
        for module, attr in patched:
            setattr(module, attr, tqdm.tqdm)
