"""A language agent champion as an MLflow pyfunc model, logged as code (nothing pickled): its one artifact is
the member checkpoint directory (safetensors + JSON), loaded through
:func:`agilerl_core.arenas.language.load_language_member` (checksums verified, the algorithm looked up by name in
the fixed registry, the architecture checked against the limits before anything is built).

``predict`` takes Wordle transcripts (a list, a DataFrame or a dict with a ``transcript`` column: whole turns
``guess feedback\\n``, possibly none) and returns the greedy next guess for each.
"""

from __future__ import annotations

import mlflow
from mlflow.pyfunc import PythonModel


class ChampionLanguage(PythonModel):
    def load_context(self, context) -> None:
        from agilerl_core.arenas.language import load_language_member

        self.member, self.env = load_language_member(context.artifacts["member"])

    def predict(self, context, model_input, params=None):
        """The next guess after each transcript."""
        from agilerl_core.arenas.language import next_guesses

        column = model_input["transcript"] if hasattr(model_input, "to_dict") or isinstance(model_input, dict) \
            else model_input
        texts = [str(t) if t == t and t is not None else "" for t in column]  # an empty cell: a new game
        return {"guess": next_guesses(self.member, texts)}


mlflow.models.set_model(ChampionLanguage())
