"""SSL methods, one file each, and this folder is their registry: every module in it is a method, named by its file
(the --method value). A method is an nn.Module holding `backbone` plus its own heads/momentum networks, with
`forward(views, precision) -> loss` (views: a list of normalised batches, one per view its spec declares, in that
order, each at its view's size) and `after_step(progress)` for momentum updates; its file ends with its MethodSpec
(train/method_spec.py), which holds everything else about it. Nothing else lists the methods: the CLI's
choices, config checks, recipes, views, resume rules, the export metadata and the report all read them here.

The names are the folder's file names, read without importing the files (a method imports torch, and `pipeline
--help` or a wrong --method must answer before torch loads); a spec is imported when it is first asked for.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator, Mapping


def names() -> tuple[str, ...]:
    """The methods: this package's modules (pkgutil lists the folder; nothing is imported)."""
    return tuple(m.name for m in pkgutil.iter_modules(__path__) if not m.ispkg and not m.name.startswith("_"))


class _Specs(Mapping):
    """name -> MethodSpec, each imported on first use. Read anew from the folder on every call: a method added to
    it (or to the package's path) is known at once."""

    def __getitem__(self, name: str):
        if name not in names():
            raise KeyError(name)
        return importlib.import_module(f"{__name__}.{name}").SPEC

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())


METHODS = _Specs()
