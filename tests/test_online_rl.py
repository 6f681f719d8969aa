"""Online RL learns from sampled rollouts: success rises over PPO updates; guidance keeps it near SFT."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch

from learner.config import VLATrainConfig
from learner.online_rl import OnlineRLConfig, episode_group_advantages, ppo_update
from learner.policy_logprobs import grammar_masks, token_logprobs
from learner.rl_losses import kl_to_reference
from learner.vla_export import export_bundle
from learner.vla_sft import VLADataset, load_vla, train_vla
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
    result = train_vla(pl.DataFrame([sft_row(s) for s in range(16)]), train, work / "sft", model_config=TINY,
                       vocab_size=300, pruning=PruningConfig(keep_ratio=1.0))  # fmt: skip
    return work, result.checkpoint_path


def test_group_advantages_are_per_task_and_seed():
    frame = pl.DataFrame(dict(episode_id=["a", "b", "c", "d"], task=["t"] * 4, seed=[1, 1, 2, 2],
                              success=[True, False, True, True]))  # fmt: skip
    assert episode_group_advantages(frame).tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)


def test_a_databc_run_needs_demonstrations(sft, tmp_path):
    _, path = sft
    with pytest.raises(ValueError, match="demonstrations"):
        ppo_update(pl.DataFrame(), VLATrainConfig(), OnlineRLConfig(guidance="databc"), path, path, tmp_path)


def run_updates(sft, guidance: str, rounds: int, tmp: str) -> tuple[list[float], object]:
    work, sft_path = sft
    rng = np.random.default_rng(0)
    train = VLATrainConfig(batch_size=16, lr=1e-3, seed=0, progress_bar=False)
    rl = OnlineRLConfig(guidance=guidance, beta=0.5, beta_warmup_steps=100, epochs=2)
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
        _, ref_all, mask = token_logprobs(reference, batch, masks, reference.cfg.num_patches)
        kls = [kl_to_reference(token_logprobs(m, batch, masks, reference.cfg.num_patches)[1], ref_all, mask).item()
               for m in (plain, guided)]  # fmt: skip
    assert kls[1] < kls[0], kls


def test_the_first_step_of_an_update_has_ratio_1_against_the_learners_own_policy(sft, tmp_path, monkeypatch):
    """Rollouts drawn at temperature 0.7 among the top 5: mu is not pi, yet the update's first minibatch
    clips against pi_old = pi_theta, so its ratio is 1 at every token (decoupled PPO)."""
    import learner.online_rl as online_rl

    work, sft_path = sft
    model, tok, pruning = load_vla(sft_path)
    bundle = export_bundle(model, tok, pruning, tmp_path / "sft.vla")
    runtime = VLARuntime(bundle, keep_ratio=1.0)
    rng, rows = np.random.default_rng(1), []
    for seed in range(6):
        image, (x0, y0, x1, y1) = box_screen(seed)
        for g in range(GROUP):
            gen, _ = runtime.step(image, INSTRUCTION, None, Sampling(temperature=0.7, top_k=5), rng)
            a = runtime.tok.parse(gen.ids).action
            rows.append(dict(episode_id=f"r{seed}-{g}", step=0, task="click-box", instruction=INSTRUCTION,
                             screenshot=encode_png(image), thought="", action_type=a.type, x=a.x, y=a.y,
                             text=a.text, key=a.key, tokens=gen.ids, token_logprobs=gen.token_logprobs,
                             seed=seed, success=(g + seed) % 2 == 0))  # fmt: skip
    calls = []
    loss = online_rl.ppo_clip_loss
    monkeypatch.setattr(online_rl, "ppo_clip_loss", lambda *args, **kw: calls.append(args) or loss(*args, **kw))
    ppo_update(pl.DataFrame(rows), VLATrainConfig(batch_size=8, lr=1e-3, seed=0, progress_bar=False),
               OnlineRLConfig(guidance="none", epochs=1), sft_path, sft_path, tmp_path / "ppo")  # fmt: skip

    logp, old_logp, mu, _, mask = calls[0][:5]
    on = mask > 0
    assert torch.allclose(logp.detach()[on], old_logp[on], atol=1e-5)  # ratio 1: nothing clipped at first
    assert (logp.detach()[on] - mu[on]).abs().max() > 0.1  # while pi / mu is not 1: mu is the sampler's
