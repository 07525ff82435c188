"""The network every algorithm builds on: an encoder per observation key, then one MLP head to the outputs.

A plain (non-Dict) vector observation goes straight into the head. A Dict observation gives each key
its own encoder (a conv encoder for an image, a small MLP for a vector or a one-hot Discrete), and the
head reads their latents concatenated. A non-Dict image gets its conv encoder as well.

Architecture mutations act on the :class:`ArchSpec` (pure data); :meth:`EvolvableNetwork.rebuilt_from`
turns a new spec into a network that keeps every weight that still exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from agilerl_core.envs.spaces import Obs, ObsSpec
from agilerl_core.networks.cnn import ATARI_CHANNELS, CNNSpec, EvolvableCNN, default_conv_layers
from agilerl_core.networks.mlp import EvolvableMLP, MLPSpec
from agilerl_core.networks.obs_norm import RunningObsNorm
from agilerl_core.networks.recurrent import EvolvableRNN, RNNSpec
from agilerl_core.networks.transfer import ACTIVATION_FNS


def arch_params(d: object, where: str = "arch", error: type[Exception] = ValueError, limits=None) -> int:
    """Parameters the networks of arch dict `d` (:meth:`ArchSpec.to_dict` output, read from a file) would hold,
    counted from the data alone *before* anything is built, every width and layer count checked against the
    limit table (``limits.layer_width``, ``layer_count``, ``network_params``); `error` names `where` and the
    field otherwise (nothing is allocated for a refused arch)."""
    from agilerl_core.errors import AgileRLError
    from agilerl_core.limits import check, current

    lim = limits or current()
    err = error if isinstance(error, type) and issubclass(error, AgileRLError) else None

    def num(value: object, at: str, limit: str = "network_params") -> int:
        if err is not None:
            return check(limit, value, f"{where}.{at}", err, lim)
        try:
            return check(limit, value, f"{where}.{at}", limits=lim)
        except AgileRLError as e:
            raise error(str(e)) from None

    def obj(value: object, at: str, kind: type = dict) -> object:
        if not isinstance(value, kind):
            raise error(f"{where}.{at}: expected {'an object' if kind is dict else 'a list'}, found "
                        f"{type(value).__name__}")
        return value

    def widths(value: object, at: str) -> list[int]:
        items = obj(value, at, list)
        num(len(items), at + " (layers)", "layer_count")
        return [num(h, f"{at}[{i}]", "layer_width") for i, h in enumerate(items)]

    def mlp(m: object, at: str) -> int:
        m = obj(m, at)
        dims = [num(m.get("in_dim"), at + ".in_dim"), *widths(m.get("hidden"), at + ".hidden"),
                num(m.get("out_dim"), at + ".out_dim")]
        mult = 2 if m.get("noisy") else 1
        return sum(mult * (a * b + b) for a, b in zip(dims[:-1], dims[1:], strict=True))

    def cnn(c: object, at: str) -> int:
        c = obj(c, at)
        chw = obj(c.get("in_chw"), at + ".in_chw", list)
        if len(chw) != 3:
            raise error(f"{where}.{at}.in_chw: expected 3 numbers (C, H, W), found {len(chw)}")
        ch, h, w = (num(x, f"{at}.in_chw[{i}]") for i, x in enumerate(chw))
        chans = widths(c.get("channels"), at + ".channels")
        kernels = [num(k, f"{at}.kernels[{i}]") for i, k in enumerate(obj(c.get("kernels"), at + ".kernels", list))]
        strides = [num(s, f"{at}.strides[{i}]") for i, s in enumerate(obj(c.get("strides"), at + ".strides", list))]
        if not (len(chans) == len(kernels) == len(strides)) or min(strides, default=1) < 1 or min(kernels, default=1) < 1:
            raise error(f"{where}.{at}: channels, kernels and strides must be lists of one length, kernels and "
                        f"strides at least 1")
        total, prev = 0, ch
        for b, k in zip(chans, kernels, strict=True):
            total += prev * b * k * k + b
            prev = b
        for k, s in zip(kernels, strides, strict=True):
            h, w = max((h - k) // s + 1, 0), max((w - k) // s + 1, 0)
        latent = num(c.get("latent_dim"), at + ".latent_dim", "layer_width")
        return total + prev * h * w * latent + latent

    d = obj(d, "(arch)") if not isinstance(d, dict) else d
    total = mlp(d.get("mlp"), "mlp")
    for i, pair in enumerate(obj(d.get("cnns", []), "cnns", list)):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise error(f"{where}.cnns[{i}]: expected [key, conv spec]")
        total += cnn(pair[1], f"cnns[{i}]")
    for i, pair in enumerate(obj(d.get("encoders", []) or [], "encoders", list)):
        if not (isinstance(pair, list) and len(pair) == 2):
            raise error(f"{where}.encoders[{i}]: expected [key, MLP spec]")
        total += mlp(pair[1], f"encoders[{i}]")
    rnn = d.get("rnn")
    if rnn:
        r = obj(rnn, "rnn")
        gates = {"lstm": 4, "gru": 3}.get(r.get("cell"))  # type: ignore[arg-type]
        if gates is None:
            raise error(f"{where}.rnn.cell: {r.get('cell')!r} is not one of lstm, gru")
        h = num(r.get("hidden"), "rnn.hidden", "layer_width")
        layers = num(r.get("layers"), "rnn.layers", "layer_count")
        inp = num(r.get("in_dim"), "rnn.in_dim")
        total += sum(gates * h * ((inp if i == 0 else h) + h + 2) for i in range(layers))
    num(total, "(parameters counted from the arch)", "network_params")
    return total


@dataclass(frozen=True)
class ArchSpec:
    """Architecture of an EvolvableNetwork: the head MLP, one conv encoder per image key and (Dict
    observations) one MLP encoder per vector key; with `rnn`, a recurrent core between the features and the
    head (the head then reads the core's hidden state). Encoders keep their latent width under every
    mutation, so the head's input width only changes with the observation (or the core's hidden size)."""

    mlp: MLPSpec
    cnns: tuple[tuple[str, CNNSpec], ...] = ()
    encoders: tuple[tuple[str, MLPSpec], ...] = ()
    rnn: RNNSpec | None = None

    @property
    def activation(self) -> str:
        return self.mlp.activation

    def to_dict(self) -> dict:
        d = {"mlp": self.mlp.to_dict(), "cnns": [[k, s.to_dict()] for k, s in self.cnns]}
        if self.encoders:  # absent for flat observations: their checkpoints read as before
            d["encoders"] = [[k, s.to_dict()] for k, s in self.encoders]
        if self.rnn is not None:
            d["rnn"] = self.rnn.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ArchSpec:
        arch_params(d)  # widths, layer counts and the parameter count against the limits, before anything is built
        return cls(MLPSpec.from_dict(d["mlp"]), tuple((str(k), CNNSpec.from_dict(s)) for k, s in d["cnns"]),
                   tuple((str(k), MLPSpec.from_dict(s)) for k, s in d.get("encoders", ())),
                   RNNSpec.from_dict(d["rnn"]) if d.get("rnn") else None)

    def describe(self) -> str:
        s = f"mlp{list(self.mlp.hidden)}/{self.activation}"
        if self.cnns:
            c = self.cnns[0][1]
            s += f" cnn{list(c.channels)}k{list(c.kernels)}"
        if self.encoders:
            s += f" enc{list(self.encoders[0][1].hidden)}x{len(self.encoders)}"
        if self.rnn is not None:
            s += f" {self.rnn.cell}{self.rnn.hidden}x{self.rnn.layers}"
        return s


@dataclass(frozen=True)
class ArchBounds:
    """Limits every architecture mutation respects."""

    min_hidden_layers: int = 1
    max_hidden_layers: int = 4
    min_nodes: int = 16
    max_nodes: int = 512
    node_changes: tuple[int, ...] = (16, 32, 64)
    min_conv_layers: int = 1
    max_conv_layers: int = 4
    min_channels: int = 8
    max_channels: int = 256
    channel_changes: tuple[int, ...] = (8, 16, 32)
    kernel_choices: tuple[int, ...] = (3, 4, 5, 8)
    activation_choices: tuple[str, ...] = ("relu", "leaky_relu", "elu", "tanh")
    max_rnn_layers: int = 2

    @classmethod
    def from_config(cls, net) -> ArchBounds:  # net: agilerl_core.config.NetworkConfig
        return cls(net.min_hidden_layers, net.max_hidden_layers, net.min_nodes, net.max_nodes,
                   tuple(net.node_changes), net.cnn.min_layers, net.cnn.max_layers, net.cnn.min_channels,
                   net.cnn.max_channels, tuple(net.cnn.channel_changes), tuple(net.cnn.kernel_choices),
                   tuple(net.activation_choices), net.rnn.max_layers if net.rnn is not None else 2)


def _conv_stack(part, cnn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(channels, kernels, strides) of image `part`'s encoder: the config's when it fixes them (kernel_sizes or
    strides given), else :func:`default_conv_layers` for the frame size; a ConfigError naming network.cnn when
    they leave no output or no conv fits the frame."""
    from agilerl_core.errors import ConfigError

    _, h, w = part.image_chw
    if cnn.explicit:
        channels, kernels, strides = tuple(cnn.channels), tuple(cnn.kernel_sizes), tuple(cnn.strides)
    else:
        stack = default_conv_layers(h, w)
        if stack is None:
            layout = "height, width, channels" if part.channels_last else "channels, height, width"
            raise ConfigError(f"network.cnn: image {part.key!r} of shape {part.shape} (read as {layout}; "
                              f"network.cnn.channels_last sets it) is {h}x{w} pixels, too small for any conv layer "
                              f"(the smallest default kernel is 2x2); flatten it into a vector "
                              f"(env_wrappers: [{{wrapper: gymnasium.wrappers.FlattenObservation}}]) or set "
                              f"network.cnn.kernel_sizes and strides (e.g. [1] and [1])")
        kernels, strides = stack
        channels = tuple(cnn.channels) if cnn.channels is not None else ATARI_CHANNELS[:len(kernels)]
        if len(channels) > len(kernels):
            raise ConfigError(f"network.cnn.channels: {len(channels)} layers given, but the default conv stack for "
                              f"{h}x{w} frames has {len(kernels)} (kernels {list(kernels)}, strides {list(strides)}); "
                              f"give at most {len(kernels)} channels or set kernel_sizes and strides too")
        kernels, strides = kernels[:len(channels)], strides[:len(channels)]
        if not cnn.min_layers <= len(kernels) <= cnn.max_layers:
            raise ConfigError(f"network.cnn: the default conv stack for {h}x{w} frames has {len(kernels)} layers, "
                              f"outside [min_layers, max_layers] = [{cnn.min_layers}, {cnn.max_layers}]; set "
                              f"kernel_sizes and strides, or change the bounds")
    spec = CNNSpec(part.image_chw, channels, kernels, strides, 1)
    if not spec.is_valid():
        raise ConfigError(f"network.cnn: kernels {list(kernels)} with strides {list(strides)} leave no output for "
                          f"image {part.key!r} of shape {part.shape}; use smaller kernels/strides or fewer layers "
                          f"(or leave kernel_sizes and strides out: the default stack fits the frame)")
    return channels, kernels, strides


