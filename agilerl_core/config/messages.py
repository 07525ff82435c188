"""What a refused config says: one line per bad field (its dotted path, the allowed values or fields), and for
a name this project spells otherwise the one to use instead: Stable-Baselines3's field and algorithm names
(the habits of its users), else the closest name."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from agilerl_core.algorithms.registry import ALGORITHMS
from agilerl_core.config.kinds import EXPERIMENT_KINDS
from agilerl_core.io.files import quote

# Stable-Baselines3 (and sb3-contrib) algorithms without a namesake here, by normalised name: the nearest one.
SB3_ALGORITHMS = {"a2c": "ppo", "trpo": "ppo", "recurrentppo": "ppo with network.rnn",
                  "qrdqn": "rainbow (distributional)", "tqc": "sac", "crossq": "sac"}


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


def _foreign_section(errors: list[dict], algorithm: str | None) -> tuple[str, list[dict]] | None:
    """When every unknown hyperparameter is one of another algorithm's (``--set algorithm=dqn`` on a SAC config):
    (one line saying the section belongs to that algorithm, the errors it replaces); None otherwise."""
    unknown = [e for e in errors if e["type"] == "extra_forbidden" and len(e["loc"]) >= 3
               and e["loc"][-3] == "hyperparameters" and e["loc"][-2] in ALGORITHMS]
    if not unknown or algorithm not in ALGORITHMS:
        return None
    names = [str(e["loc"][-1]) for e in unknown]
    owners = [a for a, info in ALGORITHMS.items() if a != algorithm and set(names) <= set(info.hp_model.model_fields)]
    if not owners:
        return None
    listed = ", ".join(names)
    return (f"  - hyperparameters: {listed} {'are' if len(names) > 1 else 'is'} not {algorithm}'s but "
            f"{' / '.join(owners[:3])}'s: the section was written for another algorithm; for {algorithm}, drop "
            f"{'them' if len(names) > 1 else 'it'} (its own: {', '.join(ALGORITHMS[algorithm].hp_model.model_fields)}) "
            f"or set algorithm back", unknown)


def _format_validation_error(err: ValidationError, source: str, kind_model: type[BaseModel],
                             algorithm: str | None = None) -> str:
    """A readable ConfigError text: one line per bad field (dotted path); an unknown field with the one to use
    instead (ours for a Stable-Baselines3 name, by `algorithm`'s hyperparameters; else the closest name)."""
    lines = [f"invalid config ({source}):"]
    info = ALGORITHMS.get(algorithm) if algorithm else None
    errors = err.errors()
    foreign = _foreign_section(errors, algorithm)
    if foreign is not None:  # the section was written for another algorithm: one line says so
        lines.append(foreign[0])
        errors = [e for e in errors if e not in foreign[1]]
    for e in errors:
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
