"""MADDPG and MATD3: a team (:mod:`.agent`), its population-batched learning (:mod:`.group`) and the sampling
maths both use (:mod:`.maths`)."""

from agilerl_core.algorithms.maddpg.agent import MADDPG, MATD3
from agilerl_core.algorithms.maddpg.group import MADDPGGroup
from agilerl_core.algorithms.maddpg.maths import gumbel_softmax, masked_logits

__all__ = ["MADDPG", "MATD3", "MADDPGGroup", "gumbel_softmax", "masked_logits"]
