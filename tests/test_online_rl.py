"""Online RL learns from sampled rollouts: success rises over PPO updates; guidance keeps it near SFT."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest
import torch

from learner.algorithms.online_rl import OnlineRLConfig, ppo_update, step_credit_advantages, task_weights
from learner.algorithms.policy_logprobs import grammar_masks, token_logprobs
from learner.algorithms.rl_losses import kl_to_reference
from learner.algorithms.sft import train_vla
from learner.data.dataset import VLADataset
from learner.model.checkpoints import load_vla
from learner.model.export import export_bundle
from learner.recipe import VLARecipe, VLATrainConfig
from policy.pruning import PruningConfig
from policy.runtime import VLARuntime
from policy.sampling import Sampling
from policy.screen import encode_png
from tests.factories import box_screen

TINY = {"stem_channels": 16, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128}
INSTRUCTION = "Click the box."
GROUP = 4  # rollouts per seed


def sft_row(seed: int) -> dict:
    image, (x0, y0, x1, y1) = box_screen(seed)
    return dict(episode_id=f"demo-{seed}", step=0, task="click-box", instruction=INSTRUCTION,
                screenshot=encode_png(image), thought="Click the box.", action_type="click", x=(x0 + x1) / 2,
                y=(y0 + y1) / 2, text="", key="")  # fmt: skip


def rollouts(bundle, seeds: range, rng: np.random.Generator) -> pl.DataFrame:
    """GROUP sampled one-step episodes per seed; success: a click inside the box (the 'environment')."""
    runtime = VLARuntime(bundle, keep_ratio=1.0)
    rows = []
    for seed in seeds:
        image, (x0, y0, x1, y1) = box_screen(seed)
        for g in range(GROUP):
            gen, _ = runtime.step(image, INSTRUCTION, None, Sampling(temperature=1.0), rng)
            a = runtime.tok.parse(gen.ids).action
            hit = a.type == "click" and x0 <= a.x <= x1 and y0 <= a.y <= y1
            rows.append(dict(episode_id=f"r{seed}-{g}", step=0, task="click-box", instruction=INSTRUCTION,
                             screenshot=encode_png(image), thought="", action_type=a.type, x=a.x, y=a.y,
                             text=a.text, key=a.key, tokens=gen.ids, token_logprobs=gen.token_logprobs,
                             seed=seed, success=hit))  # fmt: skip
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """A weak SFT model: a few steps on box demos, so sampling hits the box only sometimes."""
    work = tmp_path_factory.mktemp("online")
    train = VLATrainConfig(steps=12, batch_size=8, lr=3e-3, warmup_steps=3, seed=0, keep_ratios=(1.0,),
                           progress_bar=False, checkpoint_every=0)  # fmt: skip
    recipe = VLARecipe(model=TINY, pruning=PruningConfig(keep_ratio=1.0), vocab_size=300, train=train)
    result = train_vla(pl.DataFrame([sft_row(s) for s in range(16)]), recipe, work / "sft")
    return work, result.checkpoint_path


def test_group_advantages_are_per_task_and_seed():
    frame = pl.DataFrame(dict(episode_id=["a", "b", "c", "d"], step=[0] * 4, task=["t"] * 4, seed=[1, 1, 2, 2],
                              success=[True, False, True, True], screenshot=[b"s"] * 4))  # fmt: skip
    assert step_credit_advantages(frame, 0.9, 0.1).tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)


def test_a_databc_run_needs_demonstrations(sft, tmp_path):
    _, path = sft
    with pytest.raises(ValueError, match="demonstrations"):
        ppo_update(pl.DataFrame(), VLATrainConfig(), OnlineRLConfig(guidance="databc"), path, path, tmp_path)


def run_updates(sft, guidance: str, rounds: int, tmp: str) -> tuple[list[float], object]:
    work, sft_path = sft
    rng = np.random.default_rng(0)
    train = VLATrainConfig(batch_size=16, lr=1e-3, seed=0, progress_bar=False)
    rl = OnlineRLConfig(guidance=guidance, beta=0.5, beta_warmup_env_steps=100, epochs=2)
    model, tok, pruning = load_vla(sft_path)
    (work / tmp).mkdir(exist_ok=True)
    rates = []
    for r in range(rounds + 1):
        bundle = export_bundle(model, tok, pruning, work / tmp / f"round-{r}.vla")
        frame = rollouts(bundle, range(100 * r, 100 * r + 12), rng)
        rates.append(float(frame["success"].mean()))
        if r < rounds:
            model = ppo_update(frame, train, rl, sft_path, sft_path, work / tmp / "ppo").model
    return rates, model


def test_ppo_raises_success_over_updates(sft):
    rates, _ = run_updates(sft, "none", rounds=4, tmp="none")
    assert 0.0 < rates[0] < 0.7, rates  # room to learn
    assert np.mean(rates[-2:]) > rates[0] + 0.15, rates


def test_refkl_keeps_the_policy_closer_to_sft_than_plain_ppo(sft):
    work, sft_path = sft
    _, plain = run_updates(sft, "none", rounds=2, tmp="kl-none")
    _, guided = run_updates(sft, "refkl", rounds=2, tmp="kl-refkl")
    reference, tok, pruning = load_vla(sft_path)
    data = VLADataset(pl.DataFrame([sft_row(s) for s in range(200, 216)]), tok, reference.cfg, pruning)
    batch = data.batch(np.arange(len(data)))
    masks = grammar_masks(tok, batch["labels"], reference.cfg.max_thought_tokens)
    with torch.no_grad():
        _, ref_all, mask, _ = token_logprobs(reference, batch, masks, reference.cfg.num_patches)
        kls = [kl_to_reference(token_logprobs(m, batch, masks, reference.cfg.num_patches)[1], ref_all, mask).item()
               for m in (plain, guided)]  # fmt: skip
    assert kls[1] < kls[0], kls


def test_the_first_step_of_an_update_has_ratio_1_against_the_learners_own_policy(sft, tmp_path, monkeypatch):
    """Rollouts drawn at temperature 0.7 among the top 5: mu is not pi, yet the update's first minibatch
    clips against pi_old = pi_theta, so its ratio is 1 at every token (decoupled PPO)."""
    import learner.algorithms.online_rl as online_rl

    _, sft_path = sft
    rows = sampled_rows(sft_path, tmp_path)
    calls = []
    loss = online_rl.ppo_clip_loss
    monkeypatch.setattr(online_rl, "ppo_clip_loss", lambda *args, **kw: calls.append(args) or loss(*args, **kw))
    ppo_update(rows, VLATrainConfig(batch_size=8, lr=1e-3, seed=0, progress_bar=False),
               OnlineRLConfig(guidance="none", epochs=1), sft_path, sft_path, tmp_path / "ppo")  # fmt: skip

    logp, old_logp, mu, _, mask = calls[0][:5]
    on = mask > 0  # the action's tokens: the thought, greedy at the edge, is not in the surrogate
    assert 0 < on.sum() < (logp != 0).sum()
    assert torch.allclose(logp.detach()[on], old_logp[on], atol=1e-5)  # ratio 1: nothing clipped at first
    assert (logp.detach()[on] - mu[on]).abs().max() > 0.1  # while pi / mu is not 1: mu is the sampler's


def sampled_rows(sft_path, tmp_path, seeds: range = range(6)) -> pl.DataFrame:
    """GROUP rollouts per seed at temperature 0.7 / top-k 5; success alternates within each group."""
    model, tok, pruning = load_vla(sft_path)
    runtime = VLARuntime(export_bundle(model, tok, pruning, tmp_path / "sampler.vla"), keep_ratio=1.0)
    rng, rows = np.random.default_rng(1), []
    for seed in seeds:
        image, _ = box_screen(seed)
        for g in range(GROUP):
            gen, _ = runtime.step(image, INSTRUCTION, None, Sampling(temperature=0.7, top_k=5), rng)
            a = runtime.tok.parse(gen.ids).action
            rows.append(dict(episode_id=f"r{seed}-{g}", step=0, task="click-box", instruction=INSTRUCTION,
                             screenshot=encode_png(image), thought="", action_type=a.type, x=a.x, y=a.y,
                             text=a.text, key=a.key, tokens=gen.ids, token_logprobs=gen.token_logprobs,
                             seed=seed, success=(g + seed) % 2 == 0))  # fmt: skip
    return pl.DataFrame(rows)


def test_beta_follows_environment_steps_not_optimizer_steps(sft, tmp_path):
    """Three updates in a row (many optimizer steps) at env step 0 keep beta_0; past warm-up + anneal in
    environment steps it is 0, whatever the optimizer step. The update reports its diagnostics."""
    _, sft_path = sft
    frame = sampled_rows(sft_path, tmp_path)
    train = VLATrainConfig(batch_size=4, lr=1e-3, seed=0, progress_bar=False)
    rl = OnlineRLConfig(guidance="refkl", beta=0.3, beta_warmup_env_steps=100, beta_anneal_env_steps=100, target_kl=0)
    for _ in range(3):
        result = ppo_update(frame, train, rl, sft_path, sft_path, tmp_path / "ppo", env_steps=0)
    assert result.steps >= 12 and result.diagnostics["beta"] == pytest.approx(0.3)
    assert ppo_update(frame, train, rl, sft_path, sft_path, tmp_path / "ppo", env_steps=150).diagnostics["beta"] == (
        pytest.approx(0.15))  # fmt: skip
    late = ppo_update(frame, train, rl, sft_path, sft_path, tmp_path / "late", env_steps=200).diagnostics
    assert late["beta"] == 0.0
    for key in ("kl_old", "kl_sft", "clip_fraction", "entropy", "ratio_q05", "ratio_q50", "ratio_q95",
                "informative_share"):  # fmt: skip
        assert isinstance(late[key], float), key
    assert late["informative_share"] == 1.0 and late["entropy"] > 0 and late["kl_old"] >= 0


def test_an_rl_update_keeps_teaching_the_pruning_relevance(sft, tmp_path):
    """The relevance head learns on the clicks of successful rollouts during PPO, as in SFT: its NLL of the
    trained successes' target patches ends below the SFT model's and the same update's without the term."""
    from learner.model.vla_loss import target_patch_nll

    _, sft_path = sft
    frame = sampled_rows(sft_path, tmp_path).with_columns(success=pl.col("action_type") == "click")
    if frame["success"].n_unique() < 2:  # every rollout clicked: mark half as failures (advantages need both)
        frame = frame.with_columns(success=pl.Series([i % 2 == 0 for i in range(len(frame))]))

    mixed = pl.col("success").n_unique().over("seed") > 1  # the update trains on groups whose rollouts differ
    taught = frame.filter(mixed & pl.col("success"))

    def relevance_nll(path) -> float:
        model, tok, pruning = load_vla(path)
        data = VLADataset(taught, tok, model.cfg, pruning)
        batch = data.batch(np.arange(len(data)))
        with torch.no_grad():
            _, relevance, _ = model(batch["image"], batch["prior"], batch["instruction_ids"],
                                    batch["instruction_chars"], batch["text_ids"], model.cfg.num_patches)  # fmt: skip
        return target_patch_nll(relevance, batch["target_patch"]).item()

    def trained(weight: float) -> float:
        train = VLATrainConfig(batch_size=4, lr=3e-3, seed=0, progress_bar=False, relevance_weight=weight)
        rl = OnlineRLConfig(guidance="none", epochs=3)
        return relevance_nll(ppo_update(frame, train, rl, sft_path, sft_path, tmp_path / f"w{weight}").checkpoint_path)

    # The same update without the term (PPO without the relevance term) moves the relevance only through the trunk.
    assert trained(1.0) < min(trained(0.0), relevance_nll(sft_path)) - 0.05


