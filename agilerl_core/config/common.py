"""What every kind of experiment config shares: the strict base model (unknown fields refused), the
population's evolution (mutation weights, tournament, selection), where a run persists (storage) and which
member it registers (champion), the rules of a run name, and :class:`_ExperimentBase`: the fields and checks
every kind inherits (population, budget, seed, device, limits)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from agilerl_core.algorithms.hyperparameters.base import HP_TAG, BaseHyperparameters
from agilerl_core.algorithms.registry import ALGORITHMS, algorithms_for_kind
from agilerl_core.config.hyperparameters import _complete_space, _schema_any_hyperparameters, normalise_algorithm
from agilerl_core.errors import ConfigError
from agilerl_core.hpo.space import HyperparameterSpec
from agilerl_core.io.files import quote
from agilerl_core.limits import Limits


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


@dataclass(frozen=True)
class Location:
    """Marks a config field that names a place the run reads from or writes to (a path, URI, directory or file),
    as ``Annotated[str | None, Location("...")]``: `why` says what goes there; `no_place` lists value prefixes
    that name no place (``sklearn:``: data bundled with a package). Pydantic keeps it as the field's metadata only
    (validation and the schema are unchanged); :func:`tasks.trust.check_targets` walks every marked field of a
    config a flow run takes as a parameter, and tests/test_trust_params_round4.py fails when a field named like a
    location is left unmarked."""

    why: str
    no_place: tuple[str, ...] = ()


DATA_CACHE = Location("the run writes its dataset cache there on the worker's disk")


class MutationConfig(_Strict):
    """Relative weights of the mutation kinds (normalised) and their strengths."""

    no_mutation: float = Field(0.4, ge=0, description="Weight of leaving a member unchanged.")
    architecture: float = Field(0.2, ge=0, description="Weight of an architecture mutation.")
    new_layer_share: float = Field(0.2, ge=0, le=1, description="Share of architecture mutations that change layers.")
    parameters: float = Field(0.2, ge=0, description="Weight of Gaussian parameter noise.")
    parameter_strength: float = Field(0.1, ge=0, description="Noise std relative to each tensor's std.")
    activation: float = Field(0.0, ge=0, description="Weight of an activation change.")
    rl_hp: float = Field(0.2, ge=0, description="Weight of an RL hyperparameter mutation.")
    hp_resample: float = Field(0.0, ge=0, le=1, description="Share of hyperparameter mutations that draw the "
                                                            "value afresh from its whole hp_space range (PBT's "
                                                            "resample) instead of scaling it up or down.")

    @model_validator(mode="after")
    def _some(self) -> MutationConfig:
        if self.no_mutation + self.architecture + self.parameters + self.activation + self.rl_hp <= 0:
            raise ValueError("at least one mutation weight must be positive")
        return self


class HpInitConfig(_Strict):
    """Where the first generation's hyperparameters come from. Slot 0 always starts at the config's values, so
    the population holds the setting the user wrote; the others start where `method` says."""

    method: Literal["config", "spread", "sample"] = Field(
        "config", description="config: every member at the config's values; spread: each mutable value "
                              "(hp_space) scaled by a factor drawn log-uniformly in [1/spread, spread] "
                              "(a discount such as gamma: 1 - value), within its bounds; sample: each drawn "
                              "from its whole hp_space range (log-uniformly for log-scaled ones and ints from "
                              "1, as PBT starts).")
    spread: float = Field(2.0, gt=1, description="spread: the largest factor a first value moves by.")


class TournamentConfig(_Strict):
    """Tournament selection."""

    size: int = Field(2, ge=1, description="Members drawn per tournament.")
    elitism: bool = Field(True, description="Keep the best member unmutated in slot 0.")


class SelectionConfig(_Strict):
    """How the next generation is chosen: tournaments (``tournament:`` holds their size and elitism),
    multi-frequency subpopulations (MF-PBT; see :mod:`agilerl_core.hpo.multi_frequency`), or none (evolution
    off: each member continues itself, the ablation that shows what selection and mutation add)."""

    method: Literal["tournament", "multi_frequency", "none"] = Field(
        "tournament", description="tournament: every generation, tournaments with elitism; multi_frequency: the "
                                  "population split into len(periods) subpopulations, subpopulation i evolving "
                                  "after every periods[i]-th evaluation (MF-PBT); none: evolution off, every "
                                  "member continues itself unmutated (K independent learners sharing their "
                                  "experience as usual), to measure what evolution adds on an env.")
    every: int = Field(1, ge=1, description="tournament: select and mutate after every N-th evaluation only; in "
                                            "between every member carries on (evaluate often, e.g. a short "
                                            "evo_steps, while selection still sees N generations of learning).")
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

    uri: Annotated[str | None, Location("the run's checkpoints go there with the worker's storage credentials")] = Field(
        None, description="Local directory or s3://BUCKET/PREFIX; None: $AGILERL_STORAGE_URI, "
                                              "else output_dir.")
    endpoint_url: Annotated[str | None, Location("the worker's S3 credentials sign every request sent there")] = Field(
        None, description="S3 endpoint (SeaweedFS/MinIO); None: $AWS_ENDPOINT_URL.")
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

    promote: Literal["if_better", "if_beats_input", "always", "never"] = Field(
        "if_better", description="Move NAME@champion to this run's model: if_better (only when its fitness beats the "
                                 "fitness recorded with the version the alias points at), if_beats_input (only "
                                 "when it beats what the run started from, scored on the same fresh seeds: a "
                                 "stage's input), always, or never.")
    eval_episodes: int | None = Field(
        None, ge=1, description="Fresh-seed episodes each champion candidate (the final elite and the best member "
                                "the run ever evaluated) is re-scored on before one is registered (LLM: passes over "
                                "the held-out prompts); None: one evaluation's worth (eval_episodes; LLM: 1).")


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
    hp_space_preset: Literal["default", "wide"] = Field(
        "default", description="The mutable space hp_space starts from: default (learning rates, batch sizes, "
                               "update rhythm) or wide (also what rl-zoo3's samplers search that a member can "
                               "change mid-run: gamma, GAE lambda, tau, the exploration schedule and noise, "
                               "loss coefficients, minibatches).")
    mutation: MutationConfig = Field(default_factory=MutationConfig, description="Mutation probabilities.")
    hp_init: HpInitConfig = Field(default_factory=HpInitConfig, description="The first generation's "
                                                                           "hyperparameters: the config's, "
                                                                           "spread around them, or sampled "
                                                                           "from hp_space.")
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
    target_generations: int = Field(1, ge=1, le=1000, description="Stop at target_fitness only once the best "
                                                                  "fitness has reached it in this many "
                                                                  "generations in a row (each evaluated on "
                                                                  "fresh episode seeds): 1 stops at the first; "
                                                                  "more asks the population to hold it "
                                                                  "(unused without a target_fitness).")
    seed: int = Field(0, ge=0, description="Master seed: same config + seed gives the same result on CPU.")
    output_dir: Annotated[str, Location("the run's files are written there on the worker's disk")] = Field(
        "runs", min_length=1, description="Where checkpoints are written.")
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

    def planned_generations(self) -> int:
        """How many generations the budget pays for, at most: max_env_steps over population_size x evo_steps,
        rounded up (the last generation shrinks to fit; whole vector steps can spend a little more)."""
        return -(-self.max_env_steps // (self.population_size * self.evo_steps))

    def pinned(self, **hashes: str | None):
        """This config with the content hashes its build computed (section -> sha256: ``dataset``, ``model``)
        filled in where it left them unset: the config an arena runs with and a run records, so every worker and
        every resume checks the same content."""
        update = {section: getattr(self, section).model_copy(update={"sha256": sha})
                  for section, sha in hashes.items() if sha is not None and getattr(self, section).sha256 is None}
        return self.model_copy(update=update) if update else self

    def budget_note(self, min_generations: int = 3) -> str | None:
        """A sentence when the budget pays for fewer than `min_generations` generations (so there is little or
        no selection and mutation: the run is then mostly the initial population training), naming the fields
        to change; None otherwise."""
        gens = self.planned_generations()
        if gens >= min_generations:
            return None
        per = self.population_size * self.evo_steps
        what = "no selection or mutation ever happens" if gens == 1 else "selection and mutation happen once"
        return (f"max_env_steps {self.max_env_steps:,} pays for {gens} generation{'s' * (gens != 1)} of "
                f"population_size x evo_steps = {self.population_size} x {self.evo_steps:,} = {per:,} steps, so "
                f"{what}: for evolution, raise max_env_steps to at least {min_generations * per:,} or lower "
                f"evo_steps to {max(1, self.max_env_steps // (min_generations * self.population_size)):,} or less")

    @model_validator(mode="after")
    def _subpopulations_fit(self) -> _ExperimentBase:
        sel = self.selection
        if sel.method == "multi_frequency" and len(sel.periods) > self.population_size:
            raise ValueError(f"selection.periods: {len(sel.periods)} subpopulations need at least as many members; "
                             f"population_size is {self.population_size}: list at most {self.population_size} "
                             "periods or raise population_size")
        if sel.method != "tournament" and sel.every != 1:
            raise ValueError("selection.every: only tournament selection evolves every N-th generation "
                             "(multi_frequency has periods; none never evolves); set selection.method: tournament "
                             "or drop every")
        if sel.method != "multi_frequency" and sel.periods != SelectionConfig().periods:
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
