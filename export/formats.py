"""The format table: every export format, its `--to` group, file name, precisions and the options only it reads.

Argument checking reads this table and nothing else, so adding a format is one row plus its writer, and an option
given to a format that cannot use it is refused by name instead of silently ignored (ultralytics' exporter does the
same). A writer is `writer(program, path, meta, precision, options) -> detail dict` and must write exactly `path`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from export.targets import ML_PROGRAM_TARGET, ML_PROGRAM_TARGETS, NEURALNETWORK_TARGET, ipados
from core.errors import PipelineError


def _write_mlpackage(*args, **kwargs):
    from export.coreml import write_mlpackage  # coremltools takes seconds to import: only when converting

    return write_mlpackage(*args, **kwargs)


def _write_mlmodel(*args, **kwargs):
    from export.coreml import write_mlmodel

    return write_mlmodel(*args, **kwargs)


def _write_onnx(*args, **kwargs):
    from export.onnx_format import write_onnx

    return write_onnx(*args, **kwargs)


def minimum_os(key: str, options: dict) -> str | None:
    """The target a format's file is written for with these options (its --deployment-target or fixed); None: ONNX."""
    if key == "mlpackage":
        return options.get("deployment_target") or ML_PROGRAM_TARGET
    return NEURALNETWORK_TARGET if key == "mlmodel" else None


@dataclass(frozen=True)
class Format:
    key: str  # the name in encoder.json and in --coreml-format
    to: str  # the --to group that writes it
    file: str  # in RUN/export/; an .mlpackage is a directory
    what: str  # one line for humans
    precisions: tuple[str, ...]  # the first is the default
    options: dict[str, tuple[Any, tuple]] = field(default_factory=dict)  # option -> (default, allowed values)
    writer: Callable[..., dict] | None = None


FORMATS: dict[str, Format] = {
    "mlpackage": Format("mlpackage", "coreml", "encoder.mlpackage", "Core ML ML Program", ("fp16", "fp32"),
                        {"deployment_target": (ML_PROGRAM_TARGET, ML_PROGRAM_TARGETS)}, _write_mlpackage),
    "mlmodel": Format("mlmodel", "coreml", "encoder.mlmodel", "Core ML NeuralNetwork, one file", ("fp16", "fp32"), {},
                      _write_mlmodel),
    "onnx": Format("onnx", "onnx", "encoder.onnx", "ONNX, one file, dynamic batch",
                   ("fp32",), {"opset": (18, (18, 19, 20, 21))}, _write_onnx),  # 17: the torch.export exporter
    # writes 18 and cannot down-convert (its version converter fails on the Reduce ops)
}
TO_CHOICES = ("coreml", "onnx", "all")
COREML_FORMATS = tuple(key for key, f in FORMATS.items() if f.to == "coreml")  # the Core ML files
COREML_CHOICES = {**{key: (key,) for key in COREML_FORMATS}, "both": COREML_FORMATS}  # --coreml-format -> formats
OPTION_NAMES = tuple(sorted({name for f in FORMATS.values() for name in f.options}))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def select_formats(to: str, coreml_format: str | None, precision: str | None, options: dict[str, Any]) -> list[tuple[Format, str, dict]]:
    """[(format, precision, its options)] for a request, or a one-line error for an impossible combination.
    `None` means "not given": each format then uses its own default from the table."""
    if to not in TO_CHOICES:
        raise PipelineError(f"--to {to!r}: unknown format; use one of {', '.join(TO_CHOICES)}")
    if coreml_format is not None and coreml_format not in COREML_CHOICES:
        raise PipelineError(f"--coreml-format {coreml_format!r}: use one of {', '.join(COREML_CHOICES)}")
    if coreml_format is not None and to == "onnx":
        raise PipelineError(f"--coreml-format {coreml_format} needs --to coreml or --to all (--to onnx writes no Core ML)")
    coreml_keys = COREML_CHOICES[coreml_format or "both"]
    chosen = [f for f in FORMATS.values() if to in (f.to, "all") and (f.to != "coreml" or f.key in coreml_keys)]
    for name, value in options.items():
        if name not in OPTION_NAMES:
            raise PipelineError(f"unknown export option {_flag(name)}")
        if value is None:
            continue
        users = [f for f in FORMATS.values() if name in f.options]
        if not any(name in f.options for f in chosen):
            raise PipelineError(f"{_flag(name)} applies to {', '.join(f.key for f in users)}, which this export "
                                f"(--to {to}{' --coreml-format ' + coreml_format if coreml_format else ''}) does not write")
        allowed = users[0].options[name][1]
        if value not in allowed:
            raise PipelineError(f"{_flag(name)} {value!r}: use one of {', '.join(map(str, allowed))}")
    plan = []
    for f in chosen:
        if precision is not None and precision not in f.precisions:
            raise PipelineError(f"--precision {precision}: {f.key} is written in {'/'.join(f.precisions)} only; leave "
                                f"--precision out to use each format's default, or export {f.key} separately")
        own = {name: (options.get(name) if options.get(name) is not None else default)
               for name, (default, _) in f.options.items()}
        plan.append((f, precision or f.precisions[0], own))
    return plan


def describe_table() -> str:
    """The table as text, for --help and the README."""
    rows = []
    for f in FORMATS.values():
        opts = ", ".join(f"{_flag(n)} {'|'.join(map(str, allowed))} (default {d})" for n, (d, allowed) in f.options.items())
        target = minimum_os(f.key, {})
        runs_on = f"{ipados(target)}{' by default' if f.options.get('deployment_target') else ''}" if target else "ONNX Runtime"
        rows.append(f"{f.key:10s} --to {f.to:6s} {f.file:18s} {'|'.join(f.precisions):10s} {runs_on:23s} {opts}")
    return "\n".join(rows)
