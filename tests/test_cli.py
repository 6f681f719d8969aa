"""Every entry point as a subprocess, with tiny sizes (CleanRL-style smoke runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def flywheel(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "flywheel.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.browser
def test_eval_expert_scores_one_on_a_tier1_task(tmp_path):
    result = flywheel(
        "eval", "--policy", "expert", "--tasks", "click-button", "--episodes", "5", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["model_version"] == "expert"
    assert report["tasks"]["click-button"]["episodes"] == 5
    assert report["tasks"]["click-button"]["success_rate"] == 1.0
    assert report["mean_success_rate"] == 1.0


def test_eval_rejects_an_unknown_model(tmp_path):
    result = flywheel("eval", "--model", "no-such-version", "--tasks", "click-test", "--out", str(tmp_path),
                      env={"FLYWHEEL_DATA_DIR": str(tmp_path)})  # fmt: skip
    assert result.returncode != 0
    assert "no-such-version" in result.stderr


@pytest.mark.parametrize("command", [("eval",), ("demo", "--minutes", "1"), ("edge", "--client-id", "c0")])
def test_a_task_miniwob_cannot_run_is_refused_before_anything_starts(tmp_path, command):
    """button-delay has a page but no field extractor in miniwob: refused by name, with the typo's likely meaning,
    before a browser, a broker or a report exists (it used to run the tasks before it, then die with a KeyError)."""
    result = flywheel(
        *command,
        "--tasks",
        "click-test,button-delay,clik-menu",
        "--out" if command[0] != "edge" else "--summary",
        str(tmp_path / "out"),
        env={"FLYWHEEL_HOME": str(tmp_path / "home")},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "'button-delay'" in result.stderr and "'clik-menu' (did you mean 'click-menu'?)" in result.stderr
    assert "click-test" not in result.stderr.split("cannot run")[1]  # the runnable one is not named
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "home").exists()


@pytest.mark.kafka
@pytest.mark.browser
def test_demo_smoke_two_turns(demo_run):
    """Turn 1 experts -> SFT -> publish; turn 2 the fleet runs the published model; nothing lost."""
    out, result = demo_run  # tests/conftest.py: the demo runs once per session
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    first, second = report["turns"]
    assert first["model_version"] == "expert" and first["success_rate"] == 1.0
    assert first["episodes"] == 8 and set(first["per_task"]) == {"click-test", "click-button"}
    assert second["model_version"] == first["published_version"]  # the fleet ran what the learner published
    assert second["published_version"] != first["published_version"]
    for turn in report["turns"]:
        assert turn["steps_in_delta"] == turn["steps_published"] > 0
    assert "turn 2" in result.stdout  # progress is shown while it runs


def test_eval_refuses_samples_of_a_greedy_policy_before_anything_starts(tmp_path):
    result = flywheel(
        "eval", "--model", "release", "--tasks", "click-test", "--samples", "4", "--out", str(tmp_path / "o")
    )
    assert result.returncode != 0 and "--temperature > 0" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()
