"""`flywheel` command line: one subcommand per process of the system."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from flywheel.settings import get_settings
from flywheel.settings import parse_tasks as _tasks


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
        stop_after_s=args.stop_after_s,
    )
    summary = run_client(config, get_settings())
    print(json.dumps(summary.__dict__))
    if summary.unsent:
        print(
            f"{summary.unsent} events are still spooled (Kafka unreachable); the next run sends them", file=sys.stderr
        )
    return 0 if summary.unsent == 0 else 1


def cmd_learn(args: argparse.Namespace) -> int:
    from flywheel.observe import serve_metrics
    from learner.sft import SFTConfig
    from learner.train import LearnConfig, learn_once
    from learner.vla_sft import VLATrainConfig

    settings = get_settings()
    if args.metrics_port >= 0:
        serve_metrics("flywheel-learner", settings.metrics_host, args.metrics_port)
    # Metrics follow every 5th step (a short run still shows its loss curve); the console every 25th.
    config = LearnConfig(
        sft=SFTConfig(steps=args.steps, batch_size=args.batch_size, seed=args.seed, log_every=5),
        arch=args.arch,
        vla=VLATrainConfig(
            steps=args.steps, batch_size=args.batch_size, seed=args.seed, log_every=5, lora_rank=args.lora_rank
        ),  # fmt: skip
    )

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


def cmd_demonstrations(args: argparse.Namespace) -> int:
    from flywheel.demonstrations import DemonstrationsConfig, collect_demonstrations

    config = DemonstrationsConfig(
        out=Path(args.out),
        tasks=_tasks(args.tasks),
        episodes_per_task=args.episodes_per_task,
        clients=args.clients,
        seed=args.seed,
    )
    report = collect_demonstrations(config, get_settings())
    print(json.dumps({k: report[k] for k in ("episodes", "steps", "success_rate", "table_versions")}))
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from flywheel.registry import RELEASE_DIR
    from learner.release import run_release

    release_dir = Path(args.release_dir) if args.release_dir else RELEASE_DIR
    manifest = run_release(Path(args.config), Path(args.work), release_dir, get_settings())
    print(json.dumps({k: manifest[k] for k in ("version", "sha256", "training", "wall_s")}))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from edge_client.evaluate import evaluate

    settings = get_settings()
    if args.policy == "expert":
        from edge_client.experts import expert_for

        policy_for_task = expert_for
    else:
        from edge_client.policy import load_policy
        from flywheel.registry import resolve_model

        path, version = resolve_model(args.model, settings.artifacts_dir)
        model = load_policy(path, version, intra_op_threads=args.threads, keep_ratio=args.keep_ratio)

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


def cmd_canary(args: argparse.Namespace) -> int:
    from flywheel.canary import run_canary_controller

    run_canary_controller(get_settings(), interval_s=args.interval, once=args.once)
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
        prometheus=not args.no_prometheus,
        prometheus_port=args.prometheus_port,
    )
    report = run_demo(config, get_settings())
    return 0 if all(t["steps_in_delta"] == t["steps_published"] for t in report["turns"]) else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from processors.compare import compare_tables, format_diffs
    from processors.replay import replay

    settings = get_settings()
    out = Path(args.out)
    summary = replay(settings, out)
    print(f"replayed {summary.records} records in {summary.wall_s:.1f} s into {out}: rows {summary.rows}")
    if args.no_compare:
        return 0
    diffs = compare_tables(settings.tables_dir, out, summary.horizon_by_table(settings))
    print(f"live {settings.tables_dir} vs rebuilt {out} (rows below the replay's end offsets, ingested_at ignored):")
    print(format_diffs(diffs))
    return 0 if all(d.equal for d in diffs) else 1


def cmd_dlq(args: argparse.Namespace) -> int:
    from flywheel.dlq import format_dead_letters, read_dead_letters

    letters = read_dead_letters(get_settings(), limit=args.limit)
    print(json.dumps([d.as_json() for d in letters], indent=2) if args.json else format_dead_letters(letters))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from flywheel.bench_pipeline import BenchConfig, run_bare_consumer, run_bench

    if args.what == "edge":
        from flywheel import bench_edge
        from flywheel.registry import RELEASE_DIR

        edge_config = bench_edge.EdgeBenchConfig(
            model_dir=Path(args.model_dir) if args.model_dir else RELEASE_DIR,
            out=Path(args.out),
            screens_per_task=args.screens_per_task,
            repeats=args.repeats,
            rounds=args.rounds,
            threads=args.threads,
        )
        print(bench_edge.format_report(bench_edge.run_bench(edge_config)))
        print(f"wrote {Path(args.out) / 'edge_bench.json'}")
        return 0
    if args.what == "bare-consumer":  # the baseline consumer process the pipeline benchmark starts
        run_bare_consumer(get_settings())
        return 0
    config = BenchConfig(
        out=Path(args.out), events=args.events, rate=args.rate, client_steps_per_s=args.client_steps_per_s
    )
    report = run_bench(config, get_settings())
    return 0 if all(report[m]["lost"] == 0 and report[m]["duplicated"] == 0 for m in ("faust", "bare_consumer")) else 1


def cmd_status(args: argparse.Namespace) -> int:
    from flywheel.status import render_status

    print(render_status(get_settings(), args.prometheus))
    return 0


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
    edge.add_argument("--tasks", default="tier1", help="task ids and/or 'tier1', 'tier2', 'suite'")
    edge.add_argument("--episodes", type=int, default=10, help="episodes per task")
    edge.add_argument("--policy", choices=["expert", "model"], default="expert")
    edge.add_argument("--max-steps", type=int, default=10)
    edge.add_argument("--seed", type=int, default=0)
    edge.add_argument("--metrics-port", type=int, default=0)
    edge.add_argument("--wait-for-model", type=float, default=120.0)
    edge.add_argument("--stop-after-s", type=float, default=None, help="stop at the next episode boundary after this")
    edge.add_argument("--summary", help="write the run summary JSON here")
    edge.set_defaults(func=cmd_edge)

    learn = sub.add_parser("learn", help="train on the Delta tables by SFT and publish a model version")
    learn.add_argument("--steps", type=int, default=600)
    learn.add_argument("--batch-size", type=int, default=32)
    learn.add_argument("--seed", type=int, default=0)
    learn.add_argument("--arch", choices=["pixel", "vla"], default="pixel", help="the small pixel policy or the VLA")
    learn.add_argument("--lora-rank", type=int, default=0, help="vla: train LoRA adapters of this rank (0: full)")
    learn.add_argument("--metrics-port", type=int, default=0, help="0: any free port, -1: do not serve")
    learn.add_argument("--summary")
    learn.set_defaults(func=cmd_learn)

    ev = sub.add_parser("eval", help="success rate per task with the binary reward")
    ev.add_argument("--model", default="latest", help="model file, version id, 'latest' or 'release' (committed VLA)")
    ev.add_argument("--policy", choices=["model", "expert"], default="model")
    ev.add_argument("--tasks", default="tier1")
    ev.add_argument("--episodes", type=int, default=50)
    ev.add_argument("--seed", type=int, default=1_000_000, help="first seed (training runs use small seeds)")
    ev.add_argument("--threads", type=int, default=1)
    ev.add_argument("--keep-ratio", type=float, default=None, help="VLA: visual-token keep ratio (default: bundle's)")
    ev.add_argument("--out", required=True)
    ev.set_defaults(func=cmd_eval)

    dem = sub.add_parser("demonstrations", help="expert demonstrations on the suite, through Kafka into Delta")
    dem.add_argument("--out", default="runs/demonstrations")
    dem.add_argument("--tasks", default="suite", help="'suite' (Tier 1 + 2), 'tier1', 'tier2' or task ids")
    dem.add_argument("--episodes-per-task", type=int, default=100, help="per client")
    dem.add_argument("--clients", type=int, default=2)
    dem.add_argument("--seed", type=int, default=0)
    dem.set_defaults(func=cmd_demonstrations)

    rel = sub.add_parser("release", help="demonstrations -> VLA SFT -> release/ (reproducible; resumes)")
    rel.add_argument("--config", default="configs/vla_release.json")
    rel.add_argument("--work", default="runs/release", help="demonstrations, checkpoints and logs")
    rel.add_argument("--release-dir", default=None, help="where model.vla + manifest.json go (default: ./release)")
    rel.set_defaults(func=cmd_release)

    canary = sub.add_parser("canary", help="promote or roll back the canary version by live success")
    canary.add_argument("--interval", type=float, default=10.0, help="seconds between reviews")
    canary.add_argument("--once", action="store_true", help="review once and exit")
    canary.set_defaults(func=cmd_canary)

    demo = sub.add_parser("demo", help="run N turns of the whole flywheel and write DIR/report.json")
    demo.add_argument("--turns", type=int, default=2)
    demo.add_argument("--clients", type=int, default=2)
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--tasks", default="tier1")
    demo.add_argument("--episodes-per-task", type=int, default=12, help="per client and turn")
    demo.add_argument("--sft-steps", type=int, default=800, help="SFT steps of turn 1")
    demo.add_argument("--finetune-steps", type=int, default=300, help="SFT steps of each later turn")
    demo.add_argument("--no-prometheus", action="store_true", help="do not start the local Prometheus")
    demo.add_argument("--prometheus-port", type=int, default=0, help="its port on 127.0.0.1 (0: a free one)")
    demo.set_defaults(func=cmd_demo)

    st = sub.add_parser("status", help="one screen: fleet, pipeline, learner, success by task and model version")
    st.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus URL for the live rates")
    st.set_defaults(func=cmd_status)

    rp = sub.add_parser("replay", help="rebuild the Delta tables from the Kafka log into DIR, compare with the live")
    rp.add_argument("--out", required=True, help="tables directory to rebuild into (fresh, or a replay to resume)")
    rp.add_argument("--no-compare", action="store_true", help="only rebuild, do not compare with the live tables")
    rp.set_defaults(func=cmd_replay)

    dlq = sub.add_parser("dlq", help="list the dead letters (reason, detail, source offset, size)")
    dlq.add_argument("--limit", type=int, default=100, help="the newest N (0: all)")
    dlq.add_argument("--json", action="store_true")
    dlq.set_defaults(func=cmd_dlq)

    bench = sub.add_parser("bench", help="benchmarks: `pipeline` (faust vs a bare consumer), `edge` (VLA step)")
    bench.add_argument("what", choices=["pipeline", "edge", "bare-consumer"])
    bench.add_argument("--events", type=int, default=20_000, help="steps per phase (backlog drain, offered load)")
    bench.add_argument("--rate", type=float, default=1000.0, help="offered steps/s of the latency phase")
    bench.add_argument("--client-steps-per-s", type=float, default=10.0, help="one edge client's steps/s")
    bench.add_argument("--out", default="runs/bench")
    bench.add_argument(
        "--model-dir", default=None, help="edge: model.vla, model-int8.vla, model.pt (default ./release)"
    )
    bench.add_argument("--screens-per-task", type=int, default=4, help="edge: Tier 1 screens per task")
    bench.add_argument("--repeats", type=int, default=2, help="edge: timed passes over the screens")
    bench.add_argument("--rounds", type=int, default=3, help="edge: runs of every variant; figures are medians")
    bench.add_argument("--threads", type=int, default=1, help="edge: intra-op threads of every variant")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
