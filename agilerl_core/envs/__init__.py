"""Env construction and space handling."""

from agilerl_core.envs.make import check_env_id, make_env, make_vector_env, probe_spaces
from agilerl_core.envs.spaces import Obs, ObsPart, ObsSpec, action_dim

__all__ = ["Obs", "ObsPart", "ObsSpec", "action_dim", "check_env_id", "make_env", "make_vector_env",
           "probe_spaces"]
