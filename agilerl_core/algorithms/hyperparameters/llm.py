"""Hyperparameters of the language-model algorithms (GRPO, REINFORCE, LLM-PPO, DPO): a population of LoRA adapters on one base.

Budgets of LLM experiments count training samples: GRPO completions (prompts x group_size), DPO preference
pairs."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from agilerl_core.algorithms.hyperparameters.base import BaseHyperparameters
from agilerl_core.algorithms.hyperparameters.language import ILQL_SPACE
from agilerl_core.hpo.space import HyperparameterSpace, HyperparameterSpec

LLM_LEARNING_RATE = HyperparameterSpec(min=1e-6, max=1e-1, kind="log", grow=1.5, shrink=1 / 1.5)


class LLMHyperparameters(BaseHyperparameters):
    """What GRPO and DPO share: the adapter's optimiser and the KL anchor to the base model."""

    fixed_fields: ClassVar[frozenset[str]] = frozenset({"max_new_tokens", "micro_batch_size", "generation_batch_size"})

    lr: float = Field(1e-4, gt=0, description="Adam learning rate of the member's LoRA adapter.")
    beta: float = Field(0.04, ge=0, description="GRPO: weight of the k3 KL penalty to the base model (0: no "
                                                "reference pass). DPO: the preference temperature.")
    batch_size: int = Field(8, ge=1, description="GRPO: prompts per learn step; DPO: preference pairs per step.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Clip the adapter's gradient norm (None: off).")
    micro_batch_size: int = Field(32, ge=1, description="Sequences per forward/backward pass (gradients are "
                                                        "accumulated over a step's micro-batches; memory, not maths).")


class GRPOHyperparameters(LLMHyperparameters):
    """Group Relative Policy Optimisation with verifiable rewards."""

    algorithm_name: ClassVar[str] = "grpo"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LLM_LEARNING_RATE,
        "beta": HyperparameterSpec(min=0.0, max=0.5, kind="float", grow=1.5, shrink=1 / 1.5),
        "group_size": HyperparameterSpec(min=2, max=32, kind="int", grow=1.5, shrink=1 / 1.5),
        "temperature": HyperparameterSpec(min=0.2, max=1.5, kind="float", grow=1.2, shrink=1 / 1.2),
    }

    group_size: int = Field(8, ge=2, description="Completions sampled per prompt (advantages are normalised "
                                                 "within each group).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of training completions (evaluation "
                                                      "is greedy).")
    max_new_tokens: int = Field(16, ge=1, description="Longest completion (tokens); generation stops at EOS.")
    generation_batch_size: int = Field(128, ge=1, description="Completions sampled together (one KV cache; larger "
                                                              "batches use the cores better, memory grows with it).")
    clip: float = Field(0.2, gt=0, lt=1, description="PPO-style ratio clip.")
    update_epochs: int = Field(1, ge=1, description="Gradient passes over each batch of completions.")


class REINFORCEHyperparameters(GRPOHyperparameters):
    """REINFORCE with a leave-one-out baseline (RLOO): GRPO's sampling and loss, each completion's advantage its
    reward minus the mean of its prompt's other completions' rewards."""

    algorithm_name: ClassVar[str] = "reinforce"

    group_size: int = Field(4, ge=2, description="Completions sampled per prompt (each one's baseline is the mean "
                                                 "reward of the others).")
    beta: float = Field(0.0, ge=0, description="Weight of the k3 KL penalty to the base model (0: no reference pass).")


class GSPOHyperparameters(GRPOHyperparameters):
    """GSPO: GRPO's sampling with the importance ratio and its clip per completion (the geometric mean of its
    tokens' ratios), each completion weighing the same."""

    algorithm_name: ClassVar[str] = "gspo"

    clip: float = Field(4e-4, gt=0, lt=1, description="Clip of each completion's sequence-level ratio: small, as "
                                                       "a geometric mean of token ratios stays close to 1 (the "
                                                       "paper's range: 3e-4 to 4e-4).")


class CISPOHyperparameters(GRPOHyperparameters):
    """CISPO: GRPO's sampling with each token's importance weight truncated from above and detached; every token
    keeps its gradient."""

    algorithm_name: ClassVar[str] = "cispo"

    clip: float = Field(0.28, gt=0, description="Upper truncation of each token's importance weight, min(ratio, "
                                                "1 + clip), detached; no lower bound (as the paper).")


