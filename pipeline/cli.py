"""`pipeline`: the stages by hand. Each command is one stage reading and writing the run directory.

Every PipelineError (and a few user-caused library errors) is printed as one line and exits 2; no traceback; so is
every usage error click finds (unknown option, bad choice, missing value). Inputs a stage would miss (its data, the
file an earlier stage makes) are checked here, torch-free, before the stage module (and torch, seconds) loads.
"""

from __future__ import annotations

import functools
import shlex
import sys
from contextlib import contextmanager
from pathlib import Path

import click

from core import rundir
from core.config import as_flags
from core.errors import PipelineError
from train.data_spec import check_image_folder, check_spec


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
        except OSError as e:  # a full disk in a write outside the run directory's atomic writes (an append, a library)
            if e.errno not in rundir.DISK_FULL:
                raise
            click.echo(f"error: {rundir.not_written(Path(e.filename or 'a file'), e.strerror)}", err=True)
            sys.exit(2)

    return wrapper


class UsageLine(click.ClickException):
    """A click usage error printed as the project's errors are: one `error: ...` line, exit 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"error: {self.message}", err=True)


def _command_path(ctx: click.Context | None) -> list[str]:
    names = []
    while ctx is not None and ctx.parent is not None:  # the root's name is however python was started
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    return names


@contextmanager
def _usage_errors_on_one_line(command: list[str]):
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise  # bare `pipeline`: the help it prints is what was asked for
    except click.UsageError as e:  # some (a missing option value) come without a context: `command` names it then
        where = _command_path(e.ctx) if e.ctx is not None else command
        raise UsageLine(f"{e.format_message()} See `{shlex.join(['pipeline', *where, '--help'])}`.") from None


class PipelineCommand(click.Command):
    def make_context(self, info_name, args, parent=None, **extra):
        with _usage_errors_on_one_line([*_command_path(parent), info_name] if parent else []):
            return super().make_context(info_name, args, parent=parent, **extra)


class Pipeline(click.Group):
    """click's usage block (usage line, hint, message: three lines) becomes one line naming the --help to read:
    the group's own options are parsed in its make_context, a subcommand's name in invoke, its options in the
    subcommand's make_context."""

    command_class = PipelineCommand

    def make_context(self, *args, **kwargs):
        with _usage_errors_on_one_line([]):
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _usage_errors_on_one_line([]):
            return super().invoke(ctx)


# True in a process that `entry` started, which ends with its command; False where `main` is called in a process
# that goes on (click's CliRunner, a notebook). A stopped pretrain holds later signals off only in the first kind:
# the pretrain command hands this to train.training.StopRequest, which `entry` cannot set itself without loading
# torch for every command (`--help` included).
ENDS_WITH_COMMAND = False


def entry() -> None:
    """The `pipeline` script and `python -m pipeline` (each torchrun worker too)."""
    global ENDS_WITH_COMMAND
    ENDS_WITH_COMMAND = True
    main()


