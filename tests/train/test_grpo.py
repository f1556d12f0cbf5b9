import math

import pytest
import torch

from cleaner.train.grpo import (
    aggregate,
    entropy,
    graft_logprob_shift,
    graft_weights,
    group_advantages,
    informative_groups,
    kl_penalty,
    overlong_penalty,
    policy_loss,
    sft_loss,
    token_logprobs,
)


def lp(*ratios):
    return torch.log(torch.tensor([ratios], dtype=torch.float64))


# --- advantages ------------------------------------------------------------------------------------


def test_group_advantages_by_hand():
    rewards = [1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
    groups = ["a", "a", "a", "a", "b", "b"]
    adv = group_advantages(rewards, groups, eps=0.0)
    std = math.sqrt(4 / 3)  # mean 0, squared deviations 4, Bessel: / 3
    assert adv[:4] == pytest.approx([1 / std, -1 / std, -1 / std, 1 / std])
    assert adv[4:] == [0.0, 0.0]  # all equal: no signal
    assert group_advantages(rewards, groups, scale_by_std=False)[:4] == [1.0, -1.0, -1.0, 1.0]
    assert group_advantages([0.7], ["solo"]) == [0.0]


def test_informative_groups_are_those_with_differing_rewards():
    assert informative_groups([1, 1, 0, 1, -1, -1], ["a", "a", "b", "b", "c", "c"]) == {"b"}
    with pytest.raises(ValueError, match="3 rewards for 2 group ids"):
        informative_groups([1, 2, 3], ["a", "b"])


@pytest.mark.parametrize(
    ("length", "expected"),
    [(100, 0.0), (6000, 0.0), (7000, -0.25), (8000, -0.5), (10000, -1.0), (12000, -1.0)],
)
def test_overlong_penalty_is_dapos_linear_ramp(length, expected):
    # max 10000 tokens, buffer 4000: free up to 6000, then -1 per 4000 tokens, capped at -penalty
    assert overlong_penalty(length, max_length=10000, buffer=4000, penalty=1.0) == pytest.approx(
        expected
    )
    assert overlong_penalty(length, 10000, 0) == 0.0


# --- policy loss -------------------------------------------------------------------------------------


def test_clip_higher_by_hand_for_a_positive_advantage():
    old = torch.zeros(1, 3, dtype=torch.float64)
    loss, stats = policy_loss(
        lp(1.5, 0.5, 1.1),
        old,
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
    )
    # ratio 1.5 clips at 1 + 0.28; 0.5 is below 1 - 0.2 but for A > 0 the min keeps -0.5; 1.1 is inside
    assert loss.item() == pytest.approx((-1.28 - 0.5 - 1.1) / 3)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)