def initial_arch(obs_spec: ObsSpec, out_dim: int, net, observed: dict[str, tuple[float, ...] | None] | None = None
                 ) -> ArchSpec:
    """The starting architecture for an observation space from a NetworkConfig.

    Each image gets a conv encoder of :func:`_conv_stack` whose `input_scale` is the config's
    (``network.cnn.input_scale``) or, on auto, the one its space implies (:func:`~agilerl_core.envs.spaces.image_scale`),
    except that an image key with tops in `observed` (a ``pixels`` image whose env showed only small codes, see
    :func:`~agilerl_core.envs.spaces.observed_highs`) is scaled ``observed`` by them on auto. A scale equal to what
    the stored dtype always meant is recorded as None, keeping such archs' JSON as before."""
    cnns = []
    observed = observed or {}
    for part in obs_spec.image_parts:
        channels, kernels, strides = _conv_stack(part, net.cnn)
        mode = part.scale if net.cnn.input_scale == "auto" else net.cnn.input_scale
        high = observed.get(part.key) if net.cnn.input_scale == "auto" and part.scale == "pixels" else None
        if high is not None:
            mode, high = "observed", tuple(float(h) for h in high)
        # a ConfigError here when the space cannot take `mode`
        obs_spec.with_image_scale({part.key: mode}, {part.key: high})
        cnns.append((part.key, CNNSpec(part.image_chw, channels, kernels, strides, net.cnn.latent_dim,
                                       net.activation, None if mode == part.legacy_scale else mode, high)))
    encoders = []
    enc = net.vector_encoder
    if obs_spec.is_dict and enc.per_key:
        encoders = [(p.key, MLPSpec(p.features, enc.latent_dim, tuple(enc.hidden_sizes), net.activation))
                    for p in obs_spec.vector_parts]
    vector_in = sum(s.out_dim for _, s in encoders) if encoders else obs_spec.vector_dim
    in_dim = vector_in + sum(s.latent_dim for _, s in cnns)
    rnn = None
    if net.rnn is not None:
        rnn = RNNSpec(net.rnn.cell, in_dim, net.rnn.hidden_size, net.rnn.num_layers)
        in_dim = rnn.hidden
    return ArchSpec(MLPSpec(in_dim, out_dim, tuple(net.hidden_sizes), net.activation), tuple(cnns), tuple(encoders),
                    rnn)