@click.group(cls=Pipeline, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Self-supervised image encoders, from a folder of images to a Core ML / ONNX model with proved parity."""


def _pretrain_command():
    from core.config import options_from
    from train import backbones
    from train.configs import PretrainConfig

    @main.command("pretrain")
    @options_from(PretrainConfig)
    @click.option("--config", "config_file", type=click.Path(), help="YAML file with any of the options below.")
    @click.option("--out", "--run", "out", type=click.Path(), default=None, help="run directory [default: runs/default]")
    @click.option("--resume", is_flag=True, help="continue the run in --out from checkpoints/last.pt, exactly "
                  "(a run stopped by Ctrl-C too); a finished run is left as it is")
    @click.option("--overwrite", is_flag=True, help="delete the run in --out first (its checkpoints, config.yaml, "
                  "split.json, metrics, eval/, export/, validate/, report.html; nothing else), then train afresh; "
                  "without it or --resume, a folder that holds a run is refused")
    @click.option("--gpus", type=int, default=None, help=GPUS_HELP)
    @one_line_errors
    def pretrain(config_file, out, resume, overwrite, gpus, **overrides):
        """Self-supervised pretraining (SimCLR, BYOL or MoCo v3) into a run directory. Ctrl-C (or SIGTERM) stops
        after the step under way and writes checkpoints/last.pt there; --resume goes on from it."""
        run_dir = Path(out) if out else rundir.DEFAULT_RUN
        # Refused before torch loads, in a fraction of a second, as the data errors below: a folder that already
        # holds a run, and a new run's image side its backbone cannot take. config_for_run checks them again.
        rundir.check_out(run_dir, resume, overwrite)
        asked = _pretrain_config(config_file, overrides, run_dir, resume)
        if asked and not resume:  # a resume keeps its run's side; config_for_run names an option it may not change
            backbones.check_run_side(asked.backbone, asked.small_stem, asked.image_size)
        if asked and asked.data:
            check_spec(asked.data)  # before torch loads and before the run folder exists

        from train import distributed, runspec
        from stages import pretrain as stage

        if out is None:
            click.echo(f"using run {run_dir}")
        cfg = runspec.config_for_run(config_file, overrides, run_dir, resume, overwrite)  # a bad option fails here, once
        if gpus is not None and gpus != 1 and not distributed.launched():
            args = ["pretrain", *as_flags(overrides), "--out", str(run_dir)]
            args += (["--config", config_file] if config_file else []) + (["--resume"] if resume else [])
            args += ["--overwrite"] if overwrite else []
            sys.exit(distributed.launch(gpus, args, cfg.device))
        from train.training import StopRequest

        StopRequest.process_exits_after = ENDS_WITH_COMMAND
        result = stage.run(cfg, run_dir, resume=resume, overwrite=overwrite, say=click.echo)
        if result.get("stopped"):
            if distributed.env_rank() == 0:
                click.echo(result["stopped"], err=True)
            sys.exit(130)  # what a shell reports for Ctrl-C: a script sees that training did not finish


def _pretrain_config(config_file, overrides: dict, run_dir: Path, resume: bool):
    """The PretrainConfig as asked, from the same flags and files as runspec.config_for_run but not yet resolved
    (no torch); None when a --resume has no config.yaml (config_for_run says what is missing)."""
    from core.config import load_config
    from train.configs import PretrainConfig

    saved = run_dir / rundir.CONFIG
    if resume and not config_file:
        if not saved.is_file():
            return None
        config_file = saved
    return load_config(PretrainConfig, config_file, overrides)


GPUS_HELP = ("run N processes, one per GPU, through torchrun (what `torchrun --nproc-per-node N -m pipeline ...` "
             "does); with --device cpu, N CPU processes over gloo")


_pretrain_command()


def _bench_command():
    from core.config import options_from
    from train import backbones
    from train.configs import BenchConfig, PretrainConfig

    @main.command("bench")
    @options_from(BenchConfig)
    @click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
    @click.option("--gpus", type=int, default=None, help=GPUS_HELP)
    @one_line_errors
    def bench(as_json, gpus, **overrides):
        """Training throughput: end to end vs the model-step ceiling on ready tensors, data wait, peak memory."""
        import json

        from core.config import load_config

        cfg = load_config(BenchConfig, None, overrides)
        # before torch loads, as pretrain does; bench times the stem a run gets by default (stages/bench.py)
        backbones.check_run_side(cfg.backbone, PretrainConfig.small_stem, cfg.image_size)

        from stages import bench as stage
        from train import distributed

        if gpus is not None and gpus != 1 and not distributed.launched():
            sys.exit(distributed.launch(gpus, ["bench", *as_flags(overrides), *(["--json"] if as_json else [])], cfg.device))
        result = stage.run(cfg)
        if distributed.env_rank() == 0:
            click.echo(json.dumps(result) if as_json else stage.format_table(result))


_bench_command()


def stage_command(name, config_cls, module, help_, epilog=None, request=None, before=None, show=None):
    """One stage as a command: its config's options as flags, plus --config and --run; `request(cfg)` refuses an
    impossible request, then the stage's inputs are checked (check_inputs), `before(run_dir, cfg)` runs, and
    `show(module, result)` prints the stage's result."""
    from core.config import options_from

    @main.command(name, help=help_, epilog=epilog)
    @options_from(config_cls)
    @click.option("--config", "config_file", type=click.Path(), help="YAML file with any of the options below.")
    @click.option("--run", "run", type=click.Path(), default=None, help="run directory [default: runs/default]")
    @one_line_errors
    def command(config_file, run, **overrides):
        import importlib

        from core.config import load_config

        run_dir = rundir.resolve_run(run, say=click.echo)
        cfg = load_config(config_cls, config_file, overrides)
        if request:
            request(cfg)
        check_inputs(name, run_dir, cfg)
        if before:
            before(run_dir, cfg)
        stage = importlib.import_module(module)
        result = stage.run(cfg, run_dir, say=click.echo)
        if show:
            show(stage, result)


command_for = rundir.command_for


def missing_input(name: str, run_dir: Path) -> str | None:
    """The line for a stage whose input file is not there yet, naming the command that makes it: the earliest
    one missing, and `pipeline export` for anything strip or trace make (it runs them itself). None: all there."""
    ckpt, encoder = run_dir / rundir.LAST_CHECKPOINT, rundir.encoder_path(run_dir)
    sidecar = run_dir / rundir.EXPORT / rundir.SIDECAR
    if (name in ("linear-eval", "strip") or not encoder.is_file()) and not ckpt.is_file():
        return f"no checkpoint at {ckpt}: run `{command_for('pretrain', run_dir)}` first"
    if name == "trace" and not encoder.is_file():
        return f"no stripped encoder at {encoder}: run `{command_for('strip', run_dir)}` first"
    if name == "validate" and not (sidecar.is_file() and encoder.is_file()):
        return f"nothing exported yet (no {sidecar if encoder.is_file() else encoder}): run `{command_for('export', run_dir)}` first"
    return None


def recorded_data(run_dir: Path) -> str:
    """The data SPEC the run was trained on (its config.yaml), or "" before it has one."""
    cfg = _pretrain_config(None, {}, run_dir, resume=True)
    return cfg.data if cfg else ""


def check_inputs(name: str, run_dir: Path, cfg) -> None:
    """What a stage would refuse first, refused before it loads: a missing input file, a data SPEC or --images
    folder that cannot give an image."""
    why = missing_input(name, run_dir) if name in STAGE_INPUTS else None
    if why:
        raise PipelineError(why)
    if name in ("linear-eval", "validate"):
        spec = getattr(cfg, "data", "") or recorded_data(run_dir)
        if spec:
            check_spec(spec)
    if name == "validate" and cfg.images:
        check_image_folder("--images", Path(cfg.images))


STAGE_INPUTS = ("linear-eval", "strip", "trace", "export", "validate")  # the stages missing_input knows the inputs of


def _stage_commands():
    """linear-eval, then strip -> trace -> export -> validate -> report: each a stage reading the run directory."""
    from export.formats import describe_table, summary
    from train.configs import EvalConfig
    from export.configs import ExportConfig, StripConfig, TraceConfig, ValidateConfig
    from stages.report import ReportConfig

    stage_command("linear-eval", EvalConfig, "stages.linear_eval",
                  "Linear probe and kNN on the run's frozen backbone, beside the same backbone at random init.",
                  show=_evaluation_table)
    stage_command("strip", StripConfig, "stages.strip",
                  "Backbone only (no projection/prediction head, no momentum network) + preprocessing -> RUN/export/encoder.pt.")
    stage_command("trace", TraceConfig, "stages.trace",
                  "The Encoder (pixels 0..255 -> normalise -> backbone -> L2) as one graph: torch.export, else jit.trace.")
    stage_command("export", ExportConfig, "stages.export",
                  f"The formats of the table below ({summary()}) from the trace, metadata inside, sidecar encoder.json. "
                  "Runs strip and trace first when their files are missing or stale, as make would.",
                  request=_export_request, before=_strip_and_trace_if_stale, epilog="\b\nFormats (format, --to, file, precisions, runs on, options):\n" + describe_table())
    stage_command("validate", ValidateConfig, "stages.validate",
                  f"Run every exported artifact ({summary()}) through its format's checker on the val images and compare with PyTorch; "
                  "fails naming the artifact and the metric. Writes RUN/validate/parity.json.")
    stage_command("report", ReportConfig, "stages.report",
                  "One self-contained HTML page of the run (RUN/report.html): run card, training curves, evaluation vs "
                  "random init, retrieval grid, embedding map, parity, model card; opens offline, no JavaScript.")


def _evaluation_table(stage, result: dict) -> None:
    from train.verdict import verdict_line

    click.echo(stage.format_table(result))
    click.echo(verdict_line(result))


def _export_request(cfg) -> None:
    """An impossible format request is refused first, before any input is looked at or any work done."""
    from export.formats import option_names, select_formats

    select_formats(cfg.to, cfg.coreml_format, cfg.precision, {name: getattr(cfg, name) for name in option_names()})


def _strip_and_trace_if_stale(run_dir: Path, cfg) -> None:
    """Strip and trace are cheap and deterministic: `pipeline export` right after `pipeline pretrain` runs them (with
    their default options) instead of stopping the user, one line each, as `make` would."""
    from stages import strip, trace
    from export.configs import StripConfig, TraceConfig

    for name, stage, cfg, made in (("strip", strip, StripConfig(), rundir.ENCODER),
                                   ("trace", trace, TraceConfig(), f"{rundir.EXPORT}/{rundir.TRACE_INFO}")):
        why = stage.stale_reason(run_dir)
        if why:
            stage.run(cfg, run_dir, say=lambda *a, **k: None)
            click.echo(f"ran `pipeline {name}` first ({why}): wrote {run_dir / made}")


_stage_commands()


@main.command("doctor")
@one_line_errors
def doctor():
    """Which device training would use and why not the others; library versions; can Core ML predict here."""
    import importlib
    import platform

    from core.device import device_report, select_device

    click.echo(f"python {platform.python_version()} on {platform.system()} {platform.machine()}")
    from core.quiet import import_coremltools
    from export.formats import libraries

    for name in ("torch", "torchvision", *libraries()):
        try:
            mod = import_coremltools() if name == "coremltools" else importlib.import_module(name)
            click.echo(f"{name:12s} {getattr(mod, '__version__', '?')}")
        except Exception as e:  # a broken optional install should not stop the report
            click.echo(f"{name:12s} not importable ({type(e).__name__})")
    for dev, ok, why in device_report():
        click.echo(f"device {dev:5s} {'available' if ok else 'unavailable'}{': ' + why if why else ''}")
    click.echo(f"auto picks: {select_device('auto')}")
    from core.coreml_runtime import coreml_can_predict

    ok, why = coreml_can_predict()
    click.echo(f"Core ML predict: {'yes' if ok else 'no'}{': ' + why if why else ''}")


@main.command("show")
@click.option("--run", type=click.Path(), default=None, help="run directory [default: runs/default]")
@one_line_errors
def show(run):
    """Print a run's results from its files: the verdict, the evaluation table and the parity table (what `make all`
    ends with)."""
    from core import provenance

    run_dir = rundir.resolve_run(run, say=click.echo)
    evaluated, validated = run_dir / rundir.EVAL / rundir.LINEAR_EVAL, run_dir / rundir.VALIDATE / rundir.PARITY
    if not (evaluated.is_file() or validated.is_file()):
        first = "pretrain" if not (run_dir / rundir.LAST_CHECKPOINT).is_file() else "linear-eval"
        raise PipelineError(f"{run_dir} has no {rundir.EVAL}/{rundir.LINEAR_EVAL} or {rundir.VALIDATE}/{rundir.PARITY} yet: run "
                            f"`{command_for(first, run_dir)}` (or `make all` for every stage)")
    provenance.check_results(run_dir)  # never a result of an earlier checkpoint beside the current one
    from stages import linear_eval, validate
    from train.verdict import verdict_line

    if evaluated.is_file():
        result = rundir.load_json(evaluated, "linear-eval result")
        click.echo(verdict_line(result))
        click.echo(f"\n{evaluated}:\n{linear_eval.format_table(result)}")
    else:
        click.echo(f"verdict: not evaluated yet: run `{command_for('linear-eval', run_dir)}`")
    if validated.is_file():
        click.echo(f"\n{validated}:\n{validate.format_table(rundir.load_json(validated, 'parity result'))}")
    report, again, now = run_dir / rundir.REPORT, command_for("report", run_dir), provenance.current(run_dir)
    if not report.is_file():
        click.echo(f"\nreport: not written yet: `{again}`")
    elif now is not None and not provenance.same(provenance.of_report(report), now):
        click.echo(f"\nreport: {report} shows an earlier checkpoint: `{again}` makes it again")
    else:
        click.echo(f"\nreport: {report}")


@main.command("swift-fixtures")
@click.option("--run", type=click.Path(), default=None, help="run directory [default: runs/default]")
@click.option("--out", default="", help="folder to write [default: swift_demo/Tests/EmbeddingKitTests/Fixtures]")
@click.option("--bank-per-class", type=int, default=10, show_default=True, help="train images per class in the kNN bank")
@click.option("--max-bytes", type=int, default=1_000_000, show_default=True, help="refuse to write more (they are committed)")
@click.option("--check", is_flag=True, help="only say whether the committed fixtures are current (needs no run)")
@one_line_errors
def swift_fixtures(run, out, bank_per_class, max_bytes, check):
    """Golden files for swift_demo's `swift test`: raw pixels and the pipeline's crops, export/encoder.pt's embeddings,
    encoder.json and the model's metadata, and the pipeline's kNN / majority / centroid / parity answers."""
    from stages import swift_fixtures as stage

    if check:
        reasons = stage.stale_reasons(Path(out) if out else stage.FIXTURES_DIR)
        for r in reasons:
            click.echo(r)
        if reasons:
            raise PipelineError(f"{len(reasons)} fixture(s) out of date: run `make swift-fixtures`")
        click.echo("fixtures are current")
        return
    cfg = stage.SwiftFixturesConfig(out=out, bank_per_class=bank_per_class, max_bytes=max_bytes)
    stage.run(cfg, rundir.resolve_run(run, say=click.echo), say=click.echo)


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on; loopback unless --allow-remote")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(1, 65535))
@click.option("--root", default="jobs", show_default=True, type=click.Path(file_okay=False),
              help="where jobs.db, the token file and one folder per job live (made private: mode 0700)")
@click.option("--allow-remote", is_flag=True, help="bind a non-loopback --host (prints a warning)")
@click.option("--allow-data", multiple=True, default=("digits",), show_default=True,
              help="a data SPEC a job may name instead of uploading a zip (repeat for several)")
@click.option("--max-upload-mb", default=512, show_default=True, type=click.IntRange(1), help="largest request body")
@click.option("--max-unzipped-mb", default=2048, show_default=True, type=click.IntRange(1),
              help="largest total a zip may unpack to")
@click.option("--users", "users_file", type=click.Path(dir_okay=False), default=None,
              help="a file of `NAME TOKEN` lines (mode 0600): one token per user, each seeing only their own jobs "
                   "[default: one token, in ROOT/token]")
@click.option("--quota-gb", default=100.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="disk for uploads and runs under ROOT; a submission past it is refused (507)")
@click.option("--max-queued", default=64, show_default=True, type=click.IntRange(1),
              help="jobs one user may have queued or running")
@click.option("--max-connections", default=100, show_default=True, type=click.IntRange(1),
              help="open connections; past it a new one is closed at once")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="seconds a client has to send a request's head")
