"""The experiment config: one pydantic model, loaded from YAML, validated before any work starts.

The same object is the CLI's YAML, the flow parameter of the pipeline and what tracking logs. Every
field carries a one-line description; errors name the field (dotted path) and the allowed values.
"""

from __future__ import annotations

import contextlib
import difflib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    model_validator,
)

from agilerl_core.errors import ConfigError
from agilerl_core.hpo.space import HyperparameterSpec

ACTIVATIONS = ("relu", "leaky_relu", "elu", "tanh")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CNNConfig(_Strict):
    """Convolutional encoder for image observations (used only when the observation has images)."""

    channels: list[int] = Field([32, 64, 64], min_length=1, description="Output channels per conv layer.")
    kernel_sizes: list[int] = Field([8, 4, 3], min_length=1, description="Kernel size per conv layer.")
    strides: list[int] = Field([4, 2, 1], min_length=1, description="Stride per conv layer.")
    latent_dim: int = Field(128, ge=1, description="Width of the linear projection after the convs.")
    min_layers: int = Field(1, ge=1, description="Fewest conv layers a mutation may leave.")
    max_layers: int = Field(4, ge=1, description="Most conv layers a mutation may create.")
    min_channels: int = Field(8, ge=1, description="Fewest channels a conv layer may have.")
    max_channels: int = Field(256, ge=1, description="Most channels a conv layer may have.")
    kernel_choices: list[int] = Field([3, 4, 5, 8], min_length=1, description="Kernel sizes a mutation may pick.")
    channel_changes: list[int] = Field([8, 16, 32], min_length=1, description="Channel counts a mutation adds/removes.")
    channels_last: bool | None = Field(None, description="Image layout; None detects HWC vs CHW from the shape.")

    @model_validator(mode="after")
    def _lengths(self) -> CNNConfig:
        if not (len(self.channels) == len(self.kernel_sizes) == len(self.strides)):
            raise ValueError("channels, kernel_sizes and strides must have the same length")
        if not self.min_layers <= len(self.channels) <= self.max_layers:
            raise ValueError(f"the number of conv layers must lie in [min_layers, max_layers] = "
                             f"[{self.min_layers}, {self.max_layers}]")
        return self


class NetworkConfig(_Strict):
    """Architecture of every network and the bounds its mutations respect."""

    hidden_sizes: list[int] = Field([64, 64], min_length=1, description="Width of each hidden MLP layer.")
    activation: Literal[ACTIVATIONS] = Field("relu", description="Hidden activation.")
    min_hidden_layers: int = Field(1, ge=1, description="Fewest hidden layers a mutation may leave.")
    max_hidden_layers: int = Field(4, ge=1, description="Most hidden layers a mutation may create.")
    min_nodes: int = Field(16, ge=1, description="Fewest units a hidden layer may have.")
    max_nodes: int = Field(512, ge=1, description="Most units a hidden layer may have.")
    node_changes: list[int] = Field([16, 32, 64], min_length=1, description="Unit counts a node mutation adds/removes.")
    activation_choices: list[Literal[ACTIVATIONS]] = Field(list(ACTIVATIONS), min_length=1,
                                                           description="Activations a mutation may pick.")
    cnn: CNNConfig = Field(default_factory=CNNConfig, description="Conv encoder for image observations.")

    @model_validator(mode="after")
    def _bounds(self) -> NetworkConfig:
        if not self.min_hidden_layers <= len(self.hidden_sizes) <= self.max_hidden_layers:
            raise ValueError(f"len(hidden_sizes) = {len(self.hidden_sizes)} must lie in [min_hidden_layers, "
                             f"max_hidden_layers] = [{self.min_hidden_layers}, {self.max_hidden_layers}]")
        bad = [h for h in self.hidden_sizes if not self.min_nodes <= h <= self.max_nodes]
        if bad:
            raise ValueError(f"hidden_sizes {bad} outside [min_nodes, max_nodes] = "
                             f"[{self.min_nodes}, {self.max_nodes}]")
        return self


