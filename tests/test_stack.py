"""The local stack: children get the run's settings through their environment; a stack stops what it started and
leaves the broker it found as it found it."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import Settings, settings_env
from flywheel.run.stack import local_stack
from streams.broker import local_broker
from streams.topics import topics_for


def test_a_child_reads_back_the_settings_it_was_given(monkeypatch, tmp_path):
    settings = Settings(home=tmp_path, data_dir=tmp_path / "data", kafka_port=20001, topic_prefix="x-1",
                        canary_fraction=0.25, require_signed_models=False, ssl_cafile=Path("/ca.pem"),
                        security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password='p"w\\d')  # fmt: skip
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    assert Settings() == settings  # what a child's get_settings() builds


@pytest.mark.kafka
def test_a_stack_stops_its_worker_on_error_and_leaves_the_session_broker_running(kafka_settings, tmp_path):
    with pytest.raises(RuntimeError, match="mid-run"):
        with local_stack(kafka_settings, tmp_path / "logs", run="stack", data_dir=tmp_path / "data") as stack:
            worker = stack.worker
            assert worker.running()
            assert stack.settings.topic_prefix.startswith(f"{kafka_settings.topic_prefix}-stack-")
            assert stack.settings.data_dir == str((tmp_path / "data").resolve())
            assert stack.env["FLYWHEEL_TOPIC_PREFIX"] == stack.settings.topic_prefix
            assert stack.env["FLYWHEEL_BOOTSTRAP_SERVERS"] == kafka_settings.local_bootstrap  # never their own broker
            raise RuntimeError("mid-run")
    assert not worker.running()
    state = local_broker.status(kafka_settings)
    assert state["running"]  # the session's broker: not this stack's to stop
    assert {spec.name for spec in topics_for(stack.settings).all()} <= set(state["topics"])
