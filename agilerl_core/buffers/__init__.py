"""Replay buffers."""

from agilerl_core.buffers.replay import FieldSpec, ReplayBuffer, Shard, Transition, transition_fields

__all__ = ["FieldSpec", "ReplayBuffer", "Shard", "Transition", "transition_fields"]
