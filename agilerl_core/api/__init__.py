"""The Python API: evolve a population in this process, load any saved member, act with it.

    import agilerl_core as ac

    result = ac.evolve("deployments/configs/cartpole_dqn.yaml", env=MyEnv, overrides={"max_env_steps": 20_000})
    action = result.best.predict(obs)                          # the best member ever (result.elite: the last)
    champion = ac.load("runs/cartpole-dqn-latest/best")        # the newest run of that name; or s3://.../elite

:func:`evolve` is the engine's in-process loop (no Prefect, no MLflow: ``flows.run`` is the same run as a
tracked Prefect flow). :func:`load` reads a checkpoint as data (safetensors + JSON, checksums verified,
nothing it names imported or called). :class:`Callback` hooks the loop per member and per generation.
"""

from agilerl_core.api.callbacks import Callback
from agilerl_core.api.evolving import EvolveResult, evolve
from agilerl_core.api.policy import Policy, load

__all__ = ["Callback", "EvolveResult", "Policy", "evolve", "load"]
