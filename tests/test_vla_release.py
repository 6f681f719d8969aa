"""`flywheel release` and `flywheel bench edge` end to end, tiny: demonstrations through the session's Kafka
into Delta, VLA SFT read from Delta, the bundle + manifest, eval of the bundle, the four-way edge benchmark."""

from __future__ import annotations

import hashlib
import json

import pytest
from test_cli import flywheel

pytestmark = [pytest.mark.kafka, pytest.mark.browser]

TINY_RELEASE = {
    "seed": 3,
    "demonstrations": [{"tasks": "click-test,enter-text", "episodes_per_task": 2, "clients": 1}],
    "vocab_size": 300,
    # The release's own encoder and views, small.
    "model": {
        "encoder": "reading",
        "reading_channels": 16,
        "reading_blocks": 2,
        "pointer_relevance": True,
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 2,
        "d_ff": 128,
    },
    "pruning": {"keep_ratio": 0.25},
    "train": {
        "steps": 6,
        "batch_size": 4,
        "warmup_steps": 2,
        "checkpoint_every": 3,
        "keep_ratios": [0.25, 1.0],
        "augment_shift_px": 6,
        "augment_scale": 0.05,
        "augment_colour": 0.1,
    },
}


@pytest.fixture(scope="module")
def release(kafka_settings, tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    config = root / "tiny.json"
    config.write_text(json.dumps(TINY_RELEASE))
    args = ("release", "--config", str(config), "--work", str(root / "work"), "--release-dir", str(root / "release"))
    first = flywheel(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return root, args, first


def test_release_collects_through_kafka_trains_from_delta_and_writes_a_verified_bundle(release):
    root, _, _ = release
    manifest = json.loads((root / "release" / "manifest.json").read_text())
    for name, digest in (
        ("artifact", "sha256"),
        ("int8_artifact", "int8_sha256"),
        ("torch_weights", "torch_weights_sha256"),
    ):
        assert hashlib.sha256((root / "release" / manifest[name]).read_bytes()).hexdigest() == manifest[digest]
    (collection,) = manifest["demonstrations"]
    assert collection["episodes"] == 4 and collection["success_rate"] == 1.0  # 2 tasks x 2 episodes, expert
    assert collection["table_versions"]["steps"] >= 0 and collection["steps"] >= 4  # Delta versions start at 0
    assert manifest["seed"] == 3 and manifest["config"] == TINY_RELEASE
    assert manifest["training"]["steps"] == 6 and manifest["training"]["samples"] == collection["steps"]


def test_rerunning_release_reuses_the_demonstrations_and_the_finished_training(release):
    root, args, _ = release
    before = json.loads((root / "release" / "manifest.json").read_text())
    again = flywheel(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "demonstrations already collected" in again.stdout
    after = json.loads((root / "release" / "manifest.json").read_text())
    assert after["sha256"] == before["sha256"]  # same weights, byte-identical bundle
    assert after["training"] == before["training"]  # the figures of the run that trained these weights


def test_eval_runs_the_released_bundle(release, tmp_path):
    root, _, _ = release
    result = flywheel("eval", "--model", str(root / "release" / "model.vla"), "--tasks", "click-test",
                      "--episodes", "2", "--out", str(tmp_path))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["tasks"]["click-test"]["episodes"] == 2


def test_bench_edge_reports_every_variant_side_by_side(release, tmp_path):
    root, _, _ = release
    result = flywheel("bench", "edge", "--model-dir", str(root / "release"), "--out", str(tmp_path),
                      "--screens-per-task", "1", "--passes", "1", "--rounds", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "edge_bench.json").read_text())
    assert set(report["variants"]) == {"torch_eager", "torch_eager_pruned", "onnx", "onnx_pruned", "onnx_int8"}
    keys = {"step_ms_p50", "step_ms_p95", "prefill_ms_p50", "decode_tokens_per_s", "peak_rss_mb",
            "visual_tokens_total", "visual_tokens_kept"}  # fmt: skip
    for figures in report["variants"].values():
        assert keys <= set(figures) and figures["step_ms_p50"] > 0 and figures["visual_tokens_total"] == 336
        assert len(figures["rounds_step_ms_p50"]) == 1  # each variant ran once per round
    assert report["variants"]["onnx"]["visual_tokens_kept"] == 336
    assert report["variants"]["onnx_pruned"]["visual_tokens_kept"] == 84
    assert report["variants"]["torch_eager_pruned"]["visual_tokens_kept"] == 84
    # parity on real screens, unpruned and pruned alike
    assert report["variants"]["onnx"]["same_tokens_as_torch"] == 1.0
    assert report["variants"]["onnx_pruned"]["same_tokens_as_torch"] == 1.0
    assert {"onnx_vs_torch_step", "onnx_pruned_vs_torch_pruned_step"} <= set(report["speedups"])
    assert "torch_eager_pruned" in result.stdout


def test_learner_publishes_a_vla_bundle_that_an_edge_client_hot_swaps_in(release, tmp_path):
    root, _, _ = release
    env = {"FLYWHEEL_DATA_DIR": str(root / "work" / "demonstrations-0" / "data")}  # the release's Delta tables
    learned = flywheel("sft", "--steps", "3", "--batch-size", "4", "--metrics-port", "-1",
                       "--summary", str(tmp_path / "learn.json"), env=env)  # fmt: skip
    assert learned.returncode == 0, learned.stderr[-3000:]
    summary = json.loads((tmp_path / "learn.json").read_text())
    edge = flywheel("edge", "--client-id", "vla-edge", "--tasks", "click-test", "--episodes", "1", "--policy", "model",
                    "--max-steps", "2", "--summary", str(tmp_path / "edge.json"), env=env)  # fmt: skip
    assert edge.returncode == 0, edge.stderr[-3000:]
    ran = json.loads((tmp_path / "edge.json").read_text())
    assert ran["model_versions"] == [summary["version"]] and ran["steps_published"] >= 1
