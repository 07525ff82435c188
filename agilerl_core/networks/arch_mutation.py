"""Architecture mutations: pure functions of an :class:`~agilerl_core.networks.evolvable.ArchSpec` within its
:class:`~agilerl_core.networks.evolvable.ArchBounds` (a network rebuilt for the new spec keeps its weights:
:meth:`~agilerl_core.networks.evolvable.EvolvableNetwork.rebuilt`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from agilerl_core.networks.evolvable import ArchBounds, ArchSpec

LAYER_MUTATIONS = ("mlp.add_layer", "mlp.remove_layer", "cnn.add_layer", "cnn.remove_layer", "rnn.add_layer",
                   "rnn.remove_layer")
NODE_MUTATIONS = ("mlp.add_nodes", "mlp.remove_nodes", "cnn.add_channels", "cnn.remove_channels",
                  "cnn.change_kernel", "enc.add_nodes", "enc.remove_nodes", "rnn.add_nodes", "rnn.remove_nodes")



def applicable_mutations(arch: ArchSpec, names: tuple[str, ...]) -> list[str]:
    """The mutations in `names` that act on a part `arch` has (head MLP always; convs, key encoders, core)."""
    return [n for n in names if n.startswith("mlp.") or (n.startswith("cnn.") and arch.cnns)
            or (n.startswith("enc.") and arch.encoders) or (n.startswith("rnn.") and arch.rnn is not None)]


def _mutate_rnn(arch: ArchSpec, name: str, bounds: ArchBounds, rng: np.random.Generator) -> tuple[ArchSpec, str] | None:
    rnn = arch.rnn
    if name == "rnn.add_layer":
        if rnn.layers >= bounds.max_rnn_layers:
            return None
        return replace(arch, rnn=replace(rnn, layers=rnn.layers + 1)), name
    if name == "rnn.remove_layer":
        return None if rnn.layers <= 1 else (replace(arch, rnn=replace(rnn, layers=rnn.layers - 1)), name)
    n = int(rng.choice(bounds.node_changes))
    new = min(rnn.hidden + n, bounds.max_nodes) if name == "rnn.add_nodes" else max(rnn.hidden - n, bounds.min_nodes)
    if new == rnn.hidden:
        return None
    return (replace(arch, rnn=replace(rnn, hidden=new), mlp=replace(arch.mlp, in_dim=new)),
            f"{name}({new - rnn.hidden:+d})")


def _map_cnns(arch: ArchSpec, fn) -> ArchSpec | None:
    cnns = tuple((k, fn(s)) for k, s in arch.cnns)
    if any(not s.is_valid() for _, s in cnns):
        return None
    change = sum(s.latent_dim for _, s in cnns) - sum(s.latent_dim for _, s in arch.cnns)
    if arch.rnn is not None:  # the conv latents feed the core, not the head
        return replace(arch, cnns=cnns, rnn=replace(arch.rnn, in_dim=arch.rnn.in_dim + change))
    return replace(arch, mlp=replace(arch.mlp, in_dim=arch.mlp.in_dim + change), cnns=cnns)


def propose_mutation(arch: ArchSpec, name: str, bounds: ArchBounds,
                     rng: np.random.Generator) -> tuple[ArchSpec, str] | None:
    """Apply architecture mutation `name` to `arch`; None when the bounds forbid it."""
    if name.startswith("rnn."):
        return None if arch.rnn is None else _mutate_rnn(arch, name, bounds, rng)
    mlp = arch.mlp
    hidden = list(mlp.hidden)
    if name == "mlp.add_layer":
        if len(hidden) >= bounds.max_hidden_layers:
            return None
        return replace(arch, mlp=replace(mlp, hidden=(*hidden, hidden[-1]))), f"{name}({hidden[-1]})"
    if name == "mlp.remove_layer":
        if len(hidden) <= bounds.min_hidden_layers:
            return None
        return replace(arch, mlp=replace(mlp, hidden=tuple(hidden[:-1]))), name
    if name in ("mlp.add_nodes", "mlp.remove_nodes"):
        i = int(rng.integers(len(hidden)))
        n = int(rng.choice(bounds.node_changes))
        new = min(hidden[i] + n, bounds.max_nodes) if name == "mlp.add_nodes" else max(hidden[i] - n, bounds.min_nodes)
        if new == hidden[i]:
            return None
        hidden[i] = new
        return replace(arch, mlp=replace(mlp, hidden=tuple(hidden))), f"{name}(layer={i}, {new - mlp.hidden[i]:+d})"
    if name in ("enc.add_nodes", "enc.remove_nodes"):
        if not arch.encoders:
            return None
        enc_hidden = list(arch.encoders[0][1].hidden)
        if not enc_hidden:
            return None
        i = int(rng.integers(len(enc_hidden)))
        n = int(rng.choice(bounds.node_changes))
        old = enc_hidden[i]
        new = min(old + n, bounds.max_nodes) if name == "enc.add_nodes" else max(old - n, bounds.min_nodes)
        if new == old:
            return None
        encoders = tuple((k, replace(s, hidden=tuple(new if j == i else h for j, h in enumerate(s.hidden))))
                         for k, s in arch.encoders)
        return replace(arch, encoders=encoders), f"{name}(layer={i}, {new - old:+d})"
    if not arch.cnns:
        return None
    ref = arch.cnns[0][1]
    layers = len(ref.channels)
    if name == "cnn.add_layer":
        if layers >= bounds.max_conv_layers:
            return None
        k = min(bounds.kernel_choices)
        out = _map_cnns(arch, lambda s: replace(s, channels=(*s.channels, s.channels[-1]),
                                                kernels=(*s.kernels, k), strides=(*s.strides, 1)))
        return None if out is None else (out, f"{name}(k={k})")
    if name == "cnn.remove_layer":
        if layers <= bounds.min_conv_layers:
            return None
        out = _map_cnns(arch, lambda s: replace(s, channels=s.channels[:-1], kernels=s.kernels[:-1],
                                                strides=s.strides[:-1]))
        return None if out is None else (out, name)
    if name in ("cnn.add_channels", "cnn.remove_channels"):
        i = int(rng.integers(layers))
        n = int(rng.choice(bounds.channel_changes))
        c = ref.channels[i]
        new = min(c + n, bounds.max_channels) if name == "cnn.add_channels" else max(c - n, bounds.min_channels)
        if new == c:
            return None
        out = _map_cnns(arch, lambda s: replace(s, channels=tuple(new if j == i else x for j, x in enumerate(s.channels))))
        return None if out is None else (out, f"{name}(layer={i}, {new - c:+d})")
    if name == "cnn.change_kernel":
        i = int(rng.integers(layers))
        choices = [k for k in bounds.kernel_choices if k != ref.kernels[i]]
        if not choices:
            return None
        k = int(rng.choice(choices))
        out = _map_cnns(arch, lambda s: replace(s, kernels=tuple(k if j == i else x for j, x in enumerate(s.kernels))))
        return None if out is None else (out, f"{name}(layer={i}, k={k})")
    raise ValueError(f"unknown architecture mutation {name!r}")


def with_activation(arch: ArchSpec, activation: str) -> ArchSpec:
    """The same architecture with another hidden activation (MLP and convs)."""
    return replace(arch, mlp=replace(arch.mlp, activation=activation),
                   cnns=tuple((k, replace(s, activation=activation)) for k, s in arch.cnns),
                   encoders=tuple((k, replace(s, activation=activation)) for k, s in arch.encoders))
