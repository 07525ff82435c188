"""Population scaling: wall time of one generation (training + evaluation, the same steps per member) at
population 1, 4, 16 and 64, with population-batched learning on and off, for DQN (CartPole), TD3
(Pendulum) and PPO (CartPole). One torch thread, in-process (`Evolution.run_generation`), no mutation (so
the groups stay whole: it measures the batched path, not how a run's architectures spread).

    python benchmarks/population_scaling.py [--pops 1,4,16,64] [--algos dqn,td3,ppo] [--repeats 3]
        [--backend gymnasium|torch] [--device cpu|cuda] [--batch both|on|off]

``--backend torch`` steps the on-device classic-control envs (env_backend: torch); ``--compile-envs`` compiles
their step (compile_envs; its compile happens in the warm-up generation, outside the timing); ``--device cuda``
puts the members (and those envs) on the GPU. Prints one JSON object: per algorithm and population the median
generation wall time, its evaluation part, env steps per second, the ratio to population 1, and the phases'
shares of the training time (env steps, acting, buffer writes, GAE, learning; from one more generation run under
cProfile, whose overhead inflates small calls, so the shares are indicative), and at the largest population the
cost of one generation's selection and mutation (``evolve_s``: tournament, clones and the config's default
mutation mix, median of ``--repeats`` calls). Targets:
population 16 <= 3x population 1 with batching on (CPU); with the torch backend on a GPU, PPO population
1,024 <= 2x population 1 and >= 1M env steps/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

CONFIGS = {
    "dqn": {"env_id": "CartPole-v1", "algorithm": "dqn", "num_envs": 8, "evo_steps": 1024,
            "hyperparameters": {"batch_size": 128, "learn_step": 4, "learning_delay": 0, "buffer_size": 100_000}},
    "td3": {"env_id": "Pendulum-v1", "algorithm": "td3", "num_envs": 8, "evo_steps": 1024, "eval_max_steps": 200,
            "hyperparameters": {"batch_size": 128, "learn_step": 4, "learning_delay": 0, "random_steps": 0,
                                "buffer_size": 100_000}},
    "ppo": {"env_id": "CartPole-v1", "algorithm": "ppo", "num_envs": 8, "evo_steps": 1024,
            "hyperparameters": {"rollout_steps": 128, "num_minibatches": 4, "update_epochs": 4}},
}


PHASES = {  # phase -> (module path suffix, function names): where its time is spent
    "env": ("envs/group.py", {"step"}),
    "act": ("algorithms/", {"act", "explore_group"}),
    "buffer": ("buffers/", {"add", "add_group"}),
    "gae": ("buffers/rollout.py", {"compute_gae"}),
    "learn": ("", {"learn_step", "learn_stacked"}),
}


def phase_shares(stats) -> dict[str, float]:
    """Each phase's share of the training time (evaluation excluded) from cProfile stats of a generation."""
    def is_eval(func) -> bool:
        return func[2] == "evaluate_group"

    totals = dict.fromkeys(PHASES, 0.0)
    train = 0.0
    for func, (_, _, _, ct, callers) in stats.stats.items():
        # the arena's method wraps the loop: the outer one
        if func[2] in ("train_group", "train_group_on_policy", "train_group_off_policy"):
            train = max(train, ct)
        for phase, (where, names) in PHASES.items():
            if func[2] in names and where in func[0].replace("\\", "/"):
                totals[phase] += sum(c[3] for caller, c in callers.items()  # outermost calls (an override calling
                                     if not is_eval(caller) and caller[2] not in names)  # its base counts once)
    return {k: round(v / train, 3) if train else None for k, v in totals.items()}


