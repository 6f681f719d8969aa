"""The demo's configuration (`flywheel demo`, flywheel.run.demo) and the flags its continuous run gives the learner
daemon and the fleet, which `flywheel chaos` gives them too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from core.settings import TIER1_TASKS


@dataclass
class DemoConfig:
    turns: int = 2
    """Turns to run."""
    clients: int = 2
    """Edge clients (one browser each) per turn."""
    out: Path = Path("runs/demo")
    """Where report.json and the logs go."""
    tasks: tuple[str, ...] = TIER1_TASKS
    """Tasks the fleet cycles through."""
    episodes_per_task: int = 12
    """Episodes per task, per client and turn."""
    sft_steps: int = 800
    """SFT steps of the first model."""
    finetune_steps: int = 300
    """SFT steps of each later model (warm-started from the previous one)."""
    drain_timeout_s: float = 300.0
    """How long the pipeline may take to land a turn's steps in Delta after the clients finish."""
    prometheus: bool = True
    """Start a local Prometheus (when installed) that scrapes every process; plots and status read it."""
    prometheus_port: int = 0
    """Its port on 127.0.0.1 (0: a free one)."""
    minutes: float = 0.0
    """Run continuously for this long instead of in turns: the fleet explores, the learner daemon walks
    SFT -> offline RL -> online RL and publishes versions as it goes (sft_steps is its SFT stage)."""
    temperature: float = 0.7
    """Continuous: the fleet's sampling temperature."""
    top_k: int = 5
    """Continuous: the fleet samples among the k likeliest allowed tokens."""
    repeats: int = 2
    """Continuous: sampled rollouts per (task, seed): the online RL's groups (8 with --rl-updates-per-retrain);
    for the teacher, fewer repeats buy more distinct states (2 rollouts: +11.3 points greedy, 8: +7.2;
    docs/teacher.md)."""
    seeds_per_visit: int = 4
    """Continuous: seeds of a task each client runs before switching task (a switch costs ~0.7 s here)."""
    greedy_episodes: int = 50
    """Continuous: at the end, the first and the last published versions run greedily on this many held-out
    seeds per task, paired (report.json "greedy"; 0: not)."""
    twin: bool = True
    """Continuous, with greedy_episodes: the last version's no-fleet twin too, its retrain again from the same SFT
    model with the same steps and lr on the demonstrations alone (`flywheel twin`), greedy on the same seeds and
    paired with it (report.json "twin", "last_vs_twin": what the fleet's labels or successes bought beyond the
    demonstrations that landed after the first SFT; issue 44). Costs one retrain and one evaluation more."""
    min_demos: int = 96
    """Continuous: successful expert episodes before the first (SFT) version is trained."""
    every_episodes: int = 64
    """Continuous: a new version after this many fresh model episodes ..."""
    every_minutes: float = 3.0
    """... or this long, once min_new_episodes arrived."""
    min_new_episodes: int = 16
    """Continuous: fewer fresh model episodes than this, no RL update."""
    offline_steps: int = 100
    """Continuous: optimizer steps of the offline RL stage."""
    guidance: str = "refkl"
    """Continuous, curriculum 'rl': online RL's offline guidance, 'none', 'refkl' or 'databc'."""
    teacher_budget: int = 2
    """Continuous: teacher labels per episode each client may ask for on its model's steps (edge_client.teacher;
    0: no teacher, the learner then retrains on the fleet's verified successes)."""
    teacher_per_hour: float = 0.0
    """Continuous: each client's teacher labels in any sliding hour at most (0: no hourly bound)."""
    curriculum: str = "supervised"
    """Continuous: the learner's curriculum after SFT, 'supervised' (retrain from SFT on demonstrations + teacher
    labels or verified successes) or 'rl' (offline RL, then online PPO; learner.daemon)."""
    retrain_steps: int = 300
    """Continuous, supervised: optimizer steps of each retrain from the SFT model."""
    rl_updates_per_retrain: int = 0
    """Continuous, supervised: anchored PPO updates after each retrain (0: none)."""
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


def learner_args(config: DemoConfig) -> list[str]:
    """`flywheel learner ...`: the daemon of a continuous run."""
    return [
        "learner", "--recipe", "demo", "--sft-steps", str(config.sft_steps), "--min-demos", str(config.min_demos),
        "--every-episodes", str(config.every_episodes), "--every-minutes", str(config.every_minutes),
        "--min-new-episodes", str(config.min_new_episodes), "--offline-steps", str(config.offline_steps),
        "--guidance", config.guidance, "--poll-s", "2", "--curriculum", config.curriculum,
        "--retrain-steps", str(config.retrain_steps), "--rl-updates-per-retrain", str(config.rl_updates_per_retrain),
        "--self-imitation-top-k", str(config.top_k),
    ]  # fmt: skip


def twin_args(config: DemoConfig, version: str, summary: Path) -> list[str]:
    """`flywheel twin ...`: the no-fleet twin of `version`, trained with the flags the learner daemon ran with."""
    return ["twin", version, "--summary", str(summary), *learner_args(config)[1:]]


def fleet_edge_args(config: DemoConfig, run_s: float) -> tuple[str, ...]:
    """The `flywheel edge` flags of a continuous run's fleet: experts until a first version, then sampling."""
    return ("--bootstrap-expert", "--temperature", str(config.temperature), "--top-k", str(config.top_k),
            "--repeats", str(config.repeats), "--seeds-per-visit", str(config.seeds_per_visit),
            "--stop-after-s", str(run_s),
            "--teacher-budget", str(config.teacher_budget),
            "--teacher-per-hour", str(config.teacher_per_hour))  # fmt: skip