class LLMPPOHyperparameters(GRPOHyperparameters):
    """PPO on completions: a value head on the adapted base, token-level GAE, clipped policy and value losses, the
    KL to the base as a per-token reward penalty."""

    algorithm_name: ClassVar[str] = "llm_ppo"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LLM_LEARNING_RATE,
        "beta": HyperparameterSpec(min=0.0, max=0.5, kind="float", grow=1.5, shrink=1 / 1.5),
        "temperature": HyperparameterSpec(min=0.2, max=1.5, kind="float", grow=1.2, shrink=1 / 1.2),
        "vf_coef": HyperparameterSpec(min=0.05, max=2.0, kind="float", grow=1.5, shrink=1 / 1.5),
    }

    group_size: int = Field(2, ge=1, description="Completions sampled per prompt (the value head is the baseline, "
                                                 "so one is enough).")
    beta: float = Field(0.05, ge=0, description="Per-token KL-to-base penalty in the reward (0: no reference pass "
                                                "unless kl_metric).")
    update_epochs: int = Field(2, ge=1, description="Passes over each batch of completions.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount over completion tokens.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda over completion tokens.")
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    value_clip: float | None = Field(0.2, gt=0, description="Clip the value's change around the rollout's (None: off).")
    norm_adv: bool = Field(True, description="Whiten the advantages over the member's completion tokens.")


class DPOHyperparameters(LLMHyperparameters):
    """Direct Preference Optimisation on chosen/rejected pairs."""

    algorithm_name: ClassVar[str] = "dpo"
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LLM_LEARNING_RATE,
        "beta": HyperparameterSpec(min=0.01, max=1.0, kind="log", grow=1.5, shrink=1 / 1.5),
    }

    beta: float = Field(0.1, gt=0, description="Preference temperature of the sigmoid loss.")
    nll_weight: float = Field(0.0, ge=0, description="Weight of an NLL term on the chosen completion (0: off).")


class LLMBCHyperparameters(LLMHyperparameters):
    """Behaviour cloning of recorded games (SFT on the players' guesses): the adapter's cross-entropy on the
    guess tokens only, the prompt and the env's feedback read as context."""

    algorithm_name: ClassVar[str] = "llm_bc"
    default_space: ClassVar[HyperparameterSpace] = {"lr": LLM_LEARNING_RATE}

    batch_size: int = Field(8, ge=1, description="Recorded games per learn step.")
    beta: float = Field(0.0, ge=0, description="Unused by llm_bc (llm_ilql: the weight of Q - V when acting).")
    max_new_tokens: int = Field(8, ge=1, description="Longest guess (tokens) when the member plays; generation stops "
                                                     "at EOS.")
    generation_batch_size: int = Field(64, ge=1, description="Games played together in evaluation (one KV cache).")


class SFTHyperparameters(LLMHyperparameters):
    """Supervised fine-tuning on (prompt, response) demonstrations: the adapter's cross-entropy on the response
    tokens only, the prompt read as context."""

    algorithm_name: ClassVar[str] = "sft"
    fixed_fields: ClassVar[frozenset[str]] = frozenset({"max_new_tokens", "micro_batch_size"})
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LLM_LEARNING_RATE,
        "batch_size": HyperparameterSpec(min=2, max=64, kind="int", grow=1.5, shrink=1 / 1.5),
    }

    lr: float = Field(2e-4, gt=0, description="Adam learning rate of the member's LoRA adapter.")
    batch_size: int = Field(8, ge=1, description="Demonstrations per learn step.")
    beta: float = Field(0.0, ge=0, description="Unused by sft.")
    max_new_tokens: int = Field(32, ge=1, description="Longest greedy answer in the sample table and when the "
                                                      "champion serves (tokens); generation stops at EOS.")


class LLMILQLHyperparameters(LLMBCHyperparameters):
    """Implicit Language Q-Learning (Snell et al., 2022) for a LoRA member: Q heads (two, and their soft targets)
    and a V head on the adapted model's last hidden states, over the base's whole token vocabulary; V by expectile
    regression on the target Q, Q by TD to the next guess token's V (the env's tokens skipped), a conservative term
    and the BC cross-entropy; acting takes the model's logits plus ``beta * (Q' - V)``."""

    algorithm_name: ClassVar[str] = "llm_ilql"
    fixed_fields: ClassVar[frozenset[str]] = LLMHyperparameters.fixed_fields | {"two_q"}
    default_space: ClassVar[HyperparameterSpace] = {
        "lr": LLM_LEARNING_RATE, **ILQL_SPACE,
        "beta": HyperparameterSpec(min=0.0, max=16.0, kind="float", grow=1.5, shrink=1 / 1.5),
    }

    beta: float = Field(1.0, ge=0, description="Acting: the model's logits plus beta * (Q' - V) (0: the BC policy).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount per guess token.")
    expectile: float = Field(0.7, gt=0, lt=1, description="V's expectile of the target Q (0.5: the mean).")
    cql_weight: float = Field(0.1, ge=0, description="Weight of the conservative term (logsumexp of Q over the "
                                                     "vocabulary minus Q of the data's token).")
    bc_weight: float = Field(1.0, ge=0, description="Weight of the cross-entropy on the guess tokens.")
    tau: float = Field(0.05, gt=0, le=1, description="Soft update rate of the target Q heads per learn step.")
    two_q: bool = Field(True, description="Two Q heads; targets and acting use their minimum (clipped double Q).")
