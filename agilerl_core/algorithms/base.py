"""The small shared base of every algorithm.

An algorithm declares its networks, their target copies and optimisers as class data (no metaclasses,
no frame inspection). The base owns what every algorithm shares: building networks from an
architecture spec, flat-buffer Adam state, hyperparameter changes, architecture mutation (keeping optimiser
state for every parameter whose shape did not change), cloning and state I/O. A member acts and learns only
through its group (:mod:`agilerl_core.algorithms.group`; alone, a group of one: :mod:`.acting`).

A member's state is its flat buffers (each optimiser's weights, moments and step powers, each target's weights)
read through its networks' :class:`~agilerl_core.networks.evolvable.Layout`: groups, checkpoints, finiteness
checks, selection and parameter noise never need its modules, so a selection's clone has none built;
:attr:`RLAlgorithm.networks` builds them over the buffers when an edge asks (an architecture mutation, a caller).
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from agilerl_core.algorithms.group_state import ADAM_STATE, gather_rows, plain_mlp_shape_key, repoint
from agilerl_core.algorithms.hyperparameters.base import Hyperparameters
from agilerl_core.algorithms.optim import FlatAdam, flatten_parameters
from agilerl_core.envs.spaces import ActionSpec, Obs, ObsSpec
from agilerl_core.hpo.evolvable import RL_MUTATION_KINDS, MutationSettings
from agilerl_core.networks.arch_mutation import (
    LAYER_MUTATIONS,
    NODE_MUTATIONS,
    applicable_mutations,
    propose_mutation,
    with_activation,
)
from agilerl_core.networks.evolvable import ArchSpec, EvolvableNetwork, Layout
from agilerl_core.networks.obs_norm import RunningObsNorm
from agilerl_core.networks.transfer import copy_overlap

# the member a clone's shell is made from (RLAlgorithm._copy_shell), read by the constructor it runs
_SHELL_OF: ContextVar[RLAlgorithm | None] = ContextVar("shell_of", default=None)


class RLAlgorithm(ABC):
    """Base of all algorithms: networks built from one ArchSpec, evolvable as a group."""

    name: ClassVar[str]
    hp_model: ClassVar[type[Hyperparameters]]  # its mutable space: hp_model.default_space
    online_networks: ClassVar[tuple[str, ...]]  # trained networks, each with its own Adam
    target_networks: ClassVar[dict[str, str]]  # target name -> online network it tracks
    lr_field: ClassVar[str] = "lr"  # the hp field of every optimiser's learning rate...
    optimizer_lrs: ClassVar[dict[str, str]] = {}  # ...unless a network names its own here
    noise_networks: ClassVar[tuple[str, ...] | None] = None  # parameter-noise mutation targets (None: all online)
    action_kinds: ClassVar[tuple[str, ...]] = ("discrete",)  # ActionSpec kinds the algorithm handles
    uses_replay: ClassVar[bool] = True  # off-policy: learns from the shared replay buffer
    mutation_kinds: ClassVar[frozenset[str]] = RL_MUTATION_KINDS  # (Evolvable protocol)
    group_class: ClassVar[type | None] = None  # the MemberGroup that learns for this algorithm's members

    def __init__(self, obs_spec: ObsSpec, action: ActionSpec | int, arch: ArchSpec, hp: BaseModel, seed: int,
                 device: str | torch.device = "cpu") -> None:
        self.obs_spec = obs_spec
        self.init_actions(action)
        self.device = torch.device(device)
        self.hp = self.hp_model.model_validate(hp.model_dump())
        self.np_rng = np.random.default_rng(seed)
        self.torch_gen = torch.Generator().manual_seed(int(seed))
        self.env_steps = 0  # env steps this member (and its ancestors) collected
        self.learn_steps = 0  # gradient steps taken
        self.obs_norm = RunningObsNorm(obs_spec.vector_dim, self.hp.obs_norm_clip) if self.hp.normalize_obs else None
        parent = _SHELL_OF.get()
        if parent is not None and type(parent) is type(self):
            _SHELL_OF.set(None)  # (a member its constructor builds is no shell)
            self._install_shell(parent)
            return
        std = getattr(self.hp, "noisy_std", 0.5)
        online = {n: EvolvableNetwork(self.network_obs_spec(n), self.network_arch(arch, n), self.torch_gen, std)
                  for n in self.online_networks}
        self._install(arch, online, self._targets_from(online))

    def init_actions(self, action: Any) -> None:
        """Set `action_spec` and `action_dim` from the constructor's `action` (an ActionSpec, or a number of
        discrete actions); multi-agent algorithms take one per agent."""
        self.action_spec = action if isinstance(action, ActionSpec) else ActionSpec("discrete", int(action))
        if self.action_spec.kind not in self.action_kinds:
            raise ValueError(f"{self.name} does not handle {self.action_spec.kind} actions")
        self.action_dim = self.action_spec.dim

    @property
    def env_spec(self) -> Any:
        """The spaces a checkpoint records as data to rebuild this agent (its ObsSpec; a team's MultiAgentSpec)."""
        return self.obs_spec

    def action_meta(self) -> Any:
        """The actions as checkpoint JSON (:meth:`action_from_meta` reads it back)."""
        return self.action_spec.to_dict()

    @classmethod
    def action_from_meta(cls, meta: dict[str, Any]) -> Any:
        return ActionSpec.from_dict(meta["action"]) if "action" in meta else int(meta["action_dim"])

    # ---- observations ---------------------------------------------------------------------------------
    def observe(self, obs: Obs) -> None:
        """Fold a batch of training observations into the running normalisation statistics (a no-op
        unless normalize_obs). Leading dimensions are flattened: a rollout's [T, N, ...] works too."""
        if self.obs_norm is None:
            return
        vector, _ = self.obs_spec.preprocess({p.key: obs[p.key].reshape(-1, *p.shape) for p in self.obs_spec.parts})
        self.obs_norm.update(vector)

    # ---- networks ------------------------------------------------------------------------------------
    def network_io(self, name: str) -> tuple[int, int]:
        """(extra input width, output width) of online network `name`: its MLP takes the observation
        features plus `extra` inputs (an action, for Q(s, a) critics) and has `output` units."""
        return 0, self.action_dim

    def network_obs_spec(self, name: str) -> ObsSpec:
        """The observations network `name` reads (the agent's; a multi-agent critic reads every agent's)."""
        return self.obs_spec

    def network_arch(self, arch: ArchSpec, name: str) -> ArchSpec:
        """Network `name`'s architecture derived from the agent's shared one: every network of an agent
        has the same hidden layers, activation and encoders, so one mutation changes them together."""
        extra, out = self.network_io(name)
        return replace(arch, mlp=replace(arch.mlp, in_dim=arch.mlp.in_dim + extra, out_dim=out))

    def lr_field_for(self, name: str) -> str:
        """The hyperparameter holding network `name`'s learning rate."""
        return self.optimizer_lrs.get(name, self.lr_field)

    def lr_for(self, name: str) -> float:
        return float(getattr(self.hp, self.lr_field_for(name)))

    def _targets_from(self, online: dict[str, EvolvableNetwork]) -> dict[str, EvolvableNetwork]:
        targets = {}
        for tname, oname in self.target_networks.items():
            net = EvolvableNetwork(online[oname].obs_spec, online[oname].arch)
            net.load_state_dict(online[oname].state_dict())
            targets[tname] = net
        return targets

    def _install(self, arch: ArchSpec, online: dict[str, EvolvableNetwork],
                 targets: dict[str, EvolvableNetwork]) -> None:
        self.arch = arch
        self._networks: dict[str, EvolvableNetwork] | None = {}
        self.optimizers: dict[str, FlatAdam] = {}
        self.target_flat: dict[str, torch.Tensor] = {}
        for net in (*online.values(), *targets.values()):
            net.obs_norm = self.obs_norm
        for n, net in (*online.items(), *targets.items()):
            net.to(self.device)
            self._networks[n] = net
        self.layouts: dict[str, Layout] = {n: net.layout() for n, net in self._networks.items()}
        self.install_optimizers(online, targets)

    def _install_shell(self, parent: RLAlgorithm) -> None:
        """A clone's start (:meth:`_copy_shell`): `parent`'s architecture and layouts, its optimisers' scalars and
        zero buffers of their sizes, no module built (:attr:`networks` builds them on first use over whatever
        buffers the member holds then; :meth:`set_flat_buffer` sets the parent's rows next)."""
        self.arch, self.layouts, self._networks = parent.arch, parent.layouts, None
        self.optimizers, adams = {}, {}
        for n, opt in parent.optimizers.items():
            adam = getattr(opt, "adam", opt)
            if id(adam) not in adams:
                shell = adams[id(adam)] = adam.shell()
                for name in ADAM_STATE:
                    setattr(shell, name, torch.zeros_like(getattr(adam, name)))
            self.optimizers[n] = adams[id(adam)] if opt is adam else adams[id(adam)].view(opt.index)
        self.target_flat = {t: torch.zeros_like(f) for t, f in parent.target_flat.items()}
        for name, buffer in parent.target_buffers().items():
            if name not in self.target_flat:
                self.set_target_buffer(name, torch.zeros_like(buffer))

    @property
    def networks(self) -> dict[str, EvolvableNetwork]:
        """Every network by name (online, then targets), its parameters views of this member's flat buffers:
        built on first use when the member was made without modules (a clone), as the edges need them
        (architecture and parameter mutations, a caller reading a network); training, evaluation, checkpoints and
        selection read the buffers and :attr:`layouts`."""
        if self._networks is None:
            self._networks = self._built_networks()
        return self._networks

    def _built_networks(self) -> dict[str, EvolvableNetwork]:
        std = getattr(self.hp, "noisy_std", 0.5)
        nets = {}
        for n, buffer in self.weight_buffers().items():
            net = nets[n] = EvolvableNetwork.over(self.layouts[n], buffer, std).to(self.device)
            net.obs_norm = self.obs_norm
            if n in self.target_networks:
                net.requires_grad_(False)
        for n, opt in self.optimizers.items():  # re-pointed with the Adam's buffer from now on
            getattr(opt, "adam", opt).modules.append(nets[n])
        return nets

    def weight_buffers(self) -> dict[str, torch.Tensor]:
        """Each network's weights (its optimiser's flat buffer, or the target's), by network name, online
        networks then targets as :attr:`networks` orders them."""
        out = {n: self.optimizers[n].flat for n in self.online_networks}
        out.update({t: self.target_flat[t] for t in self.target_networks})
        return out

    def param_shapes(self, name: str) -> list[tuple[int, ...]]:
        """Network `name`'s parameter shapes in its flat buffer's order."""
        return self.layouts[name].shapes

    def install_optimizers(self, online: dict[str, EvolvableNetwork], targets: dict[str, EvolvableNetwork]) -> None:
        """Fill `optimizers` (one per online network) and `target_flat` (a flat buffer per target network).
        Default: a FlatAdam of its own for each network."""
        for n, net in online.items():
            self.optimizers[n] = FlatAdam(net, self.lr_for(n))
        for n, net in targets.items():
            self.target_flat[n], _ = flatten_parameters(net, with_grad=False)

    def apply_architecture(self, arch: ArchSpec) -> list[str]:
        """Rebuild every network with `arch`, keeping each weight that still exists in every network
        and the Adam state of every parameter whose shape did not change. Returns the kept names."""
        old_state = {n: self.optimizers[n].state_tensors() for n in self.online_networks}
        old = {n: self.layouts[n].views(b) for n, b in self.weight_buffers().items()}  # no old module is built
        online = {n: EvolvableNetwork.rebuilt_from(self.layouts[n], old[n], self.network_arch(arch, n), self.torch_gen,
                                                   getattr(self.hp, "noisy_std", 0.5)) for n in self.online_networks}
        targets = self._targets_from(online)
        with torch.no_grad():
            for tname in self.target_networks:
                for pname, p in targets[tname].named_parameters():
                    if pname in old[tname]:
                        copy_overlap(p, old[tname][pname], centered_dims=(2, 3) if p.ndim == 4 else ())
        self._install(arch, online, targets)
        kept: list[str] = []
        for n in self.online_networks:
            kept += [f"{n}.{k}" for k in self.optimizers[n].load_state_tensors(old_state[n], strict=False)]
        return kept

    def set_hyperparameter(self, name: str, value: Any) -> None:
        """Set one hyperparameter (validated); the learning rate reaches the optimisers at once."""
        if self.hp_model.model_fields[name].annotation is int:  # a float-kind spec on an int field: round
            value = round(value)
        self.hp = self.hp_model.model_validate({**self.hp.model_dump(), name: value})
        for n, opt in self.optimizers.items():
            if self.lr_field_for(n) == name:
                opt.lr = float(value)

    # ---- the Evolvable protocol (agilerl_core.hpo.evolvable) -----------------------------------------
    def describe(self) -> str:
        return self.arch.describe()

    def mutate(self, kind: str, rng: np.random.Generator, settings: MutationSettings) -> str:
        """Architecture, parameter-noise and activation mutations of every network together."""
        if kind == "architecture":
            return self._mutate_architecture(rng, settings)
        if kind == "parameters":
            return self._perturb_parameters(rng, settings.parameter_strength)
        if kind == "activation":
            return self._mutate_activation(rng, settings.arch_bounds.activation_choices)
        raise ValueError(f"{self.name} has no mutation of kind {kind!r}; its kinds are {sorted(self.mutation_kinds)}")

    def _mutate_architecture(self, rng: np.random.Generator, settings: MutationSettings) -> str:
        layer = rng.random() < settings.new_layer_share
        names = applicable_mutations(self.arch, LAYER_MUTATIONS if layer else NODE_MUTATIONS)
        for i in rng.permutation(len(names)):
            proposal = propose_mutation(self.arch, names[i], settings.arch_bounds, rng)
            if proposal is not None:
                arch, desc = proposal
                self.apply_architecture(arch)
                return f"arch:{desc}"
        return "none(arch at bounds)"

    @torch.no_grad()
    def _perturb_parameters(self, rng: np.random.Generator, strength: float) -> str:
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        buffers = self.weight_buffers()
        for name in self.noise_networks or self.online_networks:
            for p in self.layouts[name].views(buffers[name]).values():
                if p.ndim >= 2 and p.numel() > 1:
                    noise = torch.randn(p.shape, generator=gen).to(p.device)
                    p.add_(noise * (strength * p.std()))
        return f"params:noise({strength})"

    def _mutate_activation(self, rng: np.random.Generator, activation_choices) -> str:
        choices = [a for a in activation_choices if a != self.arch.activation]
        if not choices:
            return "none(one activation)"
        act = str(rng.choice(choices))
        self.apply_architecture(with_activation(self.arch, act))
        return f"activation:{act}"

    # ---- population-batched learning (agilerl_core.algorithms.group) ---------------------------------
    def batch_key(self) -> tuple | None:
        """Members with equal keys can learn as one stacked group (same network shapes and structural
        options); None: this member trains on its own. Default: no batched path."""
        return None

    def batch_refusal(self) -> str:
        """Why :meth:`batch_key` is None (the run's summary names it)."""
        return f"{self.name} has no population-batched learning path"

    @classmethod
    def group(cls, agents: list[RLAlgorithm]) -> Any:
        """The :class:`~agilerl_core.algorithms.group.MemberGroup` that trains `agents` (equal batch keys)."""
        if cls.group_class is None:
            raise TypeError(f"{cls.name} has no population-batched learning path (batch_key is None)")
        return cls.group_class(agents)

    def _group_key(self, *options: Any) -> tuple:
        """A plain-MLP agent's batch key: algorithm, architecture up to hidden widths (narrower members stack
        zero-padded), device, Adam constants and the algorithm's own structural `options`."""
        adams = tuple((o.betas, o.eps) for o in self.optimizers.values())
        return (self.name, plain_mlp_shape_key(self.arch), str(self.device), adams, *options)

    # ---- hooks of the training loops (a member acts and learns only through its group) -------------------
    def committed(self, first: int, count: int, dead: torch.Tensor | None = None) -> None:
        """Called after the shared ring received `count` new transitions starting at row `first` (and dropped
        rows `dead`, see ReplayBuffer.dead_committed_rows). Default: nothing to do."""
        return None

    def begin_rollout(self, num_envs: int) -> None:
        """Called before a training phase collects experience from `num_envs` freshly reset envs. Default: nothing to do."""
        return None

    def episodes_done(self, done: np.ndarray) -> None:
        """Called after every vector step with the sub-envs whose episode just ended. Default: nothing to do."""
        return None

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        """Algorithm-specific state beyond networks, optimisers and RNGs (saved in checkpoints)."""
        return {}

    def load_extra_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`extra_tensors` output. Default: nothing to do."""
        return None

    def param_count(self) -> int:
        return sum(self.layouts[n].size for n in self.online_networks)

    # ---- state ----------------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON-able metadata) that fully determine this agent, RNG included."""
        tensors: dict[str, torch.Tensor] = {}
        for n, buffer in self.weight_buffers().items():  # (a network's state is its parameters: no buffers)
            for k, v in self.layouts[n].views(buffer).items():
                tensors[f"net/{n}/{k}"] = v.detach().cpu().clone()
        for n, opt in self.optimizers.items():
            for k, v in opt.state_tensors().items():
                tensors[f"opt/{n}/{k}"] = v.cpu()
        tensors["rng/torch"] = self.torch_gen.get_state().clone()
        for k, v in self.extra_tensors().items():
            tensors[f"extra/{k}"] = v.detach().cpu().clone()
        if self.obs_norm is not None:
            tensors.update({f"obs_norm/{k}": v for k, v in self.obs_norm.tensors().items()})
        meta = {
            "algorithm": self.name,
            "arch": self.arch.to_dict(),
            "hp": self.hp.model_dump(),
            "optimizers": {n: opt.scalars() for n, opt in self.optimizers.items()},
            "np_rng": self.np_rng.bit_generator.state,
            "env_steps": self.env_steps,
            "learn_steps": self.learn_steps,
            "action_dim": self.action_dim,
            "action": self.action_meta(),
        }
        return tensors, meta

    @classmethod
    def from_state(cls, obs_spec: ObsSpec, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                   device: str | torch.device = "cpu", **init: Any) -> RLAlgorithm:
        """Rebuild an agent from :meth:`state` output (no unpickling anywhere); `init`: the constructor's own
        keyword arguments (:meth:`init_kwargs`)."""
        if meta.get("algorithm") != cls.name:
            raise ValueError(f"state is for algorithm {meta.get('algorithm')!r}, not {cls.name!r}")
        arch = ArchSpec.from_dict(meta["arch"])
        agent = cls(obs_spec, cls.action_from_meta(meta), arch, cls.hp_model.model_validate(meta["hp"]), 0, device,
                    **init)
        with torch.no_grad():
            for n, net in agent.networks.items():
                for k, p in net.state_dict().items():
                    src = tensors.get(f"net/{n}/{k}")
                    if src is None or tuple(src.shape) != tuple(p.shape):
                        raise ValueError(f"weights for {n}.{k} are missing or have the wrong shape")
                    p.copy_(src)
        for n, opt in agent.optimizers.items():
            prefix = f"opt/{n}/"
            opt.load_state_tensors({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            sc = meta["optimizers"][n]
            opt.lr, opt.betas, opt.eps = float(sc["lr"]), tuple(sc["betas"]), float(sc["eps"])
        agent.torch_gen.set_state(tensors["rng/torch"].clone())
        agent.np_rng.bit_generator.state = meta["np_rng"]
        agent.env_steps = int(meta["env_steps"])
        agent.learn_steps = int(meta["learn_steps"])
        agent.load_extra_tensors({k[6:]: v for k, v in tensors.items() if k.startswith("extra/")})
        if agent.obs_norm is not None:
            agent.obs_norm.load_tensors({k[9:]: v for k, v in tensors.items() if k.startswith("obs_norm/")})
        return agent

    def reseed(self, seed: int) -> None:
        """Fresh numpy and torch generators from `seed` (exploration, noise, minibatch and shuffle draws)."""
        self.np_rng = np.random.default_rng(seed)
        self.torch_gen.manual_seed(int(seed))

    def clone(self) -> RLAlgorithm:
        """An independent copy (same weights, optimiser state, hyperparameters and RNG)."""
        tensors, meta = self.state()
        return type(self).from_state(self.obs_spec, tensors, meta, self.device, **self.init_kwargs())

    @staticmethod
    def clone_many(parents: Sequence[RLAlgorithm]) -> list[RLAlgorithm]:
        """Independent copies of `parents` (a selection's picks, in slot order, repeats allowed), each what
        :meth:`clone` makes. The copies of parents of one class and architecture are rows of one state: each of
        their flat buffers (weights, Adam moments and step powers, targets) is gathered from the parents' in
        one op (an index gather when the parents are rows of a group's state, a stack otherwise), so the next
        group of those members adopts them without a copy. A class with a clone of its own clones itself."""
        out: list[RLAlgorithm | None] = [None] * len(parents)
        kinds: dict[tuple, list[int]] = {}
        for i, p in enumerate(parents):
            if type(p).clone is not RLAlgorithm.clone:
                out[i] = p.clone()
                continue
            shapes = tuple(tuple(layout.shapes) for layout in p.layouts.values())
            kinds.setdefault((type(p), repr(p.arch), shapes), []).append(i)
        for slots in kinds.values():
            children = [parents[i]._copy_shell() for i in slots]
            buffers = [parents[i].flat_buffers() for i in slots]
            for name in buffers[0]:
                for child, row in zip(children, gather_rows([b[name] for b in buffers]), strict=True):
                    child.set_flat_buffer(name, row)
            for i, child in zip(slots, children, strict=True):
                out[i] = child
        return out

    @torch.no_grad()
    def _copy_shell(self) -> RLAlgorithm:
        """A copy of everything but the flat buffers (:meth:`clone_many` gathers those): hyperparameters,
        generators, counters, optimiser scalars, extra tensors, observation statistics (the networks hold no
        persistent buffers: every tensor of their state is a parameter, in a flat buffer). The constructor runs
        (what a subclass sets up, it sets up) but builds no network: the shell takes this member's layouts
        (:meth:`_install_shell`)."""
        cls = type(self)
        token = _SHELL_OF.set(self)  # no networks of its own: the parent's layouts, its buffers set next
        try:
            child = cls(self.obs_spec, cls.action_from_meta({"action": self.action_meta()}), self.arch, self.hp, 0,
                        self.device, **self.init_kwargs())
        finally:
            _SHELL_OF.reset(token)
        child.torch_gen.set_state(self.torch_gen.get_state().clone())
        child.np_rng.bit_generator.state = self.np_rng.bit_generator.state
        child.env_steps, child.learn_steps = self.env_steps, self.learn_steps
        for n, opt in self.optimizers.items():
            child.optimizers[n].lr, child.optimizers[n].betas, child.optimizers[n].eps = opt.lr, opt.betas, opt.eps
        child.load_extra_tensors({k: v.detach().clone() for k, v in self.extra_tensors().items()})
        if self.obs_norm is not None:
            child.obs_norm.load_tensors({k: v.clone() for k, v in self.obs_norm.tensors().items()})
        return child

    def _adams(self) -> dict[str, FlatAdam]:
        """Each distinct Adam of :attr:`optimizers` (a view's shared one once), by the first name stepping it."""
        out: dict[str, FlatAdam] = {}
        for n, opt in self.optimizers.items():
            adam = getattr(opt, "adam", opt)  # an AdamView steps with its FlatAdam
            if all(a is not adam for a in out.values()):
                out[n] = adam
        return out

    def target_buffers(self) -> dict[str, torch.Tensor]:
        """Each target network's flat buffer, by name."""
        return dict(self.target_flat)

    def set_target_buffer(self, name: str, flat: torch.Tensor) -> None:
        """Make `flat` (laid out as the old one) the buffer of target `name`: a group's row, a clone's."""
        self.target_flat[name] = flat

    def flat_buffers(self) -> dict[str, torch.Tensor]:
        """Every flat buffer of this member by name: each Adam's weights, moments and step powers
        (``adam/<optimiser>/<field>``) and each target's weights (``target/<name>``)."""
        out = {f"adam/{n}/{f}": getattr(adam, f) for n, adam in self._adams().items() for f in ADAM_STATE}
        out.update({f"target/{t}": flat for t, flat in self.target_buffers().items()})
        return out

    @torch.no_grad()
    def set_flat_buffer(self, name: str, buffer: torch.Tensor) -> None:
        """Make `buffer` (laid out as the old one, holding the values to keep) flat buffer `name` of
        :meth:`flat_buffers`; the networks' parameters in a weights buffer become views of it."""
        kind, _, rest = name.partition("/")
        if kind == "target":
            repoint(self.built_parameters(), self.target_buffers()[rest], buffer)
            self.set_target_buffer(rest, buffer)
            return
        opt, _, field = rest.rpartition("/")
        adam = self._adams()[opt]
        if field == "flat":
            repoint([p for m in adam.modules for p in m.parameters()], adam.flat, buffer)
        setattr(adam, field, buffer)

    def built_parameters(self) -> list[torch.Tensor]:
        """The parameters of every network built so far (none for a clone whose networks nobody asked for)."""
        return [p for net in (self._networks or {}).values() for p in net.parameters()]

    def init_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the constructor beyond the common ones (a copy is built with them). Default: none."""
        return {}
