"""Flags derived from config dataclasses (core.cli_config) and the `flywheel` commands built from them: each
flag has its field's default and docstring, and parses back into the dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import pytest

from core.cli_config import (
    DefaultsHelpFormatter,
    add_config_arguments,
    config_argv,
    config_fields,
    config_from,
    config_values,
    field_docs,
)
from core.settings import TIER1_TASKS, parse_tasks


@dataclass(frozen=True)
class Sample:
    name: str
    """Who."""
    count: int = 3
    """How many (100% of them)."""
    ratio: float | None = None
    """A ratio (None: the bundle's)."""
    flag: bool = True
    """Whether to."""
    tags: tuple[str, ...] = ("a", "b")
    """Some tags,
    over two lines."""
    ratios: tuple[float, ...] = (0.5,)
    """Some ratios."""
    mode: Literal["fast", "slow"] = "fast"
    """How."""
    path: Path = Path("runs/x")
    """Where."""
    port: int | None = 0
    """A port (none: do not serve)."""
    extra: dict = field(default_factory=dict)
    """No flag type: needs exclude or parse."""


def sample_parser(**kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sample", formatter_class=DefaultsHelpFormatter)
    add_config_arguments(parser, Sample, **({"exclude": {"extra"}} | kwargs))
    return parser


def test_field_docs_are_the_attribute_docstrings():
    docs = field_docs(Sample)
    assert docs["name"] == "Who."
    assert docs["tags"] == "Some tags, over two lines."
    assert set(docs) == {f.name for f in dataclasses.fields(Sample)}


def test_defaults_round_trip():
    args = sample_parser().parse_args(["--name", "n"])
    assert config_from(args, Sample) == Sample(name="n")


def test_every_kind_of_field_parses():
    argv = ["--name", "n", "--count", "5", "--ratio", "0.25", "--no-flag", "--tags", "x, y", "--ratios", "0.25,1",
            "--mode", "slow", "--path", "p", "--port", "none"]  # fmt: skip
    args = sample_parser().parse_args(argv)
    config = config_from(args, Sample, extra={"k": 1})
    assert config == Sample("n", 5, 0.25, False, ("x", "y"), (0.25, 1.0), "slow", Path("p"), None, {"k": 1})
    assert config_from(sample_parser().parse_args(["--name", "n", "--tags", ""]), Sample).tags == ()


@pytest.mark.parametrize(
    "argv", [[], ["--name", "n", "--mode", "medium"], ["--name", "n", "--count", "x"], ["--name", "n", "--extra", "1"]]
)
def test_bad_values_are_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        sample_parser().parse_args(argv)
    assert exit_info.value.code == 2


def test_help_is_the_docstring_and_shows_the_default():
    parser = sample_parser()
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["Sample.count"] == "How many (100%% of them)."  # argparse reads '%' as a format
    assert helps["Sample.flag"] == "Whether to."  # not BooleanOptionalAction's own suffix
    text = " ".join(parser.format_help().split())
    assert "How many (100% of them). (default: 3)" in text
    assert "Some tags, over two lines. (default: a,b)" in text
    assert "--flag, --no-flag" in text and "{fast,slow}" in text


def test_rename_parse_and_unset():
    parser = sample_parser(rename={"count": ("--n", "--count")}, parse={"tags": parse_tasks})
    assert config_from(parser.parse_args(["--name", "n", "--count", "7"]), Sample).count == 7
    assert config_from(parser.parse_args(["--name", "n", "--n", "8", "--tags", "tier1"]), Sample).tags == TIER1_TASKS
    unset = sample_parser(unset=True)
    assert set(config_values(unset.parse_args([]), Sample).values()) == {None}
    values = config_values(unset.parse_args(["--count", "2", "--no-flag"]), Sample)
    assert values == {**dict.fromkeys(values), "count": 2, "flag": False}


def test_config_argv_is_the_parsers_inverse():
    """Every kind of field, defaults or not, written as flags and parsed back: the same config."""
    for config in (Sample("n"), Sample("-n", 5, 0.25, False, (), (0.25, 1.0), "slow", Path("-p"), None)):
        assert config_from(sample_parser().parse_args(config_argv(config, exclude={"extra"})), Sample) == config
    renamed = sample_parser(rename={"count": ("--n", "--count")})
    argv = config_argv(Sample("n", 7), exclude={"extra"}, rename={"count": ("--n", "--count")})
    assert "--n=7" in argv and config_from(renamed.parse_args(argv), Sample) == Sample("n", 7)
    with pytest.raises(ValueError, match="comma"):
        config_argv(Sample("n", tags=("a,b",)), exclude={"extra"})


@dataclass(frozen=True)
class Inner:
    count: int = 3
    """How many inside."""
    mode: Literal["fast", "slow"] = "fast"
    """How inside."""


@dataclass(frozen=True)
class Outer:
    label: str = "x"
    """A label."""
    inner: Inner = field(default_factory=lambda: Inner(count=5))
    """The inner part, with a count of its own."""


def test_a_nested_config_is_one_tree_of_flags():
    """A node's fields are flags under their own names, defaulting to the parent's value, and parse back into the
    node (its fields that are no flags keep the parent's value); the inverse writes them all."""
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    add_config_arguments(parser, Outer, exclude={"inner.mode"})
    assert parser.parse_args([]).__dict__ == {"Outer.label": "x", "Outer.inner.count": 5}
    assert config_from(parser.parse_args(["--count", "7"]), Outer) == Outer(inner=Inner(count=7))
    assert config_from(parser.parse_args([]), Outer) == Outer()
    assert "The inner part" in parser.format_help() and "How many inside. (default: 5)" in parser.format_help()
    assert [f.path for f in config_fields(Outer)] == ["label", "inner.count", "inner.mode"]
    full = argparse.ArgumentParser()
    add_config_arguments(full, Outer)
    config = Outer("y", Inner(2, "slow"))
    assert config_from(full.parse_args(config_argv(config)), Outer) == config
    with pytest.raises(ValueError, match="inner.nope"):
        add_config_arguments(argparse.ArgumentParser(), Outer, exclude={"inner.nope"})


def test_unsupported_fields_and_unknown_names_are_refused():
    with pytest.raises(TypeError, match="Sample.extra"):
        add_config_arguments(argparse.ArgumentParser(), Sample)
    with pytest.raises(ValueError, match="no_such"):
        add_config_arguments(argparse.ArgumentParser(), Sample, exclude={"extra", "no_such"})


# --- the flywheel commands ---------------------------------------------------------------------------------------

# Fields that are deliberately no flag: the recipe comes from --recipe; cmd_sft fixes the metrics' cadence. (A node of
# a nested config, e.g. EdgeConfig.teacher, is no flag either: its fields are.)
NOT_FLAGS = {"LearnConfig": {"recipe"}, "VLATrainConfig": {"log_every"}}
UNSET = {"VLATrainConfig"}  # overrides of the recipe's values
# Flags that tests, scripts (flywheel.run.fleet, flywheel.run.demo) and the README use.
FLAGS_IN_USE = {
    "edge": "--client-id --tasks --episodes --policy --max-steps --seed --summary --wait-for-model --stop-after-s "
    "--metrics-port --repeats --seeds-per-visit --teacher-budget --teacher-per-hour",
    "demo": "--turns --clients --tasks --episodes-per-task --sft-steps --finetune-steps --out --no-prometheus "
    "--prometheus-port --minutes --min-demos --every-episodes --every-minutes --min-new-episodes --offline-steps "
    "--repeats --temperature --greedy-episodes --retrain-steps --rl-updates-per-retrain --machines --workers "
    "--teacher-budget --teacher-per-hour --top-k --seeds-per-visit --curriculum --guidance --no-twin",
    "chaos": "--minutes --out --seed --faults --strikes --clients --cut-s --warmup-s --recover-s --recover-timeout-s "
    "--tasks --sft-steps",
    "process": "--metrics-port --loglevel --no-restart",
    "eval": "--model --policy --tasks --episodes --out --first-seed --threads --keep-ratio-override --browsers "
    "--env-path --baseline",
    "learner": "--recipe --sft-steps --min-demos --every-episodes --every-minutes --min-new-episodes --offline-steps "
    "--guidance --poll-s --curriculum --retrain-steps --rl-updates-per-retrain --self-imitation-top-k",
    "twin": "--summary --recipe --sft-steps --min-demos --every-episodes --every-minutes --min-new-episodes "
    "--offline-steps --guidance --poll-s --curriculum --retrain-steps --rl-updates-per-retrain --self-imitation-top-k",
    "demonstrations": "--out --tasks --episodes-per-task --clients --seed",
    "sft": "--recipe --steps --batch-size --seed --lora-rank --metrics-port --summary",
    "bench edge": "--model-dir --out --screens-per-task --passes --rounds --threads",
    "bench env": "--out --workload --task-seeds --parallel-browsers --paths --policies",
    "bench pipeline": "--events --rate --client-steps-per-s --out",
    "bench maintenance": "--rows --commits --out",
    "maintain": "--once --interval --json --min-retention-hours",
    "spool replay": "--client-id --home",
}


def subparsers(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + name] = sub
                found |= subparsers(sub, f"{prefix}{name} ")
    return found


@pytest.fixture(scope="module")
def commands() -> dict[str, argparse.ArgumentParser]:
    from flywheel.cli import build_parser

    return subparsers(build_parser())


@pytest.fixture(scope="module")
def config_classes() -> dict[str, type]:
    from edge_client.runner import EdgeConfig
    from edge_client.teacher import TeacherConfig
    from flywheel.admin.canary import CanaryConfig
    from flywheel.admin.spool import SpoolReplayConfig
    from flywheel.bench.edge import EdgeBenchConfig
    from flywheel.bench.env import EnvBenchConfig
    from flywheel.bench.learner import LearnerBenchConfig
    from flywheel.bench.maintenance import MaintenanceBenchConfig
    from flywheel.bench.pipeline import BenchConfig
    from flywheel.bench.security import SecurityBenchConfig
    from flywheel.chaos.run import ChaosConfig
    from flywheel.experiments.arms.iterated_search_bc import IteratedSearchBCSettings
    from flywheel.experiments.arms.offline_rl import OfflineRLSettings
    from flywheel.experiments.arms.search_bc_rl import SearchBCRLSettings
    from flywheel.experiments.explore import ExploreConfig
    from flywheel.experiments.harness import ArmsConfig
    from flywheel.gathering.eval_command import EvalConfig
    from flywheel.run.config import DemoConfig
    from flywheel.run.diagnose import DiagnoseConfig
    from flywheel.run.release import DemonstrationsConfig
    from flywheel.soak.run import SoakConfig
    from learner.daemon.daemon_config import DaemonConfig
    from learner.recipe import LearnConfig, VLATrainConfig
    from processors.maintenance import MaintenanceConfig
    from processors.worker_config import WorkerConfig

    classes = (EdgeConfig, EdgeBenchConfig, BenchConfig, EvalConfig, DemoConfig, DemonstrationsConfig, LearnConfig,
               VLATrainConfig, MaintenanceConfig, MaintenanceBenchConfig, DaemonConfig,
               EnvBenchConfig, LearnerBenchConfig, TeacherConfig, SecurityBenchConfig,
               ChaosConfig, SpoolReplayConfig, DiagnoseConfig, WorkerConfig, ExploreConfig, ArmsConfig,
               OfflineRLSettings, SearchBCRLSettings, IteratedSearchBCSettings, CanaryConfig, SoakConfig)  # fmt: skip
    return {c.__name__: c for c in classes}


def test_every_config_flag_has_the_dataclass_default_and_docstring(commands, config_classes):
    """Each flag has its field's docstring and the default of its config's tree: the field's own, or, in a node of a
    nested config, the value the parent's default gives it (e.g. `flywheel demo --min-demos`: the demo's learner's)."""
    flagged: dict[str, set[str]] = {}
    for command, parser in commands.items():
        for action in parser._actions:
            if "." not in action.dest:
                continue
            class_name, path = action.dest.split(".", 1)
            f = {f.path: f for f in config_fields(config_classes[class_name])}[path]
            owner = f.owner.__name__
            assert owner in config_classes, f"{command}: {owner} is not registered here"
            flagged.setdefault(owner, set()).add(f.name)
            doc = field_docs(f.owner).get(f.name)
            assert doc, f"{command} {action.option_strings[0]}: {owner}.{f.name} has no docstring"
            assert action.help == doc.replace("%", "%%"), f"{command} {action.option_strings[0]}"
            if class_name in UNSET:
                assert action.default is None and not action.required
            elif f.default is dataclasses.MISSING:
                assert action.required, f"{command} {action.option_strings[0]}"
            else:
                assert action.default == f.default, f"{command} {action.option_strings[0]}"
    for class_name, cls in config_classes.items():
        nodes = {name for name, hint in typing.get_type_hints(cls).items() if dataclasses.is_dataclass(hint)}
        fields = {f.name for f in dataclasses.fields(cls)} - NOT_FLAGS.get(class_name, set()) - nodes
        assert flagged.get(class_name) == fields, f"{class_name}: fields without a flag"


def test_flags_in_use_are_kept(commands):
    for command, flags in FLAGS_IN_USE.items():
        options = {o for a in commands[command]._actions for o in a.option_strings}
        assert set(flags.split()) <= options, f"{command}: {set(flags.split()) - options}"


def test_command_lines_parse_into_their_configs(commands, config_classes):
    from flywheel.cli import build_parser
    from learner.recipe import VLARecipe

    parser, c = build_parser(), config_classes
    args = parser.parse_args(["edge", "--client-id", "c0", "--tasks", "tier1,enter-text", "--episodes", "3",
                              "--policy", "model", "--summary", "s.json", "--metrics-port", "none"])  # fmt: skip
    assert config_from(args, c["EdgeConfig"]) == c["EdgeConfig"](
        "c0", (*TIER1_TASKS, "enter-text"), 3, "model", summary_path=Path("s.json"), metrics_port=None
    )
    demo = config_from(parser.parse_args(["demo", "--out", "d", "--no-prometheus", "--tasks", "click-test",
                                          "--min-demos", "7", "--teacher-budget", "0"]), c["DemoConfig"])  # fmt: skip
    default, no_teacher = c["DemoConfig"](out=Path("d")), c["TeacherConfig"]()
    assert demo == replace(default, prometheus=False, learner=replace(default.learner, min_demos=7),
                           fleet=replace(default.fleet, tasks=("click-test",), teacher=no_teacher))  # fmt: skip
    edge = parser.parse_args(["edge", "--client-id", "c0", "--teacher-budget", "3", "--no-bootstrap-expert"])
    assert config_from(edge, c["EdgeConfig"]) == c["EdgeConfig"]("c0", teacher=c["TeacherConfig"](teacher_budget=3))
    bench = config_from(parser.parse_args(["bench", "edge", "--out", "b", "--rounds", "1"]), c["EdgeBenchConfig"])
    assert bench == c["EdgeBenchConfig"](out=Path("b"), rounds=1)
    replay = parser.parse_args(["spool", "replay", "--client-id", "c0", "--home", "/srv/c0-home"])
    assert config_from(replay, c["SpoolReplayConfig"]) == c["SpoolReplayConfig"]("c0", Path("/srv/c0-home"))
    # sft: the flags given replace the recipe's values, the rest stay the recipe's.
    learn = parser.parse_args(["sft", "--steps", "3", "--keep-ratios", "0.5,1", "--no-warm-start"])
    recipe = VLARecipe.load("demo", **config_values(learn, c["VLATrainConfig"]))
    assert (recipe.train.steps, recipe.train.keep_ratios) == (3, (0.5, 1.0))
    assert recipe.train.batch_size == VLARecipe.load("demo").train.batch_size
    assert config_from(learn, c["LearnConfig"], recipe=recipe) == c["LearnConfig"](recipe=recipe, warm_start=False)


# One fresh interpreter runs `flywheel CMD --help` for every command (one per command would import the learner's
# torch once per process, minutes on a shared box); a second checks the edge's flags build without the learner.
HELP_ALL = """
import contextlib, io, json, sys
from flywheel.cli import main
results = {}
for name in sys.argv[1:]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*name.split(), "--help"])
        except SystemExit as exit:
            results[name] = [exit.code, out.getvalue()]
print(json.dumps(results))
"""
EDGE_ONLY = """
import sys
from flywheel.cli import main
try:
    main(["edge", "--help"])
except SystemExit:
    pass
print(sorted({"torch", "transformers", "polars", "faust"} & set(sys.modules)))
"""


def test_help_runs_for_every_command(commands):
    names = ["", *commands]
    run = functools.partial(subprocess.Popen, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    every, edge = run([sys.executable, "-c", HELP_ALL, *names]), run([sys.executable, "-c", EDGE_ONLY])
    out, err = every.communicate(timeout=300)
    assert every.returncode == 0, err[-3000:]
    results = json.loads(out)
    for name in names:
        code, text = results.get(name, (None, ""))
        assert code == 0 and text.startswith(f"usage: flywheel {name}".rstrip()), f"flywheel {name} --help: {text}"
    out, err = edge.communicate(timeout=300)
    assert edge.returncode == 0 and out.strip().endswith("[]"), out[-500:] + err[-2000:]


# --- every door fuzzed: the settings and the flags -----------------------------------------------------

SECRET = "pw-4f9a7c1e-not-for-logs"
JUNK = ["", " ", "-1", "0", "nan", "1e309", "x" * 300, SECRET, "s3://", "http://", "é\u202e", "[1]", '{"a": 1}', "-",
        "none"]  # fmt: skip
# Values a setting must refuse, by field: each would break something later and far from its cause.
REFUSED = {
    "kafka_port": ["0", "70000", "x"], "kafka_nodes": ["0", "-2"], "s3_port": ["0", "65536"],
    "kafka_heap": ["lots", "384", "0m"], "kafka_version": ["latest", "4"], "s3proxy_version": ["../4.1.0"],
    "data_dir": ["", " ", "http://host/x", "s3://", "s3:///prefix"], "s3_endpoint": ["localhost:9000", "ftp://x"],
    "s3_region": [""], "topic_partitions": ["0"], "topic_retention_ms": ["-2"], "topic_prefix": ["a b", "a/b", ""],
    "canary_fraction": ["1.5", "-0.1"], "max_model_bytes": ["0"],
    "security_protocol": ["TLS", "plaintext "], "sasl_mechanism": ["SCRAM"], "require_signed_models": ["maybe"],
}  # fmt: skip


def setting_variable(name: str) -> str:
    from core.settings import Settings

    aliases = getattr(Settings.model_fields[name].validation_alias, "choices", None)
    return aliases[0] if aliases else f"FLYWHEEL_{name.upper()}"


def test_every_setting_takes_junk_as_a_value_or_a_refusal_naming_its_variable(monkeypatch):
    """Each field's environment variable set to each junk value: Settings() is built, or fails with an error that
    names that variable and does not echo the value (it may be a secret). Never another exception."""
    from pydantic import ValidationError

    from core.settings import Settings, describe_settings_error

    for name in Settings.model_fields:
        variable = setting_variable(name)
        for value in JUNK + REFUSED.get(name, []):
            with monkeypatch.context() as env:
                env.setenv(variable, value)
                try:
                    Settings()
                except ValidationError as error:
                    message = describe_settings_error(error)
                    assert message.startswith(variable), (variable, value, message)
                    assert SECRET not in message and "x" * 300 not in message, f"{variable}: it echoes the value"
                else:
                    assert value not in REFUSED.get(name, []), f"{variable}={value!r} was accepted"


def test_a_value_a_config_refuses_is_a_usage_error_naming_the_field_before_anything_starts(capsys):
    """A config's own check (its __post_init__) turns into exit 2 and one line naming the field, not a traceback,
    and nothing starts: the worker would otherwise run, and the client open a browser."""
    from flywheel.cli import main

    for argv, field_name in [
        (["process", "--no-restart", "--abandon-after-s", "0"], "abandon_after_s"),
        (["process", "--no-restart", "--dedup-window-s", "nan"], "dedup_window_s"),
        (["process", "--no-restart", "--maintenance-interval-s", "-1"], "maintenance_interval_s"),
        (["replay", "--out", "x", "--max-screenshot-bytes", "0"], "max_screenshot_bytes"),
        (["edge", "--client-id", "c", "--teacher-ask", "bogus"], "teacher_ask"),
        (["edge", "--client-id", "c", "--spool-max-bytes", "0"], "spool_max_bytes"),
        (["canary", "--min-episodes", "0"], "min_episodes"),
    ]:
        assert main(argv) == 2, argv
        error = capsys.readouterr().err
        assert error.startswith(f"flywheel {argv[0]}: ") and field_name in error and "Traceback" not in error, error


def test_a_wrong_setting_is_a_usage_error_of_the_cli_not_a_traceback():
    for variable, value in [("FLYWHEEL_KAFKA_PORT", "port"), ("FLYWHEEL_DATA_DIR", "http://x/y"),
                            ("FLYWHEEL_ABANDON_AFTER_S", "60")]:  # fmt: skip
        result = subprocess.run([sys.executable, "-m", "flywheel.cli", "dlq"], capture_output=True, text=True,
                                env={**os.environ, variable: value}, timeout=120)  # fmt: skip
        assert result.returncode == 2, result.stderr[-2000:]
        assert variable in result.stderr and "Traceback" not in result.stderr
    # a variable that once tuned the worker names the flag that replaced it, rather than being ignored in silence
    assert "flywheel process --abandon-after-s" in result.stderr


def test_every_flag_of_every_command_takes_junk_as_a_value_or_a_usage_error(commands, capsys):
    """argparse turns only ValueError/TypeError/ArgumentTypeError of a flag's type into a usage error: a derived
    flag's parser (tuples, Literals, task lists, 'none') must raise nothing else."""
    from flywheel.cli import build_parser

    parser = build_parser()
    for command in commands:
        for action in commands[command]._actions:
            if not action.option_strings or action.nargs == 0 or action.dest == "help":
                continue
            flag = action.option_strings[0]
            for value in JUNK:
                try:
                    parser.parse_args([*command.split(), flag, value])
                except SystemExit as exit:
                    assert exit.code == 2, (command, flag, value)
                    error = capsys.readouterr().err
                    assert "error:" in error and "Traceback" not in error, (command, flag, value, error[-500:])
