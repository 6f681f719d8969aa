"""One run, one config: a run's settings form one tree (flywheel.run.config), each setting declared once,
and the command lines of the processes the run starts are that tree written as flags (core.cli_config.config_argv),
which each child's parser reads back into the same config."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from core.cli_config import config_classes, config_from, conflicting_defaults
from core.settings import NEW_TASKS
from edge_client.runner import EdgeConfig
from edge_client.teacher import TeacherConfig
from flywheel.chaos.run import ChaosConfig
from flywheel.cli import build_parser
from flywheel.experiments.harness import ArmsConfig
from flywheel.run.config import DemoConfig, fleet_client, learner_args, learner_config, twin_args, worker_args
from flywheel.run.fleet import FleetRun, client_config, edge_args
from learner.daemon.daemon_config import DaemonConfig
from processors.worker_config import WorkerConfig
from registry.store import RELEASE_DIR

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("schemas", "core", "streams", "registry", "policy", "lake", "edge_client", "processors", "learner",
          "flywheel")  # fmt: skip


@pytest.mark.parametrize("root", [DemoConfig, ChaosConfig, ArmsConfig])
def test_no_setting_of_a_run_is_declared_twice_with_different_defaults(root):
    """Where a run wants another value than a part's own default, its tree says so (DemoConfig.fleet's default ...);
    a second declaration of the setting would be a second knob to find and keep in step."""
    classes = config_classes(root)
    assert {EdgeConfig, TeacherConfig, DaemonConfig} <= set(classes)
    assert conflicting_defaults(classes) == {}


def repository_config_classes() -> list[type]:
    """Every top-level dataclass or pydantic model named *Config or *Settings in the packages."""
    found = []
    for package in FLOORS:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text(), filename=str(path)).body:
                if isinstance(node, ast.ClassDef) and node.name.endswith(("Config", "Settings")):
                    cls = getattr(importlib.import_module(module), node.name)
                    if dataclasses.is_dataclass(cls) or hasattr(cls, "model_fields"):
                        found.append(cls)
    return found


def test_no_setting_of_the_repository_is_declared_twice_with_different_defaults():
    """One name, one default: a run's tree gives a part another value in its node (a run's `fleet`, `learner`; the
    node is the run's tree, not a second declaration); a command's own argument that means something else is named
    for what it is (bench env's `workload`, eval's `first_seed`); a command's output directory has no default."""
    conflicts = {name: declared for name, declared in conflicting_defaults(repository_config_classes()).items()
                 if not any(dataclasses.is_dataclass(v) for v in declared.values())}  # fmt: skip
    assert conflicts == {}


@dataclass
class Learner:
    min_demos: int = 20
    poll_s: float = 5.0


@dataclass
class Run:
    min_demos: int = 96  # the same setting again, another default
    poll_s: float = 5.0  # again, but the same default
    learner: Learner = field(default_factory=Learner)


def test_the_check_sees_a_setting_declared_twice():
    assert config_classes(Run) == [Run, Learner]
    assert conflicting_defaults(config_classes(Run)) == {"min_demos": {"Run": 96, "Learner": 20}}


@pytest.fixture(scope="module")
def parser():
    return build_parser(["demo", "chaos", "learner", "twin", "edge", "process"])


def demo(parser, *flags: str) -> DemoConfig:
    return config_from(parser.parse_args(["demo", "--out", "runs/demo", *flags]), DemoConfig)


def test_the_childrens_command_lines_parse_back_into_the_run_config(parser, tmp_path):
    config = demo(parser, "--minutes", "5", "--min-demos", "7", "--top-k", "3", "--curriculum", "rl", "--repeats", "8",
                  "--teacher-budget", "4", "--teacher-ask", "uncertain", "--loglevel", "info")  # fmt: skip
    learner = config_from(parser.parse_args(learner_args(config)), DaemonConfig)
    assert learner == learner_config(config) == replace(config.learner, self_imitation_top_k=3, new_tasks=NEW_TASKS)
    assert (learner.min_demos, learner.curriculum, learner.sft_steps, learner.poll_s) == (7, "rl", 50, 2.0)
    assert learner.start_from == str(RELEASE_DIR / "model.pt") and learner.recipe == "release"  # the tree's own
    twin = parser.parse_args(twin_args(config, "dagger-0002", tmp_path / "twin.json"))
    assert config_from(twin, DaemonConfig) == learner and twin.version == "dagger-0002"
    fleet = FleetRun("fleet", "f-", 2, config.fleet.tasks, 10**6, "model", 0, edge=fleet_client(config, 60.0))
    client = client_config(fleet, 1, tmp_path / "c1.json")
    edge = config_from(parser.parse_args(edge_args(client)), EdgeConfig)
    assert edge == client and (edge.client_id, edge.seed, edge.stop_after_s) == ("f-c1", 1000, 60.0)
    assert edge.teacher == TeacherConfig(teacher_budget=4, teacher_ask=("uncertain",))
    assert (edge.repeats, edge.top_k, edge.temperature, edge.bootstrap_expert) == (8, 3, 0.7, True)
    worker = parser.parse_args(["process", *worker_args(config.worker)])
    assert config_from(worker, WorkerConfig) == config.worker == WorkerConfig(loglevel="info")


def test_a_turns_fleet_runs_the_edges_defaults_beyond_its_phase(tmp_path):
    """Turns run the experts, then each version greedily and without a teacher: the edge's own defaults."""
    client = client_config(FleetRun("turn2", "t2-", 1, ("click-test",), 4, "model", 20_000), 0, tmp_path / "s.json")
    assert client == EdgeConfig("t2-c0", ("click-test",), 4, "model", seed=20_000, summary_path=tmp_path / "s.json")


def test_chaos_runs_the_demo_tree_with_its_own_defaults(parser):
    config = config_from(parser.parse_args(["chaos", "--strikes", "1", "--sft-steps", "20", "--tasks", "click-test"]),
                         ChaosConfig)  # fmt: skip
    assert (config.strikes, config.run.learner.sft_steps, config.run.fleet.tasks) == (1, 20, ("click-test",))
    assert (config.run.minutes, config.run.out, config.run.learner.min_demos) == (30.0, Path("runs/chaos"), 48)
    # what chaos does not change is the demo's
    assert config.run.fleet.teacher == DemoConfig(out=Path("d")).fleet.teacher
    with pytest.raises(SystemExit):  # `--repeats` was chaos's strikes: refused rather than read as the fleet's
        parser.parse_args(["chaos", "--repeats", "1"])
