"""The stage configs are torch-free (so `pipeline --help` and flag errors answer at once), and their method and
backbone choices are the registries' own names."""

import subprocess
import sys

from train import configs


def test_choices_are_the_registries():
    from train.backbones import BACKBONES
    from train.methods import METHODS

    fields = configs.PretrainConfig.__dataclass_fields__
    assert fields["method"].metadata["choices"] == tuple(METHODS) == ("byol", "mocov3", "simclr")
    assert fields["backbone"].metadata["choices"] == tuple(BACKBONES)
    assert all(METHODS[name].name == name for name in METHODS)  # a spec is named by its file


def test_cli_help_and_flag_errors_load_no_heavy_library():
    """Every command's options are built from the configs without torch, torchvision, numpy or coremltools."""
    code = ("import sys; from click.testing import CliRunner; from pipeline.cli import main; "
            "r = CliRunner(); assert r.invoke(main, ['--help']).exit_code == 0; "
            "[r.invoke(main, [c, '--help']) for c in main.commands]; "
            "assert r.invoke(main, ['pretrain', '--method', 'nope']).exit_code == 2; "
            "heavy = sorted(m for m in ('torch', 'torchvision', 'numpy', 'coremltools', 'sklearn') if m in sys.modules); "
            "print(heavy); assert not heavy, heavy")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
