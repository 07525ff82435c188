"""Mutations of a population member, drawn with given probabilities from a seeded generator."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from agilerl_core.hpo.space import HyperparameterSpace
from agilerl_core.networks.evolvable import (
    LAYER_MUTATIONS,
    NODE_MUTATIONS,
    ArchBounds,
    propose_mutation,
    with_activation,
)

if TYPE_CHECKING:
    from agilerl_core.algorithms.base import RLAlgorithm

MUTATION_KINDS = ("none", "architecture", "parameters", "activation", "rl_hp")


class Mutations:
    """Chooses and applies one mutation per member.

    Kinds and their relative weights: none, architecture (layer vs node share), parameter noise (a
    Gaussian with std `parameter_strength` times each weight tensor's std), activation, and an RL
    hyperparameter from the declared space.
    """

    def __init__(self, weights: dict[str, float], new_layer_share: float, parameter_strength: float,
                 space: HyperparameterSpace, bounds: ArchBounds) -> None:
        w = np.array([float(weights.get(k, 0.0)) for k in MUTATION_KINDS])
        if w.sum() <= 0:
            raise ValueError("at least one mutation weight must be positive")
        self.probs = w / w.sum()
        self.new_layer_share = new_layer_share
        self.parameter_strength = parameter_strength
        self.space = dict(space)
        self.bounds = bounds

    @classmethod
    def from_config(cls, mut, space: HyperparameterSpace, bounds: ArchBounds) -> Mutations:
        weights = {"none": mut.no_mutation, "architecture": mut.architecture, "parameters": mut.parameters,
                   "activation": mut.activation, "rl_hp": mut.rl_hp}
        return cls(weights, mut.new_layer_share, mut.parameter_strength, space, bounds)

    def choose(self, rng: np.random.Generator) -> str:
        return MUTATION_KINDS[int(rng.choice(len(MUTATION_KINDS), p=self.probs))]

    def mutate(self, agent: RLAlgorithm, rng: np.random.Generator) -> str:
        """Apply one randomly chosen mutation to `agent` in place; return what was done."""
        kind = self.choose(rng)
        if kind == "architecture":
            return self.architecture(agent, rng)
        if kind == "parameters":
            return self.parameters(agent, rng)
        if kind == "activation":
            return self.activation(agent, rng)
        if kind == "rl_hp":
            return self.rl_hp(agent, rng)
        return "none"

    def architecture(self, agent: RLAlgorithm, rng: np.random.Generator) -> str:
        layer = rng.random() < self.new_layer_share
        names = [n for n in (LAYER_MUTATIONS if layer else NODE_MUTATIONS)
                 if n.startswith("mlp.") or agent.arch.cnns]
        for i in rng.permutation(len(names)):
            proposal = propose_mutation(agent.arch, names[i], self.bounds, rng)
            if proposal is not None:
                arch, desc = proposal
                agent.apply_architecture(arch)
                return f"arch:{desc}"
        return "none(arch at bounds)"

    @torch.no_grad()
    def parameters(self, agent: RLAlgorithm, rng: np.random.Generator) -> str:
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        for name in agent.noise_networks or agent.online_networks:
            for p in agent.networks[name].parameters():
                if p.ndim >= 2 and p.numel() > 1:
                    noise = torch.randn(p.shape, generator=gen).to(p.device)
                    p.add_(noise * (self.parameter_strength * p.std()))
        return f"params:noise({self.parameter_strength})"

    def activation(self, agent: RLAlgorithm, rng: np.random.Generator) -> str:
        choices = [a for a in self.bounds.activation_choices if a != agent.arch.activation]
        if not choices:
            return "none(one activation)"
        act = str(rng.choice(choices))
        agent.apply_architecture(with_activation(agent.arch, act))
        return f"activation:{act}"

    def rl_hp(self, agent: RLAlgorithm, rng: np.random.Generator) -> str:
        if not self.space:
            return "none(empty hp space)"
        names = sorted(self.space)
        name = names[int(rng.integers(len(names)))]
        old = getattr(agent.hp, name)
        new = self.space[name].mutate(float(old), rng)
        agent.set_hyperparameter(name, new)
        return f"hp:{name}={new:.6g}"
