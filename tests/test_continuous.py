"""The continuous demo: fleet and learner side by side, nobody waiting; its idle-time and version accounting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import replace

import polars as pl
import pytest

from core.object_store import join
from core.settings import settings_env
from edge_client.episode import EpisodeResult
from edge_client.experts import expert_for
from edge_client.exploration import NewTaskSampler, temperature_for
from edge_client.runner import EdgeConfig, RunSummary, episode_schedule, explore_further, samples
from flywheel.run.continuous import idle_seconds, success_rise
from lake.tables import EPISODES, STEPS, scan, table_uri
from learner.data.tables import load_samples
from policy.sampling import Sampling
from tests.conftest import isolated_broker_settings


def test_idle_time_is_the_window_no_span_covers():
    # Two clients overlapping on 0-3, one alone on 5-6: 4 s acted, 6 s of the 10 s window idle.
    assert idle_seconds([[5.0, 6.0], [0.0, 2.0], [1.0, 3.0]], 0.0, 10.0) == 6.0
    assert idle_seconds([[-1.0, 1.0], [1.5, 9.0]], 0.0, 2.0) == 0.5  # spans are clipped to the window
    assert idle_seconds([], 0.0, 4.0) == 4.0


def test_a_clients_acting_spans_merge_across_short_boundaries():
    summary = RunSummary("c0")
    for start, end in ((0.0, 1.0), (1.2, 2.0), (5.0, 6.0)):  # 0.2 s between episodes is a boundary, not idleness
        summary.record_acting(start, end)
    assert summary.acting == [[0.0, 2.0], [5.0, 6.0]]


def test_only_a_sampling_model_repeats_a_seed():
    config = EdgeConfig("c0", temperature=0.7, repeats=4)
    assert not samples(expert_for("click-test"), config)  # scripted: a repeat replays the same episode

    class Model:
        version = "sft-0001"

    assert samples(Model(), config) and not samples(Model(), EdgeConfig("c0", temperature=0.0))


def test_a_client_visits_each_task_for_its_seeds_per_visit_seeds_before_switching():
    config = EdgeConfig("c0", tasks=("a", "b"), episodes_per_task=3, repeats=2, seeds_per_visit=2)
    assert list(episode_schedule(config)) == [(0, "a", 0), (0, "a", 1), (1, "a", 0), (1, "a", 1),
                                              (0, "b", 0), (0, "b", 1), (1, "b", 0), (1, "b", 1),
                                              (2, "a", 0), (2, "a", 1), (2, "b", 0), (2, "b", 1)]  # fmt: skip
    assert [t for _, t, _ in episode_schedule(replace(config, seeds_per_visit=1, repeats=1))] == list("ababab")
    with pytest.raises(ValueError, match="seeds_per_visit"):
        list(episode_schedule(replace(config, seeds_per_visit=0)))


def test_a_new_task_runs_its_seeds_k_times_after_the_demonstrated_tasks():
    config = EdgeConfig("c0", tasks=("a",), new_tasks=("n",), episodes_per_task=2, repeats=1, new_task_repeats=3,
                        seeds_per_visit=2)  # fmt: skip
    assert list(episode_schedule(config)) == [(0, "a", 0), (1, "a", 0),
                                              (0, "n", 0), (0, "n", 1), (0, "n", 2), (1, "n", 0), (1, "n", 1),
                                              (1, "n", 2)]  # fmt: skip
    with pytest.raises(ValueError, match="not both"):
        list(episode_schedule(replace(config, new_tasks=("a",))))


def test_a_new_tasks_temperature_ladder_narrows_as_its_success_under_the_version_rises():
    assert temperature_for(0, 0, 2.0, 0.5) == 2.0  # never run: the widest top
    assert temperature_for(0, 8, 2.0, 0.5) == 2.0 and temperature_for(8, 8, 2.0, 0.5) == 0.5
    assert temperature_for(2, 8, 2.0, 0.5) == pytest.approx(1.625)
    assert [temperature_for(0, 0, 2.0, 0.5, k, 4) for k in range(4)] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    sampler, base = NewTaskSampler(2.0, 0.5), Sampling(0.7, top_k=5, seed=3)
    for success in (True, False, False, False):
        sampler.record("click-menu", "v1", success)
    drawn = sampler.sampling("click-menu", "v1", base, repeat=3, repeats=4)
    assert (drawn.temperature, drawn.top_k, drawn.seed) == (pytest.approx(1.625), 0, 3)  # every token, same sampler
    assert sampler.sampling("click-menu", "v1", base, 0, 4).temperature == 0.5  # the ladder's foot
    assert sampler.sampling("click-menu", "v2", base, 3, 4).temperature == 2.0  # a new version starts its own count


def test_a_new_task_gets_all_its_seeds_only_once_a_success_was_found_and_while_the_version_has_not_solved_it():
    sampler = NewTaskSampler(3.0, 0.5)
    assert not sampler.worth_all_seeds("click-menu", "v1")  # nothing found: one seed a visit, and the search
    sampler.record("click-menu", "v1", False)
    sampler.found.add("click-menu")  # the search found one
    assert sampler.worth_all_seeds("click-menu", "v1") and sampler.worth_all_seeds("click-menu", "v2")
    for _ in range(15):
        sampler.record("click-menu", "v1", True)
    assert sampler.worth_all_seeds("click-menu", "v1")  # 15 of 16: 0.94, not solved
    for _ in range(4):
        sampler.record("click-menu", "v1", True)
    assert not sampler.worth_all_seeds("click-menu", "v1")  # 19 of 20: 0.95, solved, only checked on
    assert sampler.worth_all_seeds("click-menu", "v2")  # a new version is judged on its own runs


def test_the_search_follows_only_a_seed_whose_k_runs_all_failed():
    class Scripted:  # no runtime: the search has nothing to branch with and returns at once
        version = "v1"

    def ending(success):
        return EpisodeResult("click-menu", 7, 1, 1.0 if success else -1.0, "success" if success else "failure", 0.1)

    config, summary = EdgeConfig("c0", new_tasks=("click-menu",), new_task_repeats=2), RunSummary("c0")
    sampler = NewTaskSampler(3.0, 0.5)
    assert explore_further(None, Scripted(), [ending(False)], sampler, config, summary, 0) == []  # 1 of 2 runs
    assert summary.search["searches"] == 0
    explore_further(None, Scripted(), [ending(False), ending(False)], sampler, config, summary, 1)
    assert summary.search["searches"] == 1  # both failed: searched
    explore_further(None, Scripted(), [ending(False), ending(True)], sampler, config, summary, 2)
    assert summary.search["searches"] == 1  # one of the seed's runs succeeded: nothing to search
    assert sampler.tally["click-menu", "v1"] == [1, 3]  # each call counts its latest run once


def test_success_rise_compares_versions_the_fleet_ran_enough():
    versions = [{"episodes": 40, "success_rate": 0.5}, {"episodes": 3, "success_rate": 1.0},
                {"episodes": 30, "success_rate": 0.7}, {"episodes": 0, "success_rate": None}]  # fmt: skip
    assert success_rise(versions) == 0.2
    assert success_rise(versions[:2]) is None


# The demo's own broker: TLS with the project's CA, SCRAM, per-role ACLs (the other settings are the session's).
BROKER_VARIABLES = ("HOME", "KAFKA_PORT", "BOOTSTRAP_SERVERS", "TOPIC_PREFIX", "SECURITY_PROTOCOL", "SASL_MECHANISM",
                    "SASL_USERNAME", "SASL_PASSWORD")  # fmt: skip


def test_the_continuous_demo_publishes_versions_while_the_fleet_keeps_acting(s3_settings, tmp_path):
    """On separate machines, simulated: two workers, the learner and the client each in a working dir and
    FLYWHEEL_HOME of its own, sharing only Kafka and the object store (S3Proxy) that holds the tables and models.
    Over SASL_SSL: the demo starts a broker of its own with TLS and ACLs, and each process logs in as its role
    (edge, worker, learner), allowed only what it needs; the CA is provisioned to each machine."""
    secure = isolated_broker_settings(tmp_path / "broker-home", "demo", security_protocol="SASL_SSL",
                                      sasl_username="flywheel-admin", sasl_password=uuid.uuid4().hex)  # fmt: skip
    broker_env = {k: v for k, v in settings_env(secure).items() if k.removeprefix("FLYWHEEL_") in BROKER_VARIABLES}
    out = tmp_path / "demo"
    # A fresh small model (--recipe demo --start-from ''); the start from the release: test_learner_daemon.
    args = ["--minutes", "1.75", "--clients", "1", "--tasks", "click-test,click-button", "--min-demos", "6",
            "--sft-steps", "15", "--every-episodes", "8", "--every-minutes", "0.2", "--min-new-episodes", "4",
            "--offline-steps", "3", "--repeats", "3", "--temperature", "1.0", "--greedy-episodes", "2",
            "--retrain-steps", "5", "--retrain-passes", "0", "--rl-updates-per-retrain", "1", "--machines",
            "--workers", "2", "--new-tasks", "click-menu", "--new-task-repeats", "3", "--new-task-search-steps", "0",
            "--pass-at-k", "2", "--pass-at-k-seeds", "2", "--audit", "5",
            "--recipe", "demo", "--start-from", ""]  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "flywheel.cli", "demo", *args, "--out", str(out)],
                            env={**os.environ, **broker_env, "FLYWHEEL_DATA_DIR": s3_settings.data_dir},
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    tables = join(report["data_dir"], "tables")
    assert str(tables).startswith(f"{s3_settings.data_dir}/demo-") and not (out / "data").exists()
    machines = {p.name for p in (out / "machines").iterdir()}
    assert {"processors", "processors-1", "learner", "fleet-client0"} <= machines
    for name in ("processors", "processors-1"):  # both workers consumed: each wrote its faust state at home
        assert any((out / "machines" / name / "home" / "faust").iterdir())
    assert (out / "machines" / "learner" / "home" / "learner" / "daemon" / "state.json").exists()
    server = (secure.kafka_dir / "server.properties").read_text()  # the broker it ran on
    assert "listener.security.protocol.map=SASL_SSL:SASL_SSL" in server and "StandardAuthorizer" in server
    logs = "\n".join(p.read_text(errors="replace") for p in out.rglob("*.log"))
    assert "AuthorizationFailed" not in logs and "SSLCertVerification" not in logs
    assert any((out / "machines" / "fleet-client0" / "home" / "models" / "sha256").iterdir())  # fetched from S3

    stages = [v["stage"] for v in report["versions"]]
    # The curriculum, by itself: SFT, then retrains from it on the teacher's labels, each refined by anchored RL.
    assert stages[0] == "sft" and stages[1] == "dagger" and "online_rl" in stages and len(stages) >= 3, stages
    assert report["steps_in_delta"] == report["steps_published"] > 0
    assert report["bootstrap"]["episodes"] >= 6  # the experts acted until the first version arrived
    assert report["fleet_idle_s"] < 0.25 * report["run_s"]  # chromium's start; never a wait for the learner
    ran = [v for v in report["versions"] if v["episodes"]]
    assert ran and all(0.0 <= v["success_rate"] <= 1.0 for v in ran)
    assert (out / "versions.png").stat().st_size > 0
    # The first and the last versions, greedy on the same 2 held-out seeds per task, paired.
    greedy = report["greedy"]
    assert (greedy["first"]["model_version"], greedy["last"]["model_version"]) == (
        report["versions"][0]["model_version"], report["versions"][-1]["model_version"])  # fmt: skip
    assert greedy["diff"] == pytest.approx(greedy["last"]["success_rate"] - greedy["first"]["success_rate"], abs=1e-3)
    assert greedy["ci"][0] <= greedy["diff"] <= greedy["ci"][1] and greedy["episodes_per_task"] == 2
    assert all(len(seeds) == 2 for seeds in greedy["last"]["success_by_seed"].values())
    # The last version's no-fleet twin: its retrain again, same stage, steps and start, on the
    # demonstrations alone at the table versions the last version pins; greedy on the same seeds, paired.
    twin, paired = report["twin"], report["last_vs_twin"]
    state = json.loads((out / "machines" / "learner" / "home" / "learner" / "daemon" / "state.json").read_text())
    retrain = next(v for v in state["versions"] if v["model_version"] == twin["retrain"])
    assert (twin["of"], twin["stage"], twin["start"], twin["steps"]) == (
        greedy["last"]["model_version"], retrain["stage"], report["versions"][0]["model_version"], 5)  # fmt: skip
    assert twin["updates_after_retrain"] == (report["versions"][-1]["stage"] == "online_rl")
    assert retrain["diagnostics"]["extra_rows"] > 0  # the version it repeats had the fleet's rows ...
    demos = load_samples(tables, ("demo",), twin["lineage"])
    assert twin["samples"] == twin["diagnostics"]["demo_rows"] == demos.height > 0  # ... the twin the demos alone
    assert twin["diagnostics"]["extra_rows"] == twin["diagnostics"]["teacher_labels"] == 0
    assert set(twin["per_task"]) == {"click-menu"}  # the twin on the new tasks, where it is the control
    assert 0.0 <= twin["success_rate"] <= 1.0
    assert paired["diff"] == pytest.approx(greedy["last"]["per_task"]["click-menu"] - twin["success_rate"], abs=1e-3)
    assert paired["ci"][0] <= paired["diff"] <= paired["ci"][1] and paired["episodes_per_task"] == 2
    assert "teacher_labels_per_point_over_twin" in report["cost"]  # the labels per point they bought (None: none)

    # The teacher's calls: counted by the clients, on the steps in Delta, and in the dagger versions' lineage.
    teacher = report["cost"]["teacher"]
    steps = scan(table_uri(tables, STEPS)).collect()
    labelled = steps.filter(pl.col("teacher_action_type").is_not_null())
    assert teacher["labels"] > 0 and labelled.height == teacher["labels"] + teacher["reused"]
    assert set(labelled["teacher_reason"]) <= {"verify_failed", "uncertain", "failing_task"}
    assert labelled["model_version"].str.starts_with("sft-").any()  # labels on a model's own steps, not an expert's
    assert report["cost"]["env_steps"] == report["steps_published"]

    episodes = scan(table_uri(tables, EPISODES)).collect().filter(pl.col("policy") == "model")
    groups = episodes.group_by("task", "seed").len()
    assert groups["len"].max() >= 2  # sampled rollouts of one start state: GRPO's groups
    assert episodes["episode_id"].n_unique() == episodes.height

    # The new task: the model alone acted on it, sampled, K runs a seed; the tables hold nothing else there.
    new = report["new_tasks"]
    assert new["tasks"] == ["click-menu"] and new["supervised_anywhere"] == 0
    on_new = steps.filter(pl.col("task") == "click-menu")
    assert new["supervision"]["click-menu"]["steps"] == on_new.height > 0
    assert (on_new["model_version"] != "expert").all() and on_new["teacher_action_type"].is_null().all()
    assert (on_new["temperature"] > 0).all() and (on_new["top_k"] == 0).all()  # over every token
    assert episodes.filter(pl.col("task") == "click-menu").group_by("seed").len()["len"].max() == 3
    assert set(new["greedy"]) >= {"first", "last", "twin", "last_vs_twin", "last_vs_first"}
    assert set(new["greedy"]["last"]) == {"click-menu"}
    assert {w: p["samples"] for w, p in new["pass_at_k"].items()} == {"first": 2, "last": 2, "twin": 2}
    assert set(greedy["by_group"]) == {"suite", "new"} and greedy["by_group"]["new"]["tasks"] == 1
    assert new["search"].get("searches", 0) == 0  # --new-task-search-steps 0: no search ran
    assert new["cost"]["env_steps"] == new["supervision"]["click-menu"]["steps"] and new["cost"]["learner_cpu_s"] > 0
    audit = new["audit"]  # the kept successes replayed with the DOM read (after the run: nothing reaches training)
    assert audit["audited"] == min(5, audit["kept"]) and audit["reproduced"] <= audit["audited"]
