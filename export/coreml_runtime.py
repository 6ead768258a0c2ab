"""Whether the real Core ML runtime can run here (macOS with coremltools' native module), and why not."""

from __future__ import annotations

import platform


def coreml_can_predict() -> tuple[bool, str]:
    if platform.system() != "Darwin":
        return False, f"Core ML runs only on macOS (this is {platform.system()}); the reference evaluator is used instead"
    try:
        from coremltools import libcoremlpython  # noqa: F401  (the native bridge predict() needs)
    except Exception as e:  # missing wheel build, wrong arch
        return False, f"coremltools has no native runtime here ({type(e).__name__}); reinstall coremltools for macOS"
    return True, ""
