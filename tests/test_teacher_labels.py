"""Supervision from the fleet's own states (learner.data.teacher_labels, the "dagger" and "self_imitation" stages): the
rows DAgger aggregates, the histories their prompts hold, the successes self-imitation keeps, the teacher's
agreement as a step reward, and that labels on the policy's own states teach it more than none."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from learner.algorithms.online_rl import step_credit_advantages
from learner.algorithms.semi_online import sop
from learner.algorithms.sft import train_vla
from learner.algorithms.stages import StageData, StageRun, repeated, run_stage, with_extra, with_replay
from learner.data.dataset import VLADataset
from learner.data.tables import SFT_COLUMNS
from learner.data.teacher_labels import (
    filtered_successes,
    label_count,
    teacher_agreement,
    teacher_rows,
    verified_successes,
)
from learner.model.checkpoints import load_vla
from learner.model.export import export_bundle
from learner.recipe import VLATrainConfig
from policy.interface import Observation
from policy.runtime import VLAPolicy, VLARuntime
from policy.screen import encode_png
from schemas import Action
from tests.factories import box_screen, two_box_screen
from tests.test_semi_online import expert_frame, sequence_frame, tiny_recipe

NO_LABEL = dict.fromkeys(("teacher_action_type", "teacher_action_text", "teacher_action_key", "teacher_thought"))


def step(episode: str, index: int, action: tuple[str, float, float], label: tuple[str, float, float] | None = None,
         **extra) -> dict:  # fmt: skip
    """A steps-table row of a model's step; `label`: the teacher's (type, x, y) on its screen."""
    row = dict(episode_id=episode, step=index, task="click-sequence", instruction="Click red, then blue.",
               screenshot=encode_png(two_box_screen(0)[0]), thought="Mine.", action_type=action[0], x=action[1],
               y=action[2], text="", key="", **NO_LABEL, teacher_action_x=None, teacher_action_y=None,
               teacher_box=[])  # fmt: skip
    if label is not None:
        row |= dict(teacher_action_type=label[0], teacher_action_x=label[1], teacher_action_y=label[2],
                    teacher_action_text="", teacher_action_key="", teacher_thought="The teacher's.",
                    teacher_box=[label[1] - 5, label[2] - 5, label[1] + 5, label[2] + 5])  # fmt: skip
    return row | extra


def steps_frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema_overrides={"teacher_action_x": pl.Float64, "teacher_action_y": pl.Float64,
                                                "teacher_box": pl.List(pl.Float32)})  # fmt: skip


def test_dagger_rows_are_each_labelled_episode_up_to_its_last_label_with_the_teachers_targets():
    rows = teacher_rows(steps_frame([
        step("a", 0, ("click", 1, 1)), step("a", 1, ("click", 2, 2), label=("click", 50, 60)),
        step("a", 2, ("click", 3, 3)),  # after the last label: not needed
        step("b", 0, ("click", 4, 4)),  # no label in the episode: not a row
    ]))  # fmt: skip
    assert rows.select("episode_id", "step", "train").rows() == [("a", 0, False), ("a", 1, True)]
    labelled = rows.row(1, named=True)
    assert (labelled["action_type"], labelled["x"], labelled["y"], labelled["thought"]) == (
        "click",
        50,
        60,
        "The teacher's.",
    )
    assert (labelled["taken_x"], labelled["taken_y"]) == (2, 2)  # what the policy did there
    assert labelled["target_box"] == [45, 55, 55, 65]
    context = rows.row(0, named=True)
    assert (context["x"], context["thought"], context["target_box"]) == (1, "Mine.", [])
    assert label_count(rows) == 1
    assert label_count(rows.drop("train")) == 2  # an expert's demonstration: every step a teacher's answer


def test_a_labelled_steps_prompt_holds_the_actions_the_policy_took_and_batches_never_train_on_context():
    model, tok, pruning = load_tiny()
    rows = teacher_rows(steps_frame([
        step("a", 0, ("click", 20, 30), label=("click", 100, 120)), step("a", 1, ("click", 40, 50)),
        step("a", 2, ("click", 60, 70), label=("click", 110, 130)),
    ]))  # fmt: skip
    data = VLADataset(rows, tok, model.cfg, pruning)
    taken = [Action("click", 20.0, 30.0), Action("click", 40.0, 50.0)]
    expected = tok.prompt_ids(
        "Click red, then blue.", model.cfg.max_instruction_tokens, taken, model.cfg.history_actions
    )
    assert data.prompt[2] == expected  # not the teacher's (100, 120) at step 0
    assert data.action[2] == Action("click", 110.0, 130.0)
    drawn = data.sample(np.random.default_rng(0), 200)
    assert set(drawn.tolist()) == {0, 2}  # step 1 is context only


def test_gathered_rows_weighed_in_by_copies_and_a_replayed_mix_keep_each_rows_own_history():
    """A retrain on a replayed mix (the start's demonstrations, --replay) + copies of the gathered rows
    (--gathered-repeats): a replayed row's prompt holds its own episode's actions where a demonstration shares its
    id, a copy's its own, and the copies weigh the labels up as many times."""
    model, tok, pruning = load_tiny()
    labels = teacher_rows(steps_frame([
        step("a", 0, ("click", 20, 30)), step("a", 1, ("click", 40, 50), label=("click", 100, 120)),
    ]))  # fmt: skip
    mix = steps_frame([step("a", 0, ("click", 90, 90)), step("a", 1, ("click", 70, 80))])
    demos = steps_frame([step("a", 0, ("click", 11, 12)), step("a", 1, ("click", 13, 14))])  # the mix's ids
    frame = with_extra(with_replay(demos, mix), repeated(labels, 3))
    assert label_count(repeated(labels, 3)) == 3 * label_count(labels) == 3
    assert repeated(labels, 1) is labels and repeated(None, 3) is None
    data = VLADataset(frame, tok, model.cfg, pruning)
    prompt = lambda taken: tok.prompt_ids("Click red, then blue.", model.cfg.max_instruction_tokens, taken,  # noqa: E731
                                          model.cfg.history_actions)  # fmt: skip
    copies = [i for i in range(len(data)) if data.action[i] == Action("click", 100.0, 120.0)]
    assert len(copies) == 3 and all(data.prompt[i] == prompt([Action("click", 20.0, 30.0)]) for i in copies)
    for taken, before in (((13.0, 14.0), (11.0, 12.0)), ((70.0, 80.0), (90.0, 90.0))):  # a demo's, a replayed row
        row = next(i for i in range(len(data)) if data.action[i] == Action("click", *taken))
        assert data.prompt[row] == prompt([Action("click", *before)])
    assert len(data) == 2 + 2 + 3 * 2  # the demonstration, the mix, three copies of the label and its context


def test_self_imitation_keeps_successes_drawn_greedily_or_from_the_top_k_only():
    def episode(name, success, temperature, top_k, version="v1"):
        return step(name, 0, ("click", 1, 1), success=success, temperature=temperature, top_k=top_k,
                    model_version=version)  # fmt: skip

    rows = steps_frame([episode("greedy", True, 0.0, 0), episode("top3", True, 1.0, 3),
                        episode("everything", True, 1.0, 0), episode("top20", True, 1.0, 20),
                        episode("failed", False, 0.0, 0), episode("expert", True, 0.0, 0, "expert")])  # fmt: skip
    assert verified_successes(rows, max_top_k=5)["episode_id"].to_list() == ["greedy", "top3"]


def test_filtered_bc_keeps_each_seeds_shortest_verified_success_on_the_new_tasks_whatever_drew_it():
    def episode(name, steps, success, seed, task="click-menu", version="v1"):
        return [step(name, i, ("click", 1, 1), task=task, success=success, seed=seed, model_version=version)
                for i in range(steps)]  # fmt: skip

    rows = steps_frame([*episode("s1-long", 3, True, 1), *episode("s1-short", 2, True, 1),
                        *episode("s1-tie", 2, True, 1),  # as short: the first id in order stays, "s1-short"
                        *episode("s2-failed", 1, False, 2), *episode("s2-won", 4, True, 2),
                        *episode("s3-expert", 1, True, 3, version="expert"),  # never on a new task; not a success
                        *episode("s4-suite", 1, True, 4, task="click-test")])  # not a new task  # fmt: skip
    kept = filtered_successes(rows, ("click-menu", "count-sides"))
    assert kept.columns == SFT_COLUMNS
    assert kept.select("episode_id", "step").rows() == [
        ("s1-short", 0),
        ("s1-short", 1),
        *(("s2-won", i) for i in range(4)),
    ]
    assert filtered_successes(rows, ()).is_empty()


def test_the_teachers_agreement_is_a_step_reward_that_ranks_agreeing_steps_above_the_others():
    rows = steps_frame([
        step("a", 0, ("click", 50, 60), label=("click", 51, 61), seed=1, success=False),  # agrees
        step("b", 0, ("click", 9, 9), label=("click", 51, 61), seed=1, success=False),  # clicks elsewhere
        step("c", 0, ("key", 0, 0), label=("click", 51, 61), seed=1, success=False),  # another kind of action
        step("d", 0, ("click", 9, 9), seed=1, success=False),  # not labelled
    ])  # fmt: skip
    agreement = teacher_agreement(rows)
    assert agreement[:3].tolist() == [1.0, 0.5, 0.1] and np.isnan(agreement[3])
    # One group on one screen: without the teacher every rollout failed alike, nothing to learn (GRPO's flat
    # group); with it the step that agreed is worth the most, the right kind of action elsewhere as much as an
    # unlabelled step (reward 0.2 * (0.5 - 0.5)), another kind of action the least.
    flat = step_credit_advantages(rows, gamma=0.9, verify_penalty=0.1, teacher_reward=0.0)
    assert flat.tolist() == [0.0, 0.0, 0.0, 0.0]
    taught = step_credit_advantages(rows, gamma=0.9, verify_penalty=0.1, teacher_reward=0.2)
    assert taught[0] > taught[1] == taught[3] > taught[2], taught


def load_tiny():
    train = VLATrainConfig(steps=1, batch_size=2, seed=0, keep_ratios=(1.0,), progress_bar=False, checkpoint_every=0)
    result = train_vla(sequence_frame(range(2)), tiny_recipe(train, history_actions=2), TMP / "tiny")
    return result.model, result.tokenizer, result.pruning


@pytest.fixture(autouse=True)
def _tmp(tmp_path):
    global TMP
    TMP = tmp_path


def test_a_retrain_starts_from_the_sft_model_not_from_the_drifted_policy(tmp_path):
    train = VLATrainConfig(steps=3, batch_size=4, lr=3e-3, warmup_steps=1, seed=0, keep_ratios=(1.0,),
                           progress_bar=False, checkpoint_every=0)  # fmt: skip
    demos = expert_frame(range(4))
    sft = train_vla(demos, tiny_recipe(train), tmp_path / "sft")
    drifted = train_vla(demos, tiny_recipe(train), tmp_path / "drifted", init_checkpoint=sft.checkpoint_path)
    for stage in ("dagger", "self_imitation"):
        run = StageRun(stage, train, tmp_path / stage, start=str(drifted.checkpoint_path),
                       reference=str(sft.checkpoint_path), stop_at=0)  # fmt: skip
        result = run_stage(run, StageData(demos=demos))
        for name, weights in result.model.state_dict().items():
            assert torch.equal(weights, sft.model.state_dict()[name]), f"{stage} started from another model: {name}"


def test_labels_on_the_policys_own_states_beat_the_same_retrain_without_them_on_held_out_screens(tmp_path):
    """The learning test: from one weak SFT model, DAgger's retrain (demonstrations + the teacher's labels of the
    screens the policy acted on) against its no-label twin (the same retrain on the demonstrations alone)."""
    train = VLATrainConfig(steps=60, batch_size=8, lr=3e-3, warmup_steps=5, seed=0, keep_ratios=(1.0,),
                           progress_bar=False, checkpoint_every=0)  # fmt: skip
    demos = expert_frame(range(4))
    sft = train_vla(demos, tiny_recipe(train), tmp_path / "sft")
    # The policy's own states: new screens it acted on greedily, each labelled by the teacher (the box's centre).
    policy = VLAPolicy(export_bundle(*load_vla(sft.checkpoint_path), tmp_path / "sft.vla"), "sft")
    own = []
    for seed in range(200, 240):
        image, (x0, y0, x1, y1) = box_screen(seed)
        action = policy_click(policy, image)
        own.append(step(f"own-{seed}", 0, ("click", action.x, action.y), label=("click", (x0 + x1) / 2, (y0 + y1) / 2),
                        screenshot=encode_png(image), instruction="Click the box.", task="click-box"))  # fmt: skip
    labels = teacher_rows(steps_frame(own))
    retrain = VLATrainConfig(steps=150, batch_size=8, lr=3e-3, warmup_steps=5, seed=1, keep_ratios=(1.0,),
                             progress_bar=False, checkpoint_every=0)  # fmt: skip
    held_out = expert_frame(range(1000, 1060))
    success = {}
    for name, stage, extra in (("dagger", "dagger", labels), ("twin", "self_imitation", None)):
        run = StageRun(stage, retrain, tmp_path / name, reference=str(sft.checkpoint_path), recipe=tiny_recipe(retrain))
        result = run_stage(run, StageData(demos=demos, extra=extra))
        assert result.diagnostics["teacher_labels"] == (40 if name == "dagger" else 0)
        bundle = export_bundle(result.model, result.tokenizer, result.pruning, tmp_path / f"{name}.vla")
        success[name] = sop(VLARuntime(bundle), held_out)["sop_success"]
    # 60 held-out screens know a rate to about +-0.12; measured: dagger 0.92, twin 0.27.
    assert success["dagger"] >= success["twin"] + 0.2, success


def policy_click(policy: VLAPolicy, image: np.ndarray) -> Action:
    """The policy's greedy action on a box screen."""
    return policy.act(Observation("click-box", "Click the box.", image)).action
