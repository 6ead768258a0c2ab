"""Helpers shared by the CLI-driving tests."""

from click.testing import CliRunner

from pipeline.cli import main


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_one_line_error(res, *needles):
    """Exit 2, exactly one line `error: ...` containing every needle, no traceback."""
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in res.output
