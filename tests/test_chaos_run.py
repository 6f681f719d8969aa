"""`flywheel chaos` in small: the flywheel on a 3-node cluster with two workers while a worker is
SIGKILLed, a client's browser is SIGKILLed, a client is SIGKILLed mid-episode and another loses power (itself and its
browser at once); then the ledger: nothing lost, nothing duplicated, every episode closed once (the killed clients'
as abandoned), no spool left behind, every fault recovered. A client cut off from every node and bad events are left
to the 30-minute run with every fault twice, `flywheel chaos --minutes 30` (docs/chaos.md), and to
tests/test_least_privilege.py, tests/test_cluster.py and tests/test_pipeline.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from flywheel.chaos.run import ChaosConfig, chaos_run, run_chaos
from tests.conftest import isolated_broker_settings

pytestmark = [pytest.mark.kafka, pytest.mark.browser]


def test_a_short_chaos_run_loses_nothing_and_recovers_from_every_fault(tmp_path: Path) -> None:
    settings = isolated_broker_settings(tmp_path / "home", "chaos")
    faults = "kill_worker,kill_browser,kill9_client,power_loss"
    run = chaos_run()
    fleet = replace(run.fleet, tasks=("click-test", "click-button-sequence"))  # two-step episodes to be killed in
    worker = replace(run.worker, abandon_after_s=20.0)  # the killed clients' episodes close within the run
    run = replace(run, minutes=2.5, out=tmp_path / "chaos", fleet=fleet, worker=worker)
    config = ChaosConfig(run, seed=3, strikes=1, warmup_s=30, settle_s=10, recover_s=20, faults=faults)
    report = run_chaos(config, settings)
    ledger = report["ledger"]
    assert ledger["steps"]["owed"] > 100 and ledger["steps"]["missing"] == ledger["steps"]["duplicated"] == 0, ledger
    assert ledger["steps"]["unowed"] == 0 and ledger["episodes"]["duplicated"] == 0, ledger
    assert ledger["episodes"]["missing"] == 0 and ledger["episodes"]["ended"].get("abandoned", 0) >= 1, ledger
    assert ledger["spools"]["spools"] >= 2 and ledger["spools"]["unsent"] == 0, ledger
    assert ledger["dead_letters"]["unaccounted"] == 0, ledger
    assert report["ledger_ok"]
    assert sorted(f["fault"] for f in report["faults"]) == sorted(faults.split(","))
    assert report["all_recovered"], report["faults"]
    assert report["fleet"]["longest_idle_s"] <= 20  # a restarted client acts again within this
    assert (config.run.out / "chaos.png").stat().st_size > 0
