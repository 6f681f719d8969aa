"""One run, one config: `flywheel demo`'s settings (flywheel.run.demo) as one tree, and the command lines of the
processes it starts, derived from that tree (core.cli_config.config_argv, the inverse of the parser), never copied
by hand. `flywheel chaos` runs the same tree (flywheel.chaos.run.ChaosConfig.run).

    DemoConfig                       the run: its length, clients, output, what it measures at the end
      fleet: EdgeConfig              every edge client (edge_client.runner), `flywheel edge`'s settings
        teacher: TeacherConfig       the teacher each client may ask (edge_client.teacher)
      learner: DaemonConfig          the learner daemon (learner.daemon.daemon_config), `flywheel learner`'s settings
      worker: WorkerConfig           each faust worker (processors.worker_config), `flywheel process`'s settings

Each setting is declared once, in the class of the part that reads it, with that part's own default; where the
main job runs a part otherwise, the tree's default below says so, with the reason. `flywheel demo --help` shows the
tree's values; tests/test_run_config.py fails when a setting is declared twice with different defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from core.cli_config import config_argv
from core.settings import NEW_TASKS
from edge_client.runner import EdgeConfig
from edge_client.teacher import TeacherConfig
from learner.daemon.daemon_config import DaemonConfig
from processors.worker_config import WorkerConfig
from registry.store import RELEASE_DIR

# The main job's tasks, by one rule: its first version must score >= 0.85 greedy, and the flywheel must still
# have somewhere to rise. The run starts from the shipped release, so the rule reads the release's own held-out
# evaluation (greedy, 100 seeds a task, docs/figures/release-43/eval-tier1.json) and keeps each Tier 1 task the
# release succeeds on at least half the time: there the fleet's samples mostly verify, and the teacher's labels go to
# the states it still fails (click-link 0.61, click-button 0.85, click-test-2 0.89). identify-shape (0.44) is left
# out: its map is short of samples, which the release recipe's collections give, not 20 minutes of fleet
# (docs/results.md).
DEMO_TASKS: tuple[str, ...] = (
    "click-test", "click-test-2", "click-button", "click-link", "click-dialog", "click-color", "focus-text",
)  # fmt: skip


def demo_fleet() -> EdgeConfig:
    """The fleet's clients as the main job runs them."""
    return EdgeConfig(
        client_id="",  # each client's own, and its seed, summary and stop time, are set when it starts
        tasks=DEMO_TASKS,
        episodes_per_task=12,  # turns: per client and turn (continuous: until the run's end)
        temperature=0.7,  # continuous: the fleet samples (turns: greedy)
        top_k=5,
        # Rollouts per (task, seed): the online RL's groups want 8 (--rl-updates-per-retrain); for the teacher fewer
        # buy more distinct states per rollout (docs/history/teacher.md).
        repeats=2,
        seeds_per_visit=4,  # a task switch costs ~0.7 s here
        # 2 labels an episode (0: no teacher; the learner then retrains on the fleet's verified successes).
        teacher=TeacherConfig(teacher_budget=2),
        # Beside them, the tasks nobody demonstrated: only the model, K runs a seed, no expert, no teacher.
        new_tasks=NEW_TASKS,
    )


def demo_learner() -> DaemonConfig:
    """The learner daemon as the main job runs it: the shipped release (release/model.pt) fine-tuned with the release
    recipe's settings, its first version 50 steps once 200 demonstrations are in (the experts' first minute), then
    a version every 64 fresh episodes or 3 minutes, each retrain at least 200 steps (about 4 minutes on the
    learner's one core here: the new tasks' successes reach a version only through a retrain), the tables polled
    often. A fleet starts from what is shipped; a fresh model of the small demo recipe (`--recipe demo --start-from
    '' --sft-steps 800`) starts near 0.55."""
    return DaemonConfig(recipe="release", start_from=str(RELEASE_DIR / "model.pt"), sft_steps=50, min_demos=200,
                        retrain_steps=200, every_minutes=3.0, poll_s=2.0)  # fmt: skip


