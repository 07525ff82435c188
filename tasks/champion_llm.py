"""An LLM champion as an MLflow pyfunc model, logged as code (nothing pickled): its base model by reference,
its LoRA adapter as the one artifact.

The artifact is a member checkpoint directory (adapter in safetensors, JSON naming the base by path or config
and SHA-256). Loading rebuilds the base from that record and refuses a base whose weights hash differently
(:func:`agilerl_core.arenas.llm.load_llm_member`). ``predict`` takes prompt texts (a list, a DataFrame or a dict
with a ``prompt`` column) and returns the greedy completions, prompts rendered through the chat template when
the run used it. ``params``: ``max_new_tokens``, ``temperature``, ``seed``.
"""

from __future__ import annotations

import mlflow
from mlflow.pyfunc import PythonModel


class ChampionLLM(PythonModel):
    def load_context(self, context) -> None:
        from agilerl_core.arenas.llm import load_llm_member

        self.member, self.env = load_llm_member(context.artifacts["member"])

    def predict(self, context, model_input, params=None):
        """Completions for a batch of prompts."""
        column = model_input["prompt"] if hasattr(model_input, "to_dict") or isinstance(model_input, dict) \
            else model_input  # a DataFrame, {"prompt": [...]}, or a list of prompts
        prompts = [str(p) for cell in column for p in (cell if isinstance(cell, list | tuple) else [cell])]
        params = params or {}
        texts = self.member.generate(prompts, bool(self.env.get("chat_template")), params.get("max_new_tokens"),
                                     float(params.get("temperature", 0.0)), int(params.get("seed", 0)))
        return {"completion": texts}


mlflow.models.set_model(ChampionLLM())
