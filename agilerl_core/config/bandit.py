"""Contextual-bandit experiments (``kind: bandit``): members pull arms for contexts from a classification table
(``data``: one arm per class, reward 1 for the right arm) or from a Gymnasium env of your own (``env_id``: the
observation is the context, the action the arm, the reward the pull's)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from agilerl_core.algorithms.hyperparameters.bandit import NeuralUCBHyperparameters
from agilerl_core.code_refs import env_id_problem
from agilerl_core.config.common import DATA_CACHE, Location, _Strict
from agilerl_core.config.envs import _EnvExperimentBase
from agilerl_core.config.hyperparameters import _hyperparameter_union, algorithms_for_kind

BANDIT_ALGORITHMS = algorithms_for_kind("bandit")
BanditHyperparameters = _hyperparameter_union("bandit")


# sklearn:NAME is a table bundled with scikit-learn (never downloaded): it names no place
_TABLE = Location("the run reads its bandit's table from there with the worker's credentials", no_place=("sklearn:",))


class BanditDataConfig(_Strict):
    """A classification table turned into a bandit: each class an arm, reward 1 for the row's class, else 0."""

    source: Annotated[str, _TABLE] = Field(min_length=1, description="sklearn:iris, sklearn:digits, sklearn:wine "
                                                                     "or sklearn:breast_cancer (bundled with "
                                                                     "scikit-learn, never downloaded), or a .csv, "
                                                                     ".parquet or .npz file, local or at "
                                                                     "s3://BUCKET/KEY.")
    label: str = Field("label", min_length=1, description="The label column (CSV, Parquet) or array (NPZ).")
    features: list[str] | None = Field(None, description="Feature columns (None: every column but the label); for "
                                                         "NPZ the one 2-D array (default: features).")
    held_out: float = Field(0.2, gt=0, lt=1, description="Share of rows held out (a seeded split): fitness is the "
                                                         "mean reward of greedy pulls on every held-out row.")
    standardize: bool = Field(True, description="Scale features by the training rows' mean and std (recorded "
                                                "with every checkpoint: a deployed policy scales its inputs "
                                                "alike).")
    cache_dir: Annotated[str | None, DATA_CACHE] = Field(None, description="Where s3:// files are cached; None: "
                                                                           "$AGILERL_DATASET_CACHE, else "
                                                                           "~/.cache/agilerl/datasets.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="Expected content hash of the file; "
                                                                           "other data is refused.")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        from agilerl_core.data.tables import check_table_source

        why = check_table_source(value)
        if why is not None:
            raise ValueError(why)
        return value


class BanditExperimentConfig(_EnvExperimentBase):
    """An evolution of contextual-bandit agents: every member pulls `evo_steps` arms per generation (its envs
    show the contexts), learning from the population's shared replay of pulls; fitness is the mean reward of
    greedy pulls on held-out contexts."""

    default_algorithm: ClassVar[str] = "neural_ucb"

    kind: Literal["bandit"] = Field(description="Kind of experiment: bandit (contextual bandits).")
    algorithm: Literal[BANDIT_ALGORITHMS] = Field("neural_ucb", description="neural_ucb, neural_ts or "
                                                                            "neural_eps_greedy (the baseline).")
    hyperparameters: BanditHyperparameters = Field(default_factory=NeuralUCBHyperparameters,
                                                   description="Initial hyperparameters of every member.")
    data: BanditDataConfig | None = Field(None, description="A classification table as the bandit (or env_id).")
    env_id: str | None = Field(None, description="A Gymnasium env of your own as the bandit (or data): its "
                                                 "observation is the context, its action the arm (Discrete), its "
                                                 "reward the pull's; registered id or module:EnvId.")
    num_envs: int = Field(8, ge=1, description="Contexts each member sees per vector step.")
    eval_max_steps: int | None = Field(None, ge=1, description="env_id: pulls per evaluation env (fitness: their "
                                                               "mean reward; required); data: the held-out rows "
                                                               "judged, at most (None: all of them).")

    @field_validator("env_id")
    @classmethod
    def _env_id_form(cls, value: str | None) -> str | None:
        why = None if value is None else env_id_problem(value)
        if why is not None:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _one_source(self) -> BanditExperimentConfig:
        if (self.data is None) == (self.env_id is None):
            raise ValueError("data: give either data (a classification table) or env_id (a Gymnasium bandit env), "
                             "not both or neither")
        if self.data is not None:
            for name in ("env_entry_point", "env_wrappers", "vector_wrappers", "env_kwargs"):
                if getattr(self, name):
                    raise ValueError(f"{name}: applies to an env_id bandit; a data bandit builds its own env from "
                                     f"the table (remove {name})")
            if self.env_backend != "gymnasium":
                raise ValueError("env_backend: a data bandit steps its table in this process; remove env_backend")
        elif self.eval_max_steps is None:
            raise ValueError("eval_max_steps: a bandit env need never end an episode; give the pulls each "
                             "evaluation env makes (fitness is their mean reward), e.g. eval_max_steps: 100")
        if self.network.activation not in ("relu", "tanh"):
            raise ValueError(f"network.activation: the confidence bonus walks ReLU or tanh layers "
                             f"({self.network.activation} given); use relu or tanh")
        return self

    def check_env(self) -> None:
        """The fast check before anything starts: the env id (env_id), or a local table that is a regular file
        (data; its contents are read and checked when the run builds its arena)."""
        if self.env_id is not None:
            super().check_env()
            return
        from pathlib import Path

        from agilerl_core.errors import DatasetError
        from agilerl_core.io.files import regular_file

        source = self.data.source
        if not source.startswith(("sklearn:", "s3://")):
            regular_file(Path(source.removeprefix("file://")).expanduser(), f"data.source {source}", DatasetError)
