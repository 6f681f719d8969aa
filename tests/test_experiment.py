"""`flywheel experiment`: arms laid over the base recipe, per-task episode subsets, the table and the curves."""

from __future__ import annotations

import polars as pl
import pytest

from flywheel.experiments.experiment import episode_subset, merged, plot_curves, table


def test_an_arm_overrides_only_the_settings_it_names():
    base = {"seed": 3, "model": {"d_model": 160, "n_layers": 4}, "train": {"steps": 600, "lr": 1e-3}}
    arm = {"name": "reading", "model": {"encoder": "reading"}, "train": {"augment_shift_px": 6}}
    recipe = merged(base, arm)
    assert recipe["model"] == {"d_model": 160, "n_layers": 4, "encoder": "reading"}
    assert recipe["train"] == {"steps": 600, "lr": 1e-3, "augment_shift_px": 6}
    assert base["model"] == {"d_model": 160, "n_layers": 4}  # the base is not touched


def test_a_fraction_of_the_episodes_keeps_every_task_and_whole_episodes():
    rows = [{"task": t, "episode_id": f"{t}-{e}", "step": s} for t in ("a", "b") for e in range(20) for s in range(2)]
    frame = pl.DataFrame(rows)
    half = episode_subset(frame, 0.25, seed=0)
    per_task = half.group_by("task").agg(pl.col("episode_id").n_unique()).sort("task")
    assert per_task["episode_id"].to_list() == [5, 5]
    assert half.group_by("episode_id").len()["len"].to_list() == [2] * 10  # no episode cut in half
    assert episode_subset(frame, 0.25, seed=0).equals(half)  # seeded
    assert not episode_subset(frame, 0.25, seed=1).equals(half)
    assert episode_subset(frame, 1.0, seed=0).equals(frame)


def _entry(arm: str, step: int, mean: float, episodes: int = 100, group: str = "g") -> dict:
    return {"arm": arm, "step": step, "group": group, "demo_episodes": episodes, "tasks": {"click-test": mean},
            "mean": mean, "train_wall_s": 120.0, "parameters": 1_500_000}  # fmt: skip


def test_the_table_has_a_row_per_arm_and_step_and_the_curves_are_drawn(tmp_path):
    entries = [_entry("patch", 300, 0.4), _entry("patch", 600, 0.5), _entry("half", 600, 0.3, episodes=50)]
    text = table(entries).splitlines()
    assert text[0].startswith("| arm | step | demo episodes | click-test | **mean**")
    assert "| patch | 600 | 100 | 0.50 | **0.500** | 2.0 min | 1.50 M |" in text
    assert len(text) == 2 + len(entries)
    plot_curves(tmp_path / "curves.png", entries)
    assert (tmp_path / "curves.png").stat().st_size > 5000


def test_an_unknown_arm_is_refused(tmp_path, monkeypatch):
    import json

    from flywheel.experiments.experiment import ExperimentConfig, run_experiment

    frame = pl.DataFrame([{"task": "click-test", "episode_id": "e", "step": 0}])
    spec = {"demonstrations_from": str(tmp_path / "r.json"), "demonstrations_work": str(tmp_path),
            "tasks": "click-test", "base": {}, "arms": [{"name": "patch"}]}  # fmt: skip
    (tmp_path / "r.json").write_text("{}")
    (tmp_path / "e.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"no arms named \['pach'\]"):
        run_experiment(ExperimentConfig(config=tmp_path / "e.json", work=tmp_path / "w", arms="pach"),
                       lambda recipe, work: frame)  # fmt: skip


@pytest.mark.browser
def test_a_finished_runs_snapshots_are_evaluated_in_step_order_once(tmp_path, monkeypatch):
    import numpy as np

    import flywheel.experiments.experiment as experiment
    from learner.algorithms.sft import train_vla
    from learner.recipe import VLARecipe, VLATrainConfig
    from policy.screen import encode_png

    image = encode_png(np.full((210, 160, 3), 255, dtype=np.uint8))
    frame = pl.DataFrame([dict(episode_id=f"e{i}", step=0, task="click-test", instruction="Click the button.",
                               screenshot=image, thought="Click.", action_type="click", x=80.0, y=105.0, text="",
                               key="") for i in range(4)])  # fmt: skip
    train = VLATrainConfig(steps=8, batch_size=4, warmup_steps=1, snapshot_every=4, checkpoint_every=0,
                           keep_ratios=(1.0,), progress_bar=False)  # fmt: skip
    model = {"stem_channels": 8, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64}
    train_vla(frame, VLARecipe(model=model, vocab_size=260, train=train), tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run" / "snapshots").iterdir()) == ["step-4.pt", "step-8.pt"]
    entries = experiment.evaluate_checkpoints(str(tmp_path / "run/snapshots/*.pt"), ("click-test",), 2, tmp_path)
    assert [e["step"] for e in entries] == [4, 8] and all(0.0 <= e["mean"] <= 1.0 for e in entries)
    monkeypatch.setattr(experiment, "evaluate_model", lambda *a: pytest.fail("evaluated twice"))
    assert (
        experiment.evaluate_checkpoints(str(tmp_path / "run/snapshots/*.pt"), ("click-test",), 2, tmp_path) == entries
    )
    with pytest.raises(ValueError, match="no checkpoints"):
        experiment.evaluate_checkpoints(str(tmp_path / "none/*.pt"), ("click-test",), 2, tmp_path)
