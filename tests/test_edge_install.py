"""The edge install as a product: a venv from the edge lock alone runs a real client against the broker.

The venv is the one `FLYWHEEL_LOCK=edge bash ops/setup.sh` builds (keyed by the lock's digest under
~/.cache/flywheel/venvs, so it is built once per lock and checked in about a second afterwards).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from kafka import TopicPartition

from learner.daemon.publish import publish_artifact
from registry.signing import load_or_create_key, sign
from registry.store import store_artifact
from schemas import ModelVersionEvent, StepEvent, decode_event, encode_event, new_event_id
from streams.kafka_clients import make_consumer, make_producer
from streams.topics import topics_for

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "release" / "model.vla"
HEAVY = ("torch", "transformers", "polars", "pyarrow", "deltalake", "faust")
# What a model-policy client imports on its way to the first step (cmd_edge -> run_client -> VLAPolicy, GuiEnv).
CLIENT_MODULES = ("flywheel.cli", "edge_client.runner", "edge_client.model_updates", "edge_client.env",
                  "policy.runtime", "registry.signing")  # fmt: skip
# The test's own environment must not leak in: flywheel.sh exports FLYWHEEL_VENV (the `all` venv), which
# setup.sh would otherwise sync down to the edge lock; PYTHONPATH could hand the edge venv the full env's packages.
LEAKY = ("FLYWHEEL_VENV", "FLYWHEEL_LOCK", "FLYWHEEL_LOCK_FILE", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")


def _clean_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in LEAKY} | extra


@pytest.fixture(scope="module")
def edge_python() -> Path:
    """bin/python of the edge venv, built or checked by ops/setup.sh exactly as a user runs it."""
    env = _clean_env(FLYWHEEL_LOCK="edge")
    venv = subprocess.run(["bash", "-c", 'source ops/venv.sh && echo "$FLYWHEEL_VENV"'], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    Path(venv).parent.mkdir(parents=True, exist_ok=True)
    # Two sessions on one machine would otherwise sync the same venv at once.
    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        setup = subprocess.run(["bash", "ops/setup.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=600)  # fmt: skip
    assert setup.returncode == 0, setup.stdout + setup.stderr
    return Path(venv) / "bin" / "python"


def test_edge_venv_has_the_client_and_none_of_the_heavy_packages(edge_python, tmp_path):
    # Run outside the checkout so the project is imported from the install, not from the current directory.
    probe = (
        "import importlib, importlib.util, json, pathlib, sys\n"
        f"for name in {CLIENT_MODULES!r}: importlib.import_module(name)\n"
        "import flywheel\n"
        "print(json.dumps({'missing': [m for m in %r if importlib.util.find_spec(m) is None],\n"
        "                  'root': str(pathlib.Path(flywheel.__file__).resolve().parents[1]),\n"
        "                  'prefix': sys.prefix}))\n" % (HEAVY,)
    )
    result = subprocess.run([str(edge_python), "-c", probe], cwd=tmp_path, env=_clean_env(), capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["missing"] == list(HEAVY)
    assert found["root"] == str(ROOT)  # this checkout, installed editable
    assert Path(found["prefix"]) == edge_python.parent.parent and Path(sys.prefix) != edge_python.parent.parent


@pytest.mark.kafka
@pytest.mark.browser
def test_edge_client_from_the_edge_venv_swaps_in_a_signed_version_and_publishes_steps(edge_python, stack, tmp_path):
    # Own home (keys, spool), data dir (artifact store) and topics: nothing shared with other tests.
    settings = stack.settings.model_copy(update={"home": tmp_path / "home"})
    key = load_or_create_key(settings.keys_dir)  # the learner's key; its public half is what the client trusts
    env = _clean_env(**(stack.env | {"FLYWHEEL_HOME": str(settings.home)}))
    log_path, summary_path = tmp_path / "edge.log", tmp_path / "summary.json"
    command = [str(edge_python), "-m", "flywheel.cli", "edge", "--client-id", "edge-install", "--policy", "model",
               "--tasks", "click-test", "--episodes", "2", "--max-steps", "3", "--wait-for-model", "120",
               "--summary", str(summary_path)]  # fmt: skip
    with open(log_path, "w") as log:
        client = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # Versions the client must refuse. Its refusal in the log also shows it is up and waiting.
        uri, digest = store_artifact(MODEL, settings.artifacts_dir)
        unsigned = ModelVersionEvent(new_event_id(), time.time(), "unsigned-0001", "", "sft", uri, digest)
        signed = msgspec.structs.replace(unsigned, version="tampered-0001")
        signed = msgspec.structs.replace(signed, signature=sign(signed, key))
        tampered = msgspec.structs.replace(signed, lineage={"steps": 999})  # edited after signing
        for event, why in ((unsigned, "unsigned"), (tampered, "bad signature")):
            _send_version(settings, event)
            _wait_for_log(log_path, client, f"refusing model {event.version}, keeping none", why)

        published = publish_artifact(MODEL, settings, stage="sft", parent="", lineage={"steps": 0})
        client.wait(timeout=150)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    log_text = log_path.read_text()
    assert client.returncode == 0, log_text
    assert f"model none -> {published.version}" in log_text

    summary = json.loads(summary_path.read_text())
    assert summary["model_versions"] == [published.version] and summary["episodes"] == 2, summary
    assert summary["steps_published"] >= 2 and summary["unsent"] == 0, summary
    steps = _read_steps(settings)
    assert len(steps) == summary["steps_published"]
    assert {(s.client_id, s.model_version) for s in steps} == {("edge-install", published.version)}


def _send_version(settings, event: ModelVersionEvent) -> None:
    producer = make_producer(settings, "test-learner")
    try:
        topic = topics_for(settings).model_versions.name
        producer.send(topic, key=event.channel.encode(), value=encode_event(event)).get(30)
    finally:
        producer.close()


def _wait_for_log(path: Path, client: subprocess.Popen, *needles: str, timeout: float = 120.0) -> None:
    """Until one line of the client's log has every needle (the client's start, onnxruntime import included)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text()
        if any(all(n in line for n in needles) for line in text.splitlines()):
            return
        assert client.poll() is None, f"edge client exited early:\n{text}"
        time.sleep(0.2)
    raise TimeoutError(f"no log line with {needles}:\n{path.read_text()}")


def _read_steps(settings) -> list[StepEvent]:
    topic = topics_for(settings).steps.name
    consumer = make_consumer(settings, "edge-install-check", consumer_timeout_ms=3000)
    try:
        consumer.assign([TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)])
        return [decode_event(record.value, expect=StepEvent) for record in consumer]
    finally:
        consumer.close()
