"""The format table: every export format, one row each, owning all the pipeline knows about it: its `--to` group,
file name, precisions, the options only it reads, its writer (`pipeline export`), its checker (`pipeline validate`'s
runtime for it), the libraries it needs (`pipeline doctor`) and its help line. The artifact names the job service
offers for download, the `--to` choices and the export/validate help read this table and nothing else, so adding a
format is one row plus the module that holds its writer and checker.

Argument checking reads the table too, so an option given to a format that cannot use it is refused by name instead
of silently ignored (ultralytics' exporter does the same). A writer is `writer(program, path, meta, precision,
options) -> detail dict` and must write exactly `path`; a checker is `checker(path, images) -> (runtime name,
N x D features, the precision the file computes in or None)`, images uint8 RGB N x 3 x S x S. Both are named by
module and function and imported when called: coremltools and onnxruntime take seconds to import, and the CLI
reads this table for its flags.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from export import compression
from export.targets import ML_PROGRAM_TARGET, ML_PROGRAM_TARGETS, NEURALNETWORK_TARGET, ipados
from core.errors import PipelineError
from core.rundir import compressed_file
from train.backbones import row


def lazy(module: str, name: str) -> Callable:
    """module.name, imported on the first call."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = f"{module}.{name}"
    return call


def minimum_os(key: str, options: dict) -> str | None:
    """The target a format's file is written for with these options (its --deployment-target or fixed); None: ONNX."""
    if key == "mlpackage":
        return options.get("deployment_target") or ML_PROGRAM_TARGET
    return NEURALNETWORK_TARGET if key == "mlmodel" else None


@dataclass(frozen=True)
class Format:
    key: str  # the name in encoder.json and in --coreml-format
    to: str  # the --to group that writes it
    file: str  # in RUN/export/ (an .mlpackage is a directory); also its download name in the job service
    what: str  # its help line
    precisions: tuple[str, ...]  # the first is the default
    options: dict[str, tuple[Any, tuple]] = field(default_factory=dict)  # option -> (default, allowed values)
    writer: Callable[..., dict] | None = None
    checker: Callable[..., tuple] | None = None
    libraries: tuple[str, ...] = ()  # what writing and checking it import (`pipeline doctor` lists their versions)
    per_op_precision: bool = True  # can keep chosen ops in fp32 in an fp16 file (a backbone's fp32_stem needs it)


FORMATS: dict[str, Format] = {
    "mlpackage": Format("mlpackage", "coreml", "encoder.mlpackage", "Core ML ML Program", ("fp16", "fp32"),
                        {"deployment_target": (ML_PROGRAM_TARGET, ML_PROGRAM_TARGETS),
                         "compress": (compression.NONE, compression.names())},
                        lazy("export.coreml", "write_mlpackage"), lazy("export.coreml", "check_mlpackage"),
                        ("coremltools",)),
    "mlmodel": Format("mlmodel", "coreml", "encoder.mlmodel", "Core ML NeuralNetwork, one file", ("fp16", "fp32"),
                      {"compress": (compression.NONE, compression.neuralnetwork_names())},
                      lazy("export.coreml", "write_mlmodel"), lazy("export.coreml", "check_mlmodel"), ("coremltools",),
                      per_op_precision=False),  # fp16 weights; the device picks one compute precision for all ops
    "onnx": Format("onnx", "onnx", "encoder.onnx", "ONNX, one file, dynamic batch",
                   ("fp32",), {"opset": (18, (18, 19, 20, 21))},  # 17: the torch.export exporter writes 18 and
                   lazy("export.onnx_format", "write_onnx"),  # cannot down-convert (its converter fails on the Reduce ops)
                   lazy("export.onnx_format", "check_onnx"), ("onnx", "onnxruntime")),
}
COREML = "coreml"  # the --to group of the Core ML files: --coreml-format picks among them, the real runtime runs them


def to_choices() -> tuple[str, ...]:
    """--to's values: each group of the table, then all."""
    return (*dict.fromkeys(f.to for f in FORMATS.values()), "all")


def coreml_formats() -> tuple[str, ...]:
    return tuple(key for key, f in FORMATS.items() if f.to == COREML)


def coreml_choices() -> dict[str, tuple[str, ...]]:
    """--coreml-format -> the Core ML files it writes."""
    return {**{key: (key,) for key in coreml_formats()}, "both": coreml_formats()}


def option_names() -> tuple[str, ...]:
    return tuple(sorted({name for f in FORMATS.values() for name in f.options}))


def libraries() -> tuple[str, ...]:
    return tuple(dict.fromkeys(lib for f in FORMATS.values() for lib in f.libraries))


