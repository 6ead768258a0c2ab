from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config import load_config, opt
from pipeline.errors import PipelineError
from stages.configs import PretrainConfig


@dataclass
class Cfg:
    a: int = opt(1, "an int")
    b: float | None = opt(None, "optional float")
    c: str = opt("x", "a choice", choices=("x", "y"))
    d: bool = opt(False, "a flag")


def test_defaults_then_yaml_then_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("a: 5\nb: 2\nc: y\n")
    cfg = load_config(Cfg, f, {"a": 7, "b": None})
    assert (cfg.a, cfg.b, cfg.c, cfg.d) == (7, 2.0, "y", False)


@pytest.mark.parametrize("text,msg", [
    ("zzz: 1\n", "unknown key `zzz`"),
    ("a: hello\n", "`a` must be int"),
    ("c: z\n", "`c` must be one of x, y"),
    ("a: [1\n", "not valid YAML"),
    ("- 1\n", "must be a mapping"),
    ("a: 1.5\n", "`a` must be int"),
    ("d: maybe\n", "`d` must be bool"),
])
def test_bad_yaml_names_the_problem(tmp_path, text, msg):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(PipelineError, match=msg):
        load_config(Cfg, f)


def test_missing_config_file(tmp_path):
    with pytest.raises(PipelineError, match="config file not found"):
        load_config(Cfg, tmp_path / "nope.yaml")


def test_unknown_override():
    with pytest.raises(PipelineError, match="unknown option `nope`"):
        load_config(Cfg, None, {"nope": 1})


CONFIGS = Path(__file__).resolve().parents[2] / "configs"  # not the working directory: pytest may run from tests/


def test_shipped_configs_load():
    """Every recipe in configs/ loads, resolves and passes the checks `pipeline pretrain` makes, and trains the
    method its name says."""
    from stages.runspec import config_for_run

    files = sorted(CONFIGS.glob("*.yaml"))
    assert {f.stem for f in files} >= {"default", "simclr", "byol", "byol-small", "mocov3"}
    for f in files:
        cfg = config_for_run(f, {}, Path("never-written"), resume=False)  # resolve + validate
        assert cfg.lr > 0 and cfg.weight_decay >= 0 and cfg.batch_size >= 2, f
        if f.stem != "default":
            assert cfg.method == f.stem.split("-")[0], f
