"""The no-fleet twin of a published version: its retrain again, on the demonstrations alone.

A version of the supervised curriculum (learner.daemon.loop) is a retrain from the SFT model on the demonstrations
+ the fleet's rows (the teacher's labels, or its verified successes), perhaps refined by anchored RL updates. It
can beat the first SFT without the fleet's rows helping at all: the first SFT trained on the demonstrations in the
tables when the learner first polled, every retrain on all those that had landed by then (a measurement found the
README's whole gain to be theirs). The twin tells the two apart: the stage the version was retrained by, with the
same steps, learning rate and start (the SFT model it descends from, by the manifests' parents), on the
demonstrations in the table versions the version's lineage pins, and nothing of the fleet's. The version minus its
twin, paired on the same seeds, is what the fleet bought.

Anchored RL updates after the retrain have no twin: without a fleet there are no rollouts to update on, so their
count is recorded (`updates_after_retrain`) and the twin stops at the retrain.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from core.settings import Settings
from lake.pins import pinned
from learner.algorithms.stages import StageData, run_stage
from learner.daemon.loop import DaemonConfig, retrain_run
from learner.data.tables import load_samples
from learner.model.export import export_bundle
from learner.recipe import VLARecipe
from registry.store import ancestry, store_artifact

RETRAINS = ("dagger", "self_imitation")  # the stages that retrain from SFT on the demonstrations + the fleet's rows


@dataclass(frozen=True)
class TwinPlan:
    of: str  # the version the twin is of
    stage: str  # the stage its retrain ran (the twin runs it too)
    retrain: str  # that retrain: the version itself, or the one its anchored RL updates refined
    start: str  # the SFT version the retrain started from
    start_checkpoint: str  # its weights (the learner's files, by its manifest)
    lineage: dict[str, int]  # the table versions `of` pins: the twin reads its demonstrations there
    updates_after_retrain: int  # versions between the retrain and `of` (anchored RL: no fleet, no rollouts)
    # the retrain's optimizer steps (its manifest's; they grow with its rows, learner.algorithms.stages.retrain_steps)
    steps: int


def twin_plan(settings: Settings, version: str) -> TwinPlan:
    """What the twin of `version` repeats, from the manifests; ValueError for a version not retrained from an SFT
    model (the SFT itself is its own twin; the rl curriculum's versions learn from the fleet's rollouts only)."""
    chain = ancestry(settings.artifacts_dir, version)
    retrain = next((i for i, manifest in enumerate(chain) if manifest.get("stage") in RETRAINS), None)
    if retrain is None or chain[-1].get("stage") != "sft" or not chain[-1].get("checkpoint"):
        stages = " <- ".join(str(m.get("stage")) for m in chain)
        raise ValueError(f"{version} ({stages}) descends from no retrain of an SFT model: it has no no-fleet twin")
    sft, retrained = chain[-1], chain[retrain]
    steps = retrained["stage_steps"] + retrained.get("resumed_from_step", 0)
    return TwinPlan(version, retrained["stage"], retrained["version"], sft["version"], sft["checkpoint"],
                    dict(chain[0]["lineage"]), retrain, steps)  # fmt: skip


def train_twin(settings: Settings, config: DaemonConfig, version: str) -> dict:
    """Train the twin of `version` as the learner `config` describes trained it, store its bundle by digest (never
    published: no fleet runs it), and return its summary: the plan, steps, lr, rows and the artifact."""
    plan = twin_plan(settings, version)
    recipe = VLARecipe.load(config.recipe, progress_bar=False)
    out_dir = settings.learner_dir / "daemon" / f"twin-of-{version}"  # resumable, as the stages' runs are
    run = retrain_run(plan.stage, recipe, config, plan.start_checkpoint, out_dir, plan.steps)
    with pinned(settings.pins_dir, plan.lineage):
        demos = load_samples(settings.tables_dir, ("demo",), plan.lineage)  # what the retrain read, minus `extra`
        result = run_stage(run, StageData(demos=demos))
    bundle = export_bundle(result.model, result.tokenizer, result.pruning, out_dir / "model.vla")
    uri, digest = store_artifact(bundle, settings.artifacts_dir)
    return {**asdict(plan), "model_version": f"twin-of-{version}", "steps": run.train.steps, "lr": run.train.lr,
            "samples": demos.height, "trained_steps": result.steps - result.start_step,
            "train_s": round(result.wall_s, 1), "diagnostics": result.diagnostics, "artifact_uri": uri,
            "sha256": digest}  # fmt: skip
