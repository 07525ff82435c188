"""The language kind of experiment (``kind: language``): character-level GPTs trained from scratch on a
language game (Wordle), judged by greedy play on held-out secrets: the game, the network and the bounds its
architecture evolves in, and the recorded or played games learnt from (which an LLM config's Wordle source
reads too)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from agilerl_core.algorithms.hyperparameters.language import ILQLHyperparameters
from agilerl_core.config.common import DATA_CACHE, Location, _ExperimentBase, _Strict
from agilerl_core.config.hyperparameters import LANGUAGE_ALGORITHMS, LanguageHyperparameterModels


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

    uri: Annotated[str | None, Location("the run reads its games from there with the worker's credentials")] = Field(
        None, min_length=1, description="A .jsonl file of games, local or s3://BUCKET/KEY "
                                                            "(cached); null: play `games` games with `players`.")
    players: str = Field("random:0.2,solver:0.3,noisy_solver_0.5:0.5",
                         description="Without a uri: the players' mix, NAME:WEIGHT pairs (random, solver, "
                                     "noisy_solver_EPS).")
    games: int = Field(5000, ge=1, le=2_000_000, description="Without a uri: games played (at most "
                                                              "agilerl_core.language.games.MAX_GAMES, as a file).")
    seed: int = Field(0, ge=0, description="Without a uri: the players' seed.")
    min_return: float | None = Field(None, description="Learn only from games whose return is at least this "
                                                       "(filtered behaviour cloning); null: every game.")
    cache_dir: Annotated[str | None, DATA_CACHE] = Field(None, description="Where s3:// files are cached; None: "
                                                                     "$AGILERL_DATASET_CACHE, "
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
