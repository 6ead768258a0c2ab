"""The shape of the code, read from the source with `ast` (every import, also those inside functions): no stage
imports another stage, and no import loop anywhere among the project's modules. Stages stand on libraries and
the run directory; shared pieces have their own homes (train/runspec.py, train/training.py, core/views.py,
export/traced.py, core/rundir.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "train", "export", "stages", "pipeline")
# The stages: each a top-floor module that reads the run directory (pipeline/serve/ is the job service, one stage).
STAGES = ("stages.pretrain", "stages.linear_eval", "stages.strip", "stages.trace", "stages.export", "stages.validate",
          "stages.bench", "stages.report", "stages.swift_fixtures", "pipeline.serve")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return mods


def _target(name: str, mods: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (`train.augment.MEAN` -> train.augment), or None."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports, anywhere in its body (inside functions too)."""
    graph = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]  # `from pkg import module` names a module
            else:
                continue
            deps |= {t for t in (_target(n, mods) for n in names) if t and t != mod}
        graph[mod] = deps
    return graph


def stage_of(mod: str) -> str | None:
    return next((s for s in STAGES if mod == s or mod.startswith(s + ".")), None)


def stage_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, d) for m, deps in graph.items() for d in deps
                  if stage_of(m) and stage_of(d) and stage_of(m) != stage_of(d))


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop as [a, b, ..., a], or None (depth-first search, colouring modules)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


GRAPH = import_graph(project_modules())


def test_the_graph_holds_the_edges_it_should():
    """The parser sees module-level, in-function and `from pkg import module` imports: without these the checks
    below would pass on an empty graph."""
    assert "train.runspec" in GRAPH["stages.pretrain"]  # module level
    assert "train.knn" in GRAPH["stages.pretrain"]  # inside run()
    assert "train.distributed" in GRAPH["train.training"]  # `from stages import augment, distributed`
    assert "core.views" in GRAPH["train.preprocess_models"]
    assert all(s in GRAPH or any(m.startswith(s + ".") for m in GRAPH) for s in STAGES)


def test_no_stage_imports_another_stage():
    assert stage_edges(GRAPH) == []


def test_no_import_loop():
    assert find_cycle(GRAPH) is None


def test_the_checks_can_fail():
    """The same functions on graphs that break the rules find what they should."""
    assert stage_edges({"stages.export": {"stages.trace"}, "stages.trace": set()}) == [("stages.export", "stages.trace")]
    assert stage_edges({"pipeline.serve.app": {"pipeline.serve.store"}}) == []  # within one stage
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_lazy_imports_are_read(tmp_path):
    """A package written for the test: a relative import inside a function is an edge, and a loop through it is found."""
    pkg = tmp_path / "stages"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from stages.a import f\n")
    graph = import_graph(project_modules(tmp_path))
    assert graph["stages.a"] == {"stages.b"} and graph["stages.b"] == {"stages.a"}
    assert find_cycle(graph) == ["stages.a", "stages.b", "stages.a"]
