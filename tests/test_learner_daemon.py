"""The continuous learner walks the curriculum on real Delta tables and publishes through Kafka:
SFT on demonstrations -> offline RL once failures are logged -> online RL on fresh sampled rollouts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from learner.algorithms.stages import retrain_steps
from learner.algorithms.training_run import TrainingRun
from learner.daemon.loop import DaemonConfig, DaemonState, TableCounts, is_due, next_stage, run_daemon
from learner.daemon.twin import train_twin, twin_plan
from learner.data.tables import table_versions
from policy.runtime import VLARuntime
from policy.sampling import Sampling
from registry.store import fetch_verified, read_manifest, resolve_model
from schemas import Action
from streams.model_versions import latest_by_channel
from tests.factories import TablesLog, box_screen

TINY_RECIPE = {"seed": 0, "vocab_size": 300,
               "model": {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128},
               "pruning": {"keep_ratio": 1.0},
               "train": {"steps": 20, "batch_size": 8, "lr": 0.003, "warmup_steps": 3, "keep_ratios": [1.0],
                         "checkpoint_every": 0}}  # fmt: skip


def test_the_schedule_follows_the_curriculum():
    config = DaemonConfig(every_episodes=10, every_minutes=1.0, min_new_episodes=4, min_demos=5, curriculum="rl")

    def fresh(n: int, demos: int = 5, failures: bool = True, labels: int = 0) -> TableCounts:
        return TableCounts(fresh=n, fresh_steps=n, failures_logged=failures, demos=demos, teacher_labels=labels)

    empty = DaemonState()
    assert next_stage(empty, fresh(0), config) == "sft"
    assert not is_due(empty, fresh(0, demos=4), 0.0, config) and is_due(empty, fresh(0), 0.0, config)  # demos first
    sft = DaemonState(sft_checkpoint="x", last_publish_at=100.0)
    assert next_stage(sft, fresh(0, failures=False), config) == "online_rl"
    assert next_stage(sft, fresh(0), config) == "offline_rl"
    assert next_stage(DaemonState(sft_checkpoint="x", offline_done=True), fresh(0), config) == "online_rl"
    assert not is_due(sft, fresh(9), 130.0, config) and is_due(sft, fresh(10), 130.0, config)  # N new episodes ...
    assert not is_due(sft, fresh(3), 1000.0, config) and is_due(sft, fresh(4), 161.0, config)  # ... or T minutes


def test_the_supervised_curriculum_retrains_on_labels_or_successes_and_refines_with_anchored_rl():
    config = DaemonConfig(curriculum="supervised", rl_updates_per_retrain=2)
    counts = TableCounts(fresh=10, fresh_steps=10, failures_logged=True, demos=5)
    labelled = TableCounts(fresh=10, fresh_steps=10, failures_logged=True, demos=5, teacher_labels=3)

    def after(*stages: str, rl: int = 0) -> DaemonState:
        """The state after publishing `stages`, the last `rl` of them anchored RL updates."""
        return DaemonState(sft_checkpoint="x", versions=[{"stage": s} for s in stages], rl_since_retrain=rl)

    assert next_stage(after("sft"), counts, config) == "self_imitation"  # no label yet: the verified successes
    assert next_stage(after("sft"), labelled, config) == "dagger"
    assert next_stage(after("sft", "dagger"), labelled, config) == "online_rl"
    assert next_stage(after("sft", "dagger", "online_rl", rl=1), labelled, config) == "online_rl"
    assert next_stage(after("sft", "dagger", "online_rl", "online_rl", rl=2), labelled, config) == "dagger"
    assert next_stage(after("sft", "dagger"), labelled, DaemonConfig()) == "dagger"  # the default: no RL


def demonstrated(stack, tmp_path):
    """(settings, the tiny recipe's path, a Log) after 12 successful demonstrations landed in the tables."""
    recipe = tmp_path / "tiny.json"
    recipe.write_text(json.dumps(TINY_RECIPE))
    log = TablesLog(stack.settings.tables_dir)
    for seed in range(12):
        log.episode(f"demo-{seed}", seed, Action("click", *box_center(seed)), True, "expert")
    return stack.settings, str(recipe), log


def test_the_daemon_retrains_from_sft_on_the_teachers_labels_and_records_them_in_the_lineage(stack, tmp_path):
    settings, recipe, log = demonstrated(stack, tmp_path)
    config = DaemonConfig(recipe=recipe, every_episodes=4, min_new_episodes=4, poll_s=0.2, min_demos=12,
                          max_versions=1, retrain_steps=6)  # fmt: skip
    state = run_daemon(settings, config)
    with pytest.raises(ValueError, match="no no-fleet twin"):
        twin_plan(settings, state.version)  # the first SFT holds nothing of the fleet's: it is its own twin
    # The model's episodes, each step labelled by the teacher with the box's centre (the policy missed it).
    for seed in range(100, 106):
        log.episode(f"m-{seed}", seed, Action("click", 1.0, 1.0), False, state.version,
                    teacher=Action("click", *box_center(seed)))  # fmt: skip
    state = run_daemon(settings, config)
    assert [v["stage"] for v in state.versions] == ["sft", "dagger"]
    assert state.versions[-1]["diagnostics"]["teacher_labels"] == 6
    event = latest_by_channel(settings)["stable"]
    assert event.stage == "dagger" and read_manifest(settings.artifacts_dir, event.version)["teacher_labels"] == 6
    assert set(event.lineage) == set(table_versions(settings.tables_dir))  # tables only: each one reopens

    # The retrain's steps grew with its rows: 4 passes over 12 demonstrations + 6 labels at batch 8, not 6.
    steps = read_manifest(settings.artifacts_dir, event.version)["stage_steps"]
    assert steps == retrain_steps(6, config.retrain_passes, 18, 8) == 9
    # Its no-fleet twin: the same retrain (stage, steps, rate, SFT start) on the 12 demonstrations alone, stored.
    twin, retrain = train_twin(settings, config, event.version), state.versions[-1]["diagnostics"]
    assert (twin["stage"], twin["retrain"], twin["start"], twin["steps"], twin["lr"], twin["lineage"]) == (
        "dagger", event.version, state.versions[0]["model_version"], 9, config.rl_lr, event.lineage)  # fmt: skip
    assert twin["trained_steps"] == 9
    assert twin["samples"] == twin["diagnostics"]["demo_rows"] == retrain["demo_rows"] == 12
    assert twin["diagnostics"]["extra_rows"] == twin["diagnostics"]["teacher_labels"] == 0 < retrain["extra_rows"]
    assert fetch_verified(twin["artifact_uri"], twin["sha256"]).is_file() and twin["updates_after_retrain"] == 0


def test_the_daemon_walks_sft_offline_online_and_publishes_each(stack, tmp_path):
    settings, recipe, log = demonstrated(stack, tmp_path)
    config = DaemonConfig(recipe=recipe, every_episodes=8, min_new_episodes=4, poll_s=0.2, offline_steps=4,
                          min_demos=12, max_versions=1, curriculum="rl")  # fmt: skip
    state = run_daemon(settings, config)
    assert [v["stage"] for v in state.versions] == ["sft"]
    assert latest_by_channel(settings)["stable"].version == state.version

    # The fleet's sampled rollouts of the SFT version: 4 per seed, so each seed is a group.
    runtime = VLARuntime(resolve_model(state.version, settings.artifacts_dir)[0], keep_ratio=1.0)
    rng = np.random.default_rng(0)

    def rollouts(seeds, prefix):
        for seed in seeds:
            image, (x0, y0, x1, y1) = box_screen(seed)
            for g in range(4):
                gen, _ = runtime.step(image, "Click the box.", None, Sampling(temperature=1.5), rng)
                a = runtime.tok.parse(gen.ids).action
                hit = a.type == "click" and x0 <= a.x <= x1 and y0 <= a.y <= y1
                log.episode(f"{prefix}-{seed}-{g}", seed, a, hit, state.version, gen.ids, gen.token_logprobs)

    rollouts(range(100, 104), "r1")
    state = run_daemon(settings, config)
    assert [v["stage"] for v in state.versions] == ["sft", "offline_rl"]
    rollouts(range(200, 204), "r2")
    state = run_daemon(settings, config)
    assert [v["stage"] for v in state.versions] == ["sft", "offline_rl", "online_rl"]
    assert state.versions[-1]["fresh_episodes"] >= 16
    assert DaemonState.load(settings.learner_dir / "daemon" / "state.json") == state  # resumable


def test_a_first_version_started_from_a_trained_model_fine_tunes_it_like_a_retrain(stack, tmp_path):
    import shutil

    import torch

    from learner.model.checkpoints import load_vla, save_weights

    settings, recipe, _ = demonstrated(stack, tmp_path)
    first = run_daemon(settings, DaemonConfig(recipe=recipe, poll_s=0.2, min_demos=12, max_versions=1))
    shipped = save_weights(tmp_path / "shipped.pt", *load_vla(first.checkpoint))  # what a release ships
    shutil.rmtree(settings.learner_dir / "daemon")  # a new fleet's learner, on the same tables

    config = DaemonConfig(recipe=recipe, poll_s=0.2, min_demos=12, max_versions=1, start_from=str(shipped),
                          sft_steps=4, rl_lr=1e-4)  # fmt: skip
    state = run_daemon(settings, config)
    assert [v["stage"] for v in state.versions] == ["sft"]
    assert read_manifest(settings.artifacts_dir, state.version)["stage_steps"] == 4
    trained = torch.load(state.checkpoint, map_location="cpu", weights_only=True)
    assert trained["train_config"]["lr"] == 1e-4 and trained["train_config"]["steps"] == 4  # at rl_lr, sft_steps

    assert "kl_old" in state.versions[0]["diagnostics"]  # its drift is measured from the start it was given

    # Four small steps from the shipped weights stay next to them; the same four from a fresh model end far away.
    start, tuned = (load_vla(p)[0].state_dict() for p in (shipped, state.checkpoint))
    shutil.rmtree(settings.learner_dir / "daemon")
    fresh = load_vla(run_daemon(settings, replace(config, start_from="")).checkpoint)[0].state_dict()
    moved = sum((tuned[k] - start[k]).abs().sum().item() for k in start)
    from_scratch = sum((fresh[k] - start[k]).abs().sum().item() for k in start)
    assert 0 < moved < 0.05 * from_scratch


class Killed(BaseException):
    """A SIGKILL, in process: nothing in the daemon catches it."""


def test_a_daemon_killed_mid_stage_resumes_it_from_its_checkpoint_on_the_same_table_versions(
    stack, tmp_path, monkeypatch
):
    settings, recipe, log = demonstrated(stack, tmp_path)
    tiny = json.loads(Path(recipe).read_text())
    tiny["train"]["checkpoint_every"] = 5
    Path(recipe).write_text(json.dumps(tiny))
    config = DaemonConfig(recipe=recipe, poll_s=0.2, min_demos=12, max_versions=1)
    versions_at_start = table_versions(settings.tables_dir)

    real_save = TrainingRun.save

    def save_then_die(run, step, path=None):
        real_save(run, step, path)
        if step == 10:
            raise Killed  # after the step-10 checkpoint, mid-way through 20 steps

    monkeypatch.setattr(TrainingRun, "save", save_then_die)
    with pytest.raises(Killed):
        run_daemon(settings, config)
    monkeypatch.setattr(TrainingRun, "save", real_save)
    assert DaemonState.load(settings.learner_dir / "daemon" / "state.json").in_progress["stage"] == "sft"
    for seed in range(100, 104):  # the tables move on while no daemon runs
        log.episode(f"late-{seed}", seed, Action("click", *box_center(seed)), True, "expert")

    state = run_daemon(settings, config)
    assert [v["stage"] for v in state.versions] == ["sft"] and state.in_progress == {}
    assert state.versions[0]["resumed_from_step"] == 10
    manifest = read_manifest(settings.artifacts_dir, state.version)
    assert manifest["stage_steps"] == 10  # the 10 steps left, not 20 again
    assert latest_by_channel(settings)["stable"].lineage == versions_at_start  # the versions it began on


def test_a_stage_in_progress_on_versions_no_longer_readable_starts_anew(stack, tmp_path):
    settings, recipe, _ = demonstrated(stack, tmp_path)
    gone = {name: version + 1000 for name, version in table_versions(settings.tables_dir).items()}
    counts = {"fresh": 0, "fresh_steps": 0, "failures_logged": False, "demos": 12, "teacher_labels": 0}
    DaemonState(in_progress={"stage": "sft", "versions": gone, "counts": counts, "started_at": 0.0}).save(
        settings.learner_dir / "daemon" / "state.json"
    )
    state = run_daemon(settings, DaemonConfig(recipe=recipe, poll_s=0.2, min_demos=12, max_versions=1))
    assert [v["stage"] for v in state.versions] == ["sft"] and state.versions[0]["resumed_from_step"] == 0
    assert latest_by_channel(settings)["stable"].lineage == table_versions(settings.tables_dir)


def box_center(seed: int) -> tuple[float, float]:
    _, (x0, y0, x1, y1) = box_screen(seed)
    return (x0 + x1) / 2, (y0 + y1) / 2


def test_no_tables_no_training(stack):
    state = run_daemon(stack.settings, DaemonConfig(poll_s=0.1, stop_after_s=0.5))
    assert state.versions == []
