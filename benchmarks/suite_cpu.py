"""Where the test suite's CPU time goes: in the pytest workers themselves, or in the Python processes the tests
start (`pipeline` commands, the job service's stage children, torchrun's workers, the pin runs), per test.

Every Python process of the run, pytest's own and each one a test starts, loads a sitecustomize from a temporary
folder put first on PYTHONPATH (children inherit it with the environment); at exit it appends one line: its argv,
its own CPU seconds, the CPU of the children it reaped, and the test it was started for (PYTEST_CURRENT_TEST, which
a child inherits from the worker that ran that test). A process killed by a signal runs no exit code and writes no
line; its CPU still reaches the process that reaps it, so "in no line" below is what such processes, non-Python ones
(Chromium) and the interpreters' shutdown after their lines cost.

    .venv/bin/python benchmarks/suite_cpu.py                       # the whole suite as make test runs it
    .venv/bin/python benchmarks/suite_cpu.py tests/pipeline -x     # other pytest arguments instead of `tests`
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# make test's pytest (its -q comes from pyproject.toml), writing no .pytest_cache
PYTEST = ["-m", "pytest", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider"]

HOOK = """
import atexit, json, os, resource, sys

def _record():
    if "SUITE_CPU_LOG" not in os.environ:  # a child given an environment of its own: nowhere to write
        return
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    line = {"argv": getattr(sys, "orig_argv", sys.argv)[1:6], "cpu": me.ru_utime + me.ru_stime,
            "children_cpu": kids.ru_utime + kids.ru_stime, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
            "pid": os.getpid(), "ppid": os.getppid()}
    with open(os.environ["SUITE_CPU_LOG"], "a") as f:  # one short write per process: lines stay whole
        f.write(json.dumps(line) + "\\n")

atexit.register(_record)
"""


def summarise(lines: list[dict], root_pid: int, top: int = 25) -> str:
    """The table: total CPU of the run (pytest's process, root_pid, and everything it reaped), the workers' own
    share, the started processes' share per test, and what no line accounts for."""
    def is_worker(r: dict) -> bool:
        """xdist's workers: pytest's own children, started for no test (under -n 0 the tests run in pytest's)."""
        return r["ppid"] == root_pid and not r["test"]

    root = next(r for r in lines if r["pid"] == root_pid)
    workers = [r for r in lines if is_worker(r)]
    started = [r for r in lines if r["pid"] != root_pid and not is_worker(r)]
    total = root["cpu"] + root["children_cpu"]
    own = sum(r["cpu"] for r in workers)
    in_lines = sum(r["cpu"] for r in started)
    per_test = collections.defaultdict(lambda: [0, 0.0])
    for r in started:
        # "<nodeid> (call)"; a process whose environment was copied before its test began (at import) has none
        name = r["test"].rsplit(" (", 1)[0] or "(test not known) " + " ".join(r["argv"][:3])
        per_test[name][0] += 1
        per_test[name][1] += r["cpu"]
    out = [f"CPU of the whole run: {total:,.1f} s",
           f"  in the pytest workers themselves: {own:,.1f} s ({own / total:.0%})",
           f"  in {len(started)} Python processes the tests started: {in_lines:,.1f} s ({in_lines / total:.0%})",
           f"  in pytest's own process (collection, scheduling): {root['cpu']:,.1f} s",
           f"  in no line (processes killed by a signal, non-Python ones, exits after the lines): "
           f"{total - root['cpu'] - own - in_lines:,.1f} s",
           "", f"Started processes by test, the {top} largest (CPU s, processes):"]
    for name, (n, cpu) in sorted(per_test.items(), key=lambda kv: -kv[1][1])[:top]:
        out.append(f"{cpu:8.1f} {n:4d}  {name}")
    return "\n".join(out)


def main(args: list[str]) -> int:
    with tempfile.TemporaryDirectory() as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(HOOK)
        log = Path(hook_dir, "processes.jsonl")
        env = dict(os.environ, SUITE_CPU_LOG=str(log),
                   PYTHONPATH=os.pathsep.join(filter(None, [hook_dir, os.environ.get("PYTHONPATH")])))
        with subprocess.Popen([sys.executable, *PYTEST, *(args or ["tests"])], cwd=ROOT, env=env) as pytest:
            returncode = pytest.wait()
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    if not any(r["pid"] == pytest.pid for r in lines):
        print("no process wrote a line: is a sitecustomize already installed ahead of this one?", file=sys.stderr)
        return 1
    print(summarise(lines, pytest.pid))
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