def one(algo: str, pop: int, batch: bool, out: str, backend: str = "gymnasium", device: str = "cpu",
        compile_envs: bool = False, profile: bool = False) -> tuple[float, float, dict | None]:
    """(generation wall seconds, of which evaluation, phase shares when `profile`) of a warmed-up generation."""
    import torch

    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    data = {"name": f"scale-{algo}", "population_size": pop, "eval_episodes": 1, "seed": 0, "output_dir": out,
            "max_env_steps": 10**9, "network": {"hidden_sizes": [64, 64]},
            "mutation": {"no_mutation": 1.0, "architecture": 0, "parameters": 0, "activation": 0, "rl_hp": 0},
            "runner": {"batch_members": batch}, "env_backend": backend, "device": device, **CONFIGS[algo]}
    if compile_envs:
        data["compile_envs"] = True
    cfg = validate_config(data)
    evo = build_evolution(cfg, batch_members=cfg.runner.batch_members)
    evo.run_generation()  # warm-up: buffers filled, envs built
    evo.evolve()
    spent = [0.0]
    arena = evo.arena
    for name in ("evaluate", "evaluate_group"):
        fn = getattr(arena, name, None)
        if fn is not None:
            def timed(*a, _fn=fn, **kw):
                t = time.perf_counter()
                try:
                    return _fn(*a, **kw)
                finally:
                    spent[0] += time.perf_counter() - t
            setattr(arena, name, timed)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    evo.run_generation()
    sync()
    wall = time.perf_counter() - t0
    evaluated = spent[0]  # (the profiled generation below evaluates again)
    shares = None
    if profile:
        import cProfile
        import pstats

        evo.evolve()
        prof = cProfile.Profile()
        prof.enable()
        evo.run_generation()
        sync()
        prof.disable()
        shares = phase_shares(pstats.Stats(prof))
    return wall, evaluated, shares


def evolve_cost(algo: str, pop: int, out: str, repeats: int, device: str = "cpu") -> dict:
    """Median seconds of one selection-and-mutation step (`Evolution.evolve`) at population `pop`, with the
    default mutation mix (architecture, parameters, activation, hyperparameters), after one generation trained
    (so every member has a fitness; a child inherits its parent's)."""
    from agilerl_core.experiment import build_evolution
    from tasks.config import validate_config

    data = {"name": f"evolve-{algo}", "population_size": pop, "eval_episodes": 1, "seed": 0, "output_dir": out,
            "max_env_steps": 10**9, "network": {"hidden_sizes": [64, 64]}, "device": device, **CONFIGS[algo],
            "evo_steps": 64}
    evo = build_evolution(validate_config(data))
    evo.run_generation()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        evo.evolve()
        times.append(time.perf_counter() - t0)
    return {"population": pop, "evolve_s": round(statistics.median(times), 4),
            "per_member_ms": round(1000 * statistics.median(times) / pop, 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pops", default="1,4,16,64")
    p.add_argument("--algos", default="dqn,td3,ppo")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--backend", default="gymnasium", choices=["gymnasium", "torch"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", default="both", choices=["both", "on", "off"])
    p.add_argument("--compile-envs", action="store_true", help="compile the torch backend's env step")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    pops = [int(x) for x in args.pops.split(",")]
    out: dict = {"benchmark": "population_scaling", "repeats": args.repeats, "threads": 1, "backend": args.backend,
                 "compile_envs": args.compile_envs, "device": args.device, "results": {}}
    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.batch]
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos.split(","):
            res = {}
            steps = CONFIGS[algo]["evo_steps"]
            for batch in modes:
                walls = {pop: [] for pop in pops}
                evals = {pop: [] for pop in pops}
                shares = {}
                for r in range(args.repeats):
                    for pop in pops:
                        wall, ev, sh = one(algo, pop, batch, tmp, args.backend, args.device, args.compile_envs,
                                           profile=r == 0)
                        walls[pop].append(wall)
                        evals[pop].append(ev)
                        shares[pop] = sh or shares.get(pop)
                med = {pop: statistics.median(w) for pop, w in walls.items()}
                res["batched" if batch else "one_by_one"] = {
                    str(pop): {"generation_s": round(med[pop], 3), "evaluate_s": round(statistics.median(evals[pop]), 3),
                               "train_env_steps_per_s": round(pop * steps / max(med[pop] - statistics.median(evals[pop]),
                                                                                1e-9)),
                               "vs_pop1": round(med[pop] / med[pops[0]], 2), "train_phase_shares": shares[pop]}
                    for pop in pops}
            res["selection_and_mutation"] = evolve_cost(algo, max(pops), tmp, args.repeats, args.device)
            out["results"][algo] = res
            print(json.dumps({algo: res}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
