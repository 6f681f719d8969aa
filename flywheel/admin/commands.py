"""The operator's commands of `flywheel`: the local services (`kafka`, `objectstore`), a dead client's `spool`, the
`canary` verdict, `status`, `replay` from the log, the dead letters (`dlq`) and Delta maintenance (`maintain`).

Each is a pair, as in flywheel.cli: `_name(p)` adds its flags, `cmd_name(args)` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from core.cli_config import DefaultsHelpFormatter, add_config_arguments, config_from
from core.settings import get_settings


def _kafka(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument(
        "--nodes",
        type=int,
        choices=range(1, 10),
        metavar="N",
        help="local cluster nodes (default: FLYWHEEL_KAFKA_NODES)",
    )
    p.set_defaults(func=cmd_kafka)


def cmd_kafka(args: argparse.Namespace) -> int:
    from streams.broker import local_broker

    settings = get_settings()
    if args.nodes is not None:
        settings = settings.model_copy(update={"kafka_nodes": args.nodes})
    if args.action == "up":
        pids = local_broker.up(settings)
        print(f"kafka running (pids {', '.join(map(str, pids.values()))}) at {settings.bootstrap}")
    elif args.action == "down":
        stopped = local_broker.down(settings)
        print(f"kafka stopped ({len(stopped)} of {settings.kafka_nodes} node(s) were running)")
    else:
        print(json.dumps(local_broker.status(settings), indent=2))
    return 0


def _objectstore(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up", "down", "status"])
    p.set_defaults(func=cmd_objectstore)


def cmd_objectstore(args: argparse.Namespace) -> int:
    from lake import s3proxy

    settings = get_settings()
    if args.action == "up":
        pid = s3proxy.up(settings)
        print(f"object store running (pid {pid}) at {settings.local_s3_endpoint}, If-None-Match: * answered 412")
    elif args.action == "down":
        print("object store stopped" if s3proxy.down(settings) else "object store was not running")
    else:
        print(json.dumps(s3proxy.status(settings), indent=2))
    return 0


def _spool(p: argparse.ArgumentParser) -> None:
    from flywheel.admin.spool import SpoolReplayConfig

    actions = p.add_subparsers(dest="action", required=True)
    help_text = "send a dead edge client's spool to Kafka, exactly once by event_id, and empty it"
    replay = actions.add_parser("replay", help=help_text, description=help_text, formatter_class=DefaultsHelpFormatter)
    add_config_arguments(replay, SpoolReplayConfig, rename={"client_home": "--home"})  # the flag operators know
    replay.set_defaults(func=cmd_spool_replay)


def cmd_spool_replay(args: argparse.Namespace) -> int:
    from edge_client.spool import SpoolInUse
    from flywheel.admin.spool import NoSpool, SpoolReplayConfig, replay_spool

    try:
        result = replay_spool(config_from(args, SpoolReplayConfig), get_settings())
    except (SpoolInUse, NoSpool) as error:  # the client still runs, or no such spool: nothing sent
        print(f"flywheel spool replay: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result.__dict__))
    if result.left:
        print(f"{result.left} events are still spooled (Kafka unreachable); run the replay again", file=sys.stderr)
    return 0 if result.left == 0 else 1


def _canary(p: argparse.ArgumentParser) -> None:
    from flywheel.admin.canary import CanaryConfig

    add_config_arguments(p, CanaryConfig, rename={"interval_s": ("--interval", "--interval-s")})  # maintain's word
    p.set_defaults(func=cmd_canary)


def cmd_canary(args: argparse.Namespace) -> int:
    from flywheel.admin.canary import CanaryConfig, run_canary_controller

    run_canary_controller(get_settings(), config_from(args, CanaryConfig))
    return 0


def _status(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL for the live rates")
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    from functools import partial

    from flywheel.admin.observe import query
    from flywheel.admin.status import render_status

    print(render_status(get_settings(), args.prometheus, partial(query, args.prometheus)))
    return 0


def _replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="tables directory to rebuild into (fresh, or a replay to resume)")
    p.add_argument("--no-compare", action="store_true", help="only rebuild, do not compare with the live tables")
    from flywheel.admin.replay import NOT_REPLAY_FLAGS
    from processors.worker_config import WorkerConfig

    add_config_arguments(p, WorkerConfig, exclude=NOT_REPLAY_FLAGS)
    p.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace) -> int:
    from flywheel.admin.replay import replay_and_compare
    from processors.worker_config import WorkerConfig

    worker = config_from(args, WorkerConfig)  # the flags it has; the rest at their defaults
    return 0 if replay_and_compare(get_settings(), Path(args.out), worker, compare=not args.no_compare) else 1


def _dlq(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=100, help="the newest N (0: all)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_dlq)


def cmd_dlq(args: argparse.Namespace) -> int:
    from flywheel.admin.dlq import format_dead_letters, read_dead_letters

    letters = read_dead_letters(get_settings(), limit=args.limit)
    print(json.dumps([d.as_json() for d in letters], indent=2) if args.json else format_dead_letters(letters))
    return 0


def _maintain(p: argparse.ArgumentParser) -> None:
    from processors.maintenance import MaintenanceConfig

    p.add_argument("--once", action="store_true", help="one pass, then exit (1 when a table failed)")
    p.add_argument("--interval", type=float, default=3600.0, help="seconds between passes")
    p.add_argument("--json", action="store_true", help="print each report as JSON")
    add_config_arguments(p, MaintenanceConfig)
    p.set_defaults(func=cmd_maintain)


def cmd_maintain(args: argparse.Namespace) -> int:
    from flywheel.admin.maintain import run_maintenance
    from processors.maintenance import MaintenanceConfig

    config = config_from(args, MaintenanceConfig)
    return 0 if run_maintenance(get_settings(), config, args.once, args.interval, args.json) else 1


OPERATOR_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "kafka": ("the local Kafka broker (KRaft, from Maven Central jars)", _kafka),
    "objectstore": ("the local S3-compatible object store (S3Proxy 4.x, from Maven Central)", _objectstore),
    "spool": ("an edge client's on-disk spool: `replay` sends a dead client's to Kafka and empties it", _spool),
    "canary": ("promote or roll back the canary version by live success", _canary),
    "status": ("one screen: fleet, pipeline, learner, success by task and model version", _status),
    "replay": ("rebuild the Delta tables from the Kafka log into DIR, compare with the live", _replay),
    "dlq": ("list the dead letters (reason, detail, source offset, size)", _dlq),
    "maintain": ("compact, vacuum and checkpoint the Delta tables, keeping every version still read", _maintain),
}
