"""The on-policy loop: every member of a group collects its own fresh rollouts and learns from them only (PPO);
:func:`train_group_on_policy`, which :class:`~agilerl_core.arenas.gym_on_policy.OnPolicyArena` calls with its
group's envs."""

from __future__ import annotations

import math
import time

import torch

from agilerl_core import progress
from agilerl_core.algorithms.ppo.maths import explained_variance
from agilerl_core.buffers.rollout import Rollout, compute_gae, members_rows
from agilerl_core.envs.group import GroupEnv
from agilerl_core.finite import FirstBad
from agilerl_core.results import TrainResult
from agilerl_core.train_metrics import EpisodeTally, marks, phase_metrics


def rollout_lengths(vector_steps: int, rollout_steps: int) -> list[int]:
    """An on-policy phase's rollouts: `rollout_steps` vector steps each, the last one shorter if need be."""
    return [min(rollout_steps, vector_steps - done) for done in range(0, vector_steps, rollout_steps)]


def _members_sequences(buf: dict, steps: int, seq_len: int, adv: torch.Tensor, ret: torch.Tensor
                       ) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """A recurrent group's rollout [T, K, N, ...] as each member's sequences, stacked (what
    :meth:`~agilerl_core.algorithms.ppo.PPOGroup.learn_stacked` takes): every field [K, S, seq_len, ...],
    member k's S sequences those :meth:`Rollout.sequences` cuts from its own rollout, in its order."""
    k, n = buf["rewards"].shape[1], buf["rewards"].shape[2]

    def merged(x: torch.Tensor) -> torch.Tensor:  # [T, K, N, ...] -> [T, K * N, ...]: one rollout of K * N envs
        return x.flatten(1, 2)

    def split(x: torch.Tensor) -> torch.Tensor:  # [chunks * K * N, ...] (chunk-major) -> [K, chunks * N, ...]
        return x.view(-1, k, n, *x.shape[1:]).transpose(0, 1).reshape(k, -1, *x.shape[1:])

    whole = Rollout({key: merged(v) for key, v in buf["obs"].items()}, merged(buf["actions"]),
                    merged(buf["logprobs"]), merged(buf["rewards"]), merged(buf["dones"]), merged(buf["values"]),
                    None if buf["masks"] is None else merged(buf["masks"]),
                    {name: merged(st) for name, st in buf["states"].items()}, merged(buf["starts"]))
    data, a, r = whole.sequences(steps, seq_len, merged(adv), merged(ret))
    dev = adv.device
    data = {key: {kk: split(vv) for kk, vv in v.items()} if isinstance(v, dict) else split(v.to(dev))
            for key, v in data.items()}
    return data, split(a), split(r)