def _as_trained(obs_spec: ObsSpec, arch: ArchSpec) -> ObsSpec:
    """`obs_spec` scaling each image as the arch's conv encoder records it was trained with (a checkpoint written
    before archs recorded it: as the stored dtype always meant), whatever the env's space would pick today."""
    if not arch.cnns:
        return obs_spec
    return obs_spec.with_image_scale({k: s.input_scale for k, s in arch.cnns}, {k: s.input_high for k, s in arch.cnns})


class EvolvableNetwork(nn.Module):
    """obs -> (vector, or an MLP encoder per vector key) ++ conv encoder per image key [-> recurrent core]
    -> MLP head -> outputs. A recurrent network acts through :meth:`step` (its state passed in and out)."""

    def __init__(self, obs_spec: ObsSpec, arch: ArchSpec, generator: torch.Generator | None = None,
                 noisy_std: float = 0.5) -> None:
        super().__init__()
        self.obs_spec = _as_trained(obs_spec, arch)
        self.arch = arch
        self.cnns = nn.ModuleDict({key: EvolvableCNN(spec, generator) for key, spec in arch.cnns})
        self.encoders = nn.ModuleDict({key: EvolvableMLP(spec, generator) for key, spec in arch.encoders})
        self.rnn = EvolvableRNN(arch.rnn, generator) if arch.rnn is not None else None
        self.mlp = EvolvableMLP(arch.mlp, generator, noisy_std)
        self._set_layout()
        self.obs_norm: RunningObsNorm | None = None  # the agent's, shared by all its networks

    def _set_layout(self) -> None:
        arch = self.arch
        self.plain_mlp = not arch.cnns and not arch.encoders
        # column widths of the flat vector, one per vector key in the order preprocess concatenates them
        self._widths = [p.features for p in self.obs_spec.vector_parts] if arch.encoders else []
        self._enc_act = ACTIVATION_FNS[arch.encoders[0][1].activation] if arch.encoders else None

    def features(self, obs: Obs) -> torch.Tensor:
        """The head's input: the flat vector part (normalised when the agent normalises observations)
        or, with per-key encoders, each key's latent; then the conv latents; concatenated."""
        vector, images = self.obs_spec.preprocess(obs)
        if self.obs_norm is not None and vector is not None:
            vector = self.obs_norm(vector)
        if self.plain_mlp:
            return vector
        if vector is None:
            parts = []
        elif self.encoders:
            act = self._enc_act
            parts = [act(self.encoders[p.key](x)) for p, x in
                     zip(self.obs_spec.vector_parts, torch.split(vector, self._widths, dim=1), strict=True)]
        else:
            parts = [vector]
        parts += [self.cnns[p.key](x) for p, x in zip(self.obs_spec.image_parts, images, strict=True)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def forward(self, obs: Obs, action: torch.Tensor | None = None) -> torch.Tensor:
        """Outputs for a batch of observations; a Q(s, a) critic also takes the (agent-scale) actions."""
        if self.rnn is not None:
            raise TypeError("a recurrent network acts through step(obs, state, starts), which carries its state")
        x = self.features(obs)
        if action is not None:
            x = torch.cat([x, action], dim=1)
        return self.mlp(x)

    def forward_latent(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(outputs [B, out], the head's last hidden activations [B, L]) of a feed-forward network without a
        dueling head: what state-dependent exploration reads."""
        if self.rnn is not None or self.mlp.value is not None:
            raise TypeError("forward_latent needs a feed-forward network without a dueling head")
        h = self.mlp.trunk(self.features(obs))
        return self.mlp.out(h), h

    def step(self, obs: Obs, state: torch.Tensor | None, starts: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of a recurrent network for a batch of B observations: (outputs [B, out], new state
        [B, layers, S, H]) from `state` (None: zeros), zeroed first where `starts` [B] is set."""
        x, new = self.rnn(self.features(obs).unsqueeze(1), state, None if starts is None else starts.unsqueeze(1))
        return self.mlp(x[:, 0]), new

    def rebuilt(self, arch: ArchSpec, generator: torch.Generator | None = None) -> EvolvableNetwork:
        """A new network with `arch` that keeps every weight that still exists."""
        new = EvolvableNetwork.rebuilt_from(self.layout(), dict(self.named_parameters()), arch, generator,
                                            self.mlp.noisy_std)
        new.obs_norm = self.obs_norm
        return new

    @classmethod
    def rebuilt_from(cls, layout: Layout, old: dict[str, torch.Tensor], arch: ArchSpec,
                     generator: torch.Generator | None = None, noisy_std: float = 0.5) -> EvolvableNetwork:
        """:meth:`rebuilt` from the network `layout` describes, its parameters by name (``layout.views`` of a
        member's buffer): no module of the old network is built. The new one draws what a fresh network of
        `arch` draws, in the same order."""

        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in old.items() if k.startswith(prefix)}

        before = layout.arch
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.obs_spec = _as_trained(layout.obs_spec, arch)
        new.arch = arch
        old_cnns = dict(before.cnns)
        new.cnns = nn.ModuleDict({key: EvolvableCNN.rebuilt_from(part(f"cnns.{key}."), old_cnns[key], spec, generator)
                                  for key, spec in arch.cnns})
        new.encoders = nn.ModuleDict({key: EvolvableMLP.rebuilt_from(part(f"encoders.{key}."), spec, generator)
                                      for key, spec in arch.encoders})
        new.rnn = None if arch.rnn is None else (EvolvableRNN(arch.rnn, generator) if before.rnn is None
                                                 else EvolvableRNN.rebuilt_from(part("rnn."), arch.rnn, generator))
        new.mlp = EvolvableMLP.rebuilt_from(part("mlp."), arch.mlp, generator, noisy_std)
        new._set_layout()
        new.obs_norm = None
        return new

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def layout(self) -> Layout:
        """What this network's flat buffer holds, as data (:class:`Layout`)."""
        return Layout(self.obs_spec, self.arch,
                      tuple((name, tuple(p.shape)) for name, p in self.named_parameters()),
                      tuple((name, m.in_dim, m.out_dim) for name, m in self.named_modules() if hasattr(m, "eps_in")))

    @classmethod
    def over(cls, layout: Layout, flat: torch.Tensor, noisy_std: float = 0.5) -> EvolvableNetwork:
        """A network of `layout` whose parameters are views of `flat` (laid out as :meth:`layout` reads them):
        a member's modules built from its state when an edge needs them (its weights stay in `flat`). Its own
        initialisation draws from a generator of its own and is overwritten, so no member's draws move."""
        net = cls(layout.obs_spec, layout.arch, torch.Generator().manual_seed(0), noisy_std)
        net.obs_spec = layout.obs_spec
        i = 0
        with torch.no_grad():
            for p in net.parameters():
                n = p.numel()
                p.data = flat[i: i + n].view(p.shape)
                i += n
        if i != flat.numel():
            raise ValueError(f"a flat buffer of {flat.numel()} values for a network of {i} parameters")
        return net

    def resample_noise(self, generator: torch.Generator | None) -> None:
        """Draw fresh noise for every noisy layer (and switch it on)."""
        for layer in self.mlp.noisy_layers():
            layer.resample(generator)

    def noise_off(self) -> None:
        """Mean weights only (greedy evaluation)."""
        for layer in self.mlp.noisy_layers():
            layer.noise_on = False


@dataclass(frozen=True)
class Layout:
    """A network as data: the observations it reads (as trained), its architecture, its parameters' names and
    shapes in its flat buffer's order and its noisy layers' (name, in, out). Read once from a built network
    (:meth:`EvolvableNetwork.layout`), it is all a group, a checkpoint or a clone needs of a member's network
    without building its modules."""

    obs_spec: ObsSpec
    arch: ArchSpec
    params: tuple[tuple[str, tuple[int, ...]], ...]
    noisy: tuple[tuple[str, int, int], ...] = ()

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [shape for _, shape in self.params]

    @property
    def size(self) -> int:
        return sum(math.prod(shape) for _, shape in self.params)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter's view of `flat` (a buffer laid out as this network's), by name."""
        out, i = {}, 0
        for name, shape in self.params:
            n = math.prod(shape)
            out[name] = flat[i: i + n].view(shape)
            i += n
        return out
