"""K networks of one structure evaluated in one batched pass, each member with its own weights.

The networks' parameters live stacked in one [K, P] state, one row per network (its own flat buffer; a narrower
member's values in the leading corner of each padded parameter, zeros around them): parameter j of all K networks
is a [K, *shape] view of the columns it occupies.
A batched forward is then one batched matmul per linear layer and one grouped convolution per conv layer
for all K networks instead of K small ones; on a CPU the per-op overhead of small networks, and on a GPU
the kernel count, is what this saves.

:class:`StackedNetwork` evaluates any :class:`~agilerl_core.networks.evolvable.EvolvableNetwork` structure
(per-key and conv encoders, noisy layers, a dueling head, observation normalisation) and is differentiable:
autograd reaches the flat buffer when it requires grad. :func:`stacked_forward` evaluates plain MLPs given
as (weight, bias) blocks (MADDPG's critics: C x N networks per member, stacked once more over the members).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from agilerl_core.envs.spaces import Obs
from agilerl_core.networks.evolvable import Layout
from agilerl_core.networks.obs_norm import StackedObsNorm
from agilerl_core.networks.recurrent import run_sequence
from agilerl_core.networks.transfer import ACTIVATION_FNS
from agilerl_core.rng import MemberDraws

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # (weight [K, out, in], bias [K, out]) per layer


def stackable(nets: list[nn.Module]) -> bool:
    """Whether `nets` (EvolvableNetworks) are plain MLPs of one architecture (no encoders, noise or dueling
    head), which :func:`stacked_forward` can evaluate together."""
    first = nets[0]
    spec = first.mlp.spec
    return (all(n.plain_mlp and n.mlp.spec == spec for n in nets) and not spec.noisy and not spec.dueling
            and first.obs_norm is None)


def stacked_layer(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One linear layer of K stacked networks: [K, B, out] from a shared input [B, in] (one matmul against
    every network's rows) or one input each [K, B, in]."""
    k, out = w.shape[0], w.shape[1]
    if x.dim() == 2:
        return torch.addmm(b.reshape(-1), x, w.reshape(k * out, -1).t()).view(x.shape[0], k, out).transpose(0, 1)
    return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))


