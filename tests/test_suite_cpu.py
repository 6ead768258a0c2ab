"""benchmarks/suite_cpu.py: where a pytest run's CPU time goes, in its workers or in the processes its tests start."""
import subprocess
import sys

from tests.benchmark_scripts import load

suite_cpu = load("suite_cpu")


def _line(pid, ppid, cpu, children_cpu=0.0, test="", argv=("-m", "pipeline", "strip")):
    return {"argv": list(argv), "cpu": cpu, "children_cpu": children_cpu, "test": test, "pid": pid, "ppid": ppid}


def test_summary_splits_workers_started_processes_and_what_no_line_holds():
    lines = [
        _line(11, 10, 20.0, test="tests/a.py::test_chain (call)"),
        _line(12, 11, 5.0, test="tests/a.py::test_chain (call)"),  # a grandchild: the same test
        _line(13, 10, 3.0, argv=("-m", "torch.distributed.run")),  # env copied at import: no test
        _line(21, 20, 7.0, test="tests/b.py::test_one (setup)"),
        _line(10, 1, 100.0, children_cpu=40.0, argv=("-u", "-c", "exec")),  # the workers last
        _line(20, 1, 50.0, children_cpu=7.0, argv=("-u", "-c", "exec")),
        _line(1, 0, 4.0, children_cpu=210.0, argv=("-m", "pytest", "-n", "2")),
        _line(30, 12, 9.0, argv=("-m", "pytest")),  # a pytest a test starts is not the run's
    ]
    out = suite_cpu.summarise(lines, root_pid=1).splitlines()
    assert out[0] == "CPU of the whole run: 214.0 s"
    assert out[1] == "  in the pytest workers themselves: 150.0 s (70%)"
    assert out[2] == "  in 5 Python processes the tests started: 44.0 s (21%)"
    assert out[3] == "  in pytest's own process (collection, scheduling): 4.0 s"
    assert out[4] == "  in no line (processes killed by a signal, non-Python ones, exits after the lines): 16.0 s"
    assert out[7:] == ["    25.0    2  tests/a.py::test_chain",
                       "     9.0    1  (test not known) -m pytest",
                       "     7.0    1  tests/b.py::test_one",
                       "     3.0    1  (test not known) -m torch.distributed.run"]


def test_a_real_run_puts_a_started_process_under_its_test_and_keeps_pytests_exit_code(tmp_path):
    (tmp_path / "test_tiny.py").write_text(
        "import subprocess, sys\n"
        "def test_spawns():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(i * i for i in range(2 * 10**6))'], check=True)\n"
        "def test_fails():\n"
        "    assert False\n")
    # -n 0 after make test's -n 2: one process, so the started one is the test's and the tests run in pytest's own
    done = subprocess.run([sys.executable, suite_cpu.__file__, str(tmp_path), "-n", "0", "-p", "no:randomly"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr  # pytest's: one test failed
    out = done.stdout.splitlines()
    assert "  in 1 Python processes the tests started:" in "\n".join(out)
    started = out[out.index("Started processes by test, the 25 largest (CPU s, processes):") + 1:]
    # the node id is relative to pytest's rootdir, which depends on what the folders above tmp_path hold
    assert len(started) == 1
    cpu, processes, test = started[0].split()
    assert processes == "1"
    assert test.endswith("test_tiny.py::test_spawns")
    assert float(cpu) > 0.05  # the child's sum, not a zero
