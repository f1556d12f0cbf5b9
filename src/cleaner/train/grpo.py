"""GRPO with the DAPO refinements, as plain functions: advantages, reward shaping, losses.

Top to bottom it follows one training step:

1. `overlong_penalty`       DAPO's soft length penalty, added to the outcome reward;
2. `informative_groups`     DAPO's dynamic sampling: groups whose rewards all agree teach nothing;
3. `group_advantages`       GRPO: each reward against its group's mean, in units of the group's std;
4. `graft_weights`          what to do with tokens SAAR grafted in (CLEANER): train on them as
                            on-policy (`recompute`, the paper), leave them out (`mask_grafts`), or
                            reweight them by a truncated importance ratio (`behavior_is`);
5. `policy_loss`            the clipped surrogate with clip-higher and dual clip, token-mean;
6. `kl_penalty`, `entropy`  optional regularisers; `sft_loss` is the imitation-only control.

Steps 1-3 are pure Python (no torch); the rest work on [batch, time] tensors with a 0/1 loss mask.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Literal

import torch

GraftMode = Literal["recompute", "mask_grafts", "behavior_is"]
LossAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]

# --- 1-3: rewards to advantages (pure) -------------------------------------------------------------


def overlong_penalty(
    response_length: int, max_length: int, buffer: int, penalty: float = 1.0
) -> float:
    """DAPO overlong reward shaping: 0 up to `max_length - buffer` tokens, then falling linearly to
    `-penalty` at `max_length` (and staying there)."""
    if buffer <= 0:
        return 0.0
    exceed = response_length - (max_length - buffer)
    return -penalty * min(max(exceed / buffer, 0.0), 1.0)


def _by_group(values: Sequence[float], groups: Sequence[Hashable]) -> dict[Hashable, list[float]]:
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} rewards for {len(groups)} group ids")
    out: dict[Hashable, list[float]] = defaultdict(list)
    for v, g in zip(values, groups, strict=True):
        out[g].append(v)
    return out


def informative_groups(rewards: Sequence[float], groups: Sequence[Hashable]) -> set[Hashable]:
    """Groups whose rewards are not all equal: the only ones with a non-zero GRPO advantage."""
    return {g for g, rs in _by_group(rewards, groups).items() if max(rs) != min(rs)}


def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> list[float]:
    """GRPO advantages: `(r - mean(group)) / (std(group) + eps)` (std with Bessel's correction, as
    verl). A group of one, or one whose rewards are all equal, gets advantage 0: no relative signal."""
    stats = {}
    for g, rs in _by_group(rewards, groups).items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1)) if len(rs) > 1 else 0.0
        stats[g] = (mean, std, len(rs))
    out = []
    for r, g in zip(rewards, groups, strict=True):
        mean, std, n = stats[g]
        if n == 1 or std == 0.0:
            out.append(0.0)
        else:
            out.append((r - mean) / (std + eps) if scale_by_std else r - mean)
    return out


# --- 4: grafted tokens -------------------------------------------------------------------------------


def graft_weights(
    mode: GraftMode,
    graft_mask: torch.Tensor,
    old_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor | None = None,
    is_cap: float = 2.0,
) -> torch.Tensor:
    """Per-token loss weights for the graft option (SPEC section 2).

    `recompute`: 1 everywhere (grafted tokens count as on-policy, as the paper does). `mask_grafts`:
    0 on grafted tokens. `behavior_is`: on grafted tokens, `min(exp(old - behavior), is_cap)`, where
    `old` are the log-probs recomputed in the purified context and `behavior` those the correction
    was sampled with (error in context); 1 elsewhere.
    """
    ones = torch.ones_like(old_logprobs)
    if mode == "recompute":
        return ones
    if mode == "mask_grafts":
        return ones * (1 - graft_mask)
    if mode == "behavior_is":
        if behavior_logprobs is None:
            raise ValueError("behavior_is needs the sampling log-probs of the grafted tokens")
        ratio = torch.exp(old_logprobs - behavior_logprobs).clamp(max=is_cap)
        return torch.where(graft_mask.bool(), ratio, ones).detach()
    raise ValueError(f"unknown graft mode {mode!r}")


# --- 5-6: losses -------------------------------------------------------------------------------------


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggregation = "token-mean",
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    `token-mean` (DAPO) weights every token of the mini-batch equally. Under gradient accumulation,
    pass the mini-batch's `total_tokens` (or `total_sequences`) so that micro-batch losses sum to the
    mini-batch mean instead of averaging per micro-batch.
    """
    if mode == "token-mean":
        denom = total_tokens if total_tokens is not None else mask.sum().clamp(min=1)
        return (values * mask).sum() / denom
    per_seq_tokens = mask.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = (values * mask).sum(-1) / per_seq_tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        per_seq = (values * mask).sum(-1)
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}")
    denom = total_sequences if total_sequences is not None else max(per_seq.shape[0], 1)
    return per_seq.sum() / denom


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 10.0,
    weights: torch.Tensor | None = None,
    aggregation: LossAggregation = "token-mean",
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip surrogate with clip-higher (DAPO) and dual clip, on [batch, time] tensors.

    ratio = exp(logprobs - old_logprobs); per token the loss is max(-A ratio, -A clip(ratio,
    1 - clip_low, 1 + clip_high)), and for A < 0 it is capped at -A dual_clip, so a token whose ratio
    exploded cannot dominate. `advantages` is [batch] (one per trajectory) or [batch, time].
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(loss, dtype=torch.bool)
    if dual_clip is not None:
        cap = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
    if weights is not None:
        loss = loss * weights
    value = aggregate(loss, mask, aggregation, total_tokens, total_sequences)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "clip_fraction": float(((clipped > unclipped).float() * mask).sum() / n),
            "dual_clip_fraction": float((dual_clipped.float() * mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
            "approx_kl": float(((old_logprobs - logprobs) * mask).sum() / n),
        }
    return value, stats


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(policy || reference), the non-negative low-variance "k3" estimator."""
    log_ratio = (ref_logprobs - logprobs).clamp(-20, 20)
    return torch.exp(log_ratio) - log_ratio - 1


def token_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature): the distribution the sampler drew from."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token entropy of softmax(logits / temperature)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def sft_loss(
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    aggregation: LossAggregation = "token-mean",
    total_tokens: float | None = None,
    total_sequences: float | None = None,
) -> torch.Tensor:
    """Plain likelihood on the (purified) trajectories, no advantages: the control that tells whether
    CLEANER's gains come from the RL signal or from imitating corrected code."""
    return aggregate(-logprobs, mask, aggregation, total_tokens, total_sequences)


def graft_logprob_shift(
    old_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, graft_mask: torch.Tensor
) -> float:
    """Mean |log p(purified context) - log p(error context)| over grafted tokens: how off-policy the
    grafts are (a reviewer's question); NaN when there are no grafted tokens."""
    n = graft_mask.sum()
    if n == 0:
        return float("nan")
    return float(((old_logprobs - behavior_logprobs).abs() * graft_mask).sum() / n)
