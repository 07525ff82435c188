"""Target: loading 1M transitions from a flat HDF5 file into the replay buffer in under 2 s.

    python benchmarks/dataset_load.py [--transitions 1000000] [--repeats 5]

Writes a CartPole-shaped dataset (4 float32 observations, next observations, int actions, rewards,
terminals, timeouts; 500-step episodes) with the dataset writer, then times, per repeat and from a fresh
read of the file: resolving the URI (its SHA-256 content hash), reading and checking the arrays, checking
them against CartPole-v1's spaces, and filling a buffer in one bulk copy. The first read is reported
separately (the OS page cache is cold only for the first). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from agilerl_core.data.hdf5 import write_hdf5
from agilerl_core.data.loader import check_fits, dataset_buffer, load_dataset
from agilerl_core.data.transitions import Transitions
from agilerl_core.envs.make import probe_spaces
from agilerl_core.envs.spaces import ObsSpec, action_spec


def synthetic(n: int, seed: int = 0) -> Transitions:
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n + 1, 4), dtype=np.float32)
    ends = (np.arange(n) % 500) == 499
    return Transitions(obs[:-1], rng.integers(0, 2, n), np.ones(n, np.float32), obs[1:], ends & (rng.random(n) < 0.5),
                       ends)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--transitions", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    obs_space, act_space = probe_spaces("CartPole-v1")
    obs_spec, act = ObsSpec(obs_space), action_spec(act_space)
    with tempfile.TemporaryDirectory(prefix="agilerl-load-") as tmp:
        path = write_hdf5(Path(tmp) / "cartpole-1m.hdf5", synthetic(args.transitions), {"env_id": "CartPole-v1"})
        times, phases = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            ds = load_dataset(str(path))
            t1 = time.perf_counter()
            check_fits(ds, "CartPole-v1", obs_space, act_space)
            t2 = time.perf_counter()
            buf = dataset_buffer(ds.transitions, obs_spec, act)
            t3 = time.perf_counter()
            assert buf.size == args.transitions
            times.append(t3 - t0)
            phases.append({"resolve_hash_read_s": round(t1 - t0, 3), "check_s": round(t2 - t1, 3),
                           "fill_buffer_s": round(t3 - t2, 3)})
        print(json.dumps({"benchmark": "dataset_load", "transitions": args.transitions,
                          "file_mb": round(path.stat().st_size / 2**20, 1), "target_s": 2.0,
                          "first_s": round(times[0], 3), "median_s": round(statistics.median(times), 3),
                          "all_s": [round(t, 3) for t in times], "phases": phases,
                          "met": statistics.median(times) < 2.0 and times[0] < 2.0}))


if __name__ == "__main__":
    main()
