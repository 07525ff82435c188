"""The kinds of experiment whose members act in an env: Gymnasium (``kind: gym``), a fixed dataset with
online evaluation (``kind: offline``) and PettingZoo teams (``kind: multi_agent``), on what they share: the env
id and entry point, its wrappers and backend, the members' network and their evaluation episodes."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from agilerl_core.algorithms.hyperparameters.cql import CQNHyperparameters
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.algorithms.hyperparameters.maddpg import MATD3Hyperparameters
from agilerl_core.code_refs import env_id_problem, ref_problem, wrapper_problem
from agilerl_core.config.common import DATA_CACHE, Location, _ExperimentBase, _Strict
from agilerl_core.config.hyperparameters import (
    GYM_ALGORITHMS,
    MULTI_AGENT_ALGORITHMS,
    OFFLINE_ALGORITHMS,
    GymHyperparameters,
    MultiAgentHyperparameters,
    OfflineHyperparameters,
)
from agilerl_core.config.network import NetworkConfig


class DatasetConfig(_Strict):
    """An offline dataset: members learn from it instead of collecting experience."""

    uri: Annotated[str, Location("the run reads its data from there with the worker's credentials")] = Field(
        min_length=1, description="A flat HDF5 file, a Minari dataset directory, minari:DATASET_ID "
                                               "(under $MINARI_DATASETS_PATH), or either at s3://BUCKET/KEY.")
    format: Literal["auto", "hdf5", "minari"] = Field("auto", description="auto: a directory (or minari:) is "
                                                                          "Minari, a file is flat HDF5.")
    cache_dir: Annotated[str | None, DATA_CACHE] = Field(None, description="Where s3:// datasets are cached; None: "
                                                    "$AGILERL_DATASET_CACHE, else ~/.cache/agilerl/datasets.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                               description="Expected content hash (`agilerl-flow dataset info` prints it); a "
                                           "different dataset is refused. The pipeline pins it in the run's "
                                           "record, so a resumed run reads the same data.")


class WrapperConfig(_Strict):
    """One Gymnasium wrapper around every copy of the env (``env_wrappers``) or around each member's training
    vector env (``vector_wrappers``), applied in the order listed."""

    wrapper: str = Field(description="The wrapper class as module.Name (or module:Name), e.g. "
                                     "gymnasium.wrappers.AtariPreprocessing or gymnasium.wrappers.vector."
                                     "NormalizeReward: imported when the config is checked, like module:EnvId.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the wrapper, e.g. "
                                                                     "{stack_size: 4}.")
    eval_kwargs: dict[str, Any] | None = Field(None, description="Overrides of kwargs in evaluation envs only, e.g. "
                                                                 "{terminal_on_life_loss: false}.")

    @field_validator("wrapper")
    @classmethod
    def _name(cls, value: str) -> str:
        why = wrapper_problem(value)
        if why is not None:
            raise ValueError(why)
        return value


class _EnvExperimentBase(_ExperimentBase):
    """An experiment whose members are RL agents acting in an env: their networks and evaluation episodes."""

    network: NetworkConfig = Field(default_factory=NetworkConfig, description="Network architecture.")
    eval_episodes: int = Field(10, ge=1, description="Greedy episodes per member evaluation (fitness = mean).")
    eval_max_steps: int | None = Field(None, ge=1, description="Cap on steps per evaluation episode.")
    env_id: str = Field(description="Gymnasium env id, e.g. CartPole-v1, or module:EnvId (the module is imported "
                                    "first, as gymnasium.make does, so it can register its envs).")
    env_entry_point: str | None = Field(None, description="module:Class (or module:function) of your own env; "
                                                          "registers env_id with it when it is not registered.")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for gymnasium.make.")
    env_wrappers: list[WrapperConfig] = Field(default_factory=list, description="Gymnasium wrappers around every "
                                              "copy of the env, in order: training, evaluation, dataset collection "
                                              "and the spaces a checkpoint records all see the wrapped env (e.g. "
                                              "AtariPreprocessing, FrameStackObservation).")
    env_backend: Literal["gymnasium", "gymnasium_async", "envpool", "torch"] = Field(
        "gymnasium", description="What steps the envs: gymnasium (Python envs in a synchronous vector env), "
                                 "gymnasium_async (each env copy in a worker process of its own: for slow envs, "
                                 "given cores to spare), envpool (C++ "
                                                         "vector envs; env_id is then an envpool task such as "
                                                         "CartPole-v1 or Pong-v5, env_kwargs its options, e.g. "
                                                         "num_threads; the envpool extra) or torch (on-device "
                                                         "vectorised classic control: CartPole, Acrobot, Pendulum, "
                                                         "MountainCar, MountainCarContinuous; env_id one of those "
                                                         "ids, no wrappers). All autoreset in the step "
                                                         "that ends an episode, with its true last observation kept.")
    compile_envs: bool = Field(False, description="env_backend: torch only: compile each group's env step into one "
                               "graph with torch.compile (Inductor). Measured on one CPU thread: a 64-env CartPole "
                               "step 210 -> 35 us, after a first compile of ~20 s (~4 s with a warm Inductor cache): "
                               "it pays on long runs only, so it is off by default.")
    compile_learn: bool = Field(False, description="DQN only (plain-MLP Q-networks: no noisy, dueling or C51 heads, "
                                "ReLU or tanh): every gradient step of a group (forward, TD gradient, hand-written "
                                "backward, clipping, Adam, target update) as one graph compiled with torch.compile "
                                "(Inductor), compiled once per process and once more for any later shape (a group "
                                "of another size, mutated widths). A group whose members are not plain MLPs (an "
                                "activation mutated to elu) learns eagerly. Measured on one CPU thread: the step "
                                "of 1 member 1.7x faster, of 4 the same, of 16 1.2x, after 4-20 s of compiling "
                                "(benchmarks/compile_learn.py): off by default.")
    vector_wrappers: list[WrapperConfig] = Field(default_factory=list, description="Gymnasium vector wrappers around "
                                                 "each member's training vector env, in order (e.g. gymnasium."
                                                 "wrappers.vector.NormalizeReward); evaluation envs never get them, "
                                                 "so fitness stays the env's own return.")

    @field_validator("env_id")
    @classmethod
    def _env_id_form(cls, value: str) -> str:
        why = env_id_problem(value)  # as Gymnasium resolves it: what the allowlist checks is what gets imported
        if why is not None:
            raise ValueError(why)
        return value

    @field_validator("env_entry_point")
    @classmethod
    def _entry_point_form(cls, value: str | None) -> str | None:
        why = None if value is None else ref_problem(value, "my_pkg.envs:GridWorld")
        if why is not None:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _backend(self) -> _EnvExperimentBase:
        if self.env_backend == "envpool":
            for name in ("env_wrappers", "vector_wrappers", "env_entry_point"):
                if getattr(self, name):
                    raise ValueError(f"{name}: the envpool backend builds its envs by task id and applies no "
                                     f"Gymnasium wrappers; use envpool's own options in env_kwargs (e.g. Atari's "
                                     f"episodic_life, stack_num) or env_backend: gymnasium")
        if self.env_backend == "torch" and getattr(self, "kind", None) != "multi_agent":  # that refuses it itself
            for name in ("env_wrappers", "vector_wrappers", "env_entry_point"):
                if getattr(self, name):
                    raise ValueError(f"{name}: the torch backend steps its own tensor versions of the classic-control "
                                     f"envs and applies no Gymnasium wrappers or entry points; remove {name} or use "
                                     f"env_backend: gymnasium")
            from agilerl_core.envs.torch_classic import TORCH_ENV_IDS  # torch: only when this backend is chosen

            if self.env_id not in TORCH_ENV_IDS:
                raise ValueError(f"env_id: {self.env_id!r} is not an env of env_backend: torch, which steps "
                                 f"{', '.join(TORCH_ENV_IDS)}; use env_backend: gymnasium for any other env")
        if self.compile_envs and self.env_backend != "torch":
            raise ValueError(f"compile_envs: compiles the on-device envs of env_backend: torch (this config's backend "
                             f"is {self.env_backend}); drop compile_envs or use env_backend: torch")
        if self.compile_learn:
            self._check_compile_learn()
        if self.network.rnn is not None and (getattr(self, "kind", None) != "gym" or self.algorithm != "ppo"):
            raise ValueError(f"network.rnn: a recurrent core trains with PPO on a gym experiment only (this is "
                             f"{getattr(self, 'kind', '?')} {self.algorithm}); drop network.rnn or use "
                             f"kind: gym, algorithm: ppo")
        return self

    def check_env(self) -> None:
        """The fast env check the CLI runs before anything starts (a ConfigError naming the field)."""
        from agilerl_core.envs.make import EnvRecipe

        EnvRecipe.of(self).check()


    def _check_compile_learn(self) -> None:
        """compile_learn names what rules it out: the algorithm, a head option or the activation."""
        if getattr(self, "kind", None) not in ("gym", "offline") or self.algorithm != "dqn":
            raise ValueError(f"compile_learn: compiles DQN's gradient step (this is {getattr(self, 'kind', '?')} "
                             f"{self.algorithm}); drop compile_learn or use algorithm: dqn")
        hp = self.hyperparameters
        for name in ("noisy", "dueling", "distributional"):
            if getattr(hp, name, False):
                raise ValueError(f"compile_learn: compiles the plain-MLP TD step, which hyperparameters.{name}: true "
                                 f"leaves; set {name}: false or drop compile_learn")
        if self.network.activation not in ("relu", "tanh"):
            raise ValueError(f"compile_learn: compiles the hand-written backward of ReLU and tanh networks (network."
                             f"activation is {self.network.activation}); use relu or tanh or drop compile_learn")


class GymExperimentConfig(_EnvExperimentBase):
    """An evolution on a Gymnasium env: every member collects its own experience (off-policy members share
    theirs through one replay buffer)."""

    default_algorithm: ClassVar[str] = "dqn"

    kind: Literal["gym"] = Field("gym", description="Kind of experiment: gym (online, Gymnasium), offline "
                                                   "(a fixed dataset).")
    num_envs: int = Field(8, ge=1, description="Vectorised envs per member.")
    algorithm: Literal[GYM_ALGORITHMS] = Field("dqn", description="RL algorithm: dqn, rainbow (DQN with every "
                                                                  "Rainbow component on), ddpg, td3, sac, ppo "
                                                                  "(cqn, cql learn online too).")
    hyperparameters: GymHyperparameters = Field(default_factory=DQNHyperparameters,
                                                description="Initial hyperparameters of every member (the "
                                                            "fields of the chosen algorithm).")

    @model_validator(mode="before")
    @classmethod
    def _no_dataset(cls, data: Any) -> Any:
        if isinstance(data, dict) and "dataset" in data:
            raise ValueError("dataset: a gym experiment collects its own experience; set kind: offline to learn "
                             "from a dataset")
        return data


class OfflineExperimentConfig(_EnvExperimentBase):
    """An evolution on a fixed dataset: every member takes evo_steps gradient steps on its batches per
    generation (the budgets count gradient steps) and is evaluated online in the env."""

    default_algorithm: ClassVar[str] = "cqn"

    kind: Literal["offline"] = Field(description="Kind of experiment: offline (learn from `dataset`).")
    algorithm: Literal[OFFLINE_ALGORITHMS] = Field("cqn", description="cqn (discrete), cql (continuous), bc, or "
                                                                       "an off-policy algorithm (dqn, rainbow, "
                                                                       "ddpg, td3, sac).")
    hyperparameters: OfflineHyperparameters = Field(default_factory=CQNHyperparameters,
                                                    description="Initial hyperparameters of every member (the "
                                                                "fields of the chosen algorithm).")
    dataset: DatasetConfig = Field(description="The dataset the members learn from.")


class FitnessConfig(_Strict):
    """How a team's per-agent returns become one fitness."""

    reduce: Literal["sum", "mean"] = Field("sum", description="Sum (cooperative teams) or mean of the chosen "
                                                             "agents' mean episode returns.")
    agents: list[str] | None = Field(None, description="Agent ids or groups (an id without its _N suffix, e.g. "
                                                       "listener) whose returns count; null: every agent.")