class Hyperparameters(_Strict):
    """What every algorithm's hyperparameters share."""

    algorithm_name: ClassVar[str]
    # structural: they size the shared buffer or the networks' outputs, so they never mutate
    fixed_fields: ClassVar[frozenset[str]] = frozenset({"buffer_size", "n_step", "num_atoms", "v_min", "v_max",
                                                        "rollout_steps", "obs_norm_clip"})

    normalize_obs: bool = Field(False, description="Normalise the observation vector by its running mean and "
                                "std (updated from training experience, saved in checkpoints).")
    obs_norm_clip: float = Field(10.0, gt=0, description="Clip normalised observations to [-clip, clip].")

    @model_validator(mode="before")
    @classmethod
    def _drop_tag(cls, data: Any) -> Any:
        if isinstance(data, dict) and _HP_TAG in data:
            data = {k: v for k, v in data.items() if k != _HP_TAG}
        return data


class OffPolicyHyperparameters(Hyperparameters):
    """Replay-based learning: how much, how often, from how large a shared buffer."""

    batch_size: int = Field(128, ge=1, description="Transitions per gradient step.")
    learn_step: int = Field(1, ge=1, description="Env steps (transitions) per gradient step.")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    tau: float = Field(0.005, gt=0, le=1, description="Soft target update rate.")
    max_grad_norm: float | None = Field(None, gt=0, description="Clip each network's gradient norm (None: off).")
    learning_delay: int = Field(1_000, ge=0, description="Member env steps before the first gradient step.")
    buffer_size: int = Field(100_000, ge=1, description="Capacity of the shared replay buffer (transitions).")


class DQNHyperparameters(OffPolicyHyperparameters):
    """DQN (Mnih et al. 2015; double Q: van Hasselt et al. 2016) and each Rainbow component (Hessel et al.
    2018), every one usable alone."""

    algorithm_name: ClassVar[str] = "dqn"

    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    hard_update_every: int | None = Field(None, ge=1, description="Copy online -> target every N gradient steps "
                                                                  "(None: soft updates with tau).")
    double: bool = Field(True, description="Double Q-learning target.")
    loss: Literal["mse", "huber"] = Field("mse", description="TD loss (ignored when distributional).")
    eps_start: float = Field(1.0, ge=0, le=1, description="Initial exploration rate.")
    eps_end: float = Field(0.05, ge=0, le=1, description="Final exploration rate.")
    eps_decay_steps: int = Field(10_000, ge=1, description="Member env steps over which epsilon decays linearly.")
    n_step: int = Field(1, ge=1, description="n-step returns (1: one-step TD).")
    per: bool = Field(False, description="Prioritised experience replay (Schaul et al. 2016).")
    per_alpha: float = Field(0.6, ge=0, le=1, description="PER: priority exponent.")
    per_beta: float = Field(0.4, ge=0, le=1, description="PER: initial importance-weight exponent.")
    per_beta_steps: int = Field(100_000, ge=1, description="PER: member env steps over which beta anneals to 1.")
    per_eps: float = Field(1e-6, gt=0, description="PER: added to every priority.")
    noisy: bool = Field(False, description="Noisy linear layers for exploration (Fortunato et al. 2018).")
    noisy_std: float = Field(0.5, gt=0, description="Noisy layers: initial sigma scale.")
    dueling: bool = Field(False, description="Dueling value/advantage heads (Wang et al. 2016).")
    distributional: bool = Field(False, description="C51 distributional Q (Bellemare et al. 2017).")
    num_atoms: int = Field(51, ge=2, description="C51: atoms of the return distribution.")
    v_min: float = Field(-10.0, description="C51: smallest return atom.")
    v_max: float = Field(10.0, description="C51: largest return atom.")

    @model_validator(mode="after")
    def _support(self) -> DQNHyperparameters:
        if self.distributional and self.v_min >= self.v_max:
            raise ValueError(f"v_min ({self.v_min}) must be below v_max ({self.v_max})")
        return self


