"""The curriculum's losses and advantages against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from learner.algorithms.rl_losses import (
    awr_loss,
    awr_weights,
    baseline_advantages,
    databc_loss,
    dpo_loss,
    entropy_over_support,
    group_advantages,
    guidance_beta,
    kl_to_reference,
    masked_mean,
    ppo_clip_loss,
    state_value_advantages,
    weigh_failures,
)

t = torch.tensor


def test_group_advantages_standardise_within_each_group():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, population std 0.5 -> +1, -1, -1, +1
    # group 1: a single rollout -> 0; group 2: all equal -> 0
    adv = group_advantages(t([1.0, 0.0, 0.0, 1.0, 1.0, 0.3, 0.3]), t([0, 0, 0, 0, 1, 2, 2]))
    assert adv.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0], abs=1e-5)


def test_baseline_advantages_subtract_the_task_mean():
    # task 0 returns 1, 0.5 (mean 0.75); task 1 returns -1, 0, 1 (mean 0)
    adv = baseline_advantages(t([1.0, 0.5, -1.0, 0.0, 1.0]), t([0, 0, 1, 1, 1]))
    assert adv.tolist() == pytest.approx([0.25, -0.25, -1.0, 0.0, 1.0])


def test_awr_weights_are_clipped_exponentials_and_weight_the_nll():
    w = awr_weights(t([0.0, 1.0, 10.0]), temperature=0.5, max_weight=20.0)
    assert w.tolist() == pytest.approx([1.0, math.exp(2.0), 20.0])  # exp(20) clipped
    logp = t([[-1.0, -2.0], [-0.5, -9.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    # (1*1 + 1*2 + 3*0.5) / 3 positions
    assert awr_loss(logp, t([1.0, 3.0]), mask).item() == pytest.approx((1 + 2 + 1.5) / 3)


def test_dpo_loss_prefers_the_success_relative_to_the_reference():
    # margin = (-1 - -2) - (-3 - -2) = 1 - (-1) = 2; beta 0.5 -> -log sigmoid(1)
    loss = dpo_loss(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), beta=0.5)
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))))
    # at the reference the margin is 0: log 2
    assert dpo_loss(t([-2.0]), t([-2.0]), t([-2.0]), t([-2.0]), beta=0.5).item() == pytest.approx(math.log(2))
    # its gradient raises the success's log-prob and lowers the failure's
    chosen, rejected = t([-2.0], requires_grad=True), t([-2.0], requires_grad=True)
    dpo_loss(chosen, rejected, t([-2.0]), t([-2.0]), beta=1.0).backward()
    assert chosen.grad.item() < 0 < rejected.grad.item()


def test_ppo_clip_loss_clips_the_ratio_to_the_old_policy_and_truncates_the_behaviour_weight():
    log = math.log
    # position ratios pi/pi_old: 1.5 (A>0: clipped to 1.2), 0.5 (A>0: min(0.5, 0.8) = 0.5), 0.5 (A<0:
    # min(-0.5, -0.8) = -0.8); weights pi_old/mu: 1, 2, 10 truncated at 5; the masked position ignored
    logp = t([[log(1.5), log(0.5)], [log(0.5), 0.0]])
    old = torch.zeros(2, 2)
    behaviour = t([[0.0, -log(2.0)], [-log(10.0), 0.0]])
    adv = t([1.0, -1.0])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    loss = ppo_clip_loss(logp, old, behaviour, adv, mask, clip=0.2, weight_cap=5.0)
    assert loss.item() == pytest.approx(-(1.0 * 1.2 + 2.0 * 0.5 - 5.0 * 0.8) / 3)


def test_an_on_policy_update_starts_at_ratio_1_and_reinforces_a_success_through_a_rare_token():
    from policy.sampling import Sampling, behaviour_distribution

    # pi over 6 allowed tokens; the success went through token 5, pi = 0.08. The edge drew it at temperature
    # 0.7 among the top 5, so mu is the sharper distribution: pi / mu ~ 2 there.
    pi = np.array([0.40, 0.25, 0.15, 0.07, 0.05, 0.08])
    log_mu = behaviour_distribution(np.log(pi), Sampling(0.7, 5))
    token = 5
    assert math.exp(log_mu[token]) < pi[token] / 1.5

    logp = torch.tensor([[math.log(pi[token])]], requires_grad=True)
    old = logp.detach().clone()  # pi_old is pi_theta at the update's first step: ratio exactly 1
    ppo_clip_loss(logp, old, t([[float(log_mu[token])]]), t([1.0]), torch.ones(1, 1)).backward()
    weight = min(pi[token] / math.exp(log_mu[token]), 5.0)
    assert logp.grad.item() == pytest.approx(-weight)  # gradient descent raises log pi of the rare success
    assert logp.grad.item() < -1.5  # not clipped away (a ratio against mu would be ~2: outside 1 +- 0.2)


def test_a_failures_push_is_scaled_by_the_negative_weight_and_a_successs_pull_is_not():
    advantages = t([1.5, -0.5, 0.0, -2.0])
    assert torch.equal(weigh_failures(advantages, 1.0), advantages)
    assert torch.allclose(weigh_failures(advantages, 0.25), t([1.5, -0.125, 0.0, -0.5]))

    # Through the loss: with weight 0 the failure's tokens get no gradient, the success's the same as before.
    def grads(negative_weight: float) -> torch.Tensor:
        logp = torch.log(t([[0.3], [0.3]])).requires_grad_()
        old = logp.detach().clone()
        weighed = weigh_failures(t([1.0, -1.0]), negative_weight)
        ppo_clip_loss(logp, old, old, weighed, torch.ones(2, 1)).backward()
        return logp.grad[:, 0]

    symmetric, successes_only = grads(1.0), grads(0.0)
    assert symmetric[0] < 0 < symmetric[1]  # descent raises the success's log pi and lowers the failure's
    assert successes_only[0] == symmetric[0] and successes_only[1] == 0.0


def test_kl_to_reference_is_exact_over_the_allowed_tokens():
    inf = float("inf")
    logp = torch.log(t([[[0.5, 0.5, 0.0]]]))  # token 2 outside the grammar: log 0 = -inf
    ref = torch.log(t([[[0.25, 0.75, 0.0]]]))
    kl = kl_to_reference(logp, ref, torch.ones(1, 1))
    assert kl.item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3))
    assert torch.isfinite(kl) and logp[0, 0, 2].item() == -inf
    assert kl_to_reference(ref, ref, torch.ones(1, 1)).item() == pytest.approx(0.0)
    # its gradient is finite although the support excludes a token
    logits = torch.tensor([[[1.0, 2.0, 0.0]]], requires_grad=True)
    masked = logits.masked_fill(torch.tensor([False, False, True]), float("-inf")).log_softmax(-1)
    kl_to_reference(masked, ref, torch.ones(1, 1)).backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 0, 2] == 0


def test_databc_and_masked_mean():
    assert databc_loss(t([[-1.0, -3.0]]), t([[1.0, 0.0]])).item() == pytest.approx(1.0)
    assert masked_mean(t([[1.0, 2.0]]), torch.zeros(1, 2)).item() == 0.0


def test_guidance_beta_is_constant_then_annealed_to_zero():
    betas = [guidance_beta(n, beta0=0.4, warmup=10, anneal=20) for n in (0, 9, 10, 20, 30, 100)]
    assert betas == pytest.approx([0.4, 0.4, 0.4, 0.2, 0.0, 0.0])
    assert guidance_beta(10, 0.4, 10, 0) == 0.0


def test_per_step_credit_does_not_push_down_the_correct_first_step_of_a_failed_episode():
    """Four rollouts of one seed, two steps each: all click the same field first (one next screen, state 1),
    then two type the right text (success) and two the wrong one. Episode-level GRPO gives the failures'
    first step -1; per-step credit gives every first step 0 and only the wrong last steps a negative."""
    rewards = t([0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # success at the last step of episodes 0 and 1
    states = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])  # step 0 on screen 0, step 1 on the one next screen
    ends = torch.tensor([False, True] * 4)
    groups = torch.zeros(8, dtype=torch.long)
    adv = state_value_advantages(rewards, states, ends, groups, gamma=0.9)
    # G_0 = 0.9 or 0 (std 0.45); V(s1) = 0.5, V(s0) = 0.45; step 0: Q = 0.9 * 0.5 = V(s0) -> 0.
    assert adv[0::2].tolist() == pytest.approx([0.0] * 4, abs=1e-6)
    assert adv[1::2].tolist() == pytest.approx([0.5 / 0.45, 0.5 / 0.45, -0.5 / 0.45, -0.5 / 0.45], rel=1e-4)


def test_per_step_credit_of_a_one_step_task_is_grpo_and_a_flat_group_gets_none():
    rewards = t([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # group 0: four one-step episodes; group 1: two, both succeed
    ends = torch.ones(6, dtype=torch.bool)
    states = torch.tensor([0, 0, 0, 0, 1, 1])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = state_value_advantages(rewards, states, ends, groups, gamma=0.9)
    expected = group_advantages(rewards[:4], torch.zeros(4, dtype=torch.long))
    assert adv[:4].tolist() == pytest.approx(expected.tolist(), rel=1e-4)
    assert adv[4:].tolist() == [0.0, 0.0]


def test_a_divergent_first_step_gets_the_credit_of_where_it_led():
    """Two first actions from one screen: A leads to screen 1 (then success 1 of 2 times), B to screen 2
    (always fails). A's first step is credited above B's."""
    rewards = t([0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    states = torch.tensor([0, 1, 0, 1, 0, 2, 0, 2])
    adv = state_value_advantages(rewards, states, torch.tensor([False, True] * 4), torch.zeros(8, dtype=torch.long),
                                 gamma=1.0)  # fmt: skip
    assert adv[0] == adv[2] > 0 > adv[4] == adv[6]


def test_entropy_over_the_grammars_support():
    logp_all = torch.log(t([[[0.5, 0.5, 0.0]]]))  # (1, 1, 3), the third token outside the support
    assert entropy_over_support(logp_all, t([[1.0]])).item() == pytest.approx(math.log(2))


# Semi-online RL: each function against values worked by hand.


def test_semi_online_step_reward_weighs_format_and_action():
    from learner.algorithms.rl_losses import semi_online_step_reward

    rewards = semi_online_step_reward(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor([1.0, 0.5, 0.1, 0.0]))
    assert torch.allclose(rewards, torch.tensor([1.0, 0.55, 0.19, 0.0]))


def test_semi_online_returns_discount_and_cut_at_a_mismatch():
    from learner.algorithms.rl_losses import semi_online_returns

    # r = 1, 1, 0.55 (mismatch), 1, 1; gamma 0.5.
    # t4: 1; t3: 1 + 0.5 = 1.5; t2 mismatched: its own 0.55, running restarts; t1: 1 + 0.5 * 0 = 1; t0: 1.5.
    returns = semi_online_returns(torch.tensor([1.0, 1.0, 0.55, 1.0, 1.0]),
                                  torch.tensor([True, True, False, True, True]))  # fmt: skip
    assert torch.allclose(returns, torch.tensor([1.5, 1.0, 0.55, 1.5, 1.0]))
    all_matched = semi_online_returns(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([True, True, True]), gamma=0.5)
    assert torch.allclose(all_matched, torch.tensor([1.75, 1.5, 1.0]))


def test_semi_online_advantages_add_the_step_and_episode_terms():
    from learner.algorithms.rl_losses import semi_online_advantages

    # Two rollouts of one task, one step each: G = 1 and 0 in the (task, step 0) group -> +1, -1 (population
    # std 0.5); episode totals 2 and 1 in the task group -> +1, -1. Sum: +2, -2.
    adv = semi_online_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([2.0, 1.0]),
                                 torch.tensor([7, 7]))  # fmt: skip
    assert torch.allclose(adv, torch.tensor([2.0, -2.0]), atol=1e-4)
    alone = semi_online_advantages(torch.tensor([1.0]), torch.tensor([0]), torch.tensor([1.0]), torch.tensor([0]))
    assert alone.item() == 0.0  # a group of one has nothing to be ranked against


def test_groups_whose_first_returns_barely_differ_are_dropped():
    from learner.algorithms.rl_losses import informative_groups

    # group 0: 1.0, 0.0 -> std 0.5; group 1: 1.0, 0.6 -> std 0.2; group 2: one rollout, std 0
    first = torch.tensor([1.0, 0.0, 1.0, 0.6, 0.9])
    assert informative_groups(first, torch.tensor([0, 0, 1, 1, 2]), min_std=0.3).tolist() == [0]
    assert informative_groups(first, torch.tensor([0, 0, 1, 1, 2])).tolist() == [0, 1]  # by default: any spread


def test_a_one_step_tasks_semi_online_group_survives_the_filter_when_its_rollouts_differ():
    from learner.algorithms.rl_losses import informative_groups, semi_online_returns, semi_online_step_reward
    from learner.algorithms.semi_online import SemiOnlineConfig

    # 8 rollouts of a one-step trajectory: 7 click inside the expert's box (score 1), one elsewhere (0.5)
    scores = torch.tensor([1.0] * 7 + [0.5])
    rewards = semi_online_step_reward(torch.ones(8), scores)  # 1.0 and 0.55
    matched = scores == 1.0
    first = torch.stack([semi_online_returns(rewards[i : i + 1], matched[i : i + 1])[0] for i in range(8)])
    group, threshold = torch.zeros(8, dtype=torch.long), SemiOnlineConfig().min_group_std
    assert informative_groups(first, group, threshold).tolist() == [0]
    assert informative_groups(torch.ones(8), group, threshold).tolist() == []  # all alike: nothing to rank
