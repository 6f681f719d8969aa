"""`flywheel experiment curriculum`: its bookkeeping, and one tiny real run (browser, SFT, retrain rounds, online)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import torch

from core.machine import machine
from flywheel.experiments.curriculum import ARMS, choose_rl_set, stage_at, tier_means
from registry.store import sha256_of


def test_tier_means_are_over_the_evaluated_tasks_of_each_tier():
    rates = {"miniwob/click-test-v1": 1.0, "click-button": 0.5, "miniwob/enter-text-v1": 0.25}
    assert tier_means(rates) == (0.75, 0.25)
    assert tier_means({"click-test": 1.0}) == (1.0, None)


def test_an_arm_spends_its_budget_in_its_stages_after_sft():
    assert stage_at(ARMS["sft_offline_refkl"], 0.0, 100.0, 0.3) == "offline_rl"
    assert stage_at(ARMS["sft_offline_refkl"], 30.0, 100.0, 0.3) == "online_rl:refkl"
    assert stage_at(ARMS["sft_ppo"], 0.0, 100.0, 0.3) == "online_rl:none"
    assert stage_at(ARMS["sft"], 50.0, 100.0, 0.3) == "sft"  # more SFT, the baseline at the same budget
    assert stage_at(ARMS["offline_only"], 0.0, 100.0, 0.3) == "offline_rl"
    assert stage_at(ARMS["sft_semi_online_views"], 90.0, 100.0, 0.3) == "semi_online:views"
    assert stage_at(ARMS["dagger_rl"], 10.0, 100.0, 0.3) == "dagger"  # labels first ...
    assert stage_at(ARMS["dagger_rl"], 40.0, 100.0, 0.3) == "online_rl:anchor"  # ... then RL anchored to them
    assert stage_at(ARMS["sft_more_demos"], 90.0, 100.0, 0.3) == "dagger:demos"
    assert set(ARMS) == {"sft", "sft_offline", "sft_offline_ppo", "sft_offline_refkl", "sft_offline_databc",
                         "sft_ppo", "offline_only", "sft_semi_online", "sft_semi_online_views", "sft_more_demos",
                         "dagger", "self_imitation", "dagger_rl", "self_imitation_rl", "dagger_edge", "dart",
                         "search_bc", "search_bc_teacher", "search_bc_rl"}  # fmt: skip
    assert stage_at(ARMS["search_bc_rl"], 10.0, 100.0, 0.3) == "self_imitation:search"  # search, then anchored RL
    assert stage_at(ARMS["search_bc_rl"], 40.0, 100.0, 0.3) == "online_rl:anchor"


def test_the_rl_set_rule_keeps_the_tasks_nearest_to_half_within_the_band():
    rates = {"a": 0.05, "b": 0.5, "c": 0.9, "d": 0.3, "e": 0.65, "f": 1.0, "g": 0.1}
    assert choose_rl_set(rates, 0.1, 0.9, 3) == ["b", "d", "e"]  # |0.5 - r|: 0, 0.2, 0.15; c and g at 0.4
    assert choose_rl_set(rates, 0.1, 0.9, 10) == ["b", "c", "d", "e", "g"]  # the band's ends are in it
    assert choose_rl_set({"a": 0.0, "b": 1.0}, 0.1, 0.9, 8) == []


def test_a_tiny_curriculum_runs_every_kind_of_stage_and_resumes(tmp_path):
    out = tmp_path / "curriculum"
    args = [sys.executable, "-m", "flywheel.cli", "experiment", "curriculum", "--out", str(out),
            "--tasks", "click-test,click-button", "--rl-set-low", "0", "--rl-set-high", "1", "--rl-set-size", "1",
            "--selection-episodes", "2", "--eval-episodes", "3", "--tier1-episodes", "1", "--curve-points", "1",
            "--budget-minutes", "0.05", "--demos-per-task", "3", "--sft-steps", "10", "--log-seeds", "2",
            "--repeats", "2", "--groups-per-round", "1", "--max-groups-per-round", "2", "--update-steps", "2",
            "--online-lr", "1e-5", "--round-episodes", "2", "--retrain-steps", "3",
            "--arms", "sft,sft_ppo,dagger_rl,sft_more_demos,search_bc_teacher,dart"]  # fmt: skip
    result = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "curriculum.json").read_text())
    rl_set = report["rl_set"]
    assert len(rl_set["tasks"]) == 1 and "nearest to 0.5" in rl_set["rule"]
    assert rl_set["selection_seeds"] == [900_000, 900_001] and rl_set["eval_seeds"] == [1_000_000, 1_000_002]
    assert set(report["arms"]) == {"sft", "sft_ppo", "dagger_rl", "sft_more_demos", "search_bc_teacher", "dart"}
    for arm, entry in report["arms"].items():
        assert entry["stages"] == list(ARMS[arm])
        assert len(entry["curve"]) == 2 and 0.0 <= entry["tier1_mean"] <= 1.0
        lo, hi = entry["rl_set_ci"]
        assert lo <= entry["rl_set_mean"] <= hi and "vs_sft" in entry and "vs_start" in entry
        assert entry["curve"][-1]["spent_s"] >= 3.0 and entry["rounds"] >= 1  # the budget was spent training
        assert len(entry["diagnostics"]) == entry["rounds"] and (out / arm / "final.vla").exists()
        assert entry["machines"] == [machine()]  # the wall-clock budget's machine, once however many rounds
        evaluated = json.loads((out / arm / "eval-1.json").read_text())["success_by_seed"]
        assert len(evaluated[rl_set["tasks"][0]]) == 3  # the RL set on its 3 evaluation seeds, every arm alike
    # DAgger paid for labels on its own states, then RL anchored to them (self-imitation, which asks no teacher, has
    # its own tests in test_teacher_labels: one arm fewer here keeps the suite under 30 min).
    dagger = report["arms"]["dagger_rl"]
    assert dagger["teacher_labels"] > 0
    assert dagger["curve"][-1]["teacher_labels"] == dagger["teacher_labels"]
    assert [d["stage"] for d in dagger["diagnostics"]][0] == "dagger" and dagger["diagnostics"][0]["teacher_labels"] > 0
    assert any((out / "dagger_rl" / "gathered").glob("round-0.parquet"))
    more = report["arms"]["sft_more_demos"]  # the baseline a label must beat: each new expert step counted as one
    assert more["teacher_labels"] > 0 and more["diagnostics"][-1]["teacher_labels"] == more["teacher_labels"]
    # The search found successes from the policy's own failures (the teacher finishing branches within its calls).
    search = report["arms"]["search_bc_teacher"]
    found = [d["gathered"] for d in search["diagnostics"]]
    assert sum(g["failures"] for g in found) > 0 and sum(g["found"] for g in found) > 0
    assert search["teacher_labels"] == sum(g["teacher_calls"] for g in found) > 0
    assert all(g["teacher_calls"] <= 10 * g["failures"] for g in found)  # search_teacher_calls a failure
    # The teacher's steps of a success are its targets; the policy's failing prefix and candidate only context.
    found_rows = pl.concat([pl.read_parquet(p) for p in (out / "search_bc_teacher" / "gathered").glob("*.parquet")])
    assert found_rows["train"].any() and not found_rows["train"].all()
    # DART: every noisy expert step is a call and a label (the clean action), with the history it took.
    dart = report["arms"]["dart"]
    dart_rows = pl.concat([pl.read_parquet(p) for p in (out / "dart" / "gathered").glob("*.parquet")])
    assert dart["teacher_labels"] == dart_rows.height == int(dart_rows["train"].sum())
    # Each retrain arm's no-fleet twin: its last retrain's steps on the demonstrations alone, on the same seeds.
    for arm in ("sft_more_demos", "search_bc_teacher", "dart"):
        entry = report["arms"][arm]
        assert entry["twin"]["retrain_steps"] == entry["diagnostics"][-1]["retrain_steps"] >= 3
        assert "vs_twin" in entry and Path(entry["twin"]["eval"]).exists()
    # dagger_rl has a twin only if its tiny budget ended in a retrain round: anchored RL after one has none.
    last_stage = report["arms"]["dagger_rl"]["curve"][-1]["stage"]
    assert ("twin" in report["arms"]["dagger_rl"]) == (last_stage == "dagger")
    sft, online = (report["arms"][a] for a in ("sft", "sft_ppo"))
    assert sft["curve"][0] == online["curve"][0]  # both start from the one shared SFT
    assert online["curve"][-1]["stage"] == "online_rl:none"
    # Online RL pays for its own rollouts; SFT only for the demonstrations. (The offline stage's own test is
    # tests/test_offline_rl.py: the offline arms are out of this run, to keep the suite under 30 min.)
    assert online["env_steps"] > sft["env_steps"] > 0
    assert (out / "curriculum.png").stat().st_size > 0
    # The online stage steps at its own learning rate, not the SFT and offline stages' rl_lr.
    online = torch.load(out / "sft_ppo" / "online" / "vla_checkpoint.pt", weights_only=True)
    assert online["optimizer"]["param_groups"][0]["lr"] == 1e-5 and online["train_config"]["lr"] == 1e-5

    states = {arm: json.loads((out / arm / "state.json").read_text()) for arm in report["arms"]}
    again = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {arm: json.loads((out / arm / "state.json").read_text()) for arm in report["arms"]} == states  # resumed

    # SOP vs live success over the run's evaluated checkpoints, on its RL set (not the selection's seeds).
    sop_out = tmp_path / "sop"
    sop = subprocess.run([sys.executable, "-m", "flywheel.cli", "experiment", "sop", "--out", str(sop_out),
                          "--curriculum", str(out), "--episodes", "2"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert sop.returncode == 0, sop.stdout[-3000:] + sop.stderr[-3000:]
    points = json.loads((sop_out / "sop.json").read_text())
    # the shared SFT and the 6 arms' ends (the twins are not the run's checkpoints)
    assert points["tasks"] == rl_set["tasks"] and len(points["checkpoints"]) == 7
    assert not any("selection" in c["checkpoint"] for c in points["checkpoints"])

    # A tuning run on the same shared part: every point on the selection seeds, none on an evaluation seed.
    tune_out = tmp_path / "tune"
    shutil.copytree(out / "shared", tune_out / "shared")
    tune_args = [a if a != str(out) else str(tune_out) for a in args[:-1]] + ["sft", "--tune"]
    tuned = subprocess.run(tune_args, capture_output=True, text=True, timeout=600)
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-3000:]
    tune_report = json.loads((tune_out / "curriculum.json").read_text())
    assert tune_report["rl_set"]["eval_seeds"] == [900_000, 900_001] and "selection seeds" in tune_report["tuning"]
    evaluated = json.loads((tune_out / "sft" / "eval-1.json").read_text())
    assert evaluated["seed"] == 900_000 and len(evaluated["success_by_seed"][rl_set["tasks"][0]]) == 2
    start = json.loads((out / "shared" / "eval-selection.json").read_text())
    tune_start = json.loads((tune_out / "sft" / "state.json").read_text())["curve"][0]
    assert tune_start["per_task"][rl_set["tasks"][0]] == start["tasks"][rl_set["tasks"][0]]
    # A shared part without the selection's evaluation (its RL set was given): the start is evaluated on the
    # selection seeds too, once.
    bare = tmp_path / "tune-bare"
    shutil.copytree(out / "shared", bare / "shared")
    (bare / "shared" / "eval-selection.json").unlink()
    # It starts from a trained model instead (start_from, as a run on the release does), recorded by its digest.
    start_from = out / "shared" / "sft" / "vla_checkpoint.pt"
    bare_args = [a if a != str(tune_out) else str(bare) for a in tune_args] + ["--start-from", str(start_from)]
    started = subprocess.run(bare_args, capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-3000:]
    assert json.loads((bare / "shared" / "eval-selection.json").read_text())["seed"] == 900_000
    meta = json.loads((bare / "shared" / "meta.json").read_text())
    assert meta["start_from"] == {"checkpoint": str(start_from), "sha256": sha256_of(start_from)}