class RainbowHyperparameters(DQNHyperparameters):
    """Rainbow DQN: DQN with n-step returns, PER, noisy nets, dueling heads and C51 on."""

    algorithm_name: ClassVar[str] = "rainbow"

    n_step: int = Field(3, ge=1, description="n-step returns (1: one-step TD).")
    per: bool = Field(True, description="Prioritised experience replay (Schaul et al. 2016).")
    noisy: bool = Field(True, description="Noisy linear layers for exploration (Fortunato et al. 2018).")
    dueling: bool = Field(True, description="Dueling value/advantage heads (Wang et al. 2016).")
    distributional: bool = Field(True, description="C51 distributional Q (Bellemare et al. 2017).")
    eps_start: float = Field(0.0, ge=0, le=1, description="Initial exploration rate (noisy nets explore).")
    eps_end: float = Field(0.0, ge=0, le=1, description="Final exploration rate.")


class TD3Hyperparameters(OffPolicyHyperparameters):
    """TD3 (Fujimoto et al. 2018): clipped double Q, target policy smoothing, delayed actor updates."""

    algorithm_name: ClassVar[str] = "td3"

    batch_size: int = Field(256, ge=1, description="Transitions per gradient step.")
    lr_actor: float = Field(1e-3, gt=0, description="Actor Adam learning rate.")
    lr_critic: float = Field(1e-3, gt=0, description="Critic Adam learning rate.")
    twin_q: bool = Field(True, description="Clipped double Q: two critics, the target takes their minimum.")
    policy_freq: int = Field(2, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.2, ge=0, description="Target policy smoothing: noise std (0: off).")
    target_noise_clip: float = Field(0.5, ge=0, description="Target policy smoothing: noise clip.")
    expl_noise: float = Field(0.1, ge=0, description="Exploration noise scale (actions in [-1, 1]).")
    noise_type: Literal["gaussian", "ou"] = Field("gaussian", description="Exploration noise process.")
    ou_theta: float = Field(0.15, gt=0, description="Ornstein-Uhlenbeck mean reversion.")
    ou_dt: float = Field(1e-2, gt=0, description="Ornstein-Uhlenbeck time step.")
    random_steps: int = Field(0, ge=0, description="Member env steps of uniformly random actions at the start.")


class DDPGHyperparameters(TD3Hyperparameters):
    """DDPG (Lillicrap et al. 2016): TD3 with its three tricks off."""

    algorithm_name: ClassVar[str] = "ddpg"

    twin_q: bool = Field(False, description="Clipped double Q: two critics, the target takes their minimum.")
    policy_freq: int = Field(1, ge=1, description="Critic updates per actor (and target) update.")
    target_noise: float = Field(0.0, ge=0, description="Target policy smoothing: noise std (0: off).")


class SACHyperparameters(OffPolicyHyperparameters):
    """SAC (Haarnoja et al. 2018, "applications" version): twin critics, squashed Gaussian actor,
    automatic entropy tuning."""

    algorithm_name: ClassVar[str] = "sac"

    batch_size: int = Field(256, ge=1, description="Transitions per gradient step.")
    lr_actor: float = Field(3e-4, gt=0, description="Actor Adam learning rate.")
    lr_critic: float = Field(3e-4, gt=0, description="Critic Adam learning rate.")
    lr_alpha: float = Field(3e-4, gt=0, description="Temperature Adam learning rate.")
    init_alpha: float = Field(1.0, gt=0, description="Initial temperature.")
    auto_entropy: bool = Field(True, description="Tune the temperature towards target_entropy.")
    target_entropy: float | None = Field(None, description="Entropy target (None: -action_dim).")
    policy_freq: int = Field(1, ge=1, description="Critic updates per actor update.")
    random_steps: int = Field(0, ge=0, description="Member env steps of uniformly random actions at the start.")


