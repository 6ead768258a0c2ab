"""The stage configs are torch-free (so `pipeline --help` and flag errors answer at once) and their name tuples
mirror the registries they stand for."""

import subprocess
import sys

from train import configs


def test_name_tuples_equal_the_registries():
    from train.backbones import BACKBONES
    from train.methods import METHODS
    from train.preprocess import CHOICES

    assert configs.METHOD_NAMES == tuple(METHODS)
    assert configs.BACKBONE_NAMES == tuple(BACKBONES)
    assert configs.PREPROCESS_CHOICES == CHOICES


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
