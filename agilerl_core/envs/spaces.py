"""Observation and action space handling: what is stored, and how it becomes network input.

Supported observations: Box (flat vectors; 3-d images, channels first or last), Discrete (one-hot),
and a Dict of those. Supported actions: Discrete and bounded Box (see :class:`ActionSpec`). Observations travel through the engine
as ``dict[str, Tensor]`` keyed by the Dict key (``"obs"`` for a non-Dict space), in their stored
dtype (images stay uint8); :meth:`ObsSpec.preprocess` turns them into network inputs.

Images are scaled into [0, 1] by what their space says they hold (:func:`image_scale`): ``pixels`` (a uint8
Box of camera-like values, 0-255) are divided by 255; ``bounds`` (an integer Box whose values span at most
:data:`CODE_RANGE`, e.g. a MiniGrid-style grid of object codes 0-10) become ``(x - low) / (high - low)`` per
channel; ``none`` (float images) pass as they are. A uint8 Box declared 0-255 whose env only shows small
values (MiniGrid's image space says 0-255 and holds codes 0-10) is ``observed``: scaled per channel by the
highest value a short seeded probe of the env showed (:func:`observed_highs`), a range the conv encoder
records (``CNNSpec.input_high``) so a saved member reads its images as it did in training.

What a checkpoint records of these specs (spaces as plain data, with size checks) is
:mod:`agilerl_core.envs.space_records`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from gymnasium import spaces

from agilerl_core.errors import ConfigError

Obs = dict[str, torch.Tensor]

ImageScale = Literal["pixels", "bounds", "none", "observed"]
IMAGE_SCALES: tuple[str, ...] = ("pixels", "bounds", "none", "observed")
CODE_RANGE = 32  # an integer image whose bounds (or, declared 0-255, observed values) span at most this holds codes


@dataclass(frozen=True)
class ObsPart:
    """One leaf of the observation: how it is stored and encoded."""

    key: str
    kind: Literal["vector", "discrete", "image"]
    shape: tuple[int, ...]  # stored shape of one observation
    dtype: torch.dtype  # stored dtype
    n: int = 0  # number of categories (discrete)
    channels_last: bool = False  # image layout as stored
    scale: ImageScale = "none"  # image: how stored values become network input (see image_scale)
    low: tuple[float, ...] = ()  # image: each channel's lowest bound (the space's low, over the frame)
    high: tuple[float, ...] = ()  # image: each channel's highest bound
    top: tuple[float, ...] = ()  # ``observed`` image: each channel's top (see observed_highs), else ()

    @property
    def features(self) -> int:
        """Width this part adds to the flat vector input (0 for images)."""
        if self.kind == "discrete":
            return self.n
        if self.kind == "vector":
            return int(np.prod(self.shape)) if self.shape else 1
        return 0

    @property
    def image_chw(self) -> tuple[int, int, int]:
        """(C, H, W) of an image part."""
        if self.channels_last:
            h, w, c = self.shape
            return c, h, w
        return self.shape  # type: ignore[return-value]

    @property
    def legacy_scale(self) -> ImageScale:
        """The scaling every image had before scaling followed the bounds: uint8 / 255, others as they are
        (what a checkpoint that records no scaling was trained with)."""
        return "pixels" if self.dtype == torch.uint8 else "none"


def image_scale(space: spaces.Box) -> ImageScale:
    """How an image Box becomes network input, chosen from what its space says it holds.

    - ``bounds``: an integer Box whose bounds are finite and span at most :data:`CODE_RANGE` values (a grid of
      object, colour or state codes, like MiniGrid's 0-10) is scaled per channel by its own bounds,
      ``(x - low) / (high - low)``, into [0, 1]. Dividing such codes by 255 leaves inputs below 0.04, which
      a conv encoder at its usual initialisation barely tells apart: PPO learned nothing in 400k steps on a
      user's 7x7 code grid divided by 255, and learned it by generation 2 with the codes multiplied by 20;
      on tests/test_small_frames.py's 5x5 grid, bounds reach fitness 0.95 in 16k-29k steps (6 seeds) where
      / 255 stays at a random policy's level for 60k. Bounds
      are chosen over one-hot codes because they keep the channel count (and so the conv weights) of the
      space whatever the number of codes, keep an order the codes may have (MiniGrid's door state: open,
      closed, locked), and cost nothing; the conv layers separate codes nonlinearly from there.
    - ``pixels``: any other uint8 Box is divided by 255, bit for bit as before.
    - ``none``: float (and wide-range integer) images pass as they are.
    """
    dtype = np.dtype(space.dtype)
    if np.issubdtype(dtype, np.integer):
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        if np.isfinite(low).all() and np.isfinite(high).all() and float((high - low).max()) <= CODE_RANGE:
            return "bounds"
    return "pixels" if dtype == np.uint8 else "none"


def observed_highs(part: ObsPart, frames: np.ndarray) -> tuple[float, ...] | None:
    """Per channel, the top of the ``observed`` scaling of a ``pixels`` image `part` whose env showed `frames`
    (a batch [N, *part.shape] of its observations, as :func:`agilerl_core.arenas.base.probe_image_tops` gathers
    them); None when the frames look like pixels (a value above :data:`CODE_RANGE`, or nothing but zeros), which
    keeps ``/ 255``.

    Why: a uint8 Box declared 0-255 that holds small codes (MiniGrid's ImgObsWrapper: objects 0-10, colours 0-5,
    states 0-2) divided by 255 gives inputs below 0.04, where a member's state barely moves its conv features:
    PPO from cartpole_ppo.yaml on benchmarks/gridworld.py's CodeRoom-v0 (codes 0-5 in a Box(0, 255), optimum
    0.875) kept elites whose action probabilities were the same in every state (a down/right mix: 0.81 sampled,
    0.15 greedy), best 0.36-0.46 in 100k global steps at seeds 0-4; scaled by the observed tops, every seed
    reached 0.85-0.90 in its first generation (8k global steps).

    Each channel's top is the highest value it showed; a channel that showed nothing above its low (a state
    channel that is 0 at the start) takes the highest top of the others, so values it shows later are scaled
    like the other codes. Values above a top later (a code the probe never met) go above 1, which a conv
    layer reads as well. Real pixels (Atari, CarRacing: frames above 32 from the first reset) stay pixels."""
    if part.kind != "image" or part.scale != "pixels":
        return None
    x = np.asarray(frames)
    if x.size == 0:
        return None
    x = x.reshape(-1, *part.shape)
    axes = (0, 1, 2) if part.channels_last else (0, 2, 3)
    top = x.max(axis=axes).astype(np.float64)
    if float(top.max()) > CODE_RANGE or float(top.max()) <= 0:
        return None
    low = np.asarray(part.low, np.float64)
    fill = float(top.max())
    return tuple(float(t) if t > lo else fill for t, lo in zip(top, low, strict=True))


def _channel_bounds(space: spaces.Box, channels_last: bool) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per channel: the lowest low and the highest high over the frame."""
    axes = (0, 1) if channels_last else (1, 2)
    low = np.asarray(space.low, np.float64).min(axis=axes)
    high = np.asarray(space.high, np.float64).max(axis=axes)
    return tuple(float(v) for v in low), tuple(float(v) for v in high)


