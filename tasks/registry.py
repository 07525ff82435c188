"""The champion in MLflow's model registry: logged as a pyfunc model, registered with tags saying what it is,
and the ``champion`` alias moved to it as ``champion.promote`` says.

:class:`ModelRegistry` holds :class:`tasks.tracker.Tracker`'s registry methods; :func:`champion_io` gives the
logged model its typed signature and input example.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow

CHAMPION_ALIAS = "champion"

# the pyfunc's code per experiment kind (default champion_model.py)
CHAMPION_CODE = {"llm": "champion_llm.py", "language": "champion_language.py"}


def champion_requirements(kind: str, torch_version: str) -> list[str]:
    """The champion's pip requirements (given, so MLflow does not infer them: seconds saved per log)."""
    reqs = ["agilerl-flow", f"torch=={torch_version.split('+')[0]}"]
    if kind == "llm":
        from importlib.metadata import version

        reqs += [f"{name}=={version(name)}" for name in ("transformers", "peft", "tokenizers")]
    return reqs


def _float(text: str | float | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except (TypeError, ValueError):
        return None


class ModelRegistry:
    """The model registry methods of :class:`tasks.tracker.Tracker` (a mixin: they use the tracker's `cfg`,
    `client`, `uri`, `run_id`, `parent_id` and :meth:`~tasks.tracker.Tracker.version_tags`)."""

    def registered_version(self):
        """The model version this run registered already (None if none): a delivery after a failed ending must not
        register a second one."""
        if not self.cfg.tracking.register_model:
            return None
        name = self.cfg.tracking.model_name or self.cfg.name
        try:
            found = self.client.search_model_versions(f"name='{name}' and run_id='{self.parent_id}'")
        except mlflow.exceptions.MlflowException:
            return None
        return found[0] if found else None

    def log_champion(self, member_dir: Path, summary: dict[str, Any], signature: Any = None,
                     input_example: Any = None) -> dict[str, Any]:
        """Log the chosen champion (``summary["champion"]``) as a pyfunc model (code + safetensors checkpoint)
        with its typed `signature` (:func:`champion_signature`) and an `input_example` (:func:`champion_example`),
        register it with tags saying what it is, and move the ``champion`` alias to it as ``champion.promote``
        says (:meth:`promote`)."""
        import torch

        name = self.cfg.tracking.model_name or self.cfg.name
        fitness = (summary.get("champion") or {}).get("fitness", summary.get("best_fitness"))
        code = str(Path(__file__).with_name(CHAMPION_CODE.get(self.cfg.kind, "champion_model.py")))
        mlflow.set_tracking_uri(self.uri)
        with mlflow.start_run(run_id=self.parent_id), _registration_lines_muted():
            info = mlflow.pyfunc.log_model(
                name="champion", python_model=code, artifacts={"member": str(member_dir)},
                pip_requirements=champion_requirements(self.cfg.kind, torch.__version__),
                registered_model_name=name if self.cfg.tracking.register_model else None,
                signature=signature, input_example=input_example,
                step=int(summary.get("generations", 1)) - 1,  # links the final generation's metrics
                metadata={"fitness": fitness, "run_id": self.run_id})
        out: dict[str, Any] = {"model_uri": info.model_uri}
        if self.cfg.tracking.register_model:
            version = str(info.registered_model_version)
            for key, value in self.version_tags(fitness).items():
                self.client.set_model_version_tag(name, version, key, value)
            out.update(registered_model=name, version=version,
                       **self.promote(name, version, fitness, (summary.get("champion") or {}).get("input_fitness")))
        return out

    def promote(self, name: str, version: str, fitness: float | None, input_fitness: float | None = None
                ) -> dict[str, Any]:
        """Move ``NAME@champion`` to `version` as ``champion.promote`` says: ``always``; ``never``; ``if_better``
        (the default): only when `fitness` beats the ``agilerl.fitness`` tag of the version the alias points at
        (a version without one, or no alias yet, is beaten by any finite fitness); ``if_beats_input``: only when
        `fitness` beats `input_fitness`, what the run started from on the same seeds. Returns what happened."""
        policy = self.cfg.champion.promote
        try:
            current = self.client.get_model_version_by_alias(name, CHAMPION_ALIAS)
        except mlflow.exceptions.MlflowException:
            current = None
        held = None if current is None else _float(current.tags.get("agilerl.fitness"))
        if current is not None and current.version == version:
            promoted, why = True, "it holds the alias already"
        elif policy == "never":
            promoted, why = False, "champion.promote is never"
        elif policy == "always":
            promoted, why = True, "champion.promote is always"
        elif fitness is None or not math.isfinite(fitness):
            promoted, why = False, "its fitness is not a number"
        elif policy == "if_beats_input":
            bar = _float(input_fitness)
            if bar is None or not math.isfinite(bar):
                promoted, why = False, "what the run started from was not scored"
            else:
                promoted = fitness > bar
                why = f"fitness {fitness:.2f} {'beats' if promoted else 'does not beat'} its input's {bar:.2f}"
        elif current is None or held is None or not math.isfinite(held):
            promoted, why = True, "no champion with a recorded fitness yet"
        elif fitness > held:
            promoted, why = True, f"fitness {fitness:.2f} beats the champion's (version {current.version}) {held:.2f}"
        else:
            promoted, why = False, (f"fitness {fitness:.2f} does not beat the champion's (version {current.version}) "
                                    f"{held:.2f}")
        if promoted:
            self.client.set_registered_model_alias(name, CHAMPION_ALIAS, version)
        champion = version if promoted else (current.version if current is not None else None)
        return {"promoted": promoted, "promotion": f"{'promoted' if promoted else 'not promoted'}: {why}",
                "champion_version": champion,
                "champion_uri": f"models:/{name}@{CHAMPION_ALIAS}" if champion is not None else None}


def champion_io(arena) -> tuple[Any, Any]:
    """(signature, input example) of an arena's champion: observations to actions for RL members, prompt texts
    to completion texts for LLM members."""
    if arena.kind == "llm":
        from mlflow.models import ModelSignature
        from mlflow.types.schema import ColSpec, Schema

        signature = ModelSignature(inputs=Schema([ColSpec("string", "prompt")]),
                                   outputs=Schema([ColSpec("string", "completion")]))
        import pandas as pd

        return signature, pd.DataFrame({"prompt": list(arena.eval_data.prompts[:2])})
    if arena.kind == "language":
        import pandas as pd
        from mlflow.models import ModelSignature
        from mlflow.types.schema import ColSpec, Schema

        signature = ModelSignature(inputs=Schema([ColSpec("string", "transcript")]),
                                   outputs=Schema([ColSpec("string", "guess")]))
        return signature, pd.DataFrame({"transcript": ["", arena.games[0].transcript[:12]]})
    return champion_signature(arena.obs_space, arena.act_space), champion_example(arena.obs_space)


def champion_signature(obs_space, act_space) -> Any:
    """The champion's typed MLflow signature: a batch of observations in (one named tensor per key of a Dict
    space; per agent for a team), the greedy actions out (ints for Discrete, floats in the env's bounds for
    Box; a dict of them, one per agent, for a team: `act_space` is then a dict of spaces)."""
    import numpy as np
    from gymnasium import spaces
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Schema, TensorSpec

    def spec(space, name=None, action=False) -> TensorSpec:
        if isinstance(space, spaces.Discrete):
            return TensorSpec(np.dtype(np.int64), (-1,), name)
        dtype = np.dtype(np.uint8) if space.dtype == np.uint8 and not action else np.dtype(np.float32)
        return TensorSpec(dtype, (-1, *space.shape), name)

    def schema(space, action=False) -> Schema:
        named = space.spaces if isinstance(space, spaces.Dict) else space if isinstance(space, dict) else None
        if named is not None:
            return Schema([spec(s, k, action) for k, s in named.items()])
        return Schema([spec(space, action=action)])

    return ModelSignature(inputs=schema(obs_space), outputs=schema(act_space, action=True))


def champion_example(obs_space) -> Any:
    """A batch of two observations drawn from the space (seeded): the champion's input example, so the
    MLflow UI shows what the model takes and MLflow checks it against the signature when logging."""
    import numpy as np
    from gymnasium import spaces

    obs_space.seed(0)
    draws = [obs_space.sample() for _ in range(2)]
    if isinstance(obs_space, spaces.Dict):
        return {k: np.stack([np.asarray(d[k]) for d in draws]) for k in obs_space.spaces}
    return np.stack([np.asarray(d) for d in draws])


@contextlib.contextmanager
def _registration_lines_muted() -> Iterator[None]:
    """MLflow prints "Successfully registered model ..." and "Created version ..." itself (straight to stderr, not
    through a logger): muted while the champion registers when MLflow's logger is quieter than INFO (the CLI
    without --verbose); the run's end line says what was registered."""
    from mlflow.tracking._model_registry import fluent

    original = getattr(fluent, "eprint", None)
    if original is None or logging.getLogger("mlflow").getEffectiveLevel() <= logging.INFO:
        yield
        return
    fluent.eprint = lambda *args, **kwargs: None
    try:
        yield
    finally:
        fluent.eprint = original
