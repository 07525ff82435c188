"""Digests of short runs, to prove a refactor changes no result: every shipped Gymnasium, offline and multi-agent
config shrunk as tests/test_algorithms.py shrinks it (three generations, every mutation kind drawn, weight noise
included) and the golden runs of tests/test_golden.py, each as its fitness history and a SHA-256 of every member's
final tensors (weights, Adam state, generators).

Run it on two trees and compare (a tree other than the installed one goes first on the path)::

    PYTHONPATH=/path/to/old python benchmarks/run_digests.py > old.json
    PYTHONPATH=/path/to/new python benchmarks/run_digests.py > new.json
    python benchmarks/run_digests.py --compare old.json new.json

Prints one JSON object (``--compare``: which entries differ; exit 1 when any does). One torch thread.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path


def digests() -> dict:
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests/ (after PYTHONPATH: the tree it names wins)
    import torch

    from agilerl_core.experiment import build_evolution, train_local
    from tests.test_algorithms import PIXELS, SHIPPED, _agent_tensors, _tiny
    from tests.test_golden import CONFIGS as GOLDEN
    from tests.test_golden import run_short

    torch.set_num_threads(1)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SHIPPED:
            if name.startswith(PIXELS):  # the ALE and CarRacing are slow here; their maths is the same code
                continue
            cfg = _tiny(name, **{"mutation.parameters": 1.0})
            if cfg.kind in ("llm", "language"):
                continue
            evo = build_evolution(cfg)
            res = train_local(cfg, progress=False, run_dir=Path(tmp) / name, evolution=evo)
            h = hashlib.sha256()
            for tensors in _agent_tensors(evo):
                for key in sorted(tensors):
                    h.update(key.encode())
                    h.update(tensors[key].contiguous().numpy().tobytes())
            out[name] = {"fitnesses": [g.fitnesses for g in res.history], "tensors_sha256": h.hexdigest()}
        for name in GOLDEN:
            out[f"golden/{name}"] = {"fitnesses": run_short(name, Path(tmp) / f"golden-{name}")["fitnesses"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = p.parse_args()
    if args.compare:
        old, new = (json.loads(Path(f).read_text())["runs"] for f in args.compare)
        differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        print(json.dumps({"benchmark": "run_digests", "entries": len(old.keys() | new.keys()), "differ": differ}))
        sys.exit(1 if differ else 0)
    print(json.dumps({"benchmark": "run_digests", "runs": digests()}))


if __name__ == "__main__":
    main()