def summary() -> str:
    """The formats in one line: `ML Program (.mlpackage), ...` for the commands' help."""
    return ", ".join(f"{f.key} ({f.file})" for f in FORMATS.values())


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def select_formats(to: str, coreml_format: str | None, precision: str | None, options: dict[str, Any]) -> list[tuple[Format, str, dict]]:
    """[(format, precision, its options)] for a request, or a one-line error for an impossible combination.
    `None` means "not given": each format then uses its own default from the table."""
    if to not in to_choices():
        raise PipelineError(f"--to {to!r}: unknown format; use one of {', '.join(to_choices())}")
    if coreml_format is not None and coreml_format not in coreml_choices():
        raise PipelineError(f"--coreml-format {coreml_format!r}: use one of {', '.join(coreml_choices())}")
    if coreml_format is not None and to not in (COREML, "all"):
        raise PipelineError(f"--coreml-format {coreml_format} needs --to coreml or --to all (--to {to} writes no Core ML)")
    coreml_keys = coreml_choices()[coreml_format or "both"]
    chosen = [f for f in FORMATS.values() if to in (f.to, "all") and (f.to != COREML or f.key in coreml_keys)]
    for name, value in options.items():
        if name not in option_names():
            raise PipelineError(f"unknown export option {_flag(name)}")
        if value is None:
            continue
        users = [f for f in FORMATS.values() if name in f.options]
        if not any(name in f.options for f in chosen):
            raise PipelineError(f"{_flag(name)} applies to {', '.join(f.key for f in users)}, which this export "
                                f"(--to {to}{' --coreml-format ' + coreml_format if coreml_format else ''}) does not write")
        allowed = tuple(dict.fromkeys(v for f in users for v in f.options[name][1]))
        if value not in allowed:
            raise PipelineError(f"{_flag(name)} {value!r}: use one of {', '.join(map(str, allowed))}")
    plan = []
    for f in chosen:
        if precision is not None and precision not in f.precisions:
            raise PipelineError(f"--precision {precision}: {f.key} is written in {'/'.join(f.precisions)} only; leave "
                                f"--precision out to use each format's default, or export {f.key} separately")
        own = {name: (options.get(name) if options.get(name) is not None else default)
               for name, (default, _) in f.options.items()}
        if own.get("compress", compression.NONE) != compression.NONE:
            why = compression.refusal(own["compress"], f.key, minimum_os(f.key, own))
            if precision == "fp32":
                why = (f"--compress {own['compress']} stores weights that Core ML decompresses to fp16 (fp16 "
                       f"activations): leave --precision out")
            if why:
                raise PipelineError(why)
        plan.append((f, precision or f.precisions[0], own))
    return plan


def for_backbone(plan: list[tuple[Format, str, dict]], backbone: str, coreml_format: str | None,
                 say=print) -> tuple[list[tuple[Format, str, dict]], set[str]]:
    """(the plan without the formats that cannot hold this backbone within the parity bound, their keys). A backbone
    whose stem must stay fp32 cannot go into a format with one precision for every op: refused in one line when the
    user named that format, else left out with a note, so the default export writes every format that can hold it."""
    if not row(backbone).fp32_stem:
        return plan, set()
    kept, left_out = [], set()
    for entry in plan:
        f = entry[0]
        if f.per_op_precision:
            kept.append(entry)
            continue
        why = (f"{f.file} cannot hold {backbone}: its stem must stay fp32 (in fp16 it breaks the 1 % parity bound), "
               f"and {f.file} has one precision for every op; use --coreml-format mlpackage")
        if coreml_format == f.key:
            raise PipelineError(why)
        say(f"not writing {why}")
        left_out.add(f.key)
    return kept, left_out


def artifact_file(f: Format, own: dict[str, Any]) -> str:
    """The file a format writes with these options: its table name, with the compression in it when compressed,
    so several compressions of one run sit side by side."""
    return compressed_file(f.file, own.get("compress"))


def describe_table() -> str:
    """The table as text, for --help and the README."""
    rows = []
    for f in FORMATS.values():
        opts = ", ".join(f"{_flag(n)} {'|'.join(map(str, allowed))} (default {d})" for n, (d, allowed) in f.options.items())
        target = minimum_os(f.key, {})
        runs_on = f"{ipados(target)}{' by default' if f.options.get('deployment_target') else ''}" if target else "ONNX Runtime"
        rows.append(f"{f.key:10s} --to {f.to:6s} {f.file:18s} {'|'.join(f.precisions):10s} {runs_on:23s} {opts}")
    return "\n".join(rows)