def test_the_online_update_gives_per_step_credit(sft, tmp_path, monkeypatch):
    """Two-step episodes of one seed: every rollout clicks the same first screen (one next screen), half then
    succeed. The update's advantages: 0 on every first step, + / - on the last steps (episode-level GRPO
    gave the failures' first steps -1)."""
    import learner.algorithms.online_rl as online_rl

    _, sft_path = sft
    one = sampled_rows(sft_path, tmp_path, seeds=range(1))  # GROUP rows of seed 0, one step each
    second = one.with_columns(step=pl.lit(1, dtype=one["step"].dtype),
                              screenshot=pl.lit(encode_png(box_screen(99)[0])))  # fmt: skip
    frame = pl.concat([one, second]).with_columns(success=pl.col("episode_id").is_in(["r0-0", "r0-1"]))
    captured = []
    loss = online_rl.ppo_clip_loss
    monkeypatch.setattr(online_rl, "ppo_clip_loss", lambda *a, **kw: captured.append(a[3]) or loss(*a, **kw))
    ppo_update(frame, VLATrainConfig(batch_size=64, lr=1e-3, seed=0, progress_bar=False),
               OnlineRLConfig(guidance="none", epochs=1), sft_path, sft_path, tmp_path / "ppo")  # fmt: skip
    credit = step_credit_advantages(frame.sort("episode_id", "step"), gamma=0.9, verify_penalty=0.1)
    assert credit[0::2].tolist() == pytest.approx([0.0] * GROUP, abs=1e-6)  # first steps: no credit either way
    assert (credit[1::2] > 0).tolist() == [True, True, False, False]
    assert sorted(captured[0].tolist()) == pytest.approx(sorted(credit[credit != 0].tolist()), rel=1e-5)


