"""`pipeline`: the stages by hand. Each command is one stage reading and writing the run directory.

Every PipelineError (and a few user-caused library errors) is printed as one line and exits 2; no traceback.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import click

from pipeline.errors import PipelineError


def one_line_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PipelineError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("error: interrupted (files already written are intact)", err=True)
            sys.exit(130)
        except MemoryError:
            click.echo("error: out of memory: lower --batch-size or --image-size", err=True)
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Self-supervised image encoders, from a folder of images to a Core ML / ONNX model with proved parity."""


def _pretrain_command():
    from stages.pretrain import PretrainConfig
    from pipeline.config import options_from

    @main.command("pretrain")
    @options_from(PretrainConfig)
    @click.option("--config", "config_file", type=click.Path(), help="YAML file with any of the options below.")
    @click.option("--out", "--run", "out", type=click.Path(), default=None, help="run directory [default: runs/default]")
    @click.option("--resume", is_flag=True, help="continue the run in --out from checkpoints/last.pt, exactly")
    @one_line_errors
    def pretrain(config_file, out, resume, **overrides):
        """Self-supervised pretraining (SimCLR, BYOL or MoCo v3) into a run directory."""
        from pipeline.rundir import DEFAULT_RUN
        from stages import pretrain as stage

        run_dir = Path(out) if out else DEFAULT_RUN
        if out is None:
            click.echo(f"using run {run_dir}")
        cfg = stage.config_for_run(config_file, overrides, run_dir, resume)
        stage.run(cfg, run_dir, resume=resume, say=click.echo)


_pretrain_command()


@main.command("doctor")
@one_line_errors
def doctor():
    """Which device training would use and why not the others; library versions; can Core ML predict here."""
    import importlib
    import platform

    from pipeline.device import device_report, select_device

    click.echo(f"python {platform.python_version()} on {platform.system()} {platform.machine()}")
    for name in ("torch", "torchvision", "coremltools", "onnx", "onnxruntime"):
        try:
            mod = importlib.import_module(name)
            click.echo(f"{name:12s} {getattr(mod, '__version__', '?')}")
        except Exception as e:  # a broken optional install should not stop the report
            click.echo(f"{name:12s} not importable ({type(e).__name__})")
    for dev, ok, why in device_report():
        click.echo(f"device {dev:5s} {'available' if ok else 'unavailable'}{': ' + why if why else ''}")
    click.echo(f"auto picks: {select_device('auto')}")
    from export.coreml_runtime import coreml_can_predict

    ok, why = coreml_can_predict()
    click.echo(f"Core ML predict: {'yes' if ok else 'no'}{': ' + why if why else ''}")


if __name__ == "__main__":
    main()
