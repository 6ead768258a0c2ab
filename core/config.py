"""Config = a typed dataclass of defaults, then a YAML file, then command-line flags; an unknown key is an error.

Each stage keeps its options in one dataclass whose fields carry a one-line reason (`opt(default, why)`); the
CLI flags are generated from the same fields, so a flag and a YAML key can never drift apart.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any, NamedTuple

import click
import yaml

from core.errors import PipelineError


class Range(NamedTuple):
    """The values a numeric option may take, both ends included unless marked open. Declared on the option, so the
    CLI, a YAML file and the job service refuse the same values with the same words: outside it a run would train
    on nonsense (a negative rate ascends the loss, a momentum above 1 extrapolates) or fail far from the cause."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def admits(self, value) -> bool:
        return ((self.lo < value) if self.lo_open else (self.lo <= value)) and \
            ((value < self.hi) if self.hi_open else (value <= self.hi))

    def __str__(self) -> str:
        lo = f"{'>' if self.lo_open else '>='} {_number(self.lo)}" if self.lo > -math.inf else ""
        hi = f"{'<' if self.hi_open else '<='} {_number(self.hi)}" if self.hi < math.inf else ""
        return " and ".join(filter(None, (lo, hi)))


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def opt(default: Any, why: str, choices: tuple[str, ...] | None = None, range: Range | None = None):
    """A config field: its default, the one-line reason for it (shown as the flag's help), and the values it may
    take: `choices` for a string, `range` for a number (None, where the type allows it, always passes)."""
    return dataclasses.field(default=default, metadata={"why": why, "choices": choices, "range": range})


def _base_type(tp: Any) -> type:
    """`int | None` -> int; the type a YAML value or flag is coerced to."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def _fields(cls) -> dict[str, dataclasses.Field]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        f.type = hints[f.name]
        out[f.name] = f
    return out


def _coerce(cls, key: str, value: Any, source: str) -> Any:
    f = _fields(cls)[key]
    if value is None:
        return None
    tp = _base_type(f.type)
    try:
        if tp is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            value = value.lower() in ("true", "1", "yes")
        elif tp is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            value = float(value)
        elif tp is int and not isinstance(value, bool):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            value = int(value)
        elif tp is str and isinstance(value, bool) and {"on", "off"} <= set(f.metadata.get("choices") or ()):
            value = "on" if value else "off"  # YAML 1.1 reads an unquoted on/off as a bool
        elif tp is str:
            value = str(value)
        elif not isinstance(value, tp):
            raise ValueError(value)
    except (TypeError, ValueError, OverflowError):
        raise PipelineError(f"{source}: `{key}` must be {tp.__name__}, got {value!r}") from None
    if tp is float and not math.isfinite(value):
        raise PipelineError(f"{source}: `{key}` must be a finite number, got {value!r}")
    choices = f.metadata.get("choices")
    if choices and value not in choices:
        raise PipelineError(f"{source}: `{key}` must be one of {', '.join(choices)}; got {value!r}")
    bounds = f.metadata.get("range")
    if bounds is not None and not bounds.admits(value):
        raise PipelineError(f"{source}: `{key}` must be {bounds}, got {value!r}")
    return value


def load_config(cls, config_file: str | Path | None = None, overrides: dict[str, Any] | None = None):
    """Defaults < YAML file < overrides (flags). Unknown keys in either name themselves in the error."""
    known = _fields(cls)
    values: dict[str, Any] = {}
    if config_file:
        path = Path(config_file)
        if not path.is_file():
            raise PipelineError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise PipelineError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
        if not isinstance(data, dict):
            raise PipelineError(f"config file {path} must be a mapping of option: value")
        for key, value in data.items():
            key = str(key).replace("-", "_")
            if key not in known:
                raise PipelineError(f"config file {path}: unknown key `{key}` (known: {', '.join(known)})")
            values[key] = _coerce(cls, key, value, str(path))
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in known:
            raise PipelineError(f"unknown option `{key}`")
        values[key] = _coerce(cls, key, value, f"--{key.replace('_', '-')}")
    return cls(**values)


def check_ranges(cfg) -> None:
    """Every declared range and finiteness on a config built in code (a recipe's values filled in), with the words
    load_config uses for a file or a flag."""
    for name, f in _fields(type(cfg)).items():
        value = getattr(cfg, name)
        bounds = f.metadata.get("range")
        if isinstance(value, float) and not math.isfinite(value):
            raise PipelineError(f"`{name}` must be a finite number, got {value!r}")
        if bounds is not None and value is not None and not bounds.admits(value):
            raise PipelineError(f"`{name}` must be {bounds}, got {value!r}")


def to_dict(cfg) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def options_from(cls, skip: tuple[str, ...] = ()):
    """Click decorator: one `--flag` per dataclass field, default None so only flags the user typed override."""

    def decorate(fn):
        for name, f in reversed(list(_fields(cls).items())):
            if name in skip:
                continue
            tp = _base_type(f.type)
            flag = "--" + name.replace("_", "-")
            choices = f.metadata.get("choices")
            bounds = f.metadata.get("range")
            help_ = f"{f.metadata.get('why', '')} [default: {f.default}{'; ' + str(bounds) if bounds else ''}]"
            if tp is bool:
                fn = click.option(f"{flag}/--no-{name.replace('_', '-')}", name, default=None, help=help_)(fn)
            else:
                ctype = click.Choice(choices) if choices else {int: int, float: float, str: str}[tp]
                fn = click.option(flag, name, type=ctype, default=None, help=help_)(fn)
        return fn

    return decorate


def as_flags(options: dict) -> list[str]:
    """Parsed options back as command-line tokens (what `--gpus` hands each process torchrun starts, and what the
    job service runs), `--name=value` each, so a value is never read as a flag of its own, whatever it holds."""
    flags = []
    for name, value in options.items():
        flag = name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(f"--{flag}" if value else f"--no-{flag}")
        elif value is not None:
            flags.append(f"--{flag}={value}")
    return flags