@click.option("--prune-older-than", default=None, metavar="AGE",
              help="remove jobs that ended longer ago than AGE (30d, 12h, 90m), at start and every hour [default: keep]")
@one_line_errors
def serve(host, port, root, allow_remote, allow_data, max_upload_mb, max_unzipped_mb, users_file, quota_gb, max_queued,
          max_connections, header_timeout, prune_older_than):
    """Training jobs over HTTP and a web page: upload a zip of images, pick a method, watch it train, download the
    validated Core ML / ONNX model. Each job runs pretrain -> linear-eval -> strip -> trace -> export -> validate
    as child processes in ROOT/<job id>/."""
    from pipeline.serve.app import serve as run_server
    from pipeline.serve.limits import Limits, parse_age
    from pipeline.serve.uploads import ZipCaps

    try:
        prune_after_s = parse_age(prune_older_than) if prune_older_than is not None else None
    except ValueError:
        raise PipelineError(f"--prune-older-than must be a number with s, m, h or d after it, got {prune_older_than!r}") from None
    limits = Limits(max_connections=max_connections, header_timeout_s=header_timeout, max_unfinished=max_queued,
                    quota=int(quota_gb * (1 << 30)))
    run_server(host, port, Path(root), allow_remote=allow_remote, allow_data=tuple(allow_data),
               max_upload=max_upload_mb << 20, caps=ZipCaps(max_total=max_unzipped_mb << 20), limits=limits,
               users_file=Path(users_file) if users_file else None, prune_after_s=prune_after_s, say=click.echo)


if __name__ == "__main__":
    main()
