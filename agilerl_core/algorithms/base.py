"""The small shared base of every algorithm.

An algorithm declares its networks, their target copies and optimisers as class data (no metaclasses,
no frame inspection). The base owns what every algorithm shares: building networks from an
architecture spec, flat-buffer Adam, target updates, hyperparameter changes, architecture mutation
(keeping optimiser state for every parameter whose shape did not change), cloning and state I/O.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from agilerl_core.algorithms.optim import FlatAdam, flatten_parameters
from agilerl_core.envs.spaces import ObsSpec
from agilerl_core.hpo.space import HyperparameterSpace
from agilerl_core.networks.evolvable import ArchSpec, EvolvableNetwork
from agilerl_core.networks.transfer import copy_overlap


class RLAlgorithm:
    """Base of all algorithms: networks built from one ArchSpec, evolvable as a group."""

    name: ClassVar[str]
    hp_model: ClassVar[type[BaseModel]]
    default_hp_space: ClassVar[HyperparameterSpace]
    online_networks: ClassVar[tuple[str, ...]]  # trained networks, each with its own Adam
    target_networks: ClassVar[dict[str, str]]  # target name -> online network it tracks
    lr_field: ClassVar[str] = "lr"

    def __init__(self, obs_spec: ObsSpec, action_dim: int, arch: ArchSpec, hp: BaseModel, seed: int,
                 device: str | torch.device = "cpu") -> None:
        self.obs_spec = obs_spec
        self.action_dim = action_dim
        self.device = torch.device(device)
        self.hp = self.hp_model.model_validate(hp.model_dump())
        self.np_rng = np.random.default_rng(seed)
        self.torch_gen = torch.Generator().manual_seed(int(seed))
        self.env_steps = 0  # env steps this member (and its ancestors) collected
        self.learn_steps = 0  # gradient steps taken
        online = {n: EvolvableNetwork(obs_spec, arch, self.torch_gen) for n in self.online_networks}
        self._install(arch, online, self._targets_from(online))

    # ---- networks ------------------------------------------------------------------------------------
    def _targets_from(self, online: dict[str, EvolvableNetwork]) -> dict[str, EvolvableNetwork]:
        targets = {}
        for tname, oname in self.target_networks.items():
            net = EvolvableNetwork(self.obs_spec, online[oname].arch)
            net.load_state_dict(online[oname].state_dict())
            targets[tname] = net
        return targets

    def _install(self, arch: ArchSpec, online: dict[str, EvolvableNetwork],
                 targets: dict[str, EvolvableNetwork]) -> None:
        lr = getattr(self.hp, self.lr_field)
        self.arch = arch
        self.networks: dict[str, EvolvableNetwork] = {}
        self.optimizers: dict[str, FlatAdam] = {}
        self.target_flat: dict[str, torch.Tensor] = {}
        for n, net in online.items():
            net.to(self.device)
            self.networks[n] = net
            self.optimizers[n] = FlatAdam(net, lr)
        for n, net in targets.items():
            net.to(self.device)
            self.networks[n] = net
            self.target_flat[n], _ = flatten_parameters(net, with_grad=False)

    @torch.no_grad()
    def update_targets(self, tau: float) -> None:
        """Polyak-average every target towards its online network (tau=1 copies)."""
        for tname, oname in self.target_networks.items():
            if tau >= 1.0:
                self.target_flat[tname].copy_(self.optimizers[oname].flat)
            else:
                self.target_flat[tname].lerp_(self.optimizers[oname].flat, tau)

    def apply_architecture(self, arch: ArchSpec) -> list[str]:
        """Rebuild every network with `arch`, keeping each weight that still exists in every network
        and the Adam state of every parameter whose shape did not change. Returns the kept names."""
        old_state = {n: self.optimizers[n].state_tensors() for n in self.online_networks}
        online = {n: self.networks[n].rebuilt(arch, self.torch_gen) for n in self.online_networks}
        targets = self._targets_from(online)
        with torch.no_grad():
            for tname in self.target_networks:
                old = dict(self.networks[tname].named_parameters())
                for pname, p in targets[tname].named_parameters():
                    if pname in old:
                        copy_overlap(p, old[pname], centered_dims=(2, 3) if p.ndim == 4 else ())
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
        if name == self.lr_field:
            for opt in self.optimizers.values():
                opt.lr = float(value)

    def param_count(self) -> int:
        return sum(self.networks[n].param_count() for n in self.online_networks)

    # ---- state ----------------------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """(tensors, JSON-able metadata) that fully determine this agent, RNG included."""
        tensors: dict[str, torch.Tensor] = {}
        for n, net in self.networks.items():
            for k, v in net.state_dict().items():
                tensors[f"net/{n}/{k}"] = v.detach().cpu().clone()
        for n, opt in self.optimizers.items():
            for k, v in opt.state_tensors().items():
                tensors[f"opt/{n}/{k}"] = v.cpu()
        tensors["rng/torch"] = self.torch_gen.get_state().clone()
        meta = {
            "algorithm": self.name,
            "arch": self.arch.to_dict(),
            "hp": self.hp.model_dump(),
            "optimizers": {n: opt.scalars() for n, opt in self.optimizers.items()},
            "np_rng": self.np_rng.bit_generator.state,
            "env_steps": self.env_steps,
            "learn_steps": self.learn_steps,
            "action_dim": self.action_dim,
        }
        return tensors, meta

    @classmethod
    def from_state(cls, obs_spec: ObsSpec, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                   device: str | torch.device = "cpu") -> RLAlgorithm:
        """Rebuild an agent from :meth:`state` output (no unpickling anywhere)."""
        if meta.get("algorithm") != cls.name:
            raise ValueError(f"state is for algorithm {meta.get('algorithm')!r}, not {cls.name!r}")
        arch = ArchSpec.from_dict(meta["arch"])
        agent = cls(obs_spec, int(meta["action_dim"]), arch, cls.hp_model.model_validate(meta["hp"]), 0, device)
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
        return agent

    def clone(self) -> RLAlgorithm:
        """An independent copy (same weights, optimiser state, hyperparameters and RNG)."""
        tensors, meta = self.state()
        return type(self).from_state(self.obs_spec, tensors, meta, self.device)
