"""Small frames and symbolic grids: default conv encoders sized to the frame, images scaled by what their
space holds (pixels / 255, code grids by their bounds), checkpoints that keep both, and PPO learning a code
grid with the default network section."""

from __future__ import annotations

import json
from dataclasses import replace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

import agilerl_core as ac
from agilerl_core.config import NetworkConfig
from agilerl_core.envs.space_records import obs_spec_from_dict, obs_spec_to_dict
from agilerl_core.envs.spaces import ObsSpec, image_scale
from agilerl_core.errors import ConfigError
from agilerl_core.networks import (
    LAYER_MUTATIONS,
    NODE_MUTATIONS,
    ArchBounds,
    ArchSpec,
    EvolvableNetwork,
    initial_arch,
    propose_mutation,
)
from agilerl_core.networks.cnn import CNNSpec, default_conv_layers

EMPTY, GOAL, AGENT = 1, 8, 10  # object codes, as MiniGrid's channel 0 holds them


class CodeGrid(gym.Env):
    """A `size` x `size` grid of MiniGrid-like codes (channel 0: the object, 1 empty, 8 goal, 10 agent; channel 1:
    a colour, goal 1; channel 2: 0). The agent starts in the centre and the goal is on another cell, drawn each
    episode; moving onto it gives reward 1 and ends the episode, which is cut after `max_steps` (the longest way
    to a goal): a policy must read where the goal's code is."""

    def __init__(self, size: int = 5, max_steps: int = 4) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_space = spaces.Box(0, 10, (size, size, 3), np.uint8)
        self.action_space = spaces.Discrete(4)  # up, down, left, right

    def _obs(self) -> np.ndarray:
        grid = np.zeros((self.size, self.size, 3), np.uint8)
        grid[..., 0] = EMPTY
        grid[self.goal] = (GOAL, 1, 0)
        grid[self.pos[0], self.pos[1], 0] = AGENT
        return grid

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        c = self.size // 2
        self.pos = [c, c]
        g = int(self.np_random.integers(self.size * self.size - 1))
        g += g >= c * self.size + c  # any cell but the centre
        self.goal = (g // self.size, g % self.size)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[int(action)]
        self.pos = [min(max(self.pos[0] + dr, 0), self.size - 1), min(max(self.pos[1] + dc, 0), self.size - 1)]
        self.t += 1
        done = tuple(self.pos) == self.goal
        return self._obs(), float(done), done, self.t >= self.max_steps, {}


CODES = spaces.Box(0, 10, (7, 7, 3), np.uint8)  # a MiniGrid-style 7x7 view of object codes
PIXELS = spaces.Box(0, 255, (84, 84, 4), np.uint8)  # Atari frames, four stacked


def _obs(space: spaces.Box, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(space.low, space.high.astype(np.int64) + 1, (n, *space.shape)).astype(space.dtype)


# ---- default encoders ---------------------------------------------------------------------------------------
def test_atari_frames_keep_the_nature_encoder_and_its_json():
    arch = initial_arch(ObsSpec(PIXELS), 6, NetworkConfig())
    [(key, cnn)] = arch.cnns
    assert (key, cnn.in_chw, cnn.channels, cnn.kernels, cnn.strides) == ("obs", (4, 84, 84), (32, 64, 64), (8, 4, 3),
                                                                         (4, 2, 1))
    assert cnn.input_scale is None  # pixels / 255, as every checkpoint before meant
    assert cnn.to_dict() == {"in_chw": [4, 84, 84], "channels": [32, 64, 64], "kernels": [8, 4, 3],
                             "strides": [4, 2, 1], "latent_dim": 128, "activation": "relu"}
    # the config that spelled the Atari stack out (or part of it) builds the very same arch
    spelled = NetworkConfig(cnn={"channels": [32, 64, 64], "kernel_sizes": [8, 4, 3], "strides": [4, 2, 1]})
    assert initial_arch(ObsSpec(PIXELS), 6, spelled) == arch
    assert initial_arch(ObsSpec(PIXELS), 6, NetworkConfig(cnn={"strides": [4, 2, 1]})) == arch


@pytest.mark.parametrize("space, kernels", [(CODES, (3, 3)), (spaces.Box(0, 255, (10, 10, 4), np.uint8), (3, 3, 3))])
def test_small_frames_get_a_default_encoder_that_runs(space, kernels):
    spec = ObsSpec(space)
    arch = initial_arch(spec, 4, NetworkConfig())  # no network.cnn section
    cnn = arch.cnns[0][1]
    assert cnn.kernels == kernels and set(cnn.strides) == {1} and cnn.is_valid()
    assert cnn.conv_output()[1:] == ((3, 3) if space is CODES else (4, 4))  # a spatial map is left for the head
    net = EvolvableNetwork(spec, arch, torch.Generator().manual_seed(0))
    out = net(spec.to_tensors(_obs(space, 5)))
    assert out.shape == (5, 4) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in net.cnns["obs"].parameters())


def test_every_frame_size_gets_a_stack_that_fits():
    for side in range(2, 100):
        kernels, strides = default_conv_layers(side, side + 3)
        spec = CNNSpec((3, side, side + 3), (32, 64, 64)[:len(kernels)], kernels, strides, 8)
        assert spec.is_valid(), side
        if side >= 36:
            assert (kernels, strides) == ((8, 4, 3), (4, 2, 1))
        elif side < 12:
            assert set(strides) == {1}, side  # small grids are not strided away


def test_a_frame_too_small_for_any_conv_names_network_cnn():
    assert default_conv_layers(1, 9) is None
    with pytest.raises(ConfigError, match=r"network\.cnn: image 'obs' of shape \(1, 9, 3\) .* 1x9 pixels, too small"
                                          r".*FlattenObservation.*kernel_sizes"):
        initial_arch(ObsSpec(spaces.Box(0, 255, (1, 9, 3), np.uint8), channels_last=True), 2, NetworkConfig())


def test_an_explicit_cnn_section_wins():
    spec = ObsSpec(CODES)
    arch = initial_arch(spec, 4, NetworkConfig(cnn={"channels": [8], "kernel_sizes": [2], "strides": [1]}))
    cnn = arch.cnns[0][1]
    assert (cnn.channels, cnn.kernels, cnn.strides) == ((8,), (2,), (1,))
    # ... even where it does not fit: the error names the section, never a silent default instead
    with pytest.raises(ConfigError, match=r"network\.cnn: kernels \[8, 4, 3\] with strides \[4, 2, 1\] leave no "
                                          r"output for image 'obs' of shape \(7, 7, 3\)"):
        initial_arch(spec, 4, NetworkConfig(cnn={"kernel_sizes": [8, 4, 3]}))
    # channels alone keep the frame's kernels and set the widths (and how many layers) of its first layers
    arch = initial_arch(spec, 4, NetworkConfig(cnn={"channels": [16]}))
    assert (arch.cnns[0][1].channels, arch.cnns[0][1].kernels) == ((16,), (3,))
    with pytest.raises(ConfigError, match=r"network\.cnn\.channels: 3 layers given, but the default conv stack for "
                                          r"7x7 frames has 2"):
        initial_arch(spec, 4, NetworkConfig(cnn={"channels": [8, 8, 8]}))
    with pytest.raises(ConfigError, match=r"network\.cnn: the default conv stack for 7x7 frames has 2 layers, outside "
                                          r"\[min_layers, max_layers\] = \[3, 4\]"):
        initial_arch(spec, 4, NetworkConfig(cnn={"min_layers": 3}))


def test_mutations_of_a_small_default_encoder_stay_valid():
    arch = initial_arch(ObsSpec(CODES), 4, NetworkConfig())
    bounds, rng = ArchBounds(), np.random.default_rng(0)
    for _ in range(300):
        out = propose_mutation(arch, str(rng.choice(LAYER_MUTATIONS + NODE_MUTATIONS)), bounds, rng)
        if out is not None:
            arch = out[0]
            assert arch.cnns[0][1].is_valid() and arch.cnns[0][1].input_scale == "bounds"


# ---- input scaling --------------------------------------------------------------------------------------------
def test_the_scaling_follows_what_the_space_holds():
    assert image_scale(PIXELS) == "pixels"
    assert image_scale(CODES) == "bounds"
    assert image_scale(spaces.Box(0, 5, (7, 7, 3), np.int64)) == "bounds"
    assert image_scale(spaces.Box(0, 1000, (7, 7, 3), np.int32)) == "none"  # not codes: as before
    assert image_scale(spaces.Box(0, 1, (7, 7, 3), np.float32)) == "none"


def test_a_code_grid_is_scaled_by_its_own_bounds_per_channel():
    low = np.zeros((5, 6, 3), np.uint8)
    high = np.broadcast_to(np.array([10, 5, 4], np.uint8), (5, 6, 3)).copy()
    low[..., 2], high[..., 2] = 2, 2  # a constant channel
    low[..., 1] = 1
    space = spaces.Box(low, high, dtype=np.uint8)
    spec = ObsSpec(space)
    assert spec.image_scales == {"obs": "bounds"}
    x = np.zeros((2, 5, 6, 3), np.uint8)
    x[0, 1, 2] = (10, 5, 2)
    x[1, 4, 5] = (3, 2, 2)
    x[..., 1] = np.maximum(x[..., 1], 1)
    x[..., 2] = 2
    _, [img] = spec.preprocess(spec.to_tensors(x))
    assert img.shape == (2, 3, 5, 6) and img.dtype == torch.float32
    assert img[0, :, 1, 2].tolist() == [1.0, 1.0, 0.0]  # each channel's high -> 1; a constant channel -> 0
    # (x - low) / (high - low): (3 - 0) / 10, (2 - 1) / (5 - 1), constant -> 0, each rounded once to float32
    assert torch.equal(img[1, :, 4, 5], torch.tensor([0.3, 0.25, 0.0]))
    assert img[0, :, 0, 0].tolist() == [0.0, 0.0, 0.0]  # each channel's low -> 0
    assert float(img.min()) == 0.0 and float(img.max()) == 1.0


def test_pixel_images_are_scaled_bit_identically_to_before():
    spec = ObsSpec(PIXELS)
    x = spec.to_tensors(_obs(PIXELS, 3))
    _, [img] = spec.preprocess(x)
    assert torch.equal(img, (x["obs"].to(torch.float32) / 255.0).permute(0, 3, 1, 2))
    dict_space = spaces.Dict({"img": spaces.Box(0, 255, (3, 12, 12), np.uint8), "v": spaces.Box(-1, 1, (2,))})
    dspec = ObsSpec(dict_space)
    d = dspec.to_tensors({"img": _obs(dict_space["img"], 2), "v": np.zeros((2, 2), np.float32)})
    assert torch.equal(dspec.preprocess(d)[1][0], d["img"].to(torch.float32) / 255.0)
    # and their specs record exactly what they recorded before (same_spec against old checkpoints holds)
    assert set(obs_spec_to_dict(spec)) == {"kind", "observation_space", "channels_last"}


def test_the_config_and_the_spec_can_force_a_scaling_and_a_checkpoint_spec_records_it():
    arch = initial_arch(ObsSpec(CODES), 4, NetworkConfig(cnn={"input_scale": "pixels"}))
    assert arch.cnns[0][1].input_scale is None  # what uint8 always meant
    assert EvolvableNetwork(ObsSpec(CODES), arch).obs_spec.image_scales == {"obs": "pixels"}
    forced = ObsSpec(CODES, image_scale="none")
    d = json.loads(json.dumps(obs_spec_to_dict(forced)))
    assert d["image_scale"] == {"obs": "none"} and obs_spec_from_dict(d).image_scales == {"obs": "none"}
    with pytest.raises(ValueError, match=r"spec\.image_scale: expected an object of image key -> one of pixels"):
        obs_spec_from_dict({**d, "image_scale": {"obs": "jpeg"}}, "spec")
    with pytest.raises(ConfigError, match=r"network\.cnn\.input_scale: bounds scaling needs finite low/high"):
        initial_arch(ObsSpec(spaces.Box(-np.inf, np.inf, (8, 8, 3), np.float32)), 4,
                     NetworkConfig(cnn={"input_scale": "bounds"}))


def test_stacked_members_scale_a_code_grid_as_each_member_does():
    from agilerl_core.algorithms.group_state import padded_shapes, param_shapes, stack_flats
    from agilerl_core.networks.stacked import StackedNetwork

    spec = ObsSpec(CODES)
    nets = [EvolvableNetwork(spec, initial_arch(spec, 4, NetworkConfig(hidden_sizes=[h])),
                             torch.Generator().manual_seed(i)) for i, h in enumerate((32, 48))]
    shapes = [param_shapes(n) for n in nets]
    padded = padded_shapes(shapes)
    flats = [torch.cat([p.detach().reshape(-1) for p in n.parameters()]) for n in nets]
    stacked = StackedNetwork([n.layout() for n in nets], stack_flats(flats, shapes, padded), padded)
    obs = [spec.to_tensors(_obs(CODES, 4, seed=i)) for i in range(2)]
    out = stacked({"obs": torch.cat([o["obs"] for o in obs])})
    for i, n in enumerate(nets):
        torch.testing.assert_close(out[i], n(obs[i]), rtol=1e-5, atol=1e-5)


# ---- checkpoints ------------------------------------------------------------------------------------------------
ENV = {"env_id": "CodeGrid", "env_kwargs": {}, "channels_last": None}


def _ppo(spec: ObsSpec, net: NetworkConfig):
    from agilerl_core.algorithms.hyperparameters.ppo import PPOHyperparameters
    from agilerl_core.algorithms.ppo import PPO

    return PPO(spec, 4, initial_arch(spec, 4, net), PPOHyperparameters(), seed=3)


def test_a_small_frame_member_round_trips_through_a_checkpoint(tmp_path):
    from agilerl_core.algorithms.saved import load_member
    from agilerl_core.hpo.population import Member
    from agilerl_core.io import save_member

    agent = _ppo(ObsSpec(CODES), NetworkConfig())
    save_member(tmp_path / "m", Member(1, agent), ENV)
    meta = json.loads((tmp_path / "m" / "member.json").read_text())
    assert meta["agent"]["arch"]["cnns"][0][1]["input_scale"] == "bounds"
    obs = ObsSpec(CODES).to_tensors(_obs(CODES, 6))
    for loaded in (load_member(tmp_path / "m")[0].agent,  # on the spaces the checkpoint records
                   load_member(tmp_path / "m", ObsSpec(CODES))[0].agent):  # on the caller's env
        assert loaded.arch == agent.arch and ArchSpec.from_dict(agent.arch.to_dict()) == agent.arch
        for name in ("actor", "critic"):
            assert loaded.networks[name].obs_spec.image_scales == {"obs": "bounds"}
            torch.testing.assert_close(loaded.networks[name](obs), agent.networks[name](obs), rtol=0, atol=0)


def test_a_code_grid_checkpoint_written_before_scaling_by_bounds_keeps_dividing_by_255(tmp_path):
    """Before this change a uint8 grid was divided by 255 and needed an explicit cnn section; its member.json
    had no input_scale. Loaded now, on its recorded spaces or through an arena's fresh (bounds) spec, its
    networks still read x / 255: the weights act as they were trained."""
    from agilerl_core.algorithms.saved import load_member
    from agilerl_core.hpo.population import Member
    from agilerl_core.io import save_member

    old_cnn = {"channels": [8], "kernel_sizes": [3], "strides": [1], "latent_dim": 16, "input_scale": "pixels"}
    agent = _ppo(ObsSpec(CODES), NetworkConfig(cnn=old_cnn))
    save_member(tmp_path / "old", Member(1, agent), ENV)
    text = (tmp_path / "old" / "member.json").read_text()
    assert "input_scale" not in text and "image_scale" not in text  # what the old code wrote
    codes = ObsSpec(CODES).to_tensors(_obs(CODES, 6))
    for loaded in (load_member(tmp_path / "old")[0].agent, load_member(tmp_path / "old", ObsSpec(CODES))[0].agent):
        net = loaded.networks["actor"]
        assert net.obs_spec.image_scales == {"obs": "pixels"}
        assert torch.equal(net.obs_spec.preprocess(codes)[1][0],
                           (codes["obs"].to(torch.float32) / 255.0).permute(0, 3, 1, 2))
        torch.testing.assert_close(net(codes), agent.networks["actor"](codes), rtol=0, atol=0)
    # the scaling matters: the same weights reading the codes by their bounds act otherwise
    actor_arch = agent.networks["actor"].arch
    bounds_arch = replace(actor_arch, cnns=tuple((k, replace(c, input_scale="bounds")) for k, c in actor_arch.cnns))
    bounds_view = EvolvableNetwork(ObsSpec(CODES), bounds_arch)
    bounds_view.load_state_dict(agent.networks["actor"].state_dict())
    assert bounds_view.obs_spec.image_scales == {"obs": "bounds"}
    assert not torch.allclose(bounds_view(codes), agent.networks["actor"](codes))


# ---- learning -------------------------------------------------------------------------------------------------
def test_ppo_learns_a_code_grid_with_the_default_network(tmp_path):
    """PPO with no network section reaches the goal it reads from the codes. Measured (CPU, seeds 0-5): every
    seed reached fitness >= 0.95 within 16k-29k steps (4-13 s); the same runs dividing the codes by 255
    (network.cnn.input_scale: pixels) stayed at 0.0-0.15, what a random policy gets (0.13), for 60k steps."""
    cfg = {"name": "codegrid", "algorithm": "ppo", "population_size": 2, "num_envs": 8, "evo_steps": 2048,
           "max_env_steps": 60_000, "eval_episodes": 20, "seed": 0, "target_fitness": 0.95,
           "hyperparameters": {"rollout_steps": 64, "num_minibatches": 4, "update_epochs": 4, "lr": 2e-3,
                               "ent_coef": 0.01},
           "output_dir": str(tmp_path)}
    res = ac.evolve(cfg, env=CodeGrid, progress=False)
    best = max(h.best_fitness for h in res.history)
    assert best >= 0.9, [h.best_fitness for h in res.history]
    assert res.elite.agent.arch.cnns[0][1].kernels == (3,)  # 5x5 frames: one 3x3 layer, stride 1


# ---- codes in a Box declared 0-255: scaled by what the env shows ---------------------------------------------
class CodeRoom255(gym.Env):
    """A 5x5 room of small codes (object 0-3, colour 0-5, state 0) declared as a Box(0, 255) uint8 image, as
    MiniGrid's ImgObsWrapper declares its codes: the agent (code 2) walks to the goal (code 3) in a corner."""

    observation_space = spaces.Box(0, 255, (7, 7, 3), np.uint8)
    action_space = spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = [int(v) for v in self.np_random.integers(1, 5, 2)], 0
        return self._obs(), {}

    def _obs(self):
        grid = np.zeros((7, 7, 3), np.uint8)
        grid[[0, -1], :, :2] = (1, 5)
        grid[:, [0, -1], :2] = (1, 5)
        grid[5, 5, :2] = (3, 1)
        grid[self.pos[0], self.pos[1], 0] = 2
        return grid

    def step(self, action):
        dr, dc = ((-1, 0), (1, 0), (0, -1), (0, 1))[int(action)]
        self.pos = [min(max(self.pos[0] + dr, 1), 5), min(max(self.pos[1] + dc, 1), 5)]
        self.t += 1
        done = self.pos == [5, 5]
        return self._obs(), float(done), done, self.t >= 20, {}


class LateLight(gym.Env):
    """A Box(0, 255) frame black at reset that shows a real pixel (200) from its second step: pixels."""

    observation_space = spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((8, 8, 3), np.uint8), {}

    def step(self, action):
        self.t += 1
        frame = np.zeros((8, 8, 3), np.uint8)
        frame[0, 0, 1] = 200 if self.t >= 2 else 4
        return frame, 0.0, False, self.t >= 10, {}


WIDE = CodeRoom255.observation_space


def _wide_config(env_id: str, tmp_path, **over):
    from tests.conftest import tiny_config

    for name, cls in (("CodeRoom255-v0", CodeRoom255), ("LateLight-v0", LateLight)):
        if name not in gym.registry:
            gym.register(name, entry_point=cls)
    return tiny_config(env_id=env_id, algorithm="ppo", population_size=2, num_envs=2, evo_steps=64,
                       max_env_steps=256, output_dir=str(tmp_path),
                       hyperparameters={"rollout_steps": 16, "num_minibatches": 2, "update_epochs": 1}, **over)


def test_codes_declared_0_255_get_their_observed_tops_and_pixels_keep_255():
    from agilerl_core.envs.spaces import observed_highs

    part = ObsSpec(WIDE).parts[0]
    assert part.scale == "pixels"  # by the space alone: what the bounds say
    frames = np.zeros((2, 7, 7, 3), np.uint8)
    frames[0, ..., 0], frames[1, 2, 2, 0], frames[1, ..., 1] = 1, 3, 5
    # per channel the highest value seen; a channel that showed only its low takes the others' highest top
    assert observed_highs(part, frames) == (3.0, 5.0, 5.0)
    assert observed_highs(part, np.full((1, 7, 7, 3), 32, np.uint8)) == (32.0, 32.0, 32.0)  # CODE_RANGE: codes
    assert observed_highs(part, np.full((1, 7, 7, 3), 33, np.uint8)) is None  # above it: pixels
    assert observed_highs(part, np.zeros((3, 7, 7, 3), np.uint8)) is None  # nothing seen: keep / 255
    assert observed_highs(ObsSpec(CODES).parts[0], frames) is None  # declared bounds win (bounds scaling)
    chw = ObsSpec(spaces.Box(0, 255, (3, 7, 7), np.uint8)).parts[0]
    assert observed_highs(chw, frames.transpose(0, 3, 1, 2)) == (3.0, 5.0, 5.0)
    # the network input: x / top per channel, so the codes span [0, 1] instead of 0-0.02
    spec = ObsSpec(WIDE).with_image_scale({"obs": "observed"}, {"obs": (3.0, 5.0, 5.0)})
    x = np.zeros((1, 7, 7, 3), np.uint8)
    x[0, 1, 1], x[0, 2, 2] = (3, 5, 0), (2, 0, 5)
    _, [img] = spec.preprocess(spec.to_tensors(x))
    assert img[0, :, 1, 1].tolist() == [1.0, 1.0, 0.0]
    torch.testing.assert_close(img[0, :, 2, 2], torch.tensor([2 / 3, 0.0, 1.0]), rtol=0, atol=1e-7)
    with pytest.raises(ValueError, match="needs a finite top per channel"):
        ObsSpec(WIDE).with_image_scale({"obs": "observed"}, {"obs": (3.0, 5.0)})


def test_the_cnn_spec_records_observed_tops_and_refuses_bad_ones():
    spec = CNNSpec((3, 7, 7), (32, 64), (3, 3), (1, 1), 128, "tanh", "observed", (3.0, 5.0, 5.0))
    d = json.loads(json.dumps(spec.to_dict()))
    assert d["input_scale"] == "observed" and d["input_high"] == [3.0, 5.0, 5.0]
    assert CNNSpec.from_dict(d) == spec and ArchSpec.from_dict(json.loads(json.dumps(
        initial_arch(ObsSpec(WIDE), 4, NetworkConfig(), {"obs": (3.0, 5.0, 5.0)}).to_dict()))).cnns[0][1].input_high == (
        3.0, 5.0, 5.0)
    for bad in ([3.0, 5.0], [3.0, 5.0, float("nan")], [3.0, 5.0, 0.0], "3,5,5", [3.0, True, 5.0]):
        with pytest.raises(ValueError, match="input_high"):
            CNNSpec.from_dict({**d, "input_high": bad})
    with pytest.raises(ValueError, match="only then"):
        CNNSpec.from_dict({k: v for k, v in d.items() if k != "input_high"})
    with pytest.raises(ValueError, match="only then"):
        CNNSpec.from_dict({**d, "input_scale": "pixels"})
    # a pixel image's spec is as before (no new keys); the config's explicit scaling is never overridden
    assert "input_high" not in initial_arch(ObsSpec(PIXELS), 6, NetworkConfig()).cnns[0][1].to_dict()
    forced = initial_arch(ObsSpec(WIDE), 4, NetworkConfig(cnn={"input_scale": "pixels"}), {"obs": (3.0, 5.0, 5.0)})
    assert forced.cnns[0][1].input_scale is None and forced.cnns[0][1].input_high is None


def test_an_arena_probes_its_env_and_a_saved_member_scales_as_in_training(tmp_path):
    """The arena reads the codes' tops from a seeded probe of the env; a member saved and loaded (on its recorded
    spaces, or on the caller's spec that knows nothing of the probe) reads its images exactly as in training;
    a spec recorded with the observed scaling round-trips too."""
    from agilerl_core.algorithms.saved import load_member
    from agilerl_core.arenas import build_arena
    from agilerl_core.hpo.population import Member
    from agilerl_core.io import save_member

    arena = build_arena(_wide_config("CodeRoom255-v0", tmp_path))
    cnn = arena.arch.cnns[0][1]
    assert (cnn.input_scale, cnn.input_high) == ("observed", (3.0, 5.0, 5.0))
    assert build_arena(_wide_config("CodeRoom255-v0", tmp_path)).arch == arena.arch  # the probe is seeded
    [agent] = arena.build_members([5])
    save_member(tmp_path / "m", Member(1, agent), ENV)
    meta = json.loads((tmp_path / "m" / "member.json").read_text())
    assert meta["agent"]["arch"]["cnns"][0][1]["input_high"] == [3.0, 5.0, 5.0]
    env = CodeRoom255()
    obs = ObsSpec(WIDE).to_tensors(np.stack([env.reset(seed=i)[0] for i in range(6)]))
    expected = (obs["obs"].to(torch.float32) / torch.tensor([3.0, 5.0, 5.0])).permute(0, 3, 1, 2)
    for loaded in (load_member(tmp_path / "m")[0].agent, load_member(tmp_path / "m", ObsSpec(WIDE))[0].agent):
        for name in ("actor", "critic"):
            net = loaded.networks[name]
            assert net.obs_spec.image_scales == {"obs": "observed"}
            torch.testing.assert_close(net.obs_spec.preprocess(obs)[1][0], expected, rtol=0, atol=0)
            torch.testing.assert_close(net(obs), agent.networks[name](obs), rtol=0, atol=0)
    observed_spec = agent.networks["actor"].obs_spec
    d = json.loads(json.dumps(obs_spec_to_dict(observed_spec)))
    assert d["image_scale"] == {"obs": "observed"} and d["image_top"] == {"obs": [3.0, 5.0, 5.0]}
    back = obs_spec_from_dict(d)
    assert back.parts == observed_spec.parts
    with pytest.raises(ValueError, match="image_top"):
        obs_spec_from_dict({**d, "image_top": {"obs": "3,5,5"}})


def test_real_pixels_keep_dividing_by_255_whatever_the_probe_needed(tmp_path):
    from agilerl_core.arenas import build_arena
    from agilerl_core.arenas.base import probe_image_tops
    from agilerl_core.envs.make import EnvRecipe

    late = build_arena(_wide_config("LateLight-v0", tmp_path))  # black at reset, a 200 two steps on
    assert late.arch.cnns[0][1].input_scale is None and late.arch.cnns[0][1].input_high is None
    cfg = _wide_config("agilerl_test/Image-v0", tmp_path)  # 0/255 quadrants (tests/conftest.py)
    assert probe_image_tops(EnvRecipe.of(cfg), ObsSpec(LateLight.observation_space)) == {}
    assert build_arena(cfg).arch.cnns[0][1].to_dict().keys() == {"in_chw", "channels", "kernels", "strides",
                                                                   "latent_dim", "activation"}
    # an explicit scaling skips the probe: the codes stay / 255 as the config asks
    forced = build_arena(_wide_config("CodeRoom255-v0", tmp_path, network={"hidden_sizes": [32, 32], "min_nodes": 8,
                                                                          "cnn": {"input_scale": "pixels"}}))
    assert forced.arch.cnns[0][1].input_scale is None


@pytest.mark.slow
def test_ppo_from_cartpole_ppo_yaml_learns_the_code_room_declared_0_255(tmp_path, monkeypatch):
    """benchmarks/gridworld.py's CodeRoom-v0 (codes 0-5 in a Box(0, 255)) from the shipped cartpole_ppo.yaml with
    only env_id changed. Divided by 255 its members kept a policy that ignored the grid (best 0.36-0.46 in 100k
    global steps, seeds 0-4); scaled by the observed tops, seeds 0-4 reached 0.85-0.90 (optimum 0.875; 10 episodes)
    at the first generation, 8k global steps: one generation here (~17 s on a CPU)."""
    from pathlib import Path

    from agilerl_core.experiment import train_local
    from tasks.config import load_config

    root = Path(__file__).resolve().parents[1]
    monkeypatch.syspath_prepend(str(root / "benchmarks"))
    cfg = load_config(root / "deployments" / "configs" / "cartpole_ppo.yaml",
                      {"env_id": "gridworld:CodeRoom-v0", "max_env_steps": 8192, "seed": 0,
                       "output_dir": str(tmp_path)})
    res = train_local(cfg, progress=False)
    assert max(h.best_fitness for h in res.history) >= 0.8, [h.best_fitness for h in res.history]
    assert res.elite_uri and '"input_high"' in (Path(res.elite_uri) / "member.json").read_text()