class MultiAgentExperimentConfig(_EnvExperimentBase):
    """An evolution of teams in a PettingZoo parallel env: every member is one team (an actor per agent,
    centralised critics), collecting experience in its own vectorised envs into one shared replay buffer.
    Budgets count parallel-env steps (every agent acts once per step)."""

    default_algorithm: ClassVar[str] = "matd3"

    kind: Literal["multi_agent"] = Field(description="Kind of experiment: multi_agent (PettingZoo).")
    env_id: str = Field(description="PettingZoo parallel env as module:env, e.g. mpe2:simple_speaker_listener_v4 "
                                    "(a module with parallel_env, or a function returning a parallel env).")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the env function, "
                                                                         "e.g. {continuous_actions: true}.")
    num_envs: int = Field(8, ge=1, description="Vectorised envs per member.")
    vector_workers: int = Field(0, ge=0, description="Worker processes stepping the env copies (0: in the member's "
                                                     "own process; workers pay off only for slow envs).")
    algorithm: Literal[MULTI_AGENT_ALGORITHMS] = Field("matd3", description="Multi-agent algorithm: maddpg, "
                                                                            "matd3 (shared replay), ippo "
                                                                            "(independent PPO), mappo (PPO with "
                                                                            "a centralised critic).")
    hyperparameters: MultiAgentHyperparameters = Field(default_factory=MATD3Hyperparameters,
                                                       description="Initial hyperparameters of every member (the "
                                                                   "fields of the chosen algorithm).")
    fitness: FitnessConfig = Field(default_factory=FitnessConfig, description="The team's fitness.")

    @field_validator("env_id")
    @classmethod
    def _env_id_form(cls, value: str) -> str:  # replaces the Gymnasium form: imported as module, then getattr
        why = ref_problem(value, "mpe2:simple_speaker_listener_v4") if ":" in value else None
        if why is not None:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _no_entry_point(self) -> MultiAgentExperimentConfig:
        if self.env_entry_point is not None:
            raise ValueError("env_entry_point: multi-agent envs are named by env_id alone (module:env); remove "
                             "env_entry_point")
        for name in ("env_wrappers", "vector_wrappers"):
            if getattr(self, name):
                raise ValueError(f"{name}: Gymnasium wrappers do not apply to PettingZoo parallel envs; wrap the env "
                                 f"in the function env_id names instead")
        if self.env_backend != "gymnasium":
            raise ValueError("env_backend: multi-agent envs are PettingZoo parallel envs (vector_workers steps them "
                             "in processes); remove env_backend")
        if self.algorithm == "mappo" and self.hyperparameters.normalize_obs:
            raise ValueError("hyperparameters.normalize_obs: mappo's centralised critic reads the joint observation, "
                             "which one agent's running statistics do not cover; set normalize_obs: false")
        return self

    def check_env(self) -> None:
        from agilerl_core.envs.multi_agent import check_parallel_env

        check_parallel_env(self.env_id, self.env_kwargs)
