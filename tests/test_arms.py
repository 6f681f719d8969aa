"""The experiment's arms and their harness: registered modules, refused flags, the control's shuffle, the failures
the offline arm pairs, the statistics, and one tiny run end to end in a real browser (resumed, not retrained)."""

from __future__ import annotations

import dataclasses
import json
import math

import polars as pl
import pytest

from core.settings import EVAL_SEED
from core.stats import seeds_mean_ci
from flywheel.cli import main
from flywheel.experiments.arms.offline_rl import informative_failures
from flywheel.experiments.arms.shuffled_labels import shuffled_success
from flywheel.experiments.arms_report import pass_at
from flywheel.experiments.harness import ARMS, EXPLORE_SEED, ArmsConfig, ArmSettings, run_arms


def test_every_arm_is_a_module_registered_by_its_name_with_typed_settings():
    settings = {f.name: f.type for f in dataclasses.fields(ArmSettings)}
    assert set(settings) == {name for name, module in ARMS.items() if module.SETTINGS is not None}
    for name, module in ARMS.items():
        assert module.NAME == name and module.SUMMARY and module.__doc__ and callable(module.train)
        assert module.SETTINGS is None or module.SETTINGS.__name__ in settings[name]
        assert module.AFTER in ("", *ARMS)


@pytest.mark.parametrize("arms", ["search_bc,nope", "search_bc_rl,search_bc", "search_bc_rl"])
def test_an_unknown_arm_or_one_before_the_arm_it_starts_from_is_refused_before_anything_starts(arms, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["experiment", "--arms", arms, "--out", str(tmp_path / "run")])
    assert refused.value.code == 2
    assert "error: argument --arms:" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def episodes(outcomes: dict[tuple[str, int], list[bool]]) -> pl.DataFrame:
    """Two-step episodes of each (task, seed), one per outcome."""
    rows = [{"episode_id": f"{task}-{seed}-{i}", "step": step, "task": task, "seed": seed, "success": ok}
            for (task, seed), oks in outcomes.items() for i, ok in enumerate(oks) for step in range(2)]  # fmt: skip
    return pl.DataFrame(rows)


def test_the_control_shuffles_success_labels_within_a_task_keeping_their_count_and_each_episode_whole():
    rows = episodes({("a", 1): [True, False, False, False], ("a", 2): [False] * 4, ("b", 1): [True, True, False]})
    moved = False
    for seed in range(20):
        shuffled = shuffled_success(rows, seed)
        per_episode = shuffled.group_by("episode_id").agg(pl.col("success").n_unique().alias("labels"))
        assert per_episode["labels"].max() == 1  # an episode's steps keep one label
        counts = shuffled.unique("episode_id").group_by("task").agg(pl.col("success").sum()).sort("task")
        assert counts["success"].to_list() == [1, 2]
        moved |= not shuffled.sort("episode_id", "step")["success"].equals(rows.sort("episode_id", "step")["success"])
    assert moved


def test_the_offline_arm_keeps_the_failures_of_the_seeds_that_have_a_success():
    rows = episodes({("a", 1): [True, False, False], ("a", 2): [False, False], ("b", 1): [False]})
    failures = informative_failures(rows)
    assert sorted(failures["episode_id"].unique().to_list()) == ["a-1-1", "a-1-2"]


def test_pass_at_k_is_the_unbiased_estimate_and_the_seeds_interval_is_students():
    assert pass_at(1, 4, 1) == pytest.approx(0.25)
    assert pass_at(2, 4, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at(0, 4, 4) == 0.0 and pass_at(1, 4, 4) == 1.0
    spread = seeds_mean_ci([0.1, 0.2, 0.3])
    half = 4.303 * 0.1 / math.sqrt(3)
    assert spread["mean"] == pytest.approx(0.2) and spread["ci"] == pytest.approx([0.2 - half, 0.2 + half], abs=1e-4)
    assert seeds_mean_ci([0.1])["ci"] is None


@pytest.mark.browser  # it runs the harness's own browsers, not the `env` fixture's
def test_a_tiny_run_trains_every_arm_and_its_twin_pairs_them_and_resumes_without_training_again(tmp_path):
    from edge_client.runner import EdgeConfig
    from flywheel.experiments.arms import iterated_search_bc, search_bc_rl
    from flywheel.experiments.harness import arms_learner

    fleet = EdgeConfig(client_id="arms", policy="model", tasks=(), new_tasks=("unicode-test",), new_task_repeats=2,
                       new_task_search_steps=10)  # fmt: skip
    learner = dataclasses.replace(arms_learner(), retrain_steps=2, retrain_passes=0.0, new_tasks=fleet.new_tasks)
    rl = search_bc_rl.SearchBCRLSettings(rl_rounds=1, rl_repeats=2, rl_max_groups_per_round=1)
    rounds = iterated_search_bc.IteratedSearchBCSettings(rounds=2, round_seeds=1)
    config = ArmsConfig(out=tmp_path / "run", training_seeds=1, demos_per_task=1, seeds_per_task=2, eval_episodes=3,
                        suite_episodes=0, best_of_k=2, best_of_k_seeds=2, eval_browsers=1, fleet=fleet, learner=learner,
                        settings=ArmSettings(search_bc_rl=rl, iterated_search_bc=rounds))  # fmt: skip
    report = run_arms(config)

    assert set(report["arms"]) == set(ARMS)
    for arm, entry in report["arms"].items():
        seed = entry["seeds"]["0"]
        assert seed["steps"] == 2 and "vs_twin" in seed and "vs_start" in seed, arm
        assert seed["vs_start_best_of_k"]["k"] in (1, 2)
        assert entry["over_seeds"]["vs_twin"]["n"] == 1
        cost = seed["a_point_costs"]  # None where the gain over the twin is not above 0
        assert (cost is None) == (seed["vs_twin"]["ci"][0] <= 0), arm
        if cost is not None:
            assert cost["env_steps"] == round(seed["env_steps"] / (100 * seed["vs_twin"]["diff"])), arm
    assert report["arms"]["search_bc_rl"]["seeds"]["0"]["updates"] == 1
    assert report["arms"]["iterated_search_bc"]["seeds"]["0"]["rows"]["rounds"] == 2
    # An arm that builds on search_bc pays for its retrain too: every round's update, not the last one's alone.
    cpu_s = {arm: report["arms"][arm]["seeds"]["0"]["cpu_s"] for arm in ("search_bc", "iterated_search_bc",
                                                                          "search_bc_rl")}  # fmt: skip
    # (two retrains of the same length: about twice one's CPU, where the last one's alone is about once)
    assert cpu_s["iterated_search_bc"] > 1.4 * cpu_s["search_bc"] and cpu_s["search_bc_rl"] > cpu_s["search_bc"], cpu_s
    second = json.loads((tmp_path / "run" / "seed-0" / "iterated_search_bc-round-2" / "explore.json").read_text())
    assert second["tasks"]["unicode-test"]["first_seed"] == EXPLORE_SEED + 2  # after the start's 2 seeds
    explored = pl.read_parquet(tmp_path / "run" / "seed-0" / "explore" / "unicode-test.parquet")
    assert explored["seed"].max() < EVAL_SEED and set(explored["found_by"]) <= {"sampled", "search"}
    # A rerun reads every unit back: nothing trains or explores again.
    trained = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("trained.json")}
    assert len(trained) == len(ARMS) + 1  # the arms and one twin (every arm trained 2 steps)
    again = run_arms(config)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("trained.json")} == trained
    assert json.dumps(again["arms"], sort_keys=True) == json.dumps(report["arms"], sort_keys=True)
