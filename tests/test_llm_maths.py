"""The LLM algorithms' maths on hand-built numbers: group and leave-one-out advantages, token GAE and the clipped
value loss, GRPO's clipped ratio with beta k3, the k3 estimator, the DPO loss."""

from __future__ import annotations

import math

import pytest
import torch

from agilerl_core.llm.dpo import dpo_loss
from agilerl_core.llm.grpo import group_advantages, grpo_token_loss, k3_kl


# ---- the maths on hand-built numbers ---------------------------------------------------------------------------
def test_group_advantages_are_normalised_within_each_group():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(r, 4)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-3)  # mean .5, std .5
    assert torch.equal(adv[4:], torch.zeros(4))  # equal rewards teach nothing


def test_rloo_advantages_leave_each_completion_out_of_its_own_baseline():
    from agilerl_core.llm.reinforce import rloo_advantages

    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 3.0])  # two groups of 3
    adv = rloo_advantages(r, 3)
    # group 1: 1 - (0+0)/2 = 1, 0 - (1+0)/2 = -0.5, -0.5; group 2: 1 - 6/2 = -2, 3 - 4/2 = 1, 1
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, -2.0, 1.0, 1.0]))
    # RLOO = k/(k-1) (r - group mean): no division by the group's std, unlike GRPO's
    assert not torch.allclose(adv, group_advantages(r, 3))
    g = r.reshape(2, 3)
    assert torch.allclose(adv, (1.5 * (g - g.mean(1, keepdim=True))).reshape(-1))
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.ones(4), 1)


def test_token_gae_and_the_clipped_value_loss_on_hand_computed_numbers():
    from agilerl_core.llm.ppo import clipped_value_loss, token_gae

    # two completions: 3 tokens (reward 1 on the last, -0.1 KL penalty on the first) and 1 token (reward 2)
    r = torch.tensor([[-0.1, 0.0, 1.0], [2.0, 0.0, 0.0]])
    v = torch.tensor([[0.5, 0.6, 0.7], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, ret = token_gae(r, v, mask, gamma=1.0, lam=0.5)
    d2 = 1.0 - 0.7                  # last token: no value after it
    d1 = 0.0 + 0.7 - 0.6
    d0 = -0.1 + 0.6 - 0.5
    a1 = d1 + 0.5 * d2
    a0 = d0 + 0.5 * a1
    assert torch.allclose(adv[0], torch.tensor([a0, a1, d2]))
    assert torch.allclose(adv[1], torch.tensor([1.0, 0.0, 0.0])) and torch.allclose(ret, (adv + v) * mask)
    vl = clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]), 0.2)
    assert float(vl) == pytest.approx(0.5 * max(1.0, (0.7 - 2.0) ** 2))  # the clipped value is further: it counts
    assert float(clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]), None)) == 0.5


def test_grpo_token_loss_clips_the_ratio_and_adds_beta_k3():
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.8, 0.5], [0.2, 0.5]]))  # ratios 1.6 / 1 and 0.4 / 1
    adv = torch.tensor([1.0, -1.0])
    loss = grpo_token_loss(logp, old, None, adv, clip=0.2, beta=0.0)
    # positive advantage: min(1.6, 1.2) * 1 -> -1.2; negative: min(-0.4, -0.8) -> 0.8
    assert torch.allclose(loss, torch.tensor([[-1.2, -1.0], [0.8, 1.0]]), atol=1e-6)
    ref = torch.log(torch.tensor([[0.4, 0.5], [0.4, 0.5]]))
    with_kl = grpo_token_loss(logp, old, ref, adv, clip=0.2, beta=0.1)
    assert torch.allclose(with_kl - loss, 0.1 * k3_kl(logp, ref))
    # the gradient of the unclipped token flows, that of the clipped one does not
    lp = logp.clone().requires_grad_(True)
    grpo_token_loss(lp, old, None, adv, 0.2, 0.0).sum().backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] == pytest.approx(-1.0) and lp.grad[1, 0] == 0