def stacked_forward(layers: Layers, x: torch.Tensor, activation: str,
                    inputs: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Outputs [K, B, out] of K stacked MLPs on `x`: one input [B, in] for all of them, or one each
    [K, B, in]. Each network computes exactly what its own forward would (up to float rounding). With
    `inputs` (a list), every layer's input is appended to it (what a hand-written backward needs)."""
    act = ACTIVATION_FNS[activation]
    h = x
    last = len(layers) - 1
    for i, (w, b) in enumerate(layers):
        if inputs is not None:
            inputs.append(h)
        h = stacked_layer(w, b, h)
        if i < last:
            h = act(h)
    return h


def parameter_blocks(flat: torch.Tensor, k: int, padded: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
    """The [K, *shape] block of every parameter in a stacked state (`flat` [K, P]: one row per network, its
    parameters one after another; views, in layout order)."""
    rows = flat.view(k, -1)
    views, i = [], 0
    for shape in padded:
        n = math.prod(shape)
        views.append(rows[:, i: i + n].view(k, *shape))
        i += n
    return views


def trainable_blocks(flat: torch.Tensor, k: int, padded: Sequence[tuple[int, ...]]) -> list[torch.Tensor]:
    """:func:`parameter_blocks` as leaf tensors that require grad and share `flat`'s storage: autograd hands each
    block its gradient directly (views of one leaf would each scatter theirs into a buffer the size of the
    whole: measured a third of a small network's step), and an optimiser stepping `flat` in place moves them."""
    return [b.requires_grad_(True) for b in parameter_blocks(flat.detach(), k, padded)]


# d act(z) / dz times an upstream gradient, from the activation's output (as autograd computes them)
_DERIVATIVES = {
    "relu": lambda grad, out: torch.ops.aten.threshold_backward(grad, out, 0),
    "tanh": lambda grad, out: torch.ops.aten.tanh_backward(grad, out),
}


def _noise(x: torch.Tensor) -> torch.Tensor:
    return x.sign() * x.abs().sqrt()  # factorised Gaussian noise, as NoisyLinear draws it


class StackedNetwork:
    """K members' copies of one network (equal structure, hidden widths may differ) over a stacked flat
    buffer: :meth:`forward` gives every member's outputs [K, B, out] for its own batch of observations.

    `flat` [K, P] holds the parameters as :func:`parameter_blocks` reads them (`padded`: each parameter's stacked
    shape, in ``named_parameters`` order); the network only reads it, so an optimiser may step it in place.
    A `trainable` network's blocks are leaves (:attr:`leaves`, :func:`trainable_blocks`) that autograd
    differentiates.
    A padded hidden unit has zero weights in and out, so it outputs act(0) = 0 and every gradient reaching
    it is 0: each member computes what its own network computes."""

    def __init__(self, layouts: Sequence[Layout], flat: torch.Tensor, padded: Sequence[tuple[int, ...]],
                 trainable: bool = False, norm: StackedObsNorm | None = None) -> None:
        """`layouts`: each member's network as data (:meth:`~agilerl_core.networks.evolvable.EvolvableNetwork.
        layout`; one structure, widths may differ); `norm`: the group's stacked observation statistics, when its
        members normalise observations."""
        first = layouts[0]
        self.k = len(layouts)
        self.obs_spec = first.obs_spec
        self.arch = first.arch
        self.norm = norm
        names = [name for name, _ in first.params]
        self.padded = list(padded)
        blocks = trainable_blocks(flat, self.k, padded) if trainable else parameter_blocks(flat, self.k, padded)
        self.leaves = blocks if trainable else []
        self.p = dict(zip(names, blocks, strict=True))
        self.act = ACTIVATION_FNS[self.arch.activation]
        self.enc_act = ACTIVATION_FNS[self.arch.encoders[0][1].activation] if self.arch.encoders else None
        self.widths = [p.features for p in self.obs_spec.vector_parts] if self.arch.encoders else []
        # each member's noisy layers (name, in, out) in the order NoisyLinear.resample draws them
        self.noisy_layers = [list(layout.noisy) for layout in layouts]
        self.eps: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
        self.grouped_convs: bool | None = None  # one grouped convolution per layer; None: on GPUs only
        spec = self.arch.mlp
        self._hand = (not self.arch.cnns and not self.arch.encoders and self.arch.rnn is None and not spec.noisy
                      and not spec.dueling
                      and spec.activation in _DERIVATIVES and not any(n.endswith("_mu") for n in self.p))
        self._grad_blocks: tuple[torch.Tensor, dict[str, torch.Tensor]] | None = None  # views of backward's out

    # ---- noise ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def resample_noise(self, draws: MemberDraws, who: torch.Tensor) -> None:
        """Fresh factorised noise for every noisy layer of each member in `who` ([K] bool; zeros for the others),
        one keyed draw per layer side for the whole group (member i's values from its own key and counter, so
        they do not depend on its group; a narrower member takes the first of its layer's values)."""
        device = next(iter(self.p.values())).device
        self.eps = {}
        for j, (name, _, _) in enumerate(self.noisy_layers[0]):
            w = self.p[f"{name}.weight_mu"]
            sides = []
            for width, dim in ((1, w.shape[2]), (2, w.shape[1])):  # (in, out) of each member's layer j
                own = torch.tensor([layers[j][width] for layers in self.noisy_layers], device=device)
                keep = (torch.arange(dim, device=device) < own.unsqueeze(1)) & who.to(device).unsqueeze(1)
                sides.append(_noise(draws.normal(who, dim)) * keep)
            self.eps[name] = (sides[0], sides[1])

    def noise_off(self) -> None:
        """Mean weights only (greedy actions)."""
        self.eps = None

    # ---- forward --------------------------------------------------------------------------------------
    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Linear (or noisy linear) layer `name` of every member: [K, B, in] -> [K, B, out]."""
        p = self.p
        if f"{name}.weight" in p:
            w, b = p[f"{name}.weight"], p[f"{name}.bias"]
        else:
            w, b = p[f"{name}.weight_mu"], p[f"{name}.bias_mu"]
            if self.eps is not None:
                e_in, e_out = self.eps[name]
                w = w + p[f"{name}.weight_sigma"] * (e_out.unsqueeze(2) * e_in.unsqueeze(1))
                b = b + p[f"{name}.bias_sigma"] * e_out
        return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))

    def trunk(self, prefix: str, spec, x: torch.Tensor) -> torch.Tensor:
        """An EvolvableMLP's hidden layers (its parameters under `prefix`) of every member: the output layer's
        input [K, B, last hidden width] (`x` itself when it has none)."""
        act = self.act if prefix == "mlp." else ACTIVATION_FNS[spec.activation]
        for i in range(len(spec.hidden)):
            x = act(self.linear(f"{prefix}hidden.{i}", x))
        return x

    def mlp(self, prefix: str, spec, x: torch.Tensor) -> torch.Tensor:
        """An EvolvableMLP (its parameters under `prefix`) of every member."""
        x = self.trunk(prefix, spec, x)
        out = self.linear(f"{prefix}out", x)
        if not spec.dueling:
            return out
        k, b, d = self.k, x.shape[1], spec.dueling
        adv = out.view(k, b, -1, d)
        q = self.linear(f"{prefix}value", x).view(k, b, 1, d) + adv - adv.mean(dim=2, keepdim=True)
        return q.reshape(k, b, -1)

    def cnn(self, key: str, spec, x: torch.Tensor) -> torch.Tensor:
        """A conv encoder of every member: images [K, B, C, H, W] -> latents [K, B, latent]. On a GPU one grouped
        convolution per layer; on a CPU each member's own convolutions, which measured 2-3x faster there than
        one grouped convolution, forward and backward (benchmarks/population_flops.py, cnn_ppo)."""
        k, b = self.k, x.shape[1]
        act = ACTIVATION_FNS[spec.activation]
        layers = [(self.p[f"cnns.{key}.convs.{i}.weight"], self.p[f"cnns.{key}.convs.{i}.bias"], stride)
                  for i, stride in enumerate(spec.strides)]
        if not (self.grouped_convs if self.grouped_convs is not None else x.device.type != "cpu"):
            outs = []
            for m in range(k):
                h = x[m]
                for w, bias, stride in layers:
                    h = act(torch.nn.functional.conv2d(h, w[m], bias[m], stride=stride))
                outs.append(h.reshape(b, -1))
            return act(self.linear(f"cnns.{key}.proj", torch.stack(outs)))
        h = x.transpose(0, 1).reshape(b, -1, *x.shape[3:])  # [B, K * C, H, W]: member i's channels together
        for w, bias, stride in layers:
            h = act(torch.nn.functional.conv2d(h, w.reshape(-1, *w.shape[2:]), bias.reshape(-1), stride=stride,
                                               groups=k))
        return act(self.linear(f"cnns.{key}.proj", h.reshape(b, k, -1).transpose(0, 1)))

    def features(self, obs: Obs) -> torch.Tensor:
        """The heads' input [K, B, D] for member-major observations (every tensor [K * B, ...])."""
        vector, images = self.obs_spec.preprocess(obs)
        k = self.k
        if vector is not None:
            vector = vector.view(k, -1, vector.shape[-1])
            if self.norm is not None:
                vector = self.norm(vector)
        arch = self.arch
        if not arch.cnns and not arch.encoders:
            return vector
        if vector is None:
            parts = []
        elif arch.encoders:
            specs = dict(arch.encoders)
            parts = [self.enc_act(self.mlp(f"encoders.{p.key}.", specs[p.key], x)) for p, x in
                     zip(self.obs_spec.vector_parts, torch.split(vector, self.widths, dim=2), strict=True)]
        else:
            parts = [vector]
        specs = dict(arch.cnns)
        parts += [self.cnn(p.key, specs[p.key], x.view(k, -1, *x.shape[1:]))
                  for p, x in zip(self.obs_spec.image_parts, images, strict=True)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    # ---- a hand-written backward for plain MLPs ----------------------------------------------------------
    @property
    def hand_backward(self) -> bool:
        """Whether :meth:`forward_saving` and :meth:`backward` apply: a plain MLP (no encoders, noisy layers or
        dueling head) with a ReLU or tanh activation. On small networks autograd's per-node cost is about
        half of a learn step (benchmarks/batched_learn_paths.py); these take it out of the trunk."""
        return self._hand

    @torch.no_grad()
    def forward_saving(self, obs: Obs, action: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`forward` of a :attr:`hand_backward` network, without autograd: (outputs [K, B, out], what
        :meth:`backward` needs)."""
        h = self.features(obs)
        if action is not None:
            h = torch.cat([h, action], dim=2)
        saved = [h]
        spec = self.arch.mlp
        for i in range(len(spec.hidden)):
            h = self.act(self.linear(f"mlp.hidden.{i}", h))
            saved.append(h)
        return self.linear("mlp.out", h), saved

    @torch.no_grad()
    def backward(self, saved: list[torch.Tensor], grad_out: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The gradient of a loss for every parameter, given its gradient for the outputs of
        :meth:`forward_saving` ([K, B, out]), written into `out`: a buffer laid out as the stacked
        parameters (what :func:`~agilerl_core.algorithms.group.gradients` returns). Returns `out`.
        Tests check it against autograd."""
        derivative = _DERIVATIVES[self.arch.mlp.activation]
        layers = [f"mlp.hidden.{i}" for i in range(len(self.arch.mlp.hidden))] + ["mlp.out"]
        if self._grad_blocks is None or self._grad_blocks[0] is not out:  # the same buffer step after step
            self._grad_blocks = (out, dict(zip(self.p, parameter_blocks(out, self.k, self.padded), strict=True)))
        blocks = self._grad_blocks[1]
        g = grad_out
        for i in range(len(layers) - 1, -1, -1):
            name, x = layers[i], saved[i]
            # autograd's own product (x^T g, then transposed): the same rounding as autograd's backward
            blocks[f"{name}.weight"].copy_(torch.bmm(x.transpose(1, 2), g).transpose(1, 2))
            blocks[f"{name}.bias"].copy_(g.sum(1))  # (the block is a strided view: no out= for compile)
            if i:
                g = derivative(torch.bmm(g, self.p[f"{name}.weight"]), x)
        return out

    def sequence(self, obs: Obs, state: torch.Tensor | None, starts: torch.Tensor | None, steps: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """A recurrent network's outputs for every member's B sequences of `steps` observations (member-major,
        then sequence, then step: every tensor [K * B * steps, ...]) from `state` [K, B, layers, S, H] (None:
        zeros), zeroed before the steps where `starts` [K, B, steps] is set: (outputs [K, B * steps, out],
        the state after the last step)."""
        return sequences([self], obs, [state], starts, steps)[0]

    def core_params(self) -> list[tuple[torch.Tensor, ...]]:
        """The recurrent core's (w_ih, w_hh, b_ih, b_hh) of every layer, each [K, ...]."""
        return [tuple(self.p[f"rnn.layers.{i}.{n}"] for n in ("w_ih", "w_hh", "b_ih", "b_hh"))
                for i in range(self.arch.rnn.layers)]

    def forward(self, obs: Obs, action: torch.Tensor | None = None) -> torch.Tensor:
        """Every member's outputs [K, B, out]; a Q(s, a) critic also takes the actions [K, B, A]."""
        if self.arch.rnn is not None:
            raise TypeError("a recurrent network runs through sequence(obs, state, starts, steps)")
        x = self.features(obs)
        if action is not None:
            x = torch.cat([x, action], dim=2)
        return self.mlp("mlp.", self.arch.mlp, x)

    __call__ = forward

    def forward_latent(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs [K, B, out], the head's last hidden activations [K, B, L]) of a feed-forward network without
        a dueling head: what state-dependent exploration reads (a padded unit's activation is 0)."""
        if self.arch.rnn is not None or self.arch.mlp.dueling:
            raise TypeError("forward_latent needs a feed-forward network without a dueling head")
        h = self.trunk("mlp.", self.arch.mlp, self.features(obs))
        return self.linear("mlp.out", h), h


def sequences(nets: Sequence[StackedNetwork], obs: Obs, states: Sequence[torch.Tensor | None],
              starts: torch.Tensor | None, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:meth:`StackedNetwork.sequence` of several recurrent networks (each K members) over the same observations,
    each from its own state in `states` (all given, or all None: zeros): (outputs, state after the last step)
    per network. When their cores have one shape and read features of one width (a PPO group's actor and
    critic), the cores run as one stack of len(nets) x K members: the step loop runs once for all of them."""
    feats = [n.features(obs) for n in nets]
    k, rnn, m = nets[0].k, nets[0].arch.rnn, len(nets)
    cores = [n.core_params() for n in nets]
    shapes = [(f.shape, [tuple(t.shape) for layer in c for t in layer]) for f, c in zip(feats, cores, strict=True)]
    if m == 1 or any(sh != shapes[0] for sh in shapes):
        runs = [run_sequence(rnn.cell, c, f.view(k, -1, steps, f.shape[-1]), s, starts)
                for c, f, s in zip(cores, feats, states, strict=True)]
    else:  # every parameter [m * K, ...], network-major: network j's members are rows j*K..j*K+K-1
        params = [tuple(torch.cat(parts) for parts in zip(*layers, strict=True)) for layers in zip(*cores, strict=True)]
        h, new = run_sequence(rnn.cell, params, torch.cat(feats).view(m * k, -1, steps, feats[0].shape[-1]),
                              None if states[0] is None else torch.cat(list(states)),
                              None if starts is None else torch.cat([starts] * m))
        runs = list(zip(h.chunk(m), new.chunk(m), strict=True))
    return [(n.mlp("mlp.", n.arch.mlp, h.reshape(k, -1, h.shape[-1])), new) for n, (h, new) in zip(nets, runs, strict=True)]
