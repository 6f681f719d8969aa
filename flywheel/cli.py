"""`flywheel` command line: one subcommand per process of the system."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from flywheel.settings import TIER1_TASKS, get_settings


def _tasks(value: str) -> tuple[str, ...]:
    if value == "tier1":
        return TIER1_TASKS
    return tuple(t.strip() for t in value.split(",") if t.strip())


def cmd_kafka(args: argparse.Namespace) -> int:
    from streams import broker

    settings = get_settings()
    if args.action == "up":
        pid = broker.up(settings)
        print(f"kafka running (pid {pid}) at {settings.bootstrap}")
    elif args.action == "down":
        broker.down(settings)
        print("kafka stopped")
    else:
        print(json.dumps(broker.status(settings), indent=2))
    return 0


def cmd_process(args: argparse.Namespace) -> int:
    from processors.worker import run_worker

    run_worker(get_settings(), metrics_port=args.metrics_port, loglevel=args.loglevel)
    return 0


def cmd_edge(args: argparse.Namespace) -> int:
    from edge_client.runner import EdgeConfig, run_client

    config = EdgeConfig(
        client_id=args.client_id,
        tasks=_tasks(args.tasks),
        episodes_per_task=args.episodes,
        policy=args.policy,
        max_steps=args.max_steps,
        seed=args.seed,
        metrics_port=args.metrics_port,
        summary_path=Path(args.summary) if args.summary else None,
        wait_for_model_s=args.wait_for_model,
    )
    summary = run_client(config, get_settings())
    print(json.dumps(summary.__dict__))
    return 0 if summary.send_errors == 0 else 1


def cmd_learn(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from learner.sft import SFTConfig
    from learner.train import LearnConfig, learn_once

    settings = get_settings()
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr=settings.metrics_host)
    config = LearnConfig(sft=SFTConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed, log_every=25))

    def progress(p) -> None:
        print(f"  sft step {p.step}/{p.total_steps} loss {p.loss:.3f} ({p.samples_per_s:.0f} samples/s)", flush=True)

    summary = learn_once(settings, config, progress)
    print(json.dumps(summary), flush=True)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from edge_client.evaluate import evaluate

    settings = get_settings()
    if args.policy == "expert":
        from edge_client.experts import expert_for

        policy_for_task = expert_for
    else:
        from edge_client.onnx_policy import OnnxPolicy
        from flywheel.registry import resolve_model

        path, version = resolve_model(args.model, settings.artifacts_dir)
        model = OnnxPolicy(path, version, intra_op_threads=args.threads)

        def policy_for_task(_task: str):
            return model

    def progress(task, index, result) -> None:
        if (index + 1) % 10 == 0 or index + 1 == args.episodes:
            print(f"  {task}: {index + 1}/{args.episodes}", file=sys.stderr, flush=True)

    report = evaluate(policy_for_task, _tasks(args.tasks), args.episodes, seed=args.seed, progress=progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    for task, entry in report["tasks"].items():
        print(f"{task:24s} {entry['success_rate']:.3f}  ({entry['episodes']} episodes)")
    print(f"{'mean':24s} {report['mean_success_rate']:.3f}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from flywheel.demo import DemoConfig, run_demo

    config = DemoConfig(
        turns=args.turns,
        clients=args.clients,
        out=Path(args.out),
        tasks=_tasks(args.tasks),
        episodes_per_task=args.episodes_per_task,
        sft_steps=args.sft_steps,
        finetune_steps=args.finetune_steps,
    )
    report = run_demo(config, get_settings())
    return 0 if all(t["steps_in_delta"] == t["steps_published"] for t in report["turns"]) else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flywheel", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="the local Kafka broker (KRaft, from Maven Central jars)")
    kafka.add_argument("action", choices=["up", "down", "status"])
    kafka.set_defaults(func=cmd_kafka)

    process = sub.add_parser("process", help="run the faust stream processors (steps -> Delta)")
    process.add_argument("--metrics-port", type=int, default=0)
    process.add_argument("--loglevel", default="warning")
    process.set_defaults(func=cmd_process)

    edge = sub.add_parser("edge", help="run one edge client")
    edge.add_argument("--client-id", required=True)
    edge.add_argument("--tasks", default="tier1", help="comma-separated MiniWoB task ids, or 'tier1'")
    edge.add_argument("--episodes", type=int, default=10, help="episodes per task")
    edge.add_argument("--policy", choices=["expert", "model"], default="expert")
    edge.add_argument("--max-steps", type=int, default=10)
    edge.add_argument("--seed", type=int, default=0)
    edge.add_argument("--metrics-port", type=int, default=0)
    edge.add_argument("--wait-for-model", type=float, default=120.0)
    edge.add_argument("--summary", help="write the run summary JSON here")
    edge.set_defaults(func=cmd_edge)

    learn = sub.add_parser("learn", help="train on the Delta tables by SFT and publish a model version")
    learn.add_argument("--steps", type=int, default=600)
    learn.add_argument("--batch-size", type=int, default=32)
    learn.add_argument("--seed", type=int, default=0)
    learn.add_argument("--metrics-port", type=int, default=None)
    learn.add_argument("--summary")
    learn.set_defaults(func=cmd_learn)

    ev = sub.add_parser("eval", help="success rate per task with the binary reward")
    ev.add_argument("--model", default="latest", help="ONNX path, version id, or 'latest'")
    ev.add_argument("--policy", choices=["model", "expert"], default="model")
    ev.add_argument("--tasks", default="tier1")
    ev.add_argument("--episodes", type=int, default=50)
    ev.add_argument("--seed", type=int, default=1_000_000, help="first seed (training runs use small seeds)")
    ev.add_argument("--threads", type=int, default=1)
    ev.add_argument("--out", required=True)
    ev.set_defaults(func=cmd_eval)

    demo = sub.add_parser("demo", help="run N turns of the whole flywheel and write DIR/report.json")
    demo.add_argument("--turns", type=int, default=2)
    demo.add_argument("--clients", type=int, default=2)
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--tasks", default="tier1")
    demo.add_argument("--episodes-per-task", type=int, default=12, help="per client and turn")
    demo.add_argument("--sft-steps", type=int, default=800, help="SFT steps of turn 1")
    demo.add_argument("--finetune-steps", type=int, default=300, help="SFT steps of each later turn")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