class PPOHyperparameters(Hyperparameters):
    """PPO (Schulman et al. 2017) with GAE (Schulman et al. 2016)."""

    algorithm_name: ClassVar[str] = "ppo"

    lr: float = Field(3e-4, gt=0, description="Adam learning rate (actor and critic).")
    rollout_steps: int = Field(128, ge=1, description="Steps per env per rollout (a rollout is num_envs x this).")
    gamma: float = Field(0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    update_epochs: int = Field(4, ge=1, description="Passes over each rollout.")
    num_minibatches: int = Field(4, ge=1, description="Minibatches per pass.")
    clip_coef: float = Field(0.2, gt=0, description="Surrogate clipping range.")
    clip_vloss: bool = Field(False, description="Clip the value loss around the old values.")
    ent_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    vf_coef: float = Field(0.5, ge=0, description="Value loss coefficient.")
    max_grad_norm: float | None = Field(0.5, gt=0, description="Clip each network's gradient norm (None: off).")
    target_kl: float | None = Field(None, gt=0, description="Stop a rollout's epochs once the approx. KL exceeds this.")
    norm_adv: bool = Field(True, description="Normalise advantages per minibatch.")
    log_std_init: float = Field(0.0, description="Continuous actions: initial log std of the Gaussian policy.")


class CQNHyperparameters(DQNHyperparameters):
    """CQN: conservative Q-learning (Kumar et al. 2020, CQL(H)) on a double DQN, for discrete actions."""

    algorithm_name: ClassVar[str] = "cqn"
    fixed_fields: ClassVar[frozenset[str]] = DQNHyperparameters.fixed_fields

    cql_alpha: float = Field(1.0, ge=0, description="Weight of the conservative penalty "
                                                    "E[logsumexp_a Q(s, a) - Q(s, a_data)].")

    @model_validator(mode="after")
    def _q_values(self) -> CQNHyperparameters:
        for name in ("distributional", "per"):
            if getattr(self, name):
                raise ValueError(f"{name}: cqn's penalty is defined on Q-values learned from a fixed dataset; "
                                 f"set {name}: false")
        return self


class CQLHyperparameters(SACHyperparameters):
    """CQL on SAC (Kumar et al. 2020, CQL(H) with importance-sampled logsumexp) for continuous actions."""

    algorithm_name: ClassVar[str] = "cql"

    cql_alpha: float = Field(5.0, ge=0, description="Weight of the conservative penalty on each critic.")
    cql_n_actions: int = Field(10, ge=1, description="Sampled actions per state (uniform, and from the policy at "
                                                     "s and s') estimating logsumexp_a Q(s, a).")


class BCHyperparameters(Hyperparameters):
    """Behaviour cloning: supervised regression of the dataset's actions (the offline baseline)."""

    algorithm_name: ClassVar[str] = "bc"

    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    batch_size: int = Field(256, ge=1, description="Transitions per gradient step.")
    max_grad_norm: float | None = Field(None, gt=0, description="Clip the gradient norm (None: off).")


HYPERPARAMETER_MODELS: dict[str, type[Hyperparameters]] = {
    m.algorithm_name: m for m in (DQNHyperparameters, RainbowHyperparameters, DDPGHyperparameters,
                                  TD3Hyperparameters, SACHyperparameters, PPOHyperparameters,
                                  CQNHyperparameters, CQLHyperparameters, BCHyperparameters)}
ALGORITHMS = tuple(HYPERPARAMETER_MODELS)
_HP_TAG = "__algorithm__"
OFFLINE_ONLY = ("bc",)  # algorithms that cannot collect their own experience
OFFLINE_ALGORITHMS = ("cqn", "cql", "bc")  # made for datasets (cqn and cql could also learn online)
ON_POLICY = ("ppo",)  # algorithms that cannot learn from a fixed dataset


def _hp_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get(_HP_TAG, "dqn")
    return getattr(value, "algorithm_name", None)


AnyHyperparameters = Annotated[
    Annotated[DQNHyperparameters, Tag("dqn")] | Annotated[RainbowHyperparameters, Tag("rainbow")]
    | Annotated[DDPGHyperparameters, Tag("ddpg")] | Annotated[TD3Hyperparameters, Tag("td3")]
    | Annotated[SACHyperparameters, Tag("sac")] | Annotated[PPOHyperparameters, Tag("ppo")]
    | Annotated[CQNHyperparameters, Tag("cqn")] | Annotated[CQLHyperparameters, Tag("cql")]
    | Annotated[BCHyperparameters, Tag("bc")],
    Discriminator(_hp_tag),
]


class MutationConfig(_Strict):
    """Relative weights of the mutation kinds (normalised) and their strengths."""

    no_mutation: float = Field(0.4, ge=0, description="Weight of leaving a member unchanged.")
    architecture: float = Field(0.2, ge=0, description="Weight of an architecture mutation.")
    new_layer_share: float = Field(0.2, ge=0, le=1, description="Share of architecture mutations that change layers.")
    parameters: float = Field(0.2, ge=0, description="Weight of Gaussian parameter noise.")
    parameter_strength: float = Field(0.1, ge=0, description="Noise std relative to each tensor's std.")
    activation: float = Field(0.0, ge=0, description="Weight of an activation change.")
    rl_hp: float = Field(0.2, ge=0, description="Weight of an RL hyperparameter mutation.")

    @model_validator(mode="after")
    def _some(self) -> MutationConfig:
        if self.no_mutation + self.architecture + self.parameters + self.activation + self.rl_hp <= 0:
            raise ValueError("at least one mutation weight must be positive")
        return self


class TournamentConfig(_Strict):
    """Tournament selection."""

    size: int = Field(2, ge=1, description="Members drawn per tournament.")
    elitism: bool = Field(True, description="Keep the best member unmutated in slot 0.")


class StorageConfig(_Strict):
    """Where a run's generations (checkpoints, experience shards, manifests) are persisted."""

    uri: str | None = Field(None, description="Local directory or s3://BUCKET/PREFIX; None: $AGILERL_STORAGE_URI, "
                                              "else output_dir.")
    endpoint_url: str | None = Field(None, description="S3 endpoint (SeaweedFS/MinIO); None: $AWS_ENDPOINT_URL.")
    region: str | None = Field(None, description="S3 region; None: $AWS_REGION, else us-east-1.")
    access_key_id: SecretStr | None = Field(None, description="S3 access key; prefer $AWS_ACCESS_KEY_ID.")
    secret_access_key: SecretStr | None = Field(None, description="S3 secret; prefer $AWS_SECRET_ACCESS_KEY.")
    keep_generations: int = Field(3, ge=1, description="Member checkpoints kept for the last K generations "
                                                       "(every generation's elite is always kept).")


class TrackingConfig(_Strict):
    """MLflow tracking of the pipeline (the in-process --local loop does not track)."""

    enabled: bool = Field(True, description="Log runs to MLflow.")
    uri: str | None = Field(None, description="Tracking URI; None: $MLFLOW_TRACKING_URI, else a SQLite file in "
                                              "output_dir.")
    register_model: bool = Field(True, description="Register the final elite and alias it 'champion'.")
    model_name: str | None = Field(None, description="Registered model name; None: the experiment name.")


class RunnerConfig(_Strict):
    """How the pipeline runs a generation's train/evaluate tasks."""

    kind: Literal["threads", "dask"] = Field("threads", description="threads: one process, shared buffer; "
                                                                   "dask: worker processes, shards via storage.")
    address: str | None = Field(None, description="Dask scheduler address; None starts a local cluster.")
    workers: int = Field(2, ge=1, description="Worker processes of the local Dask cluster.")
    max_threads: int = Field(1, ge=1, description="Members the thread runner trains at once. Keep 1 for CPU-bound "
                                                  "small networks: their Python-heavy loops fight over the GIL "
                                                  "(4 threads measured 2.7x slower); use dask for CPU parallelism.")


class DatasetConfig(_Strict):
    """An offline dataset: members learn from it instead of collecting experience."""

    uri: str = Field(min_length=1, description="A flat HDF5 file, a Minari dataset directory, minari:DATASET_ID "
                                               "(under $MINARI_DATASETS_PATH), or either at s3://BUCKET/KEY.")
    format: Literal["auto", "hdf5", "minari"] = Field("auto", description="auto: a directory (or minari:) is "
                                                                          "Minari, a file is flat HDF5.")
    cache_dir: str | None = Field(None, description="Where s3:// datasets are cached; None: "
                                                    "$AGILERL_DATASET_CACHE, else ~/.cache/agilerl/datasets.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                               description="Expected content hash (`agilerl-flow dataset info` prints it); a "
                                           "different dataset is refused. The pipeline pins it in the run's "
                                           "record, so a resumed run reads the same data.")


def _schema_any_hyperparameters(schema: dict[str, Any]) -> None:
    """JSON Schema `oneOf` demands exactly one match, but a DQN section also matches Rainbow's (same
    fields, other defaults), so servers validating parameters (Prefect) would refuse it: use anyOf.
    Which model applies is decided by `algorithm` when the config is validated."""
    hp = schema.get("properties", {}).get("hyperparameters", {})
    if "oneOf" in hp:
        hp["anyOf"] = hp.pop("oneOf")
        hp.pop("discriminator", None)


class ExperimentConfig(_Strict):
    """One evolution run: env, algorithm, population, evolution and budget."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_schema_any_hyperparameters)

    name: str = Field("experiment", min_length=1, description="Experiment name (tracking groups runs by it).")
    env_id: str = Field(description="Gymnasium env id, e.g. CartPole-v1.")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for gymnasium.make.")
    num_envs: int = Field(8, ge=1, description="Vectorised envs per member.")
    algorithm: Literal[ALGORITHMS] = Field("dqn", description="RL algorithm: dqn, rainbow (DQN with every "
                                                               "Rainbow component on), ddpg, td3, sac, ppo; "
                                                               "offline: cqn, cql, bc.")
    hyperparameters: AnyHyperparameters = Field(default_factory=DQNHyperparameters,
                                                description="Initial hyperparameters of every member (the "
                                                            "fields of the chosen algorithm).")
    network: NetworkConfig = Field(default_factory=NetworkConfig, description="Network architecture.")
    population_size: int = Field(4, ge=1, description="Members in the population.")
    hp_space: dict[str, HyperparameterSpec | dict[str, Any] | None] = Field(
        default_factory=dict, description="Overrides of the algorithm's mutable hyperparameters (null removes one).")
    mutation: MutationConfig = Field(default_factory=MutationConfig, description="Mutation probabilities.")
    tournament: TournamentConfig = Field(default_factory=TournamentConfig, description="Selection.")
    evo_steps: int = Field(10_000, ge=1, description="Env steps per member per generation "
                                                     "(offline: gradient steps).")
    eval_episodes: int = Field(10, ge=1, description="Greedy episodes per member evaluation (fitness = mean).")
    eval_max_steps: int | None = Field(None, ge=1, description="Cap on steps per evaluation episode.")
    max_env_steps: int = Field(150_000, ge=1, description="Global training env-step budget (whole "
                                                            "population; offline: gradient steps).")
    target_fitness: float | None = Field(None, description="Stop once the best fitness reaches this.")
    seed: int = Field(0, ge=0, description="Master seed: same config + seed gives the same result on CPU.")
    output_dir: str = Field("runs", min_length=1, description="Where checkpoints are written.")
    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description="Torch device.")
    torch_threads: int = Field(1, ge=1, description="Torch intra-op threads (small nets run fastest on 1).")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Pipeline persistence.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow tracking.")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="Task runner of the pipeline.")
    dataset: DatasetConfig | None = Field(None, description="Offline training: members learn from this dataset "
                                                            "for evo_steps gradient steps each generation (the "
                                                            "budgets then count gradient steps), evaluated online.")

    @model_validator(mode="after")
    def _offline(self) -> ExperimentConfig:
        if self.dataset is None and self.algorithm in OFFLINE_ONLY:
            raise ValueError(f"algorithm: {self.algorithm} learns only from a dataset; add a dataset section "
                             f"(dataset.uri: a file made with `agilerl-flow dataset collect`)")
        if self.dataset is not None and self.algorithm in ON_POLICY:
            raise ValueError(f"dataset: {self.algorithm} is on-policy and cannot learn from a fixed dataset; use "
                             f"cqn (discrete), cql (continuous), bc, or an off-policy algorithm")
        return self

    @model_validator(mode="before")
    @classmethod
    def _algorithm_sections(cls, data: Any) -> Any:
        """Route `hyperparameters` to the chosen algorithm's model, and complete partial `hp_space`
        overrides ({min, max}) from the algorithm's declared space, keeping its kind and factors (so an
        int hyperparameter stays int): runs before pydantic would fill the omitted fields with
        HyperparameterSpec's generic defaults."""
        if not isinstance(data, dict):
            return data
        algo = data.get("algorithm", "dqn")
        if algo not in HYPERPARAMETER_MODELS:
            return data  # the algorithm field reports it
        data = dict(data)
        hp = data.get("hyperparameters")
        if hp is None or isinstance(hp, dict):
            data["hyperparameters"] = {**(hp or {}), _HP_TAG: algo}
        elif isinstance(hp, Hyperparameters) and type(hp) is not HYPERPARAMETER_MODELS[algo]:
            data["hyperparameters"] = {**hp.model_dump(), _HP_TAG: algo}
        if isinstance(data.get("hp_space"), dict):
            data["hp_space"] = _complete_space(algo, data["hp_space"])
        return data