_TORCH_DTYPES = {np.dtype(np.uint8): torch.uint8, np.dtype(np.float32): torch.float32,
                 np.dtype(np.float64): torch.float32, np.dtype(np.int64): torch.float32,
                 np.dtype(np.int32): torch.float32, np.dtype(np.int8): torch.float32,
                 np.dtype(np.bool_): torch.float32, np.dtype(np.float16): torch.float32}


def _part(key: str, space: spaces.Space, channels_last: bool | None, where: str) -> ObsPart:
    if isinstance(space, spaces.Discrete):
        return ObsPart(key, "discrete", (), torch.int64, n=int(space.n))
    if isinstance(space, spaces.Box):
        shape = tuple(space.shape)
        if len(shape) == 3:
            last = channels_last if channels_last is not None else (shape[-1] in (1, 3, 4) and shape[0] not in (1, 3, 4))
            dtype = torch.uint8 if space.dtype == np.uint8 else torch.float32
            low, high = _channel_bounds(space, bool(last))
            return ObsPart(key, "image", shape, dtype, channels_last=bool(last), scale=image_scale(space),
                           low=low, high=high)
        if len(shape) > 3:
            raise ConfigError(f"env_id: observation {where} is a Box of shape {shape}; supported are flat "
                              f"vectors and 3-d images (HWC or CHW)")
        return ObsPart(key, "vector", shape, _TORCH_DTYPES.get(np.dtype(space.dtype), torch.float32))
    hint = (" Flatten it into one Box vector: env_wrappers: [{wrapper: gymnasium.wrappers.FlattenObservation}]."
            if isinstance(space, spaces.Tuple | spaces.MultiDiscrete | spaces.MultiBinary) else "")
    raise ConfigError(f"env_id: observation {where} is {type(space).__name__}, which is not supported; "
                      f"supported observation spaces are Box, Discrete and Dict of those.{hint}")


