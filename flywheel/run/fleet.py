"""Run a fleet of edge clients in a local stack (broker + processors) and wait for their steps in Delta.

Shared by `flywheel demo` (one fleet phase per turn) and `flywheel demonstrations` (expert data at scale).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from core.cli_config import config_argv
from core.console import say
from core.processes import Child, wait_until
from core.settings import Settings
from edge_client.runner import FLAG_NAMES, EdgeConfig
from lake.queries import episode_stats, step_count


class Stack(Protocol):
    """What a fleet needs of the stack it runs in (flywheel.run.stack.LocalStack)."""

    settings: Settings

    @property
    def worker(self) -> Child: ...

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None,
              cpus: set[int] | None = None, role: str | None = None) -> Child: ...  # fmt: skip


@dataclass(frozen=True)
class FleetRun:
    """One fleet phase: `clients` edge processes, each running every task `episodes_per_task` times."""

    name: str
    """Names the client processes, their logs and summaries (e.g. 'turn1')."""
    prefix: str
    """Client-id prefix; episode ids start with it, so the phase's rows can be counted in Delta."""
    clients: int
    tasks: tuple[str, ...]
    episodes_per_task: int
    policy: str
    """'expert' or 'model'."""
    seed: int
    """Client k starts at seed + k * seed_stride; episode i of a task uses that + i."""
    seed_stride: int = 1_000
    max_steps: int = 10
    drain_timeout_s: float = 300.0
    edge: EdgeConfig | None = None
    """Every client's other settings (sampling, repeats, the teacher, a time limit); None: the edge's defaults."""
    cpus: set[int] | None = None
    """CPUs the clients and their browsers run on (None: any)."""


@dataclass(frozen=True)
class FleetResult:
    steps_published: int
    steps_in_delta: int
    episodes: int
    success_rate: float
    per_task: dict
    model_versions: list[str]
    wall_s: float
    started_at: float
    """Wall-clock time the clients were launched."""
    acting: list[list[float]]
    """Every client's [start, end] spans in episodes (RunSummary.acting), all clients together."""
    teacher: dict
    """The teacher's calls, all clients together: labels by why asked, skipped by why, reused (no call)."""
    search: dict
    """The new tasks' searches, all clients together: searches, branches, env steps, successes found, and the steps
    of those successes published (the search's other steps reach no table)."""


def run_fleet(run: FleetRun, stack: Stack, out: Path) -> FleetResult:
    """The clients run in `stack`, whose worker lands their steps; their summaries go to `out`."""
    started, started_at = time.monotonic(), time.time()
    settings, worker = stack.settings, stack.worker
    summaries = [out / f"{run.name}-client{k}.json" for k in range(run.clients)]
    clients = [
        stack.start(f"{run.name}-client{k}", edge_args(client_config(run, k, summaries[k])), cpus=run.cpus, role="edge")
        for k in range(run.clients)
    ]
    try:
        _watch_clients(clients, worker, settings, run.prefix)
    finally:
        for client in clients:
            client.stop()
    failed = [c.name for c in clients if c.proc.returncode != 0]
    if failed:
        raise RuntimeError(f"edge clients failed: {failed}\n" + "\n".join(c.tail() for c in clients))
    client_summaries = [json.loads(path.read_text()) for path in summaries]
    published = sum(s["steps_published"] for s in client_summaries)
    episodes_run = sum(s["episodes"] for s in client_summaries)

    say(f"{run.name}: {published} steps published; waiting for the pipeline to land them in Delta")
    in_delta = wait_until(
        lambda: (n := step_count(settings.tables_dir, run.prefix)) >= published and n,
        run.drain_timeout_s,
        what=f"{published} steps of {run.name} in Delta",
    )
    stats = wait_until(
        lambda: (s := episode_stats(settings.tables_dir, run.prefix))["episodes"] >= episodes_run and s,
        run.drain_timeout_s,
        what=f"{episodes_run} episodes of {run.name} in Delta",
    )
    return FleetResult(
        steps_published=published,
        steps_in_delta=in_delta,
        episodes=stats["episodes"],
        success_rate=stats["success_rate"],
        per_task=stats["per_task"],
        model_versions=sorted({v for s in client_summaries for v in s["model_versions"]}),
        wall_s=round(time.monotonic() - started, 1),
        started_at=started_at,
        acting=[span for s in client_summaries for span in s["acting"]],
        teacher=teacher_calls(client_summaries),
        search=dict(sum((Counter(c.get("search", {})) for c in client_summaries), Counter())),
    )


def client_config(run: FleetRun, k: int, summary: Path) -> EdgeConfig:
    """Client k of the fleet: `run.edge` with the phase's client id, tasks, episodes, policy, seed and summary."""
    return replace(run.edge or EdgeConfig(""), client_id=f"{run.prefix}c{k}", tasks=run.tasks,
                   episodes_per_task=run.episodes_per_task, policy=run.policy, max_steps=run.max_steps,
                   seed=run.seed + k * run.seed_stride, summary_path=summary)  # fmt: skip


def edge_args(client: EdgeConfig) -> list[str]:
    """`flywheel edge ...` of one client: its config as flags (core.cli_config.config_argv, the parser's inverse)."""
    return ["edge", *config_argv(client, rename=FLAG_NAMES)]


def teacher_calls(client_summaries: list[dict]) -> dict:
    """The clients' teacher figures added up (edge_client.runner.RunSummary)."""
    labels, skipped = Counter(), Counter()
    for summary in client_summaries:
        labels.update(summary.get("teacher_labels", {}))
        skipped.update(summary.get("teacher_skipped", {}))
    return {"labels": sum(labels.values()), "labels_by_reason": dict(labels), "skipped": dict(skipped),
            "reused": sum(s.get("teacher_reused", 0) for s in client_summaries)}  # fmt: skip


def _watch_clients(clients: list[Child], worker: Child, settings: Settings, prefix: str) -> None:
    """Wait for the clients, printing progress; fail fast if the processors die."""
    last = 0.0
    while any(c.running() for c in clients):
        if not worker.running():
            raise RuntimeError(f"the faust worker died:\n{worker.tail()}")
        if time.monotonic() - last > 15:
            last = time.monotonic()
            running = sum(c.running() for c in clients)
            say(f"  {running} clients running, {step_count(settings.tables_dir, prefix)} steps in Delta so far")
        time.sleep(1)
