"""`flywheel` command line: one subcommand per process or job of the system."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from kafka.errors import KafkaConnectionError, KafkaTimeoutError
from pydantic import ValidationError

from core.cli_config import (
    ConfigError,
    DefaultsHelpFormatter,
    add_config_arguments,
    config_argv,
    config_from,
    config_values,
)
from core.settings import TASK_ALIASES, describe_settings_error, get_settings, parse_tasks, removed_variables_set
from flywheel.admin.commands import OPERATOR_COMMANDS


def runnable_tasks(value: str) -> tuple[str, ...]:
    """A --tasks flag: task ids and the aliases 'tier1', 'tier2', 'suite', 'new', each one MiniWoB++ can run;
    refused while the command line is read, so nothing starts for a run that would die on its fourth task."""
    from edge_client.tasks import check_runnable

    try:
        return check_runnable(parse_tasks(value))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


TASKS = {"tasks": runnable_tasks}


class HelpFormatter(DefaultsHelpFormatter):
    """Task-list defaults by their alias ('suite', not 24 task ids)."""

    def format_default(self, value: object) -> str:
        alias = next((name for name, tasks in TASK_ALIASES.items() if value == tasks), None)
        return alias or super().format_default(value)


# Each command is a pair: `_name(p)` adds its flags and, right below it, `cmd_name(args)` turns them into the
# command's config and calls the one function that does the work. Flags are added only when that command runs
# (main), because deriving them from a config dataclass imports its module: `flywheel edge` on an edge install
# must not import the learner's torch.
def _process(p: argparse.ArgumentParser) -> None:
    from processors.worker_config import WorkerConfig

    add_config_arguments(p, WorkerConfig)
    p.set_defaults(func=cmd_process)


def cmd_process(args: argparse.Namespace) -> int:
    from processors.worker_config import WorkerConfig

    config = config_from(args, WorkerConfig)
    if config.restart:
        from core.processes import supervise

        # A crashed worker acked nothing: the next one is redelivered what it had not written (processors.worker).
        worker = [sys.executable, "-m", "flywheel.cli", "process", *config_argv(replace(config, restart=False))]
        return supervise(worker, "faust worker")
    from processors.worker import run_worker

    run_worker(get_settings(), config)
    return 0


def _edge(p: argparse.ArgumentParser) -> None:
    from edge_client.runner import FLAG_NAMES, EdgeConfig

    add_config_arguments(
        p, EdgeConfig, parse={**TASKS, "new_tasks": runnable_tasks}, rename=FLAG_NAMES
    )  # the teacher's flags: a group of their own
    p.set_defaults(func=cmd_edge)


def cmd_edge(args: argparse.Namespace) -> int:
    from edge_client.runner import EdgeConfig, run_client
    from edge_client.spool import SpoolInUse

    config = config_from(args, EdgeConfig)
    try:
        summary = run_client(config, get_settings())
    except SpoolInUse as error:  # this client id already runs (or its spool is being replayed): one sender only
        print(f"flywheel edge: {error}", file=sys.stderr)
        return 1
    print(json.dumps(summary.__dict__))
    if summary.unsent:
        print(
            f"{summary.unsent} events are still spooled (Kafka unreachable); the next run sends them", file=sys.stderr
        )
    return 0 if summary.unsent == 0 else 1


def _sft(p: argparse.ArgumentParser) -> None:
    from learner.recipe import LearnConfig, VLATrainConfig

    p.add_argument("--recipe", default="demo", help="VLA recipe: 'demo', 'release' (configs/vla_<name>.json) or a path")
    p.add_argument("--metrics-port", type=int, default=0, help="0: any free port, -1: do not serve")
    p.add_argument("--summary", help="write the run summary JSON here")
    add_config_arguments(p, LearnConfig, exclude={"recipe"})
    # cmd_sft sets log_every (the metrics' cadence), so it is no flag.
    train = p.add_argument_group("training (VLATrainConfig)", "each one not given keeps the recipe's value")
    add_config_arguments(train, VLATrainConfig, exclude={"log_every"}, unset=True)
    p.set_defaults(func=cmd_sft)


def cmd_sft(args: argparse.Namespace) -> int:
    from core.metrics import serve_metrics
    from learner.daemon.sft_once import learn_once
    from learner.recipe import LearnConfig, VLARecipe, VLATrainConfig

    settings = get_settings()
    if args.metrics_port >= 0:
        serve_metrics("flywheel-learner", settings.metrics_host, args.metrics_port)
    # Metrics follow every 5th step (a short run still shows its loss curve); the console every 25th.
    recipe = VLARecipe.load(args.recipe, **{**config_values(args, VLATrainConfig), "log_every": 5})
    config = config_from(args, LearnConfig, recipe=recipe)

    def progress(p) -> None:
        if p.step % 25 == 0 or p.step == p.total_steps:
            print(
                f"  sft step {p.step}/{p.total_steps} loss {p.loss:.3f} ({p.samples_per_s:.0f} samples/s)", flush=True
            )

    summary = learn_once(settings, config, progress)
    print(json.dumps(summary), flush=True)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    return 0


def _learner(p: argparse.ArgumentParser) -> None:
    from learner.daemon.daemon_config import DaemonConfig

    p.add_argument("--metrics-port", type=int, default=0, help="0: any free port, -1: do not serve")
    add_config_arguments(p, DaemonConfig)
    p.set_defaults(func=cmd_learner)


def cmd_learner(args: argparse.Namespace) -> int:
    from core.metrics import serve_metrics
    from learner.daemon.daemon_config import DaemonConfig
    from learner.daemon.loop import run_daemon

    settings = get_settings()
    if args.metrics_port >= 0:
        serve_metrics("flywheel-learner", settings.metrics_host, args.metrics_port)
    state = run_daemon(settings, config_from(args, DaemonConfig))
    print(json.dumps(state.versions), flush=True)
    return 0


def _twin(p: argparse.ArgumentParser) -> None:
    from learner.daemon.daemon_config import DaemonConfig

    p.add_argument("version", help="a published version retrained from SFT (dagger, self_imitation, or anchored RL "
                   "after one)")  # fmt: skip
    p.add_argument("--summary", help="write the twin's summary JSON here (its bundle's address and digest included)")
    learner = p.add_argument_group("the learner's flags (DaemonConfig)", "give those the learner ran with: the twin "
                                   "trains as it trained the version")  # fmt: skip
    add_config_arguments(learner, DaemonConfig)
    p.set_defaults(func=cmd_twin)


def cmd_twin(args: argparse.Namespace) -> int:
    from learner.daemon.daemon_config import DaemonConfig
    from learner.daemon.twin import train_twin

    summary = train_twin(get_settings(), config_from(args, DaemonConfig), args.version)
    print(json.dumps(summary), flush=True)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    return 0


def _diagnose(p: argparse.ArgumentParser) -> None:
    from flywheel.run.diagnose import DiagnoseConfig

    add_config_arguments(p, DiagnoseConfig, parse=TASKS)
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from flywheel.run.diagnose import DiagnoseConfig, run_diagnose

    report = run_diagnose(config_from(args, DiagnoseConfig), get_settings())
    print(json.dumps(report["tasks"], indent=2))
    return 0


def _eval(p: argparse.ArgumentParser) -> None:
    from flywheel.gathering.eval_command import EvalConfig

    add_config_arguments(p, EvalConfig, parse=TASKS)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from flywheel.gathering.eval_command import EvalConfig, check_eval_config, run_eval

    config = config_from(args, EvalConfig)
    try:
        check_eval_config(config)
    except ValueError as error:
        raise SystemExit(f"flywheel eval: {error}") from None
    run_eval(config, get_settings())
    return 0


def _demonstrations(p: argparse.ArgumentParser) -> None:
    from flywheel.run.release import NOT_DEMONSTRATION_FLAGS, DemonstrationsConfig

    add_config_arguments(p, DemonstrationsConfig, exclude=NOT_DEMONSTRATION_FLAGS,
                         parse={"fleet.tasks": runnable_tasks},
                         rename={"fleet.episodes_per_task": "--episodes-per-task"})  # fmt: skip
    p.set_defaults(func=cmd_demonstrations)


def cmd_demonstrations(args: argparse.Namespace) -> int:
    from flywheel.run.release import DemonstrationsConfig, collect_demonstrations

    report = collect_demonstrations(config_from(args, DemonstrationsConfig), get_settings())
    print(json.dumps({k: report[k] for k in ("episodes", "steps", "success_rate", "table_versions")}))
    return 0


def _release(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="configs/vla_release.json")
    p.add_argument("--work", default="runs/release", help="demonstrations, checkpoints and logs")
    p.add_argument("--release-dir", default=None, help="where model.vla + manifest.json go (default: ./release)")
    p.add_argument("--steps", type=int, default=None,
                   help="train this many steps instead of the recipe's train.steps (e.g. an equal-CPU A/B); "
                        "the manifest's config records it")  # fmt: skip
    p.set_defaults(func=cmd_release)


def cmd_release(args: argparse.Namespace) -> int:
    from flywheel.run.release import run_release
    from registry.store import RELEASE_DIR

    release_dir = Path(args.release_dir) if args.release_dir else RELEASE_DIR
    manifest = run_release(Path(args.config), Path(args.work), release_dir, get_settings(), steps=args.steps)
    print(json.dumps({k: manifest[k] for k in ("version", "sha256", "training", "wall_s")}))
    return 0


def _experiment(p: argparse.ArgumentParser) -> None:
    from flywheel.experiments.explore import NOT_EXPLORE_FLAGS, ExploreConfig
    from flywheel.experiments.harness import NOT_ARMS_FLAGS, ArmsConfig, parse_arms

    add_config_arguments(p, ArmsConfig, parse={"fleet.new_tasks": runnable_tasks, "arms": parse_arms},
                         exclude=NOT_ARMS_FLAGS)  # fmt: skip
    p.set_defaults(func=cmd_experiment)
    kinds = p.add_subparsers(dest="kind", metavar="{explore}", help="instead of the arms:")
    explore = kinds.add_parser("explore", help="the fleet's exploration on the new tasks (K runs a seed on the "
                               "temperature ladder, then the search): pass@K and pass with the search per task -> "
                               "OUT/explore.json", formatter_class=HelpFormatter)  # fmt: skip
    add_config_arguments(explore, ExploreConfig, parse={"fleet.new_tasks": runnable_tasks}, exclude=NOT_EXPLORE_FLAGS)
    explore.set_defaults(func=cmd_explore)


def cmd_experiment(args: argparse.Namespace) -> int:
    from flywheel.experiments.harness import ArmsConfig, check_arms_config, run_arms

    config = config_from(args, ArmsConfig)
    try:
        check_arms_config(config)
    except ValueError as error:
        print(f"flywheel experiment: {error}", file=sys.stderr)
        return 2
    run_arms(config)
    return 0


def cmd_explore(args: argparse.Namespace) -> int:
    from flywheel.experiments.explore import ExploreConfig, run_explore

    run_explore(config_from(args, ExploreConfig), get_settings())
    return 0


def _demo(p: argparse.ArgumentParser) -> None:
    from flywheel.run.config import NOT_DEMO_FLAGS, DemoConfig

    add_config_arguments(
        p, DemoConfig, parse={"fleet.tasks": runnable_tasks, "fleet.new_tasks": runnable_tasks}, exclude=NOT_DEMO_FLAGS
    )
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from flywheel.run.demo import DemoConfig, run_demo

    report = run_demo(config_from(args, DemoConfig), get_settings())
    phases = report["turns"] + ([report] if report.get("mode") == "continuous" else [])
    return 0 if all(p["steps_in_delta"] == p["steps_published"] for p in phases) else 1


def _chaos(p: argparse.ArgumentParser) -> None:
    from flywheel.chaos.run import NOT_CHAOS_FLAGS, ChaosConfig

    add_config_arguments(
        p,
        ChaosConfig,
        parse={"run.fleet.tasks": runnable_tasks, "run.fleet.new_tasks": runnable_tasks},
        exclude=NOT_CHAOS_FLAGS,
    )
    p.set_defaults(func=cmd_chaos)


def cmd_chaos(args: argparse.Namespace) -> int:
    from flywheel.chaos.run import ChaosConfig, run_chaos

    report = run_chaos(config_from(args, ChaosConfig), get_settings())
    return 0 if report["ledger_ok"] and report["all_recovered"] else 1


def _soak(p: argparse.ArgumentParser) -> None:
    from flywheel.soak.run import NOT_SOAK_FLAGS, SoakConfig

    add_config_arguments(
        p,
        SoakConfig,
        parse={"run.fleet.tasks": runnable_tasks, "run.fleet.new_tasks": runnable_tasks},
        exclude=NOT_SOAK_FLAGS,
    )
    p.set_defaults(func=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    from flywheel.soak.run import SoakConfig, run_soak

    report = run_soak(config_from(args, SoakConfig), get_settings())
    return 0 if report.get("finished") is False or report["targets"]["ledger_ok"] else 1


def _bench(p: argparse.ArgumentParser) -> None:
    from flywheel.bench import edge, env, learner, maintenance, pipeline, security

    what = p.add_subparsers(dest="what", required=True)
    kinds = {  # each bench module's config and `command(config, settings) -> exit code`
        "pipeline": ("faust vs a bare consumer: capacity and latency", pipeline, pipeline.BenchConfig),
        "edge": ("the VLA step five ways on real screens", edge, edge.EdgeBenchConfig),
        "env": ("environment steps/s: stock miniwob, the previous and the fast path", env, env.EnvBenchConfig),
        "learner": ("samples/s, FLOPs and the fp32 ceiling per update", learner, learner.LearnerBenchConfig),
        "maintenance": ("a steps table before and after maintenance", maintenance, maintenance.MaintenanceBenchConfig),
        "security": ("the same demo over PLAINTEXT and SASL_SSL (TLS, SCRAM, ACLs): wall times side by side", security,
                     security.SecurityBenchConfig),
    }  # fmt: skip
    for name, (help_text, module, config) in kinds.items():
        kind = what.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        workload = {"workload": runnable_tasks} if "workload" in config.__dataclass_fields__ else None
        add_config_arguments(kind, config, parse=workload)
        kind.set_defaults(func=lambda args, module=module, config=config: module.command(config_from(args, config),
                                                                                        get_settings()))  # fmt: skip
    help_text = "the baseline consumer process `bench pipeline` starts"
    bare = what.add_parser("bare-consumer", help=help_text, description=help_text, formatter_class=HelpFormatter)
    bare.set_defaults(func=lambda _args: pipeline.run_bare_consumer(get_settings()) or 0)


# The system's processes and jobs, then the operator's commands (flywheel.admin.commands).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "process": ("run the faust stream processors (steps -> Delta)", _process),
    "edge": ("run one edge client", _edge),
    "sft": ("one SFT run on the Delta tables' demonstrations and successes, published as a model version", _sft),
    "learner": (
        "the continuous learner: SFT, then retrains from it on demos + teacher labels (curriculum "
        "supervised) or offline RL -> online RL (curriculum rl), a version every N episodes",
        _learner,
    ),
    "twin": ("a version's retrain again on the demonstrations alone: its no-fleet twin (stored, unpublished)", _twin),
    "eval": ("success rate per task with the binary reward", _eval),
    "diagnose": ("where clicks go wrong: map and decoded click in the target, recall under pruning", _diagnose),
    "demonstrations": ("expert demonstrations on the suite, through Kafka into Delta", _demonstrations),
    "release": ("demonstrations -> VLA SFT -> release/ (reproducible; resumes)", _release),
    "experiment": (
        "methods that learn the new tasks, a module each, beside their no-fleet twins (arms.json)",
        _experiment,
    ),
    "demo": (
        "the whole flywheel turning by itself for --minutes (the main job; --turns N: N rounds instead), "
        "then DIR/report.json",
        _demo,
    ),
    "chaos": ("the continuous flywheel under a seeded fault schedule, then the ledger check: DIR/chaos.json", _chaos),
    "soak": ("the main job's parts for hours, each process and table sampled, then the ledger: DIR/soak.json", _soak),
    "bench": (
        "benchmarks: `pipeline`, `edge` (VLA step), `env` (environment), `learner`, `maintenance`, `security`",
        _bench,
    ),
    **OPERATOR_COMMANDS,
}


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """Every subcommand, with the flags of those in `commands` (None: all of them)."""
    parser = argparse.ArgumentParser(prog="flywheel", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, configure) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if commands is None or name in commands:
            configure(p)
    return parser


ORCHESTRATORS = {"demo", "demonstrations", "release", "experiment", "bench", "chaos", "soak"}  # they start processes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The only top-level option (-v) takes no value, so the first word is the command.
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser([command] if command else []).parse_args(argv)
    if command in ORCHESTRATORS:
        # SIGTERM unwinds like Ctrl-C: a demo stopped by `kill` stops the processes it started (its context
        # managers run) instead of leaving them orphaned.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    try:
        settings = get_settings()  # read the environment once, up front: a wrong setting is a usage error
    except ValidationError as error:
        print(f"flywheel: invalid settings\n{describe_settings_error(error)}", file=sys.stderr)
        return 2
    if removed := removed_variables_set():
        print("flywheel: invalid settings\n" + "\n".join(removed), file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except ConfigError as error:
        print(f"flywheel {command}: {error}", file=sys.stderr)
        return 2
    except (KafkaConnectionError, KafkaTimeoutError) as error:
        print(f"flywheel: no Kafka broker answers at {settings.bootstrap} ({error}); start the local one with "
              "`flywheel kafka up`, or set FLYWHEEL_BOOTSTRAP_SERVERS", file=sys.stderr)  # fmt: skip
        return 1


if __name__ == "__main__":
    sys.exit(main())
