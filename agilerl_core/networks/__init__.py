"""Evolvable networks whose mutations keep trained weights."""

from agilerl_core.networks.arch_mutation import LAYER_MUTATIONS, NODE_MUTATIONS, propose_mutation, with_activation
from agilerl_core.networks.cnn import CNNSpec, EvolvableCNN
from agilerl_core.networks.evolvable import ArchBounds, ArchSpec, EvolvableNetwork, initial_arch
from agilerl_core.networks.mlp import EvolvableMLP, MLPSpec

__all__ = ["LAYER_MUTATIONS", "NODE_MUTATIONS", "ArchBounds", "ArchSpec", "CNNSpec", "EvolvableCNN",
           "EvolvableMLP", "EvolvableNetwork", "MLPSpec", "initial_arch", "propose_mutation", "with_activation"]