def _complete_space(algo: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from agilerl_core.algorithms.registry import ALGORITHM_HP_SPACES

    known = ALGORITHM_HP_SPACES[algo]
    model = HYPERPARAMETER_MODELS[algo]
    numeric = {n for n, f in model.model_fields.items() if f.annotation in (int, float)} - model.fixed_fields
    out = {}
    for name, spec in overrides.items():
        if name not in numeric:
            raise ValueError(f"hp_space.{name}: not a mutable hyperparameter of {algo}; mutable ones are "
                             f"{sorted(numeric)}")
        if isinstance(spec, dict):
            base = known[name].model_dump() if name in known else {}
            if "kind" not in spec and "kind" not in base:
                base["kind"] = "int" if model.model_fields[name].annotation is int else "float"
            try:
                spec = HyperparameterSpec(**{**base, **spec})
            except ValidationError as err:
                e = err.errors()[0]
                where = ".".join(str(x) for x in e["loc"])
                msg = e["msg"].removeprefix("Value error, ")
                raise ValueError(f"hp_space.{name}{'.' + where if where else ''}: {msg}") from None
        out[name] = spec
    return out


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for e in err.errors():
        parts = list(e["loc"])
        if len(parts) > 1 and parts[0] == "hyperparameters" and parts[1] in HYPERPARAMETER_MODELS:
            parts.pop(1)  # the union member's tag: the algorithm, already named by the config
        loc = ".".join(str(p) for p in parts) or "<root>"
        msg = e["msg"]
        if not parts and e["type"] == "value_error":
            lines.append(f"  - {msg.removeprefix('Value error, ')}")
            continue
        if e["type"] == "extra_forbidden":
            parent = e["loc"][:-1]
            model: Any = ExperimentConfig
            if len(parent) > 1 and parent[0] == "hyperparameters" and parent[1] in HYPERPARAMETER_MODELS:
                model, parent = HYPERPARAMETER_MODELS[parent[1]], parent[2:]
            for part in parent:
                field = model.model_fields.get(str(part)) if hasattr(model, "model_fields") else None
                ann = getattr(field, "annotation", None)
                model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
                if model is None:
                    break
            if model is not None:
                names = list(model.model_fields)
                close = difflib.get_close_matches(str(e["loc"][-1]), names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                msg = f"unknown field{hint}; allowed fields: {', '.join(names)}"
        elif "input" in e and e["type"] not in ("missing",):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  - {loc}: {msg}")
    return "\n".join(lines)


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section, cannot set a field inside it")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Parse CLI `key=value` pairs; values are read as YAML scalars (`lr=3e-4`, `double=false`)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set hyperparameters.lr=3e-4")
        key, raw = pair.split("=", 1)
        if not key:
            raise ConfigError(f"--set {pair!r}: empty key")
        value = yaml.safe_load(raw) if raw != "" else ""
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        out[key.strip()] = value
    return out


def validate_config(data: dict[str, Any], source: str = "config") -> ExperimentConfig:
    """Build an ExperimentConfig from plain data, raising ConfigError that names each bad field."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config ({source}): expected a mapping of fields, got {type(data).__name__}")
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load a YAML config file and apply dotted overrides (`hyperparameters.lr`: 3e-4)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML config "
                          f"such as deployments/configs/cartpole_dqn.yaml")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields at the top level")
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return validate_config(data, source=str(path))
