"""The docs stay true to the tree: README stays a short page for users, every link and repository path the docs
name exists, every `pipeline` command and option README names is one the CLI has, every `make` target it names is in
the Makefile, and no tracked file speaks of how the project was built (issue numbers, sessions, numbered rounds of
work): that history belongs in git."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 320
PAGES = sorted([README, *(ROOT / "docs").glob("*.md"), *(ROOT / "benchmarks" / "results").rglob("README.md")])

# the word issue, session or round, then a number (a space, "_", "-" or "#" between them or nothing), in any case;
# a word that only ends in one of them ("around") does not count. test_the_history_pattern has the examples.
HISTORY = re.compile(r"\b(?:issues?|sessions?|rounds?)[ _-]?#?\d", re.IGNORECASE)

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)?)`")  # a code span may wrap onto a second line
COMMAND = re.compile(r"\bpipeline ([a-z][a-z-]*)")
FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")
MAKE = re.compile(r"\bmake ([a-z][a-z-]*)")
# repository paths named in code spans; export/ is left out: `export/encoder.pt` is a run-directory path
REPO_PATH = re.compile(r"^(?:benchmarks|configs|stages|pipeline|tests|swift_demo|docs)/[\w./-]*$")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def code_of(text: str) -> list[str]:
    """Every piece of code in a Markdown text: fenced blocks line by line (continuations joined), then spans."""
    pieces = []
    for block in FENCE.findall(text):
        pieces += block.replace("\\\n", " ").splitlines()
    pieces += [m.replace("\n", " ") for m in SPAN.findall(FENCE.sub("", text))]
    return pieces


def commands_named(text: str) -> list[tuple[str, list[str]]]:
    """(command, options written after it) for each `pipeline CMD ...` in the text's code; the options end at a
    comment, a `;` or `&&`, or the next `pipeline` command."""
    named = []
    for piece in code_of(text):
        for m in COMMAND.finditer(piece):
            rest = re.split(r"\s#|;|&&|\bpipeline ", piece[m.end():])[0]
            named.append((m.group(1), FLAG.findall(rest)))
    return named


def cli_options() -> dict[str, set[str]]:
    from pipeline.cli import main

    ctx = click.Context(main)
    options = {}
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        options[name] = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"-h", "--help"}
    return options


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    return [f for f in out.decode().split("\0") if f]


def test_readme_is_a_page_not_a_notebook():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; depth belongs in docs/ (at most {README_MAX_LINES})"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(page):
    named = {p.rstrip(".,:;") for piece in code_of(page.read_text()) for p in piece.split()}
    missing = sorted(p for p in named if REPO_PATH.match(p) and not re.search(r"[<>*$]|NNNN|PATH|/\.", p)
                     and not (ROOT / p).exists())  # /. : build outputs (swift_demo/.build) are not tracked
    assert not missing, f"{page.relative_to(ROOT)} names paths the tree does not have: {missing}"


def test_every_pipeline_command_and_option_in_readme_exists():
    options = cli_options()
    wrong = []
    for cmd, flags in commands_named(README.read_text()):
        if cmd not in options:
            wrong.append(f"`pipeline {cmd}`: no such command")
            continue
        wrong += [f"`pipeline {cmd} {f}`: no such option" for f in flags if f not in options[cmd]]
    assert not wrong, "; ".join(sorted(set(wrong)))


def test_readme_names_every_command_of_the_cli():
    named = {cmd for cmd, _ in commands_named(README.read_text())}
    assert set(cli_options()) <= named, f"README says nothing of {sorted(set(cli_options()) - named)}"


def test_every_make_target_in_readme_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    named = {t for piece in code_of(README.read_text()) for t in MAKE.findall(piece)}
    assert named and named <= targets, f"README names make targets the Makefile lacks: {sorted(named - targets)}"


def test_no_tracked_file_speaks_of_how_it_was_built():
    found = []
    for name in tracked_files():
        if HISTORY.search(name):
            found.append(f"{name} (its name)")
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: fixtures, zips, images
            continue
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            if m := HISTORY.search(line):
                found.append(f"{name}:{n}: {m.group(0)!r}")
    assert not found, f"{len(found)} mentions of issues, sessions or rounds of work: " + "; ".join(found[:20])


@pytest.mark.parametrize("text, history", [
    ("see " + "Issue" + " 6: the grid", True), ("benchmarks/" + "issue" + "6_7.sh", True),
    ("results/cpu-" + "session" + "9/", True), ("sessions" + " 4-5", True), ("in " + "round" + " 3 we", True),
    ("Issue" + " #12", True), ("ar" + "ound 5 steps", False), ("rounded once", False), ("the issue's own command", False),
    ("Swift 6.3.1", False), ("coremltools#1843", False),
])
def test_the_history_pattern(text, history):
    assert bool(HISTORY.search(text)) == history


def test_commands_named_reads_options_up_to_the_next_command():
    text = ("`pipeline pretrain --data folder:x [--resume | --overwrite]` and\n"
            "```\npipeline export --to coreml   # then --not-this\npipeline strip \\\n  --no-l2-normalize\n```\n")
    assert sorted(commands_named(text)) == [("export", ["--to"]), ("pretrain", ["--data", "--resume", "--overwrite"]),
                                            ("strip", ["--no-l2-normalize"])]


def test_every_benchmark_line_for_this_tree_parses_as_pipeline_bench():
    """benchmarks/*.lines (same_call.sh's input): a line run in this checkout (tree "new") parses as `pipeline
    bench` arguments, options and their values both, so a GPU call's minutes are not lost to a stale flag; lines of
    other trees run their own commit's CLI."""
    from pipeline.cli import main

    bench = main.get_command(click.Context(main), "bench")
    wrong = []
    for path in sorted((ROOT / "benchmarks").glob("*.lines")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            fields = line.split()  # tree, label, bench's arguments: as same_call.sh's `read` splits them
            if fields[:1] != ["new"]:
                continue
            try:
                bench.make_context("bench", fields[2:], resilient_parsing=False)
            except click.ClickException as e:
                wrong.append(f"{path.name}:{n}: {e.format_message()}")
    assert not wrong, "; ".join(wrong)


def _titles(phrase):
    """The backbone titles a prose list names: "MobileNetV3-Small, -Large and EfficientNet-B0" (a shared stem)."""
    titles = []
    for t in re.split(r", | and ", phrase.strip()):
        titles.append(titles[-1].rsplit("-", 1)[0] + t if t.startswith("-") else t)
    return titles


# Where each document lists the compile defaults: (file, pattern with one group per set of methods, named as
# COMPILED_SETS names them). docs/benchmarks.md names its rows beside its measurements (the test below).
COMPILED_SETS = {"every": ("simclr", "byol", "mocov3"), "simclr_byol": ("simclr", "byol"), "simclr": ("simclr",)}
COMPILE_LISTS = [
    ("README.md", r"repay the compiling: (?P<every>[\w\-, ]+?) for every method; (?P<simclr_byol>[\w\-, ]+?) for "
                  r"SimCLR and BYOL; (?P<simclr>[\w\-, ]+?) for SimCLR,"),
    ("docs/recipes.md", r"on CUDA (?P<every>[\w\-, ]+?) \(every method\), (?P<simclr_byol>[\w\-, ]+?) \(SimCLR and "
                        r"BYOL\) and (?P<simclr>[\w\-, ]+?) \(SimCLR:"),
]


def _compiling(methods):
    """The titles of the rows that compile exactly these methods by default, in the registry's order."""
    from train.backbones import BACKBONES

    return [b.title for b in BACKBONES.values() if set(b.compile_methods) == set(methods)]


def test_the_compiled_sets_the_documents_name_are_every_row_that_compiles():
    """A row whose compile_methods is a set no document names (a new combination) fails here, not silently."""
    from train.backbones import BACKBONES
    from train.methods import METHODS

    assert set(COMPILED_SETS["every"]) == set(METHODS)
    named = [t for methods in COMPILED_SETS.values() for t in _compiling(methods)]
    assert sorted(named) == sorted(b.title for b in BACKBONES.values() if b.compile_methods)


@pytest.mark.parametrize("doc, pattern", COMPILE_LISTS, ids=[d for d, _ in COMPILE_LISTS])
def test_the_compile_defaults_each_document_lists_are_the_registrys(doc, pattern):
    """README and recipes.md say in prose which backbones compile which methods by default: a row's
    compile_methods changed in train/backbones.py without these sentences fails here."""
    text = " ".join((ROOT / doc).read_text().split())  # prose wraps anywhere
    stated = re.search(pattern, text)
    assert stated, f"{doc} no longer lists the compile defaults as this test reads them"
    assert {k: _titles(v) for k, v in stated.groupdict().items()} == \
        {k: _compiling(methods) for k, methods in COMPILED_SETS.items()}


def test_the_compile_defaults_the_docs_state_are_the_registrys():
    """docs/benchmarks.md states each compiling row's `compile_repays`, in the registry's order, and the backbones
    that compile SimCLR and BYOL, and SimCLR only: a row changed in train/backbones.py without its measurement's
    prose fails here."""
    from train.backbones import BACKBONES

    text = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())  # prose wraps anywhere
    stated = re.search(r"Each row's `compile_repays` is its count rounded up \(([\d, ]+)\)", text)
    assert stated, "docs/benchmarks.md no longer states the rows' compile_repays"
    rows = [b for b in BACKBONES.values() if b.compile_repays]
    assert stated.group(1) == ", ".join(f"{b.compile_repays:,}" for b in rows)
    named = re.search(r"([\w\-, ]+?) compile SimCLR and BYOL; ([\w\-, ]+?) compiles SimCLR only", text)
    assert named, "docs/benchmarks.md no longer names the backbones that compile SimCLR and BYOL, and SimCLR only"
    assert [_titles(g) for g in named.groups()] == [_compiling(COMPILED_SETS["simclr_byol"]),
                                                     _compiling(COMPILED_SETS["simclr"])]