def test_dynamic_sampling_weighs_tasks_by_their_recent_informative_groups():
    weights = task_weights({"new": [], "flat": [False] * 6, "mixed": [False, True, True, False, True, True]})
    assert weights.tolist() == pytest.approx([1.0, 0.1, 0.75])


def test_an_update_stops_when_its_policy_has_moved_too_far_from_pi_old(sft, tmp_path):
    """The first minibatch steps from pi_old (KL 0); with a target KL of ~0 the next one is already past it."""
    _, sft_path = sft
    frame = sampled_rows(sft_path, tmp_path)
    train = VLATrainConfig(batch_size=4, lr=1e-3, seed=0, progress_bar=False)
    cut = ppo_update(frame, train, OnlineRLConfig(guidance="none", target_kl=1e-9), sft_path, sft_path, tmp_path / "a")
    full = ppo_update(frame, train, OnlineRLConfig(guidance="none", target_kl=0.0), sft_path, sft_path, tmp_path / "b")
    assert (cut.diagnostics["optimizer_steps"], cut.diagnostics["stopped_early"]) == (1, True)
    assert full.diagnostics["optimizer_steps"] > 1 and not full.diagnostics["stopped_early"]


def test_a_whole_batch_minibatch_takes_one_optimizer_step_per_epoch(sft, tmp_path):
    _, sft_path = sft
    frame = sampled_rows(sft_path, tmp_path)
    train = VLATrainConfig(batch_size=4, lr=1e-4, seed=0, progress_bar=False)
    rl = OnlineRLConfig(guidance="none", target_kl=0.0, epochs=3)
    small = ppo_update(frame, train, rl, sft_path, sft_path, tmp_path / "small")
    whole = ppo_update(frame, train, replace(rl, minibatch_rows=len(frame)), sft_path, sft_path, tmp_path / "whole")
    informative = whole.diagnostics["informative_rows"]
    assert informative >= 8 and whole.diagnostics["optimizer_steps"] == 3  # one step per epoch over every row
    assert small.diagnostics["optimizer_steps"] == 3 * (informative // 4)


def test_the_thought_stays_near_sft_while_the_action_trains(sft, tmp_path):
    """The surrogate trains the action's tokens; the thought's, decoded greedily, are held by a KL to SFT.
    Without it the shared decoder moved them as far as the actions (the demo's thoughts turned to babble)."""
    _, sft_path = sft
    frame = sampled_rows(sft_path, tmp_path)
    train = VLATrainConfig(batch_size=4, lr=3e-3, seed=0, progress_bar=False)

    def thought_kl_after(weight: float) -> float:
        rl = OnlineRLConfig(guidance="none", epochs=3, target_kl=0, thought_kl=weight)
        for _ in range(2):
            result = ppo_update(frame, train, rl, sft_path, sft_path, tmp_path / f"w{weight}")
        return result.diagnostics["kl_sft_thought"]

    anchored, free = thought_kl_after(1.0), thought_kl_after(0.0)
    assert anchored < 0.5 * free, (anchored, free)