class ObsSpec:
    """How one observation space is stored and turned into network inputs.

    `image_scale` overrides the scaling :func:`image_scale` picks for image keys: one mode for every image,
    or a mode per key (keys left out, or None, keep the space's own choice)."""

    def __init__(self, space: spaces.Space, channels_last: bool | None = None,
                 image_scale: str | dict[str, str | None] | None = None) -> None:
        self.space = space
        if isinstance(space, spaces.Dict):
            if not space.spaces:
                raise ConfigError("env_id: the observation space is an empty Dict")
            self.parts = [_part(str(k), s, channels_last, f"key {k!r}") for k, s in space.spaces.items()]
            self.is_dict = True
        else:
            self.parts = [_part("obs", space, channels_last, "space")]
            self.is_dict = False
        if image_scale is not None:
            if isinstance(image_scale, str):
                image_scale = {p.key: image_scale for p in self.parts if p.kind == "image"}
            self.parts = [_rescaled(p, image_scale.get(p.key)) if p.kind == "image" else p for p in self.parts]
        self._set_views()
        self._bounds: dict[tuple[str, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def _set_views(self) -> None:
        """The per-kind views of `parts` the hot paths read."""
        self.vector_parts = [p for p in self.parts if p.kind != "image"]
        self.image_parts = [p for p in self.parts if p.kind == "image"]
        self.vector_dim = sum(p.features for p in self.vector_parts)
        # The common case (one float Box vector) skips all conversion work.
        only = self.parts[0]
        self.plain_vector = (len(self.parts) == 1 and only.kind == "vector" and len(only.shape) == 1
                             and only.dtype == torch.float32)

    @property
    def has_images(self) -> bool:
        return bool(self.image_parts)

    @property
    def image_scales(self) -> dict[str, ImageScale]:
        """Each image key's scaling mode."""
        return {p.key: p.scale for p in self.image_parts}

    def with_image_scale(self, scales: dict[str, str | None],
                         highs: dict[str, tuple[float, ...] | None] | None = None) -> ObsSpec:
        """This spec with the image keys of `scales` scaled by the given mode (None: the scaling a checkpoint
        that records none was trained with, :attr:`ObsPart.legacy_scale`); ``observed`` takes each channel's
        top from `highs`. Itself when nothing changes."""
        highs = highs or {}
        wanted = {p.key: (p.legacy_scale if scales[p.key] is None else scales[p.key])
                  for p in self.image_parts if p.key in scales}
        if all(p.scale == wanted[p.key] and (p.scale != "observed" or p.top == tuple(highs.get(p.key) or ()))
               for p in self.image_parts if p.key in wanted):
            return self
        new = ObsSpec.__new__(ObsSpec)
        new.space, new.is_dict = self.space, self.is_dict
        new.parts = [_rescaled(p, wanted.get(p.key), highs.get(p.key)) if p.kind == "image" else p
                     for p in self.parts]
        new._set_views()
        new._bounds = {}
        return new

    def _shift_scale(self, p: ObsPart, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel (low, high - low) of a ``bounds`` or ``observed`` image as [1, C, 1, 1] tensors on `device` (cached)."""
        got = self._bounds.get((p.key, device))
        if got is None:
            low = torch.tensor(p.low, dtype=torch.float32)
            high = p.top if p.scale == "observed" else p.high
            span = torch.tensor([h - lo if h > lo else 1.0 for lo, h in zip(p.low, high, strict=True)],
                                dtype=torch.float32)  # a constant channel maps to 0, never 0 / 0
            got = (low.view(1, -1, 1, 1).to(device), span.view(1, -1, 1, 1).to(device))
            self._bounds[(p.key, device)] = got
        return got

    def to_tensors(self, obs: np.ndarray | dict, device: torch.device | str = "cpu") -> Obs:
        """Batch of raw env observations (leading batch dim) -> stored-dtype tensors."""
        if not self.is_dict:
            obs = {"obs": obs}
        return {p.key: torch.as_tensor(np.asarray(obs[p.key]), device=device).to(p.dtype) for p in self.parts}

    def preprocess(self, obs: Obs) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
        """Stored tensors -> (flat float vector [B, vector_dim] or None, images as float [B, C, H, W])."""
        if self.plain_vector:
            return obs["obs"], []
        vecs = []
        for p in self.vector_parts:
            x = obs[p.key]
            if p.kind == "discrete":
                vecs.append(torch.nn.functional.one_hot(x.long().reshape(-1), p.n).to(torch.float32))
            else:
                vecs.append(x.reshape(x.shape[0], -1).to(torch.float32))
        vector = None if not vecs else (vecs[0] if len(vecs) == 1 else torch.cat(vecs, dim=1))
        images = []
        for p in self.image_parts:
            x = obs[p.key].to(torch.float32)
            if p.scale == "pixels":
                x = x / 255.0
            if p.channels_last:
                x = x.permute(0, 3, 1, 2)
            if p.scale == "bounds" or p.scale == "observed":
                low, span = self._shift_scale(p, x.device)
                x = (x - low) / span
            images.append(x)
        return vector, images


def _rescaled(p: ObsPart, mode: str | None, high: tuple[float, ...] | None = None) -> ObsPart:
    """Image part `p` scaled by `mode` (None: unchanged; ``observed``: by the per-channel tops `high`); a
    ConfigError naming network.cnn.input_scale when the mode is unknown or needs bounds the space does not have."""
    if mode == "observed":
        top = tuple(float(h) for h in (high or ()))
        if len(top) != len(p.low) or not all(np.isfinite(top)):
            raise ValueError(f"observed scaling of image {p.key!r} needs a finite top per channel ({len(p.low)}), "
                             f"got {str(high)[:100]}")
        return p if (p.scale, p.top) == (mode, top) else replace(p, scale=mode, top=top)
    if mode is None or mode == p.scale:
        return p
    if p.scale == "observed":
        p = replace(p, top=())
    if mode not in IMAGE_SCALES:
        raise ConfigError(f"network.cnn.input_scale: {mode!r} is not one of auto, pixels, bounds, none")
    if mode == "bounds" and not (np.isfinite(p.low).all() and np.isfinite(p.high).all()):
        raise ConfigError(f"network.cnn.input_scale: bounds scaling needs finite low/high, and image {p.key!r} "
                          f"has low {min(p.low)}, high {max(p.high)}; use pixels or none, or wrap the env to "
                          f"declare its real bounds")
    return replace(p, scale=mode)


@dataclass(frozen=True)
class ActionSpec:
    """An action space as the engine sees it.

    ``discrete``: actions are integers in [0, n); ``dim`` = n. ``box``: actions are float vectors of
    width ``dim`` (the Box flattened); agents act in [-1, 1] and :meth:`to_env` scales into [low, high]
    (and :meth:`from_env` back), so one tanh-bounded actor serves every bounded Box.
    """

    kind: Literal["discrete", "box"]
    dim: int
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()
    shape: tuple[int, ...] = ()  # the Box's own shape (flattened to `dim` inside the engine)

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """Batch of actions as the agent produced them -> what the vector env takes."""
        if self.discrete:
            return action
        low, high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        a = np.clip(np.asarray(action, dtype=np.float32), -1.0, 1.0)
        return (low + (a + 1.0) * 0.5 * (high - low)).reshape(a.shape[0], *self.shape)

    def from_env(self, action: np.ndarray) -> np.ndarray:
        """Batch of env actions -> the agent's scale ([-1, 1] for a Box)."""
        if self.discrete:
            return np.asarray(action)
        low, high = np.asarray(self.low, np.float32), np.asarray(self.high, np.float32)
        a = np.asarray(action, dtype=np.float32).reshape(-1, self.dim)
        return 2.0 * (a - low) / (high - low) - 1.0

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dim": self.dim, "low": list(self.low), "high": list(self.high),
                "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, d: dict) -> ActionSpec:
        if not isinstance(d, dict):
            raise ValueError(f"action: expected an object, found {type(d).__name__}")
        from agilerl_core.limits import check

        try:
            check("space_elements", d.get("dim"), "action.dim")
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return cls(d["kind"], int(d["dim"]), tuple(float(x) for x in d.get("low", ())),
                   tuple(float(x) for x in d.get("high", ())), tuple(int(x) for x in d.get("shape", ())))


def action_spec(space: spaces.Space) -> ActionSpec:
    """The ActionSpec of a Gymnasium action space; a ConfigError naming the space when unsupported."""
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise ConfigError(f"env_id: Discrete action space starts at {space.start}; only start=0 is supported")
        return ActionSpec("discrete", int(space.n))
    if isinstance(space, spaces.Box):
        low, high = np.asarray(space.low, np.float64).reshape(-1), np.asarray(space.high, np.float64).reshape(-1)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            raise ConfigError(f"env_id: the action space {space} is unbounded; continuous-action algorithms act in "
                              f"[-1, 1] scaled to the bounds, so wrap the env to give the Box finite low/high")
        if (high <= low).any():
            raise ConfigError(f"env_id: the action space {space} has high <= low in some dimension")
        return ActionSpec("box", int(low.size), tuple(low.tolist()), tuple(high.tolist()), tuple(space.shape))
    hint = (" For a MultiDiscrete space, act in every combination as one Discrete: env_wrappers: [{wrapper: "
            "agilerl_core.envs.wrappers.MultiDiscreteAsDiscrete}]." if isinstance(space, spaces.MultiDiscrete) else "")
    raise ConfigError(f"env_id: action space {space} is not supported; supported action spaces: Discrete and "
                      f"bounded Box.{hint}")


def action_dim(space: spaces.Space) -> int:
    """Number of discrete actions; raise a ConfigError naming the space otherwise."""
    spec = action_spec(space)
    if not spec.discrete:
        raise ConfigError(f"env_id: action space {space} is continuous; DQN needs Discrete actions (use td3, ddpg, "
                          f"sac or ppo)")
    return spec.dim


@dataclass(frozen=True)
class MultiAgentSpec:
    """The spaces of a multi-agent env: each agent's observations and actions, and the joint observation
    (a Dict keyed by agent id) that centralised critics read. Observations travel as ``dict[agent_id,
    Tensor]``, which is exactly the joint spec's :data:`Obs`; an agent's own networks read ``{"obs": x}``."""

    agents: tuple[str, ...]
    obs: dict[str, ObsSpec]
    actions: dict[str, ActionSpec]
    joint: ObsSpec

    @classmethod
    def from_spaces(cls, agents: list[str], obs_spaces: dict[str, spaces.Space],
                    action_spaces: dict[str, spaces.Space]) -> MultiAgentSpec:
        obs = {}
        for a in agents:
            spec = ObsSpec(obs_spaces[a])
            if spec.has_images or spec.is_dict:
                raise ConfigError(f"env_id: agent {a!r} observes {obs_spaces[a]}; multi-agent observations must be "
                                  f"flat Box vectors or Discrete")
            obs[a] = spec
        actions = {a: action_spec(action_spaces[a]) for a in agents}
        joint = ObsSpec(spaces.Dict({a: obs_spaces[a] for a in agents}))
        return cls(tuple(agents), obs, actions, joint)

    @property
    def vector_dim(self) -> int:
        return self.joint.vector_dim

    @property
    def space(self) -> spaces.Dict:
        """The joint observation space (a Dict keyed by agent id)."""
        return self.joint.space

    def to_tensors(self, obs: dict[str, np.ndarray], device: torch.device | str = "cpu") -> Obs:
        """Per-agent raw observations (leading sub-env dim) -> stored-dtype tensors keyed by agent."""
        return {a: torch.as_tensor(np.asarray(obs[a]), device=device).to(self.obs[a].parts[0].dtype)
                for a in self.agents}