def train_group_on_policy(group, slots: list[int], envs: GroupEnv, evo_steps: int, seeds: list[int]
                          ) -> list[TrainResult]:
    """Collect `evo_steps` env steps per member (whole vector steps) of its own rollouts of `rollout_steps`
    each, learning after every rollout (the last one may be shorter). The whole loop carries the member axis:
    the group's envs step as one (`envs`, K members x N sub-envs), one batched forward samples every member's
    actions from its keyed stream (a rollout's draws taken in one op), the rollout lives in [T, K, N] tensors on
    the group's device, GAE is one reverse scan for all K x N envs at each member's gamma and lambda, and each
    minibatch round of the update is one batched step over all members' rows, or, for recurrent members,
    sequences (:meth:`~agilerl_core.algorithms.ppo.PPOGroup.learn_stacked`). Returns, losses and step counts
    stay on the device and are read once at the end. A member alone is a group of one.

    Member k's envs are reset with ``seeds[k]`` first and its random draws come from a key taken from its own
    generator, so its result depends only on itself and its seed, never on its group; a rollout bootstraps
    from V of the observation after its last step, and a time-limit cut from V of the final observation."""
    t0 = time.perf_counter()
    agents, k, n = group.agents, envs.k, envs.n
    first, dev = agents[0], group.device
    hp0 = first.hp
    learn0 = [a.learn_steps for a in agents]
    recurrent = group.rnn is not None
    group.begin_phase()  # each member's random key for the phase, from its own generator
    obs, mask = envs.reset(seeds)
    for a in agents:
        a.begin_rollout(n)
    group.begin_acting(n)
    vector_steps = math.ceil(evo_steps / n)
    rollout_steps = hp0.rollout_steps  # structural: equal within a group
    gamma, lam = group.hp_tensor("gamma").view(k, 1), group.hp_tensor("gae_lambda").view(k, 1)
    rows = (rollout_steps, k, n)
    act_spec = first.action_spec
    buf = {"obs": {key: torch.zeros((*rows, *v.shape[1:]), dtype=v.dtype, device=dev) for key, v in obs.items()},
           "actions": torch.zeros(rows if act_spec.discrete else (*rows, act_spec.dim),
                                  dtype=torch.int64 if act_spec.discrete else torch.float32, device=dev),
           "logprobs": torch.zeros(rows, device=dev), "values": torch.zeros(rows, device=dev),
           "rewards": torch.zeros(rows, device=dev), "dones": torch.zeros(rows, device=dev),
           "masks": None if mask is None else torch.ones((*rows, mask.shape[1]), dtype=torch.bool, device=dev),
           "states": None if not recurrent else {name: torch.zeros((*rows, *group.rnn), device=dev)
                                                 for name in group.nets},
           "starts": None if not recurrent else torch.zeros(rows, dtype=torch.bool, device=dev)}
    # a time limit is not the end of the world: a cut episode's reward is credited with V of its final
    # observation. Host envs say when a step cut one (V is then taken at that step); on-device envs never do
    # (no host round trip), so a feed-forward critic values every step's final observation once per rollout,
    # in one forward (a recurrent critic reads its state of the moment: at every step)
    defer_cuts = envs.on_device and not recurrent
    if defer_cuts:
        buf["final_obs"] = {key: torch.zeros_like(v) for key, v in buf["obs"].items()}
        buf["cuts"] = torch.zeros(rows, device=dev)
    starts = torch.ones(k, n, dtype=torch.bool, device=dev)
    episodes = EpisodeTally(k, n, dev)
    loss_means, updates = [], torch.zeros(k, dtype=torch.long, device=dev)
    bad_loss = FirstBad(k, dev)
    rollouts = rollout_lengths(vector_steps, rollout_steps)
    marked, done_steps = marks(len(rollouts), vector_steps * n), 0  # a long phase's points: after some rollouts
    for r, steps in enumerate(rollouts):
        draws = group.action_draws(steps, n)  # the rollout's action samples, drawn at once
        for t in range(steps):
            actions, logp, value, before = group.act(obs, mask, starts if recurrent else None, draws[t])
            for key, v in obs.items():
                buf["obs"][key][t] = v.view(k, n, *v.shape[1:])
            buf["actions"][t], buf["logprobs"][t], buf["values"][t] = actions, logp, value
            if mask is not None:
                buf["masks"][t] = mask.view(k, n, -1)
            if recurrent:
                for name, st in before.items():
                    buf["states"][name][t] = st
                buf["starts"][t] = starts
            step = envs.step(actions)
            reward = step.reward.view(k, n).float()
            done = (step.terminated | step.truncated).view(k, n)
            cut = (step.truncated & ~step.terminated).view(k, n)
            if defer_cuts:
                for key, v in step.final_obs.items():
                    buf["final_obs"][key][t] = v.view(k, n, *v.shape[1:])
                buf["cuts"][t] = cut
            elif step.any_cut is None or step.any_cut:
                reward = reward + gamma * group.values_all(step.final_obs) * cut
            buf["rewards"][t], buf["dones"][t] = reward, done
            episodes.step(step.reward, done)
            starts, obs, mask = done, step.obs, step.mask
            progress.advance(k * n)
        if defer_cuts:
            final = group.values_all({key: members_rows(v, steps).flatten(0, 1) for key, v in buf["final_obs"].items()})
            buf["rewards"][:steps] += gamma * final.view(k, steps, n).transpose(0, 1) * buf["cuts"][:steps]
        last_value = group.values_all(obs, starts if recurrent else None)
        adv, ret = compute_gae(buf["rewards"][:steps], buf["values"][:steps], buf["dones"][:steps], last_value,
                               gamma, lam)
        group.metrics.add(explained_variance=explained_variance(members_rows(buf["values"], steps),
                                                                members_rows(ret, steps)))
        if recurrent:  # whole sequences per member (the update's rows are sequences, not steps)
            data, adv, ret = _members_sequences(buf, steps, group.seq_len, adv, ret)
        else:
            data = {"obs": {key: members_rows(v, steps) for key, v in buf["obs"].items()},
                    "actions": members_rows(buf["actions"], steps), "logprobs": members_rows(buf["logprobs"], steps),
                    "values": members_rows(buf["values"], steps)}
            if buf["masks"] is not None:
                data["masks"] = members_rows(buf["masks"], steps)
            adv, ret = members_rows(adv, steps), members_rows(ret, steps)
        stats = group.learn_stacked(data, adv, ret)
        mean = stats["loss_sum"] / stats["updates"].clamp(min=1)
        updates += stats["updates"]
        bad_loss.see(mean, r + 1)
        loss_means.append(mean)
        # the statistics move between rollouts only: a rollout's log-probs and its update see one scale
        group.observe({key: members_rows(v, steps) for key, v in buf["obs"].items()})
        done_steps += steps * n
        if r + 1 in marked:
            group.metrics.mark([a.env_steps + done_steps for a in agents])
    group.write_back()
    envs.check(slots)
    bad_loss.check(slots, "the loss", "update of rollout")
    # the phase's numbers come back to the host once
    counts, returns, lengths = episodes.read()
    losses = torch.stack(loss_means).mean(0).cpu().tolist() if loss_means else [float("nan")] * k
    taken = updates.cpu().tolist()
    diagnostics, points = group.metrics.means(), group.metrics.points()
    wall = time.perf_counter() - t0
    out = []
    for i, (a, slot) in enumerate(zip(agents, slots, strict=True)):
        a.env_steps += vector_steps * n
        a.learn_steps += int(taken[i])
        out.append(TrainResult(slot, vector_steps * n, a.learn_steps - learn0[i], counts[i], returns[i], losses[i],
                               wall, phase_metrics(diagnostics[i], vector_steps * n, wall, lengths[i]), points[i]))
    return out
