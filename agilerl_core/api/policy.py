"""A saved or live member ready to act (:class:`Policy`: ``predict`` for RL, ``generate`` for LLM members),
and :func:`load`, which reads one from a checkpoint directory, local or on S3."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agilerl_core.algorithms.acting import Acting
from agilerl_core.algorithms.saved import load_member
from agilerl_core.errors import CheckpointError
from agilerl_core.hpo.population import Member
from agilerl_core.io.checkpoint import MEMBER_FORMAT, _member_record, _read_json, save_member
from agilerl_core.limits import Limits, applied


class Policy:
    """A member ready to act: a run's elite, one of its population, or a loaded checkpoint.

    RL members act with :meth:`predict`; LLM members (LoRA adapters on a shared base) write with
    :meth:`generate`. A member of a finished :func:`evolve` run is live (what the run left); :meth:`save`
    writes it as a checkpoint :func:`load` reads back."""

    def __init__(self, member: Member, env: dict[str, Any]) -> None:
        self.member = member
        self.env = dict(env)  # what the member acts in, as a label: never imported or called
        self._acting: dict[bool, Acting] = {}  # predict's groups of one: greedy (True) and exploring (False)

    @property
    def agent(self) -> Any:
        """The underlying agent (an RL algorithm's agent, or an LLM member)."""
        return self.member.agent

    @property
    def kind(self) -> str:
        """``"llm"`` for an LLM member, ``"language"`` for a language-game agent (Wordle), ``"rl"`` otherwise."""
        kind = self.env.get("kind")
        return kind if kind in ("llm", "language") else "rl"

    @property
    def algorithm(self) -> str:
        """The algorithm's name in the registry (``dqn``, ``ppo``, ``grpo``, ``ilql``...)."""
        return str(getattr(self.agent, "name", None) or self.agent.algorithm_name)

    @property
    def member_id(self) -> int:
        """The member's id in its run's lineage."""
        return self.member.member_id

    @property
    def fitness(self) -> float | None:
        """Its last evaluation (None before any)."""
        return self.member.fitness

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """Its (evolved) hyperparameters."""
        return self.agent.hp.model_dump()

    @property
    def classes(self) -> list[str] | None:
        """A bandit trained on a table: each arm's label, arm i's at i (the label column's distinct values,
        sorted; numbers as text), so ``policy.classes[policy.predict(x)]`` is the predicted label. None for any
        other member."""
        bandit = self.env.get("bandit")
        return None if not isinstance(bandit, dict) or bandit.get("classes") is None else list(bandit["classes"])

    @property
    def observation_space(self) -> Any:
        """The observation space :meth:`predict` takes (a Dict keyed by agent id for a team); None for LLM and
        language members."""
        spec = None if self.kind != "rl" else getattr(self.agent, "env_spec", None)  # an ippo team has no obs_spec
        return None if spec is None else spec.space

    def __repr__(self) -> str:
        return (f"Policy({self.algorithm}, member {self.member_id}, fitness {self.fitness}, "
                f"env {self.env.get('env_id') or self.env.get('kind')})")

    # ---- acting -------------------------------------------------------------------------------------------
    def predict(self, obs: Any, action_mask: Any = None, deterministic: bool = True) -> Any:
        """Actions as the env takes them (a Box's bounds applied): the greedy ones, or with
        ``deterministic=False`` drawn from the member's exploration policy, as it collects experience in training:

        - ``ppo`` (and each ``ippo``/``mappo`` learner): sampled from the categorical (masked) or Gaussian policy;
        - ``sac``, ``cql``: sampled from the squashed Gaussian;
        - ``td3``, ``ddpg``, ``maddpg``, ``matd3``: the actor plus the member's Gaussian or Ornstein-Uhlenbeck
          exploration noise (clipped to the bounds; a team's Discrete agents sample their softmax);
        - ``dqn``, ``rainbow``, ``cqn``: epsilon-greedy at the member's current epsilon (``eps_start`` decayed
          over the env steps it collected: an offline ``cqn`` member, which collected none, acts at
          ``eps_start``), with fresh parameter noise for noisy networks (Rainbow);
        - ``bc``: greedy (it has no exploration policy);
        - a member still in its warm-up (``random_steps`` not yet collected): uniform random actions.

        A language-game member (``kind: language``) takes a Wordle transcript (whole turns ``guess marks\n``, or
        ``""`` for a new game), or a list of them, and returns its greedy next guess (or a list).

        The draws come from this Policy's own copy of the member's generators, taken at its first such call: they
        are reproducible (the same member, or its checkpoint loaded, draws the same sequence) and leave the
        member's own stream, which its training reads, untouched. Unlike Stable-Baselines3, where
        ``deterministic`` defaults to False, the default here is the greedy action.

        `obs` is one observation as the env returns it (inside the wrappers the run's ``env_wrappers`` named:
        the checkpoint records them, ``policy.env["env_wrappers"]``, but never applies them), or a batch of
        them (a leading batch axis): an array;
        a dict of arrays for a Dict observation space; for a multi-agent team, a dict keyed by agent id (the
        actions come back the same way). One observation gives one action, a batch a batch. `action_mask`
        (single-agent): the env's valid actions, shaped like the actions. A wrong shape raises ValueError
        naming the shape the member was trained on.

        A recurrent member (``network.rnn``) remembers: each call continues the episodes of the previous one
        (one env per row); call :meth:`reset` before new episodes, and ``reset(done)`` with the envs whose
        episode ended."""
        if self.kind == "llm":
            raise TypeError("predict: an LLM member writes text; call generate(prompts)")
        if self.kind == "language":  # a transcript (whole turns "guess marks\n") in, the next guess out
            from agilerl_core.arenas.language import next_guesses

            one = isinstance(obs, str)
            guesses = next_guesses(self.agent, [obs] if one else list(obs))
            return guesses[0] if one else guesses
        spec = self.agent.env_spec  # the spaces it acts in: an ObsSpec, a team's MultiAgentSpec
        wrappers = [w.get("wrapper") for w in self.env.get("env_wrappers") or [] if isinstance(w, dict)]
        batched, obs = _as_batch(obs, spec, f" (the env inside {', '.join(map(str, wrappers))})" if wrappers else "")
        mask = None if action_mask is None else np.asarray(action_mask, dtype=bool)
        if mask is not None and not batched:
            mask = mask[None]
        if not isinstance(deterministic, bool | np.bool_):
            raise TypeError(f"predict: deterministic={deterministic!r}; give True (the greedy action) or False (a "
                            f"draw from the member's exploration policy)")
        with torch.no_grad():
            tensors = spec.to_tensors(obs, self.agent.device)
            key = bool(deterministic)
            if key not in self._acting:
                self._acting[key] = Acting(self.agent, explore=not key)
            actions = self._acting[key].env_action(tensors, mask)
        if isinstance(actions, dict):
            return actions if batched else {k: v[0] for k, v in actions.items()}
        actions = np.asarray(actions)
        return actions if batched else actions[0]

    def reset(self, done: Any = None) -> None:
        """New episodes: every env's (`done` None) or those where `done` is set. A recurrent member forgets them,
        and ``predict(deterministic=False)``'s noise processes start them at 0; otherwise a no-op."""
        if self.kind == "rl":
            ended = None if done is None else np.atleast_1d(np.asarray(done, dtype=bool))
            for acting in self._acting.values():
                acting.reset(ended)

    def generate(self, prompts: str | Sequence[str], max_new_tokens: int | None = None, temperature: float = 0.0,
                 seed: int = 0) -> str | list[str]:
        """Completions of prompt texts (greedy at temperature 0; rendered through the chat template when the
        run used it). One prompt gives one completion, a list a list."""
        if self.kind != "llm":
            raise TypeError(f"generate: a {self.algorithm} member acts in an env; call predict(obs)")
        one = isinstance(prompts, str)
        texts = self.agent.generate([prompts] if one else [str(p) for p in prompts],
                                    bool(self.env.get("chat_template")), max_new_tokens, float(temperature), int(seed))
        return texts[0] if one else texts

    def save(self, path: str | Path) -> Path:
        """Write this member as a checkpoint directory (what :func:`load` reads)."""
        return save_member(path, self.member, self.env)


def _as_batch(obs: Any, spec: Any, wrapped: str = "") -> tuple[bool, Any]:
    """(whether `obs` was a batch, `obs` with a leading batch axis), checked against the spec's spaces."""
    agents = getattr(spec, "agents", None)
    if agents is not None:  # a team: {agent_id: obs}
        if not isinstance(obs, dict) or set(obs) != set(agents):
            raise ValueError(f"predict: a team's observations are a dict keyed by agent id {list(agents)}, got "
                             f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        parts = {a: (np.asarray(obs[a]), tuple(spec.obs[a].space.shape)) for a in agents}
    elif getattr(spec, "is_dict", False):
        keys = list(spec.space.spaces)
        if not isinstance(obs, dict) or set(obs) != set(keys):
            raise ValueError(f"predict: this member observes a Dict with keys {keys}; got "
                             f"{sorted(obs) if isinstance(obs, dict) else type(obs).__name__}")
        parts = {k: (np.asarray(obs[k]), tuple(spec.space.spaces[k].shape)) for k in keys}
    else:
        parts = {"obs": (np.asarray(obs), tuple(spec.space.shape))}
    kinds = set()
    for key, (arr, shape) in parts.items():
        if arr.shape == shape:
            kinds.add(False)
        elif arr.shape[1:] == shape:
            kinds.add(True)
        else:
            where = "" if key == "obs" else f"[{key!r}]"
            raise ValueError(f"predict: observation{where} has shape {arr.shape}; this member was trained on "
                             f"observations of shape {shape} (one) or (batch, *{shape}) (a batch){wrapped}")
    if len(kinds) != 1:
        raise ValueError("predict: mix of one observation and a batch across keys; give every key the same form")
    batched = kinds.pop()
    out = {k: (a if batched else a[None]) for k, (a, _) in parts.items()}
    return batched, out if agents is not None or getattr(spec, "is_dict", False) else out["obs"]


def load(uri: str | Path, device: str = "cpu", limits: Limits | dict[str, Any] | None = None) -> Policy:
    """A saved member ready to act: a member directory (a run's ``elite/``, ``population/members/N``, a
    registered champion's ``member`` artifact), local or ``s3://bucket/prefix/...`` (read with the standard AWS
    environment: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``).

    The checkpoint is data: safetensors and JSON, every file's checksum verified; nothing it names is
    imported, registered or called. An LLM member rebuilds its base from the recorded path or config and
    refuses a base whose weights hash differently. Every size the files declare is checked against the limit
    table before anything is allocated (`limits` raises entries for this load, e.g. ``{"layer_width": 16384}``:
    see docs/security.md).

    Raises:
        CheckpointError: the URI holds no member, or a file is missing, truncated or tampered with.
        StorageError: the S3 store cannot be read (credentials, bucket).
    """
    with applied(limits):
        return _load(uri, device)


def _load(uri: str | Path, device: str) -> Policy:
    text = str(uri)
    if text.startswith("s3://"):
        from agilerl_core.io.storage import open_storage

        parent, _, name = text.rstrip("/").rpartition("/")
        if not name or parent == "s3:/":
            raise CheckpointError(f"{text}: name a member directory, e.g. s3://bucket/runs/RUN/elite")
        with tempfile.TemporaryDirectory(prefix="agilerl-load-") as tmp:
            local = open_storage(parent).download_dir(name, Path(tmp) / "member")
            return _load_dir(local, text, device)
    return _load_dir(Path(uri), text, device)


def _load_dir(path: Path, where: str, device: str) -> Policy:
    if not (path / "member.json").exists() and not (path / "member.json").is_symlink():  # other kinds: named below
        hint = ""
        if (path / "elite" / "member.json").is_file():
            hint = f"; the run's elite is {where.rstrip('/')}/elite"
        elif (path / "population.json").is_file():
            hint = f"; a population: load one member, e.g. {where.rstrip('/')}/members/0"
        raise CheckpointError(f"{where}: no member checkpoint there (member.json){hint}")
    from agilerl_core.io.manifest import verify_committed

    verify_committed(path)  # a member of a committed generation: its files checked against the manifest
    meta = _read_json(path / "member.json", MEMBER_FORMAT, path)
    env = meta.get("env") if isinstance(meta.get("env"), dict) else {}
    if env.get("kind") == "llm":
        from agilerl_core.arenas.llm import load_llm_member

        agent, env = load_llm_member(str(path), device)
        record = _member_record(meta, str(path / "member.json"))  # every field checked
        member = Member(record["member_id"], agent, *record["rest"])
        return Policy(member, env)
    if env.get("kind") == "language":
        from agilerl_core.arenas.language import load_language_member

        agent, env = load_language_member(str(path))
        record = _member_record(meta, str(path / "member.json"))
        return Policy(Member(record["member_id"], agent, *record["rest"]), env)
    member, env = load_member(path, device=device)
    _check_classes(env, member.agent, path / "member.json")
    return Policy(member, env)


def _check_classes(env: dict[str, Any], agent: Any, where: Path) -> None:
    """A table bandit's ``env.bandit.classes`` (read from the checkpoint: data, checked like any other field):
    a list of strings, one per arm of the member."""
    bandit = env.get("bandit")
    classes = bandit.get("classes") if isinstance(bandit, dict) else None
    if classes is None:
        return
    arms = getattr(getattr(agent, "action_spec", None), "dim", None)
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes) or len(classes) != arms:
        raise CheckpointError(f"{where}: env.bandit.classes must list one label (a string) per arm of the member "
                              f"({arms} arms); re-save the member from its run")