def test_clip_low_and_dual_clip_by_hand_for_a_negative_advantage():
    old = torch.zeros(1, 3, dtype=torch.float64)
    loss, stats = policy_loss(
        lp(1.5, 0.5, 20.0),
        old,
        torch.tensor([-1.0], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
    )
    # 1.5: unclipped 1.5 > clipped 1.28 -> 1.5; 0.5: clipped 0.8 wins; 20: 20 capped by dual clip at 10
    assert loss.item() == pytest.approx((1.5 + 0.8 + 10.0) / 3)
    assert stats["dual_clip_fraction"] == pytest.approx(1 / 3)
    no_dual, _ = policy_loss(
        lp(1.5, 0.5, 20.0),
        old,
        torch.tensor([-1.0], dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.float64),
        dual_clip=None,
    )
    assert no_dual.item() == pytest.approx((1.5 + 0.8 + 20.0) / 3)


def test_token_mean_weights_tokens_not_sequences_and_masks_tool_tokens():
    logprobs = torch.log(
        torch.tensor([[1.1, 1.1, 9.0, 9.0], [0.9, 9.0, 9.0, 9.0]], dtype=torch.float64)
    )
    mask = torch.tensor(
        [[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64
    )  # 9.0: tool or padding tokens
    adv = torch.tensor([1.0, 2.0], dtype=torch.float64)
    loss, _ = policy_loss(logprobs, torch.zeros_like(logprobs), adv, mask)
    assert loss.item() == pytest.approx((-1.1 - 1.1 - 2 * 0.9) / 3)
    seq, _ = policy_loss(
        logprobs, torch.zeros_like(logprobs), adv, mask, aggregation="seq-mean-token-mean"
    )
    assert seq.item() == pytest.approx((-1.1 + -1.8) / 2)


def test_micro_batches_with_a_global_normaliser_sum_to_the_mini_batch_loss():
    torch.manual_seed(0)
    logprobs, old = torch.randn(4, 6) * 0.1, torch.randn(4, 6) * 0.1
    mask = (torch.rand(4, 6) > 0.3).float()
    adv = torch.randn(4)
    whole, _ = policy_loss(logprobs, old, adv, mask)
    parts = [
        policy_loss(
            logprobs[i : i + 2],
            old[i : i + 2],
            adv[i : i + 2],
            mask[i : i + 2],
            total_tokens=mask.sum(),
        )[0]
        for i in (0, 2)
    ]
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item())


def test_gradient_flows_only_through_unclipped_tokens():
    logprobs = lp(1.5, 1.1).clone().requires_grad_(True)
    loss, _ = policy_loss(
        logprobs,
        torch.zeros(1, 2, dtype=torch.float64),
        torch.tensor([1.0], dtype=torch.float64),
        torch.ones(1, 2, dtype=torch.float64),
    )
    loss.backward()
    assert logprobs.grad[0, 0].item() == 0.0  # clipped above 1.28
    assert logprobs.grad[0, 1].item() == pytest.approx(
        -1.1 / 2
    )  # d(-ratio)/dlogp = -ratio, over 2 tokens


# --- grafts ----------------------------------------------------------------------------------------


def test_graft_modes():
    graft = torch.tensor([[0.0, 1.0, 1.0]])
    old = torch.tensor([[-1.0, -0.5, -2.0]])
    behavior = torch.tensor([[-1.0, -2.0, -1.0]])
    assert graft_weights("recompute", graft, old).tolist() == [[1.0, 1.0, 1.0]]
    assert graft_weights("mask_grafts", graft, old).tolist() == [[1.0, 0.0, 0.0]]
    w = graft_weights("behavior_is", graft, old, behavior, is_cap=2.0)
    assert w[0].tolist() == pytest.approx([1.0, 2.0, math.exp(-1.0)])  # exp(1.5) truncated at 2
    with pytest.raises(ValueError):
        graft_weights("behavior_is", graft, old)
    assert graft_logprob_shift(old, behavior, graft) == pytest.approx((1.5 + 1.0) / 2)
    assert math.isnan(graft_logprob_shift(old, behavior, torch.zeros_like(graft)))


def test_mask_grafts_removes_grafted_tokens_from_the_loss():
    logprobs = lp(1.1, 1.2, 0.9)
    mask = torch.ones(1, 3, dtype=torch.float64)
    graft = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    w = graft_weights("mask_grafts", graft, logprobs)
    loss, _ = policy_loss(
        logprobs, torch.zeros_like(logprobs), torch.tensor([1.0], dtype=torch.float64), mask * w
    )
    assert loss.item() == pytest.approx((-1.1 - 0.9) / 2)


# --- the rest --------------------------------------------------------------------------------------


def test_kl_entropy_logprobs_sft():
    assert kl_penalty(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    assert kl_penalty(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == pytest.approx(
        math.exp(-1) + 1 - 1
    )
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    assert entropy(logits).item() == pytest.approx(math.log(4))
    logits = torch.tensor([[[2.0, 0.0]]])
    assert token_logprobs(logits, torch.tensor([[0]]), temperature=2.0).item() == pytest.approx(
        1 - math.log(math.exp(1) + 1)
    )
    assert sft_loss(torch.tensor([[-1.0, -3.0]]), torch.tensor([[1.0, 0.0]])).item() == 1.0
    assert (
        aggregate(
            torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 1.0]]), "seq-mean-token-sum"
        ).item()
        == 3.0
    )
