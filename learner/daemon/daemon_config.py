"""The learner daemon's settings (`flywheel learner`, learner.daemon.loop): when it trains, what, and for how long.

A module of its own, free of torch and polars, so that the runs that start a daemon (`flywheel demo`, `flywheel
chaos`) hold its config in theirs and derive its command line from it (core.cli_config.config_argv) without
importing the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Guidance = Literal["none", "refkl", "databc", "anchor"]
"""Online RL's offline guidance (learner.algorithms.online_rl): none, KL to the SFT reference, the demonstrations' NLL
annealed, or the NLL of the demonstrations and teacher labels at a fixed weight."""


@dataclass(frozen=True)
class DaemonConfig:
    recipe: str = "demo"
    """VLA recipe of the SFT stage: 'demo', 'release' (configs/vla_<name>.json) or a path."""
    sft_steps: int = 0
    """Optimizer steps of the SFT stage (0: the recipe's)."""
    start_from: str = ""
    """A trained model's weights (learner.model.checkpoints.save_weights, e.g. release/model.pt): the first version is
    this model fine-tuned on the demonstrations, sft_steps at rl_lr like a retrain, instead of a fresh model of the
    recipe ("": fresh). Its architecture and tokenizer are the start's; the recipe gives the training settings."""
    min_demos: int = 20
    """Successful demonstration episodes in the tables before the first (SFT) version is trained."""
    every_episodes: int = 64
    """Publish after this many new model episodes in the tables ..."""
    every_minutes: float = 5.0
    """... or after this long, once at least min_new_episodes arrived."""
    min_new_episodes: int = 16
    """Fewer fresh episodes than this: no RL update (too few groups to rank)."""
    poll_s: float = 5.0
    """How often the tables are looked at."""
    offline_steps: int = 100
    """Optimizer steps of the offline RL stage."""
    rl_lr: float = 3e-4
    """Learning rate of the offline RL stage."""
    online_lr: float = 3e-5
    """Learning rate of the online RL updates: a few noisy steps each, where Adam moves every weight by about the
    learning rate a step (docs/history/curriculum.md, "the online learning rate")."""
    guidance: Guidance = "refkl"
    """Online RL's offline guidance: 'none', 'refkl' or 'databc'."""
    replay_versions: int = 2
    """An online update trains on the rollouts produced since the publish this many versions ago (1: only the
    fresh ones); decoupled PPO weights the older versions' tokens by pi_old / mu."""
    curriculum: Literal["supervised", "rl"] = "supervised"
    """After SFT: 'supervised' (retrain from SFT on demonstrations + teacher labels, or + verified successes when
    there is no label; optionally refined by anchored RL) or 'rl' (offline RL, then online PPO with guidance)."""
    retrain_steps: int = 300
    """supervised: optimizer steps at least of each retrain from the SFT model (at rl_lr) ..."""
    retrain_passes: float = 4.0
    """... or this many passes over its rows (the demonstrations + the fleet's labels or successes), if more."""
    rl_updates_per_retrain: int = 0
    """supervised: anchored PPO updates (online_rl:anchor, at online_lr) on fresh rollouts after each retrain."""
    self_imitation_top_k: int = 5
    """supervised, no teacher label: a success counts when it was drawn greedily or among this many likeliest
    tokens (the fleet's --top-k; never a draw over every token)."""
    new_tasks: tuple[str, ...] = ()
    """supervised: tasks nobody demonstrated; each retrain adds the fleet's verified successes on them (filtered BC,
    each seed's shortest, whatever temperature drew it: learner.data.teacher_labels.filtered_successes)."""
    new_task_copies: int = 4
    """supervised: copies of each of those successes in a retrain: a few verified rows beside thousands of
    demonstration rows are otherwise a rounding error in the loss (with retrain_passes 4, each is seen 16 times)."""
    keep_versions: int = 0
    """After each publish, keep the newest this many versions in the model store, plus every one still needed (a
    channel's head, one in use, one held), and only the training runs a stage starts from again
    (learner.daemon.retention); 0: keep every version and run."""
    max_versions: int = 0
    """Stop after publishing this many versions (0: run until stopped)."""
    stop_after_s: float = 0.0
    """Stop after this many seconds (0: run until stopped)."""

    def __post_init__(self) -> None:
        if self.keep_versions < 0:
            raise ValueError(f"keep_versions must be 0 (keep all) or more, not {self.keep_versions}")
