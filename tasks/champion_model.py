"""The champion as an MLflow pyfunc model, logged as code (nothing pickled).

The model's one artifact is a member checkpoint directory (safetensors + JSON); loading it goes
through :func:`agilerl_core.io.checkpoint.load_member`, which verifies checksums and never unpickles.
``predict`` takes a batch of observations (an array, a DataFrame, or a dict of arrays for Dict
observation spaces) and returns the greedy actions as the env takes them (a Box's bounds applied).
"""

from __future__ import annotations

import mlflow
import numpy as np
import torch
from mlflow.pyfunc import PythonModel


class ChampionPolicy(PythonModel):
    def load_context(self, context) -> None:
        from agilerl_core.algorithms.acting import Acting
        from agilerl_core.algorithms.saved import load_member

        member, self.env = load_member(context.artifacts["member"])
        self.agent = member.agent
        self.acting = Acting(self.agent)  # the member's group of one, greedy

    def predict(self, context, model_input: np.ndarray, params=None):
        """Greedy actions for a batch of observations. `model_input` is an array (a dict of arrays, one per
        key, for a Dict observation space: what MLflow's tensor signature delivers; a DataFrame is read as
        one row per observation). The hint is np.ndarray because MLflow validates against the model's
        signature, not the hint, for that type. A served request is stateless: a recurrent policy starts each
        request from a fresh memory (each row its own env at its episode's first step)."""
        spec = self.agent.obs_spec
        self.acting.reset()
        if hasattr(model_input, "to_numpy"):  # a DataFrame: one row per observation
            model_input = model_input.to_numpy()
        if isinstance(model_input, dict):
            obs = {k: np.asarray(v) for k, v in model_input.items()}
        else:
            obs = np.asarray(model_input)
            shape = getattr(spec.space, "shape", None)
            if shape:
                obs = obs.reshape(-1, *shape)
        mask = params.get("action_mask") if params else None  # single-agent envs
        with torch.no_grad():
            actions = self.acting.env_action(spec.to_tensors(obs, self.agent.device),
                                             None if mask is None else np.asarray(mask, dtype=bool))
        return actions if isinstance(actions, dict) else np.asarray(actions)  # a team: one array per agent


mlflow.models.set_model(ChampionPolicy())
