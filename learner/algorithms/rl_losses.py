"""The RL losses and advantages of the curriculum, as small pure functions (tensor shapes in comments).

Notation: B sequences (one per step), T generated-token positions, V vocabulary, `mask` (B, T) is 1 where a
position holds a generated token the loss counts. `logp` are log pi_theta of the generated tokens under the
action grammar (learner.algorithms.policy_logprobs), `behaviour_logp` the log mu the edge recorded when it drew them
(policy.sampling), `ref_logp` the frozen SFT reference's.

    offline RL (AWR):      L = -sum_i w_i log pi(a_i|s_i) / sum_i 1,  w_i = min(exp(A_i / tau), w_max)
    bidirectional (DPO):   L = -log sigmoid(beta * ((log pi(y+) - log ref(y+)) - (log pi(y-) - log ref(y-))))
    online RL (PPO clip):  L = -mean_t w_t min(r_t A, clip(r_t, 1 - eps, 1 + eps) A),  r_t = pi_theta / pi_old,
                           w_t = min(pi_old / mu, cap): decoupled PPO, the clip against the learner's own
                           policy at the update's start, the sampler's mu only as a truncated weight
    RefKL:                 L_PPO + beta(k) * KL(pi_theta || pi_SFT)     (exact, over the allowed vocabulary)
    DataBC:                L_PPO + beta(k) * -log pi_theta(a_demo | s)
    beta(n):               beta_0 for n < warmup, then linear to 0 over `anneal` (environment steps)
    per-step credit:       r_t = verify term (+ success at the last step), G_t = r_t + gamma G_{t+1},
                           V(s) = mean G over the group's visits to s,
                           A_t = (r_t + gamma V(s_{t+1}) - V(s_t)) / std of the group's G_0
    semi-online (UI-S1):   r_t = 0.1 * well_formed + 0.9 * action_score;  G_t = r_t + gamma * G_{t+1}, cut at a
                           mismatch;  A_t = z(G_t | task, step index) + z(R | task);  groups whose step-0
                           returns are all alike are dropped
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` (B, T) over the positions where `mask` (B, T) is 1; 0 when the mask is empty."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: each reward standardised within its group (rollouts of one task and seed).

    rewards (N,), groups (N,) integer ids -> (N,) (r - mean_g) / (std_g + eps); 0 for a group of one, or one
    whose rollouts all scored alike (no signal to rank them by). std is the population std.
    """
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=rewards.dtype).index_add_(0, inverse, rewards)
    means = sums / counts
    centred = rewards - means[inverse]  # (N,)
    variances = torch.zeros(len(counts), dtype=rewards.dtype).index_add_(0, inverse, centred**2) / counts
    std = variances.sqrt()[inverse]  # (N,)
    return torch.where(std > eps, centred / (std + eps), torch.zeros_like(rewards))