@dataclass
class DemoConfig:
    out: Path
    """Where report.json and the logs go."""
    turns: int = 2
    """Turns to run."""
    clients: int = 2
    """Edge clients (one browser each) per turn."""
    finetune_steps: int = 300
    """Turns: SFT steps of each later model (warm-started from the previous one; the first has sft_steps)."""
    drain_timeout_s: float = 300.0
    """How long the pipeline may take to land a turn's steps in Delta after the clients finish."""
    prometheus: bool = True
    """Start a local Prometheus (when installed) that scrapes every process; plots and status read it."""
    prometheus_port: int = 0
    """Its port on 127.0.0.1 (0: a free one)."""
    minutes: float = 0.0
    """Run continuously for this long instead of in turns: the fleet explores, the learner daemon trains and
    publishes versions as it goes."""
    finish_stage_s: float = 300.0
    """Continuous: after the fleet stops, how long the learner may still take to publish the version it is training
    (on the fleet's last data), while the first version is evaluated beside it (0: cut off at once)."""
    greedy_episodes: int = 50
    """Continuous: at the end, the first and the last published versions run greedily on this many held-out
    seeds per task, paired (report.json "greedy"; 0: not)."""
    twin: bool = True
    """Continuous, with greedy_episodes: the last version's no-fleet twin too, its retrain again from the same SFT
    model with the same steps and lr on the demonstrations alone (`flywheel twin`), greedy on the same seeds and
    paired with it (report.json "twin", "last_vs_twin": what the fleet's labels or successes bought beyond the
    demonstrations that landed after the first SFT). Costs one retrain and one evaluation more."""
    pass_at_k: int = 4
    """Continuous, with greedy_episodes: K, the first, last and twin versions each sampled K times on each of
    pass_at_k_seeds held-out seeds of every new task (report.json "new_tasks" "pass_at_k"; 0: not). What sampling
    reaches beside what greedy does: learning that only sharpens stays inside it (Yue et al. 2025)."""
    pass_at_k_seeds: int = 5
    """Held-out seeds per new task for pass@K (the first of the greedy ones)."""
    pass_at_k_temperature: float = 1.0
    """pass@K's sampling temperature, over every token."""
    audit: int = 20
    """Continuous: the kept successes on the new tasks replayed on their seeds with the DOM read, after the run
    (report.json "new_tasks" "audit": reproduced, clicks on nothing; flywheel.run.audit; 0: none). It reports;
    nothing it reads reaches training."""
    workers: int = 1
    """Faust workers, one consumer group: each takes a share of the topics' partitions."""
    machines: bool = False
    """Run every process (each worker, the learner, each edge client) as on a machine of its own: its own
    FLYWHEEL_HOME and working dir under OUT/machines/, sharing only Kafka and the object store (the data dir must
    be s3://...). The learner's public key is provisioned to every machine, as a deployment would."""
    learner_cpu_share: float = 0.5
    """Continuous: share of this machine's CPUs the learner gets to itself (the fleet, its browsers and the
    worker share the rest; 0: no pinning). Unpinned on 2 cores, 400 SFT steps took 23 min beside the fleet
    (chromium raises its own threads' priority, so niceness does not help)."""
    fleet: EdgeConfig = field(default_factory=demo_fleet)
    """The fleet: every edge client's settings. Continuous: the experts until a first version, then the newest
    version, sampling; turns: the experts, then each version greedily, without a teacher."""
    learner: DaemonConfig = field(default_factory=demo_learner)
    """Continuous: the learner daemon (its sft_steps is also the first turn's SFT)."""
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    """Each faust worker."""


# Settings of the tree that are no flags of `flywheel demo`: each client's and process's own, set when it starts, the
# learner's self-imitation top-k, which is the fleet's top-k (a success counts when drawn as the fleet draws), and
# its new tasks, which are the fleet's.
NOT_DEMO_FLAGS = (
    "fleet.client_id", "fleet.seed", "fleet.policy", "fleet.bootstrap_expert", "fleet.channel", "fleet.summary_path",
    "fleet.stop_after_s", "fleet.ledger_path", "fleet.metrics_port", "fleet.wait_for_model_s", "fleet.spool_timeout_s",
    "learner.self_imitation_top_k", "learner.new_tasks", "learner.max_versions", "learner.stop_after_s",
    "worker.metrics_port",
)  # fmt: skip


def learner_config(config: DemoConfig) -> DaemonConfig:
    """The learner daemon of a continuous run: the tree's, self-imitating at the fleet's top-k, on its new tasks."""
    return replace(config.learner, self_imitation_top_k=config.fleet.top_k, new_tasks=config.fleet.new_tasks)


def learner_args(config: DemoConfig) -> list[str]:
    """`flywheel learner ...`: the daemon of a continuous run."""
    return ["learner", *config_argv(learner_config(config))]


def twin_args(config: DemoConfig, version: str, summary: Path) -> list[str]:
    """`flywheel twin ...`: the no-fleet twin of `version`, trained with the settings the learner daemon ran with."""
    return ["twin", version, "--summary", str(summary), *config_argv(learner_config(config))]


def fleet_client(config: DemoConfig, run_s: float) -> EdgeConfig:
    """A continuous run's client (its id, seed and files still to set): the experts until a first version, then the
    newest version, sampling, for `run_s` seconds."""
    return replace(config.fleet, policy="model", bootstrap_expert=True, episodes_per_task=1_000_000, stop_after_s=run_s)


def worker_args(worker: WorkerConfig) -> list[str]:
    """`flywheel process`'s flags after the command: each worker of a run."""
    return config_argv(worker)
