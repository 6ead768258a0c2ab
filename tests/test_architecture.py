"""The shape of the code, read from the source with `ast` (every import, also those inside functions).

The top-level packages are floors, each importing only its own floor and the floors below it:

    core      errors, the run directory and its file names, config machinery, device, Core ML runtime, views
    train     data, augmentation, methods, backbones, the step, recipes, a run's config, features and kNN
    export    the format table, writers and checkers, the encoder, metadata, the reference evaluators, parity
    stages    the stages, one module each (a stage's own helper is named after it: report_figures)
    pipeline  the faces: the CLI and the job service

Within stages/, no stage imports another; pipeline/serve/ never imports the CLI (nor any stage: it runs them as
child processes). No import loop anywhere, counting a package's __init__ as imported with each of its modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("core", "train", "export", "stages", "pipeline")  # lowest first
PACKAGES = FLOORS
# The stages: each a module of stages/ that reads and writes the run directory.
STAGES = ("stages.pretrain", "stages.linear_eval", "stages.strip", "stages.trace", "stages.export", "stages.validate",
          "stages.bench", "stages.report", "stages.swift_fixtures")
NOT_PACKAGES = {"tests", "benchmarks", "swift_demo", "configs", "docs", "runs", "jobs", "mutants"}


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


def _with_packages(name: str | None, mods: dict[str, Path]) -> set[str]:
    """A module and every package above it: importing `train.methods.byol` runs train/__init__ and
    train/methods/__init__ first."""
    out = set()
    while name:
        if name in mods:
            out.add(name)
        name = name.rpartition(".")[0]
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports, anywhere in its body (inside functions too), with their packages."""
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
            deps |= {t for n in names for t in _with_packages(_target(n, mods), mods) if t != mod}
        graph[mod] = deps
    return graph


def stage_of(mod: str) -> str | None:
    return next((s for s in STAGES if mod == s or mod.startswith((s + ".", s + "_"))), None)


def floor(mod: str) -> int:
    return FLOORS.index(mod.split(".")[0])


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, what it imports) for every import of a floor above the module's own."""
    return sorted((m, d) for m, deps in graph.items() for d in deps if floor(d) > floor(m))


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
    """The parser sees module-level, in-function and `from pkg import module` imports, and the packages they run:
    without these the checks below would pass on an empty graph."""
    assert "train.runspec" in GRAPH["stages.pretrain"]  # module level
    assert "train.knn" in GRAPH["stages.pretrain"]  # inside run()
    assert {"train.distributed", "train"} <= GRAPH["train.training"]  # `from train import augment, distributed`
    assert {"train.method_spec", "train"} <= GRAPH["train.methods.simclr"]  # a module and the package above it
    assert "core.views" in GRAPH["train.preprocess_models"]
    assert all(s in GRAPH for s in STAGES)


def test_no_floor_imports_one_above_it():
    assert upward_imports(GRAPH) == []


def test_every_package_is_a_floor():
    """A new top-level package must be placed among the floors (and this test's docstring says where)."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_PACKAGES
    assert packages == set(FLOORS)


def test_stages_holds_the_stages_only():
    """A module of stages/ that is no stage (nor a stage's own helper) is a library piece: it belongs to train/,
    export/ or core/, where other stages can use it without importing a stage."""
    assert [m for m in GRAPH if floor(m) == FLOORS.index("stages") and m != "stages" and not stage_of(m)] == []


def test_no_stage_imports_another_stage():
    assert stage_edges(GRAPH) == []


def test_the_job_service_imports_no_stage_and_not_the_cli():
    """It runs each stage as `python -m pipeline STAGE` in a child process; importing the CLI would be a loop
    (the CLI's `serve` command imports the service)."""
    assert [(m, d) for m, deps in GRAPH.items() if m.startswith("pipeline.serve") for d in deps
            if d == "pipeline.cli" or floor(d) == FLOORS.index("stages")] == []


def test_no_import_loop():
    assert find_cycle(GRAPH) is None


def test_the_checks_can_fail():
    """The same functions on graphs that break the rules find what they should."""
    assert upward_imports({"core.rundir": {"train.data"}, "train.data": {"core.rundir"}}) == [("core.rundir", "train.data")]
    assert upward_imports({"pipeline.cli": {"stages.trace", "core.rundir"}}) == []
    assert stage_edges({"stages.export": {"stages.trace"}, "stages.trace": set()}) == [("stages.export", "stages.trace")]
    assert stage_edges({"stages.report": {"stages.report_figures"}}) == []  # a stage's own helper
    assert stage_of("stages.report_figures") == "stages.report" and stage_of("stages.data_spec") is None
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
    assert graph["stages.a"] == {"stages", "stages.b"} and graph["stages.b"] == {"stages", "stages.a"}
    assert find_cycle(graph) == ["stages.a", "stages.b", "stages.a"]


def test_a_package_that_imports_its_modules_is_a_loop_with_them(tmp_path):
    """A registry __init__ importing each of its modules, one of which imports a sibling through the package: the
    loop a method file importing another method made (methods -> mocov3 -> methods)."""
    pkg = tmp_path / "train" / "methods"
    pkg.mkdir(parents=True)
    (tmp_path / "train" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from train.methods import byol, mocov3\n")
    (pkg / "byol.py").write_text("VIEWS = ()\n")
    (pkg / "mocov3.py").write_text("from train.methods import byol\n")
    graph = import_graph(project_modules(tmp_path))
    assert find_cycle(graph) == ["train.methods", "train.methods.mocov3", "train.methods"]