def baseline_advantages(returns: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """AWR's advantage: the return minus its group's mean return (a baseline per task). (N,), (N,) -> (N,)."""
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    means = torch.zeros(len(counts), dtype=returns.dtype).index_add_(0, inverse, returns) / counts
    return returns - means[inverse]


def episode_advantages(
    frame: pl.DataFrame,
    reward: str,
    group_by: list[str],
    advantage: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> np.ndarray:
    """(M,) each step of `frame` gets its episode's advantage: `advantage(rewards (E,), group ids (E,))` over
    the frame's episodes (one reward each, from column `reward`), grouped by the columns `group_by`."""
    episodes = frame.unique("episode_id", keep="first", maintain_order=True)
    keys = list(zip(*(episodes[c].to_list() for c in group_by), strict=True))
    ids = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    adv = advantage(torch.tensor(episodes[reward].cast(pl.Float64).to_list(), dtype=torch.float64),
                    torch.tensor([ids[k] for k in keys]))  # fmt: skip
    by_episode = dict(zip(episodes["episode_id"].to_list(), adv.tolist(), strict=True))
    return np.array([by_episode[e] for e in frame["episode_id"].to_list()])


def awr_weights(advantages: torch.Tensor, temperature: float, max_weight: float) -> torch.Tensor:
    """(N,) exp(A / temperature), clipped at max_weight so one lucky episode cannot dominate a batch."""
    return torch.exp(advantages / temperature).clamp(max=max_weight)


def awr_loss(logp: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Advantage-weighted regression: token NLL of logged actions, each sequence weighted.

    logp (B, T) log pi of the logged tokens, weights (B,), mask (B, T) -> scalar.
    """
    return masked_mean(-logp * weights[:, None], mask)


def dpo_loss(
    logp_chosen: torch.Tensor,  # (P,) log pi of each pair's preferred trajectory (sum over its tokens)
    logp_rejected: torch.Tensor,  # (P,) ... of its dispreferred one (same task and seed)
    ref_chosen: torch.Tensor,  # (P,) the same under the frozen SFT reference
    ref_rejected: torch.Tensor,  # (P,)
    beta: float,
) -> torch.Tensor:
    """Bidirectional self-reinforcement: raise the success relative to the reference, push the failure away.

    Trajectory-level DPO: the environment's transition probabilities are the same under pi and the reference,
    so they cancel in each log-ratio and only the policy's token log-probs remain.
    """
    margin = (logp_chosen - ref_chosen) - (logp_rejected - ref_rejected)  # (P,)
    return -F.logsigmoid(beta * margin).mean()


def ppo_clip_loss(
    logp: torch.Tensor,  # (B, T) log pi_theta of the rollout's tokens
    old_logp: torch.Tensor,  # (B, T) log pi_old: the learner's own policy when this update began (no gradient)
    behaviour_logp: torch.Tensor,  # (B, T) log mu the edge recorded when it drew them (tempered, top-k)
    advantages: torch.Tensor,  # (B,) one per sequence (GRPO) or per step
    mask: torch.Tensor,  # (B, T)
    clip: float = 0.2,
    weight_cap: float = 5.0,
) -> torch.Tensor:
    """Decoupled PPO (AReaL), token-level, as a loss to minimise:

        L = -mean_t w_t min(r_t A, clip(r_t, 1 - eps, 1 + eps) A),  r_t = pi_theta / pi_old,
        w_t = min(pi_old / mu, weight_cap), without gradient.

    The clip bounds how far one update moves from the learner's own policy (r_t = 1 at its first step), and
    the behaviour policy only reweights: mu is the sampler's distribution (a temperature, top-k), so a ratio
    against it would start far from 1 and clip the very tokens exploration found (pi 0.08 drawn at
    temperature 0.7: pi / mu ~ 2, no gradient for the success that went through it). The cap bounds the
    weight of tokens drawn by stale versions.
    """
    ratio = torch.exp(logp - old_logp)  # (B, T)
    weight = torch.exp(old_logp - behaviour_logp).clamp(max=weight_cap).detach()  # (B, T)
    a = advantages[:, None]  # (B, 1)
    surrogate = torch.minimum(ratio * a, ratio.clamp(1.0 - clip, 1.0 + clip) * a)  # (B, T)
    return masked_mean(-weight * surrogate, mask)


def weigh_failures(advantages: torch.Tensor, negative_weight: float) -> torch.Tensor:
    """(M,) the advantages with the negative ones scaled by `negative_weight`: 1 is the policy gradient as
    written; below 1 a failure pushes its tokens down less than a success pulls its own up; 0 learns from the
    successes only (advantage-weighted imitation of the fleet's own successes: expert iteration / RFT). Pushing
    down a sampled pointer token moves its probability to every other cell, which no success asked for (yet
    successes only at 3e-4 drifted as fast: docs/history/curriculum.md, the pilots)."""
    return torch.where(advantages < 0, negative_weight * advantages, advantages)


def kl_to_reference(
    logp_all: torch.Tensor,  # (B, T, V) log pi_theta over the vocabulary, -inf outside the grammar
    ref_logp_all: torch.Tensor,  # (B, T, V) log pi_SFT, the same support
    mask: torch.Tensor,  # (B, T)
) -> torch.Tensor:
    """RefKL's regulariser: exact KL(pi_theta || pi_SFT) per position, averaged over the masked positions."""
    # Outside the support both are -inf: zero them *before* the arithmetic, so neither the value nor the
    # gradient meets -inf - -inf (a torch.where after it would still back-propagate 0 * nan = nan).
    support = torch.isfinite(logp_all)  # (B, T, V)
    logp = torch.where(support, logp_all, torch.zeros_like(logp_all))
    ref = torch.where(support, ref_logp_all, torch.zeros_like(ref_logp_all))
    terms = logp.exp() * (logp - ref) * support  # (B, T, V); 0 log 0 = 0
    return masked_mean(terms.sum(-1), mask)


def databc_loss(logp_demo: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DataBC's regulariser: -log pi_theta of the demonstrations' tokens. (B, T), (B, T) -> scalar."""
    return masked_mean(-logp_demo, mask)


def guidance_beta(n: int, beta0: float, warmup: int, anneal: int) -> float:
    """The offline-guidance weight after n environment steps: beta0 for `warmup`, then linearly to 0 over `anneal`."""
    if n < warmup:
        return beta0
    if anneal <= 0:
        return 0.0
    return beta0 * max(0.0, 1.0 - (n - warmup) / anneal)


def entropy_over_support(logp_all: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean entropy of pi at the masked positions, over the grammar's support. (B, T, V), (B, T) -> scalar."""
    support = torch.isfinite(logp_all)
    logp = torch.where(support, logp_all, torch.zeros_like(logp_all))
    return masked_mean(-(logp.exp() * logp * support).sum(-1), mask)


def state_value_advantages(
    rewards: torch.Tensor,  # (N,) r_t of each step, rows in episode, step order
    states: torch.Tensor,  # (N,) the state each step acted in (one id per distinct state of its group)
    ends: torch.Tensor,  # (N,) bool: the episode's last step
    groups: torch.Tensor,  # (N,) the step's group (rollouts of one task and seed)
    gamma: float,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-step credit from Monte-Carlo state values over a group's rollouts -> (N,).

    G_t = r_t + gamma G_{t+1} within each episode; V(s) = mean G over the steps acting in s; Q_t = r_t +
    gamma V(s_{t+1}) (r_t at an episode's last step); A_t = (Q_t - V(s_t)) / std of the group's episode
    returns G_0 (population), 0 for a group whose episodes all returned alike. A step every rollout of the
    group took alike, into one next state, gets Q = V: no credit either way."""
    n = len(rewards)
    returns = torch.zeros(n, dtype=torch.float64)
    for i in reversed(range(n)):
        returns[i] = rewards[i] + (0.0 if ends[i] else gamma * returns[i + 1])
    _, inverse, counts = torch.unique(states, return_inverse=True, return_counts=True)
    values = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inverse, returns) / counts  # (S,)
    value = values[inverse]  # (N,) V(s_t)
    next_value = torch.zeros(n, dtype=torch.float64)
    next_value[:-1] = value[1:]
    q = rewards.double() + torch.where(ends, torch.zeros_like(next_value), gamma * next_value)  # (N,)
    firsts = torch.cat([torch.tensor([True]), ends[:-1]])  # (N,) an episode's first step
    spread = torch.zeros(n, dtype=torch.float64)
    for g in torch.unique(groups):
        in_group = groups == g
        spread[in_group] = returns[firsts & in_group].std(unbiased=False) if (firsts & in_group).sum() > 1 else 0.0
    return torch.where(spread > eps, (q - value) / (spread + eps), torch.zeros_like(q)).float()


# Semi-online RL (UI-S1, arXiv 2509.11543): rollouts over expert trajectories, one step reward per step.


def semi_online_step_reward(well_formed: torch.Tensor, action_score: torch.Tensor) -> torch.Tensor:
    """r_t = 0.1 * well_formed + 0.9 * action_score.  (N,), (N,) -> (N,)

    action_score: 1 the expert's action exactly (a click inside its element's box, the same text or key),
    0.5 the right action type only, 0.1 an action that parses but is of another type, 0 none parses."""
    return 0.1 * well_formed + 0.9 * action_score


def semi_online_returns(rewards: torch.Tensor, matched: torch.Tensor, gamma: float = 0.5) -> torch.Tensor:
    """Discounted returns of one rollout, G_t = r_t + gamma * G_{t+1}, cut at every mismatch.

    rewards (T,), matched (T,) bool -> (T,). A mismatched step's return is its own reward, and the running
    return restarts at 0 there: the steps before it get no credit for what followed a patched history."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros((), dtype=rewards.dtype)
    for t in reversed(range(len(rewards))):
        if matched[t]:
            running = rewards[t] + gamma * running
            returns[t] = running
        else:
            running = torch.zeros((), dtype=rewards.dtype)
            returns[t] = rewards[t]
    return returns


def semi_online_advantages(
    step_returns: torch.Tensor,
    step_groups: torch.Tensor,
    episode_returns: torch.Tensor,
    episode_groups: torch.Tensor,
    step_weight: float = 1.0,
    episode_weight: float = 1.0,
) -> torch.Tensor:
    """A_t = step_weight * z(G_t within (task, step index)) + episode_weight * z(R within the task's rollouts),
    z the standardisation of group_advantages. All (N,) per step: episode_returns is each step's rollout total."""
    step_term = group_advantages(step_returns, step_groups)
    return step_weight * step_term + episode_weight * group_advantages(episode_returns, episode_groups)


def informative_groups(first_returns: torch.Tensor, groups: torch.Tensor, min_std: float = 1e-6) -> torch.Tensor:
    """The group ids to keep: those whose rollouts' step-0 returns spread more than `min_std` (population
    std). first_returns (R,) one per rollout, groups (R,) -> (G',) the kept ids, sorted."""
    ids, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    means = torch.zeros(len(ids), dtype=first_returns.dtype).index_add_(0, inverse, first_returns) / counts
    variances = (
        torch.zeros(len(ids), dtype=first_returns.dtype).index_add_(0, inverse, (first_returns - means[inverse]) ** 2)
        / counts
    )
    return ids[variances.sqrt() > min_std]
