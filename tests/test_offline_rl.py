"""Offline RL learns from failures: the DPO term pushes a failed action's probability below the reference."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from learner.algorithms.offline_rl import OfflineRLConfig, preference_pairs, step_advantages, train_offline_rl
from learner.algorithms.policy_logprobs import grammar_masks, token_logprobs
from learner.algorithms.sft import train_vla
from learner.data.dataset import VLADataset
from learner.model.checkpoints import load_vla
from learner.recipe import VLARecipe, VLATrainConfig
from policy.pruning import PruningConfig
from policy.screen import encode_png
from schemas import Action

TINY = {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
INSTRUCTION = "Click the box."


def box_screen(seed: int) -> tuple[np.ndarray, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    image = np.full((210, 160, 3), 255, dtype=np.uint8)
    y, x = int(rng.integers(60, 180)), int(rng.integers(10, 130))
    image[y : y + 20, x : x + 20] = (30, 80, 200)
    return image, (x + 10.0, y + 10.0)


def row(episode: str, seed: int, action: Action, score: float, success: bool, tokens: list[int]) -> dict:
    image, _ = box_screen(seed)
    return dict(episode_id=episode, step=0, task="click-box", instruction=INSTRUCTION, screenshot=encode_png(image),
                thought="Click the box.", action_type=action.type, x=action.x, y=action.y, text="", key="",
                tokens=tokens, seed=seed, score=score, success=success, weight=1.0)  # fmt: skip


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """An SFT model on 12 box demos, and a log of its successes (the box) and failures (the corner)."""
    work = tmp_path_factory.mktemp("offline")
    demos = [row(f"demo-{s}", s, Action("click", *box_screen(s)[1]), 1.0, True, []) for s in range(12)]
    train = VLATrainConfig(steps=30, batch_size=8, lr=3e-3, warmup_steps=3, seed=0, keep_ratios=(1.0,),
                           progress_bar=False, checkpoint_every=0)  # fmt: skip
    sft = train_vla(pl.DataFrame(demos), VLARecipe(model=TINY, vocab_size=300, train=train), work / "sft")
    tok = sft.tokenizer
    rows = []
    for s in range(12, 24):
        good, bad = Action("click", *box_screen(s)[1]), Action("click", 5.0, 205.0)
        rows.append(row(f"ok-{s}", s, good, 1.0, True, tok.target_ids("Click the box.", good, 16)))
        rows.append(row(f"fail-{s}", s, bad, 0.15, False, tok.target_ids("Click the box.", bad, 16)))
    return work, sft.checkpoint_path, pl.DataFrame(demos + rows)


def test_advantages_and_pairs_come_from_the_log(logged):
    _, _, frame = logged
    adv = dict(zip(frame["episode_id"].to_list(), step_advantages(frame).tolist(), strict=True))
    mean = (12 * 1.0 + 12 * 1.0 + 12 * 0.15) / 36
    assert adv["fail-12"] == pytest.approx(0.15 - mean) and adv["ok-12"] == pytest.approx(1.0 - mean)
    pairs = dict((lose, win) for win, lose in preference_pairs(frame))
    assert pairs["fail-12"] == "ok-12"  # same seed, the model's own success
    assert len(pairs) == 12


def test_a_preference_pair_always_shares_task_and_seed(logged):
    _, _, frame = logged
    alone = frame.filter(pl.col("episode_id") == "fail-12").with_columns(
        pl.lit(99, dtype=frame.schema["seed"]).alias("seed"), pl.lit("fail-alone").alias("episode_id")
    )
    seeds = dict(zip(frame["episode_id"].to_list(), frame["seed"].to_list(), strict=True)) | {"fail-alone": 99}
    pairs = preference_pairs(pl.concat([frame, alone]))
    assert all(seeds[win] == seeds[lose] for win, lose in pairs)
    assert "fail-alone" not in {lose for _, lose in pairs}  # no success on seed 99: no pair, not another seed's


def failure_vs_reference(model, reference, tok, frame) -> tuple[float, float]:
    """Mean log-ratio to the reference of the logged failures' and successes' tokens."""
    data = VLADataset(frame.sort("episode_id", "step"), tok, model.cfg, PruningConfig(keep_ratio=1.0))
    batch = data.batch(np.arange(len(data)))
    masks = grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens)
    with torch.no_grad():
        ratio = (token_logprobs(model, batch, masks, model.cfg.num_patches)[0]
                 - token_logprobs(reference, batch, masks, model.cfg.num_patches)[0]).sum(1)  # fmt: skip
    failed = torch.tensor(~frame.sort("episode_id", "step")["success"].to_numpy())
    return ratio[failed].mean().item(), ratio[~failed].mean().item()


def test_offline_rl_pushes_failures_away_and_keeps_successes(logged):
    work, sft_path, frame = logged
    train = VLATrainConfig(steps=25, batch_size=8, lr=1e-3, warmup_steps=2, seed=0, checkpoint_every=10,
                           progress_bar=False)  # fmt: skip
    result = train_offline_rl(frame, train, OfflineRLConfig(dpo_pairs=4), sft_path, work / "offline")
    reference, tok, _ = load_vla(sft_path)
    logged_rollouts = frame.filter(pl.col("tokens").list.len() > 0)
    failed, succeeded = failure_vs_reference(result.model, reference, tok, logged_rollouts)
    assert failed < -1.0  # the dead-end click is now much less likely than under SFT
    assert succeeded > failed + 1.0  # and the success is not pushed down with it
    assert result.steps == 25 and np.isfinite(result.losses).all()


def test_offline_rl_resumes_to_the_same_weights(logged, tmp_path):
    _, sft_path, frame = logged
    train = VLATrainConfig(steps=6, batch_size=4, lr=1e-3, warmup_steps=1, seed=0, checkpoint_every=3,
                           progress_bar=False)  # fmt: skip
    straight = train_offline_rl(frame, train, OfflineRLConfig(dpo_pairs=2), sft_path, tmp_path / "a")
    train_offline_rl(frame, train, OfflineRLConfig(dpo_pairs=2), sft_path, tmp_path / "b", stop_at=3)
    resumed = train_offline_rl(frame, train, OfflineRLConfig(dpo_pairs=2), sft_path, tmp_path / "b")
    for a, b in zip(straight.model.state_dict().values(), resumed.model.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_the_dpo_term_does_not_swamp_awr(logged):
    """Three-step trajectories (the stage scores up to dpo_max_steps of each): the weighted DPO term's gradient
    is of AWR's order, not ~50x it (126 vs 2.4) as when each trajectory's log-ratio was its sum over its tokens."""
    from learner.algorithms.offline_rl import trajectory_logprobs
    from learner.algorithms.rl_losses import awr_loss, dpo_loss

    _, sft_path, frame = logged
    three = pl.concat([frame.with_columns(step=pl.lit(k, dtype=frame["step"].dtype)) for k in range(3)])
    three = three.sort("episode_id", "step")
    model, tok, pruning = load_vla(sft_path)
    reference, _, _ = load_vla(sft_path)
    data = VLADataset(three, tok, model.cfg, PruningConfig(keep_ratio=1.0))
    rows_of = {e: [i for i, x in enumerate(three["episode_id"].to_list()) if x == e] for e in three["episode_id"]}
    pairs = preference_pairs(three)[:4]
    rows = [i for win, lose in pairs for i in rows_of[win] + rows_of[lose]]
    segments = np.array([2 * p + side for p, (win, lose) in enumerate(pairs) for side, e in ((0, win), (1, lose))
                         for _ in rows_of[e]])  # fmt: skip
    rl, keep = OfflineRLConfig(), model.cfg.num_patches

    def grad_norm(loss) -> float:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return float(torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None)))

    batch = data.batch(np.arange(0, len(data), 3)[:16])
    scored = token_logprobs(model, batch, grammar_masks(tok, batch["labels"], model.cfg.max_thought_tokens), keep)
    awr = grad_norm(awr_loss(scored.logp, torch.ones(len(scored.logp)), scored.mask))
    policy = trajectory_logprobs(model, data, rows, segments, keep)
    with torch.no_grad():
        ref = trajectory_logprobs(reference, data, rows, segments, keep)
    dpo = rl.dpo_weight * grad_norm(dpo_loss(policy[0::2], policy[1::2], ref[0::2], ref[1::2], rl.dpo_beta))
    assert 0.2 * awr < dpo < 1.5 * awr, (dpo, awr)


def test_offline_rl_keeps_teaching_the_pruning_relevance(logged, tmp_path):
    """The successes' clicks teach the relevance head in the offline stage too (SFT's relevance term): its
    NLL of their target patches ends below the SFT model's and below the same run's without the term."""
    from learner.model.vla_loss import target_patch_nll

    _, sft_path, frame = logged
    successes = frame.filter(pl.col("success"))

    def relevance_nll(model, tok, pruning) -> float:
        batch = VLADataset(successes, tok, model.cfg, pruning).batch(np.arange(len(successes)))
        with torch.no_grad():
            _, relevance, _ = model(batch["image"], batch["prior"], batch["instruction_ids"],
                                    batch["instruction_chars"], batch["text_ids"], model.cfg.num_patches)  # fmt: skip
        return target_patch_nll(relevance, batch["target_patch"]).item()

    def trained(weight: float):
        train = VLATrainConfig(steps=20, batch_size=8, lr=1e-3, warmup_steps=2, seed=0, checkpoint_every=0,
                               progress_bar=False, relevance_weight=weight)  # fmt: skip
        result = train_offline_rl(frame, train, OfflineRLConfig(dpo_pairs=2), sft_path, tmp_path / f"w{weight}")
        return relevance_nll(result.model, result.tokenizer, result.pruning)

    # The same run without the term (the stage without the relevance term) moves the relevance only through the trunk.
    assert trained(1.0) < min(trained(0.0), relevance_nll(*load_vla(sft_path))) - 0.05
