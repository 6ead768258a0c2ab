from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from core.config import as_flags, load_config, options_from, opt
from core.errors import PipelineError
from train.configs import PretrainConfig


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
    from train.runspec import config_for_run

    files = sorted(CONFIGS.glob("*.yaml"))
    assert {f.stem for f in files} >= {"default", "simclr", "byol", "byol-small", "mocov3"}
    for f in files:
        cfg = config_for_run(f, {}, Path("never-written"), resume=False)  # resolve + validate
        assert cfg.lr > 0 and cfg.weight_decay >= 0 and cfg.batch_size >= 2, f
        if f.stem not in ("default", "digits-cpu"):  # make all's default, and the digits run it was before
            assert cfg.method == f.stem.split("-")[0], f


@pytest.mark.parametrize("word,value", [("true", True), ("TRUE", True), ("1", True), ("Yes", True),
                                        ("false", False), ("False", False), ("0", False), ("NO", False)])
def test_bool_words_from_a_flag_or_a_quoted_yaml_value(tmp_path, word, value):
    f = tmp_path / "c.yaml"
    f.write_text(f'd: "{word}"\n')
    assert load_config(Cfg, f).d is value
    assert load_config(Cfg, None, {"d": word}).d is value


def test_numbers_given_as_text_or_whole_floats_become_ints():
    assert load_config(Cfg, None, {"a": "7"}).a == 7
    cfg = load_config(Cfg, None, {"a": 4.0, "b": "2.5"})
    assert type(cfg.a) is int and cfg.a == 4 and cfg.b == 2.5


def _command_from_fields():
    """A click command whose flags options_from makes at test time (the module-level configs are made at import,
    before a test runs), and the options it was last called with."""

    @dataclass
    class Local:
        count: int = opt(3, "how many")
        rate: float | None = opt(None, "optional rate")
        mode: str = opt("x", "a choice", choices=("x", "y"))
        on: bool = opt(False, "a switch")
        dry_run: bool = opt(False, "a switch named with two words")
        two_words: int = opt(1, "a name with an underscore")
        plain: int = 2  # a field without a reason
        hidden: int = opt(0, "set in the YAML file only")

    seen = {}

    @click.command()
    @options_from(Local, skip=("hidden",))
    def cmd(**options):
        seen.clear()
        seen.update(options)

    return Local, cmd, seen


def test_flags_are_made_from_the_fields():
    Local, cmd, seen = _command_from_fields()
    assert Local() == Local(count=3, rate=None, mode="x", on=False, dry_run=False, two_words=1, plain=2, hidden=0)
    run = CliRunner().invoke
    untyped = dict.fromkeys(["count", "rate", "mode", "on", "dry_run", "two_words", "plain"])
    assert run(cmd, []).exit_code == 0
    assert seen == untyped  # None, switches included: a flag not typed does not override the YAML value
    assert run(cmd, ["--count", "5", "--rate", "0.5", "--mode", "y", "--on", "--dry-run", "--two-words", "4"]).exit_code == 0
    assert seen == {**untyped, "count": 5, "rate": 0.5, "mode": "y", "on": True, "dry_run": True, "two_words": 4}
    assert run(cmd, ["--no-on", "--no-dry-run"]).exit_code == 0
    assert seen == {**untyped, "on": False, "dry_run": False}
    assert load_config(Local, None, seen) == Local(on=False)
    assert run(cmd, ["--mode", "z"]).exit_code == 2  # the field's choices
    assert run(cmd, ["--count", "many"]).exit_code == 2  # the field's type
    assert run(cmd, ["--hidden", "1"]).exit_code == 2  # skipped
    text = " ".join(run(cmd, ["--help"]).output.split())
    for line in ("--count INTEGER how many [default: 3]", "--rate FLOAT optional rate [default: None]",
                 "--mode [x|y] a choice [default: x]", "--on / --no-on a switch [default: False]",
                 "--dry-run / --no-dry-run a switch named with two words", "--two-words INTEGER a name with an underscore",
                 "--plain INTEGER [default: 2]"):
        assert line in text, text
    assert text.index("--count") < text.index("--rate") < text.index("--mode") < text.index("--on")  # field order


def test_as_flags_gives_back_the_options_it_was_made_from():
    _, cmd, seen = _command_from_fields()
    options = {"count": 5, "rate": None, "mode": "y", "on": False, "dry_run": None, "two_words": None, "plain": None}
    flags = as_flags(options)
    assert flags == ["--count=5", "--mode=y", "--no-on"]
    assert CliRunner().invoke(cmd, flags).exit_code == 0
    assert seen == options
    assert as_flags({"on": True, "rate": -0.5}) == ["--on", "--rate=-0.5"]  # `=`: a negative value is not a flag
    assert as_flags({"two_words": 3, "dry_run": True}) == ["--two-words=3", "--dry-run"]
    assert CliRunner().invoke(cmd, as_flags({"on": True, "rate": -0.5})).exit_code == 0
    assert seen["on"] is True and seen["rate"] == -0.5


@dataclass
class Words:
    two_words: int = opt(1, "a name with an underscore")


def test_errors_name_the_file_or_the_flag_and_what_is_known(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("a: [1\n")
    with pytest.raises(PipelineError) as e:
        load_config(Cfg, f)
    assert str(e.value) == f"config file {f} is not valid YAML: while parsing a flow sequence"  # the first line
    f.write_text("zzz: 1\n")
    with pytest.raises(PipelineError) as e:
        load_config(Cfg, f)
    assert str(e.value) == f"config file {f}: unknown key `zzz` (known: a, b, c, d)"
    f.write_text("a: hello\n")
    with pytest.raises(PipelineError) as e:
        load_config(Cfg, f)
    assert str(e.value) == f"{f}: `a` must be int, got 'hello'"
    with pytest.raises(PipelineError) as e:
        load_config(Words, None, {"two_words": "x"})
    assert str(e.value) == "--two-words: `two_words` must be int, got 'x'"


def test_yaml_keys_may_use_dashes_and_untyped_flags_are_skipped(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("two-words: 5\n")
    assert load_config(Words, f).two_words == 5
    assert load_config(Cfg, None, {"a": None, "b": 3}).b == 3.0  # a None (flag not typed) before it changes nothing


def test_an_unquoted_on_or_off_in_yaml_is_the_choice_it_spells(tmp_path):
    """YAML 1.1 reads `on`/`off` as booleans; an on/off option takes them as the word the user typed."""
    f = tmp_path / "c.yaml"
    f.write_text("small_stem: on\nchannels_last: off\nproj_last_bn: on\n")
    cfg = load_config(PretrainConfig, f)
    assert (cfg.small_stem, cfg.channels_last, cfg.proj_last_bn) == ("on", "off", "on")
    f.write_text("method: yes\n")  # a choice without on/off still refuses a boolean
    with pytest.raises(PipelineError, match="`method` must be one of"):
        load_config(PretrainConfig, f)
