"""Prometheus config and rules (promtool), Grafana dashboards (raw JSON; every panel's query returns data
against a real Prometheus that scraped a short `flywheel demo`), the demo's plots, `flywheel status`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from flywheel.admin.observe import OPS_PROMETHEUS, query, query_range, running_prometheus, write_demo_config
from flywheel.admin.status import _live

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "ops" / "grafana" / "dashboards").glob("*.json"))
ALERTS = OPS_PROMETHEUS / "rules" / "flywheel.alerts.yml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is not installed (ops/setup.sh installs Debian's prometheus package)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_repo_config_and_the_demo_config(tmp_path):
    result = promtool("check", "config", str(OPS_PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    demo_config = write_demo_config(tmp_path / "prometheus")
    assert "scrape_interval: 1s" in demo_config.read_text()
    result = promtool("check", "config", str(demo_config))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_tests_pass():
    tests = sorted(str(p) for p in (OPS_PROMETHEUS / "tests").glob("*.yml"))
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_test_that_fires_it_and_one_that_does_not():
    alerts = re.findall(r"(?m)^\s*- alert: (\S+)", ALERTS.read_text())
    assert len(alerts) >= 5
    tests = "\n".join(p.read_text() for p in (OPS_PROMETHEUS / "tests").glob("*.yml"))
    for alert in alerts:
        cases = re.findall(rf"alertname: {alert}\n\s+exp_alerts:(.*)", tests)
        assert any(c.strip() == "[]" for c in cases), f"{alert}: no test where it stays quiet"
        assert any(c.strip() == "" for c in cases), f"{alert}: no test that fires it"


def test_dashboards_are_raw_provisionable_json():
    assert {p.stem for p in DASHBOARDS} == {"fleet", "pipeline", "learner"}
    uids = set()
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        assert dashboard["id"] is None and "__inputs" not in dashboard, f"{path.name}: export-for-sharing form"
        assert re.fullmatch(r"flywheel-[a-z-]+", dashboard["uid"])
        uids.add(dashboard["uid"])
        panel_ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(panel_ids) == len(set(panel_ids))
        for panel in dashboard["panels"]:
            for item in (panel, *panel["targets"]):
                assert item["datasource"] == {"type": "prometheus", "uid": "flywheel-prometheus"}, panel["title"]
    assert len(uids) == len(DASHBOARDS)
    datasource = (ROOT / "ops" / "grafana" / "provisioning" / "datasources" / "flywheel.yml").read_text()
    assert "uid: flywheel-prometheus" in datasource


def _panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, expr) with Grafana's variables replaced as Grafana would for the run."""
    queries = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                expr = (
                    target["expr"]
                    .replace("$__rate_interval", "10s")  # 4 x the demo's 1 s scrapes, and then some
                    .replace("$__range", "10m")
                    .replace("$task", ".*")
                )
                queries.append((path.stem, panel["title"], expr))
    return queries


@pytest.mark.kafka
@pytest.mark.browser
def test_every_dashboard_query_returns_data_from_a_demo_run(demo_run, tmp_path):
    out, result = demo_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    obs = report["observability"]
    assert obs["prometheus_url"], "the demo did not start Prometheus"
    assert f"prometheus at {obs['prometheus_url']}" in result.stdout
    # The demo's Prometheus stopped with it; a new one opens its TSDB (a copy) and answers for the run's time range.
    workdir = tmp_path / "prometheus"
    shutil.copytree(obs["prometheus_dir"], workdir, ignore=shutil.ignore_patterns("targets", "*.log", "lock"))
    (workdir / "targets").mkdir()
    with running_prometheus(workdir) as prometheus:
        empty = []
        for dashboard, title, expr in _panel_queries():
            series = query_range(prometheus.url, expr, obs["start"], obs["end"], 1.0)  # = the scrape interval
            values = [v for s in series for _, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
            if not values:
                empty.append(f"{dashboard} / {title}: {expr}")
        assert not empty, "panels without data:\n" + "\n".join(empty)
        live = _live(partial(query, prometheus.url))  # `flywheel status`'s live queries parse against a real Prometheus
        assert live is not None and live["clients_up"] == 0  # the run is over: no client is up now

        # Success by task and model version in Prometheus = what the demo measured in Delta.
        ratios = query_range(prometheus.url, "task_model_version:flywheel_episode_success:ratio",
                             obs["end"] - 5, obs["end"], 1.0)  # fmt: skip
        seen = {(s["metric"]["task"], s["metric"]["model_version"]): float(s["values"][-1][1]) for s in ratios}
        for turn in report["turns"]:
            for task, entry in turn["per_task"].items():
                assert seen[(task, turn["model_version"])] == pytest.approx(entry["success_rate"]), (task, turn)


@pytest.mark.kafka
@pytest.mark.browser
def test_demo_writes_plots_and_status_reads_the_run(demo_run):
    out, result = demo_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in ("success.png", "pipeline.png"):
        png = out / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
    report = json.loads((out / "report.json").read_text())
    prefix = re.search(r"FLYWHEEL_TOPIC_PREFIX=(\S+)", result.stdout).group(1)
    env = {**os.environ, "FLYWHEEL_DATA_DIR": str(out / "data"), "FLYWHEEL_TOPIC_PREFIX": prefix}
    status = subprocess.run([sys.executable, "-m", "flywheel.cli", "status", "--prometheus", "http://127.0.0.1:9"],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert status.returncode == 0, status.stderr
    screen = status.stdout
    for section in ("FLEET", "PIPELINE", "LEARNER", "SUCCESS BY TASK"):
        assert section in screen, screen
    assert "unreachable" in screen  # no Prometheus at that address: says so and shows the rest
    assert f"current version {report['turns'][-1]['published_version']}" in screen, screen
    assert "lag (records not yet in Delta): steps 0, episodes 0, training_samples 0" in screen
    assert "click-button" in screen and report["turns"][0]["published_version"] in screen
