"""What a run found, as an Optuna user gets ``study.best_params``: the champion's mutable hyperparameters, how
they moved along its line of descent from its generation-0 ancestor, where the final population stands on each,
and the run's config with them filled in, to run again from there."""

from __future__ import annotations

import copy
import statistics
from typing import Any

import yaml


def found_hyperparameters(lineage: list[dict[str, Any]], member_id: int, names: list[str]) -> dict[str, Any]:
    """`member_id`'s hyperparameters among `names` (the mutable ones), from `lineage` (LineageEvent dicts):
    ``values``, ``started_from`` (its generation-0 ancestor's), ``moves`` (each birth on its line that changed one:
    generation, member, mutation, {name: [before, after]}), and ``population`` (min, median and max over the last
    generation's members)."""
    by_id = {e["member_id"]: e for e in lineage}
    if member_id not in by_id:
        raise KeyError(f"member {member_id} is not in the run's lineage")
    line = []
    node: dict[str, Any] | None = by_id[member_id]
    while node is not None and len(line) <= len(by_id):  # a parent cycle in a damaged record cannot loop
        line.append(node)
        node = by_id.get(node["parent_id"]) if node.get("parent_id") is not None else None
    line.reverse()
    names = [n for n in sorted(names) if n in line[-1]["hyperparameters"]]
    moves = []
    for before, after in zip(line[:-1], line[1:], strict=True):
        changed = {n: [before["hyperparameters"][n], after["hyperparameters"][n]] for n in names
                   if before["hyperparameters"].get(n) != after["hyperparameters"].get(n)}
        if changed:
            moves.append({"generation": after["generation"], "member_id": after["member_id"],
                          "mutation": after["mutation"], "changed": changed})
    last = max(e["generation"] for e in lineage)
    final = [e["hyperparameters"] for e in lineage if e["generation"] == last]
    population = {}
    for n in names:
        xs = [float(h[n]) for h in final if isinstance(h.get(n), (int, float))]
        if xs:
            population[n] = {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}
    return {"member_id": member_id, "generation": line[-1]["generation"],
            "values": {n: line[-1]["hyperparameters"][n] for n in names},
            "started_from": {n: line[0]["hyperparameters"][n] for n in names}, "moves": moves,
            "population": population}


def rerun_config(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """`config` (a config as data) with its hyperparameters set to `values` and every member starting there
    (``hp_init.method: config``): what re-runs the search from what it found (same seed, same budget)."""
    out = copy.deepcopy(config)
    out["hyperparameters"] = {**(out.get("hyperparameters") or {}), **values}
    out["hp_init"] = {**(out.get("hp_init") or {}), "method": "config"}
    return out


def _fmt(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def found_words(found: dict[str, Any], limit: int = 8) -> str:
    """The champion's hyperparameters in one line: each value, with where its line started when it moved."""
    moved = [n for n, v in found["values"].items() if found["started_from"].get(n) != v]
    kept = [n for n in found["values"] if n not in moved]
    parts = [f"{n} {_fmt(found['values'][n])} (from {_fmt(found['started_from'][n])})" for n in moved]
    parts += [f"{n} {_fmt(found['values'][n])}" for n in kept]
    more = f", and {len(parts) - limit} more" if len(parts) > limit else ""
    moved = len(found["moves"])
    return (f"member {found['member_id']}'s hyperparameters: {', '.join(parts[:limit])}{more}; "
            f"{moved} change{'s' * (moved != 1)} along its line since generation 0")


def config_data(cfg: Any) -> dict[str, Any]:
    """A config model as the data a user would write: the fields set away from their defaults, plus the ones
    that say what runs (name, kind, algorithm, env_id) so the file reads on its own."""
    data = cfg.model_dump(mode="json", exclude_defaults=True)
    full = cfg.model_dump(mode="json", include={"name", "kind", "algorithm", "env_id"})
    return {**full, **data}


def rerun_yaml(config: dict[str, Any], values: dict[str, Any], run_id: str) -> str:
    """:func:`rerun_config` as a YAML file's text, headed by what it is and how to use it."""
    head = (f"# What run {run_id} found: its config with the champion's hyperparameters, every member starting\n"
            f"# from them (hp_init.method: config). Run it as any config: agilerl-flow run THIS_FILE\n")
    return head + yaml.safe_dump(rerun_config(config, values), sort_keys=False)