def test_k3_is_the_kl_estimator():
    logp, ref = torch.log(torch.tensor([0.3, 0.5])), torch.log(torch.tensor([0.6, 0.5]))
    expected = [0.6 / 0.3 - math.log(0.6 / 0.3) - 1, 0.0]
    assert torch.allclose(k3_kl(logp, ref), torch.tensor(expected), atol=1e-6)
    # in expectation over the policy it is KL(policy || ref): two outcomes, sampled exactly
    p, q = torch.tensor([0.3, 0.7]), torch.tensor([0.6, 0.4])
    assert float((p * k3_kl(p.log(), q.log())).sum()) == pytest.approx(float((p * (p / q).log()).sum()), abs=1e-6)


def test_dpo_loss_is_its_formula():
    pc, pr, rc, rr = (torch.tensor([v]) for v in (-3.0, -5.0, -4.0, -4.5))
    beta = 0.3
    margin = (-3.0 + 4.0) - (-5.0 + 4.5)
    assert float(dpo_loss(pc, pr, rc, rr, beta)) == pytest.approx(math.log1p(math.exp(-beta * margin)), rel=1e-6)


def test_gspo_clips_whole_completions_by_their_geometric_mean_ratio():
    """Known answer: each completion's ratio is exp of the mean of its tokens' log-ratios (padding ignored); a
    completion whose clipped term is the smaller loses its whole gradient, an unclipped one spreads -A s / len over
    its tokens; completions weigh alike (the mean over them)."""
    from agilerl_core.algorithms.hyperparameters.llm import GSPOHyperparameters
    from agilerl_core.llm.gspo import GSPO, gspo_sequence_loss

    d = torch.tensor([[0.1, 0.2, 0.3], [-0.2, 0.0, 5.0]])  # logp - old_logp; row 1's third token is padding
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    s = torch.exp(torch.tensor([0.2, -0.1]))  # 1.2214 (above 1 + 0.1: clipped), 0.9048 (inside [0.9, 1.1])
    old = torch.zeros(2, 3)
    logp = d.clone().requires_grad_(True)
    per = gspo_sequence_loss(logp, old, adv, mask, 0.1)
    torch.testing.assert_close(per, torch.stack([-1.1 * adv[0], -s[1] * adv[1]]))
    hp = GSPOHyperparameters(clip=0.1, beta=0.0)
    loss = GSPO.piece_loss(logp, old, None, adv, mask, hp, ntok=5, nseq=2)
    loss.backward()
    expected = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]) * (-adv[1] * s[1] / 2 / 2)
    torch.testing.assert_close(logp.grad, expected)
    assert GSPOHyperparameters().clip == 4e-4


def test_cispo_truncates_and_detaches_the_weight_and_keeps_every_tokens_gradient():
    """Known answer: the loss is -min(r, 1 + c) A log pi per token with the weight detached, so a token whose ratio
    is far above the range (which GRPO's clip would silence) still gets gradient -(1 + c) A / ntok."""
    from agilerl_core.algorithms.hyperparameters.llm import CISPOHyperparameters
    from agilerl_core.llm.cispo import CISPO, cispo_token_loss
    from agilerl_core.llm.grpo import grpo_token_loss

    old = torch.log(torch.tensor([[0.5, 0.1, 0.4]]))
    new = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))  # ratios 1, 3 (truncated to 1.28), 0.5 (no lower bound)
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 3)
    weight = torch.tensor([[1.0, 1.28, 0.5]])
    torch.testing.assert_close(cispo_token_loss(new, old, adv, 0.28), -weight * 2.0 * new, rtol=1e-5, atol=1e-6)
    logp = new.clone().requires_grad_(True)
    CISPO.piece_loss(logp, old, None, adv, mask, CISPOHyperparameters(beta=0.0), ntok=3, nseq=1).backward()
    torch.testing.assert_close(logp.grad, -weight * 2.0 / 3, rtol=1e-5, atol=1e-6)
    grpo = new.clone().requires_grad_(True)
    (grpo_token_loss(grpo, old, None, adv, 0.28, 0.0).sum() / 3).backward()
    assert grpo.grad[0, 1] == 0.0 and logp.grad[0, 1] != 0.0  # GRPO's clip silences it; CISPO does not
