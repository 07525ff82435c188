"""Lineage reports: a table (one row per member per generation) and two pictures, the family tree
coloured by fitness and the evolved hyperparameter schedules. Rendered headless with matplotlib."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

LINEAGE_COLUMNS = ["generation", "slot", "member_id", "parent_id", "mutation", "fitness", "architecture"]


def lineage_table(lineage: list[dict[str, Any]]) -> dict[str, list]:
    """Column-oriented table of lineage events (as MLflow's log_table takes it)."""
    return {c: [e.get(c) for e in lineage] for c in LINEAGE_COLUMNS}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: flows run on servers and workers
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out)
    _pyplot().close(fig)
    return out


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None


def plot_family_tree(lineage: list[dict[str, Any]], out: str | Path, title: str = "lineage") -> Path:
    """Generations left to right, slots top to bottom; an edge joins each member to its parent, each
    node is coloured by the member's fitness in that generation."""
    plt = _pyplot()

    where = {}  # member_id -> (generation, slot) of its first appearance
    for e in lineage:
        where.setdefault(e["member_id"], (e["generation"], e["slot"]))
    fits = [_finite(e.get("fitness")) for e in lineage]
    known = [f for f in fits if f is not None]
    lo, hi = (min(known), max(known)) if known else (0.0, 1.0)
    gens = max(e["generation"] for e in lineage) + 1
    slots = max(e["slot"] for e in lineage) + 1
    fig, ax = plt.subplots(figsize=(min(2 + 0.6 * gens, 30), min(1.5 + 0.5 * slots, 20)), dpi=110)
    cmap = plt.get_cmap("viridis")
    for e in lineage:
        if e["parent_id"] is not None and e["parent_id"] in where:
            pg, ps = where[e["parent_id"]]
            style = "-" if e["mutation"] != "elite" else "--"
            ax.plot([pg, e["generation"]], [ps, e["slot"]], style, color="0.6", lw=0.8, zorder=1)
    xs = [e["generation"] for e in lineage]
    ys = [e["slot"] for e in lineage]
    colours = [cmap((f - lo) / (hi - lo) if hi > lo else 1.0) if f is not None else (0.8, 0.8, 0.8, 1) for f in fits]
    ax.scatter(xs, ys, c=colours, s=90, edgecolors="black", linewidths=0.5, zorder=2)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(lo, hi))
    fig.colorbar(sm, ax=ax, label="fitness")
    ax.set_xlabel("generation")
    ax.set_ylabel("slot")
    ax.set_yticks(range(slots))
    ax.invert_yaxis()
    ax.set_title(f"{title}: family tree (dashed: elite kept unmutated)")
    return _save(fig, out)


def plot_hp_schedules(lineage: list[dict[str, Any]], names: list[str], out: str | Path, title: str = "") -> Path:
    """One panel per mutable hyperparameter: its value in each slot across generations."""
    plt = _pyplot()

    if not names and lineage:
        names = sorted(lineage[0]["hyperparameters"])
    slots = sorted({e["slot"] for e in lineage})
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * max(len(names), 1)), dpi=110, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for s in slots:
            pts = sorted((e["generation"], e["hyperparameters"].get(name)) for e in lineage if e["slot"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=f"slot {s}")
        ax.set_ylabel(name)
    axes[-1, 0].set_xlabel("generation")
    axes[0, 0].legend(fontsize="small", ncol=min(len(slots), 6))
    axes[0, 0].set_title(f"{title}: evolved hyperparameters".strip(": "))
    return _save(fig, out)
