"""Nothing per step on the host: a training phase on on-device envs reads from the device a fixed number of
times, however many steps it takes (the CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``: every
read a CUDA device would wait for - ``item``, ``tolist``, ``numpy``, ``cpu``, a tensor's truth value or number -
is counted, for a phase and for one twice as long)."""

from __future__ import annotations

import collections

import pytest
import torch

from agilerl_core.arenas import build_arena

READS = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__")


def reads_of(fn) -> collections.Counter:
    """How often `fn()` reads a tensor back to the host, by kind."""
    counts: collections.Counter = collections.Counter()
    real = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name, method):
        def read(self, *args, **kwargs):
            counts[name] += 1
            return method(self, *args, **kwargs)
        return read

    try:
        for name, method in real.items():
            setattr(torch.Tensor, name, counting(name, method))
        fn()
    finally:
        for name, method in real.items():
            setattr(torch.Tensor, name, method)
    return counts


OFF_POLICY = {"batch_size": 32, "learning_delay": 16, "buffer_size": 2000}
CASES = {
    "dqn": ("dqn", "CartPole-v1", OFF_POLICY),
    # PER, noisy layers, dueling C51 heads; one-step returns: n-step windows still end on the host (which episodes
    # ended decides how many transitions each slot receives, and the buffer counts its rows there)
    "rainbow": ("rainbow", "CartPole-v1", {**OFF_POLICY, "n_step": 1}),
    "dqn-obs-norm": ("dqn", "CartPole-v1", {**OFF_POLICY, "normalize_obs": True}),
    "td3": ("td3", "Pendulum-v1", OFF_POLICY),
    "sac": ("sac", "Pendulum-v1", OFF_POLICY),
    "ppo": ("ppo", "CartPole-v1", {"rollout_steps": 16, "update_epochs": 2, "num_minibatches": 2, "normalize_obs": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_training_phase_reads_the_device_a_fixed_number_of_times(case):
    from tasks.config import validate_config

    algorithm, env_id, hp = CASES[case]
    reads = []
    for steps in (128, 256):
        cfg = validate_config({"name": "reads", "algorithm": algorithm, "env_id": env_id, "env_backend": "torch",
                               "population_size": 2, "num_envs": 4, "evo_steps": steps, "max_env_steps": 4 * steps,
                               "eval_episodes": 2, "hyperparameters": hp, "network": {"hidden_sizes": [16, 16]}})
        arena = build_arena(cfg)
        members = arena.build_members([1, 2])
        arena.begin_generation(2)
        reads.append(reads_of(lambda: arena.train_group(members, [0, 1], [5, 6], steps)))  # noqa: B023
        assert sum(m.learn_steps for m in members) > 0  # it learned
    assert reads[0] == reads[1], f"reads grow with the steps taken: {dict(reads[0])} then {dict(reads[1])}"
