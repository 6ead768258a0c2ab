"""One minimum iPadOS, said the same everywhere: export/targets.py holds it, and the format table, the export
plan (hence encoder.json's deployment_target), the CLI's help, the export line and the report's model card read it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from export import coreml, formats, targets
from export.formats import select_formats
from export.targets import ML_PROGRAM_TARGET, NEURALNETWORK_TARGET, ipados
from core import rundir
from stages import report
from stages.report import ReportConfig
from tests.cli_helpers import cli

ROOT = Path(__file__).resolve().parents[2]
MENTION = re.compile(r"i(?:Pad)?OS ?(\d+)\+")  # "iPadOS 16+", "iOS/iPadOS 15+", "iOS 16+"


def test_the_plan_and_the_writers_use_the_constants():
    plan = {f.key: own for f, _, own in select_formats("all", None, None, {"deployment_target": None, "opset": None})}
    assert plan["mlpackage"]["deployment_target"] == ML_PROGRAM_TARGET  # what write_mlpackage records in encoder.json
    assert coreml.NEURALNETWORK_TARGET is targets.NEURALNETWORK_TARGET
    assert formats.FORMATS["mlpackage"].options["deployment_target"] == (ML_PROGRAM_TARGET, targets.ML_PROGRAM_TARGETS)
    assert ipados("iOS16") == "iPadOS 16+"


def test_the_help_says_the_same_versions():
    out = " ".join(cli("export", "--help").output.split())
    said = set(MENTION.findall(out))
    assert said == {ML_PROGRAM_TARGET[3:], NEURALNETWORK_TARGET[3:]}, said
    assert f"None = {ML_PROGRAM_TARGET} ({ipados(ML_PROGRAM_TARGET)}" in out


def test_the_report_reads_the_versions_the_files_were_written_for(tmp_path):
    export = tmp_path / rundir.EXPORT
    export.mkdir(parents=True)
    for name in ("encoder.pt", "trace.json"):
        (export / name).write_text("{}")
    artifacts = [{"format": "mlpackage", "file": "encoder.mlpackage", "deployment_target": "iOS17"},
                 {"format": "mlmodel", "file": "encoder.mlmodel", "deployment_target": NEURALNETWORK_TARGET}]
    (export / rundir.SIDECAR).write_text(json.dumps({"image_size": 32, "embedding_dim": 512, "artifacts": artifacts}))
    card = report.model_card(report.Run(tmp_path, ReportConfig()))
    assert set(MENTION.findall(card)) == {"17", NEURALNETWORK_TARGET[3:]}
    (export / rundir.SIDECAR).write_text(json.dumps({"artifacts": []}))  # an older sidecar: the defaults
    card = report.model_card(report.Run(tmp_path, ReportConfig()))
    assert set(MENTION.findall(card)) == {ML_PROGRAM_TARGET[3:], NEURALNETWORK_TARGET[3:]}


def test_no_module_types_a_version_of_its_own():
    """Anywhere in the code a user reads (messages, help, the report): an iPadOS version only through ipados()."""
    typed = []
    for package in ("pipeline", "stages", "export"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "targets.py":
                continue
            typed += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in MENTION.finditer(path.read_text())]
    assert typed == []
