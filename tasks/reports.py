"""Lineage reports: a table (one row per member per generation) and two pictures, the family tree (edges
coloured by the mutation that made each child, nodes by fitness, the elite's line highlighted) and the evolved
hyperparameter schedules. Rendered headless with matplotlib."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

LINEAGE_COLUMNS = ["generation", "slot", "member_id", "parent_id", "other_parent_id", "mutation", "fitness",
                   "architecture"]


def member_rows(population, train_returns: list[float], space_names: list[str],
                train_metrics: list[dict[str, float]] | None = None,
                train_points: list[list] | None = None) -> list[dict[str, Any]]:
    """Per-slot metrics of an evaluated agilerl_core Population (`train_metrics`: the training phase's means per
    slot, e.g. loss and entropy, an LLM member's reward and KL; `train_points`: within a long phase, its points
    ``[env steps, {name: mean}]``)."""
    rows = []
    for slot, m in enumerate(population.members):
        hp = m.agent.hp.model_dump()
        rows.append({"fitness": m.fitness, "train_return": train_returns[slot], "member_id": m.member_id,
                     "mutation": m.mutation, "architecture": m.agent.describe(),
                     "param_count": m.agent.param_count(),
                     "agent_returns": dict(getattr(m.agent, "agent_returns", None) or {}),  # teams: per agent
                     "train_metrics": dict(train_metrics[slot]) if train_metrics else {},
                     "train_points": list(train_points[slot]) if train_points else [],
                     "samples": list(getattr(m.agent, "samples", None) or []),  # LLM members: held-out completions
                     # language agents: win rate and mean guesses of their evaluation games
                     "eval_metrics": dict(getattr(m.agent, "eval_metrics", None) or {}),
                     "hyperparameters": {k: hp[k] for k in space_names if isinstance(hp.get(k), int | float)}})
    return rows


def lineage_table(lineage: list[dict[str, Any]]) -> dict[str, list]:
    """Column-oriented table of lineage events (as MLflow's log_table takes it)."""
    return {c: [e.get(c) for e in lineage] for c in LINEAGE_COLUMNS}


def _pyplot():
    import importlib.util

    import matplotlib

    matplotlib.use("Agg")  # headless: flows run on servers and workers
    import matplotlib.pyplot as plt

    if importlib.util.find_spec("IPython") is not None:
        # A new canvas reads sys.modules["IPython"] without importing it; while another thread is importing
        # IPython (MLflow does, logging the champion beside the pictures) it finds a half-initialised module
        # and fails. Importing it here waits on that import's lock instead.
        import IPython  # noqa: F401

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


# How each child was made (the prefix of its mutation record): legend label, edge colour, line style
EDGE_KINDS = {
    "elite": ("elite kept unmutated", "0.45", "--"),
    "kept": ("carried on unchanged (multi-frequency selection)", "0.45", "--"),
    "migrant": ("migrated from another subpopulation", "tab:cyan", "-"),
    "none": ("cloned, not mutated", "0.7", "-"),
    "hp": ("hyperparameter", "tab:blue", "-"),
    "arch": ("architecture", "tab:orange", "-"),
    "params": ("weight noise", "tab:green", "-"),
    "activation": ("activation", "tab:purple", "-"),
    "rank": ("adapter rank", "tab:brown", "-"),
    "crossover": ("adapter crossover (both parents)", "tab:pink", "-"),
}


def mutation_kind(mutation: str) -> str:
    """The kind of a mutation record: "hp:lr=0.001" -> "hp", "none(arch at bounds)" -> "none", "elite"."""
    kind = mutation.split(":", 1)[0].split("(", 1)[0]
    return kind if kind in EDGE_KINDS else "none" if kind == "init" else kind


def elite_path(lineage: list[dict[str, Any]]) -> list[int]:
    """Member ids from the last generation's best member back to its generation-0 ancestor."""
    by_id = {e["member_id"]: e for e in lineage}
    last = max(e["generation"] for e in lineage)
    final = [e for e in lineage if e["generation"] == last]
    best = max(final, key=lambda e: (_finite(e.get("fitness")) is not None,
                                     _finite(e.get("fitness")) or 0.0, -e["slot"]))
    path, node = [], best
    while node is not None:
        path.append(node["member_id"])
        node = by_id.get(node["parent_id"]) if node["parent_id"] is not None else None
    return path


def plot_family_tree(lineage: list[dict[str, Any]], out: str | Path, title: str = "lineage") -> Path:
    """Generations left to right, slots top to bottom; an edge joins each member to its parent, coloured by the
    mutation that made the child (legend); each node is coloured by the member's fitness in that generation;
    the final elite's line of descent is drawn thick red."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    where = {}  # member_id -> (generation, slot) of its first appearance
    for e in lineage:
        where.setdefault(e["member_id"], (e["generation"], e["slot"]))
    fits = [_finite(e.get("fitness")) for e in lineage]
    known = [f for f in fits if f is not None]
    lo, hi = (min(known), max(known)) if known else (0.0, 1.0)
    gens = max(e["generation"] for e in lineage) + 1
    slots = max(e["slot"] for e in lineage) + 1
    path = set(elite_path(lineage))
    fig, ax = plt.subplots(figsize=(min(max(7.5, 3.5 + 0.6 * gens), 30), min(2.5 + 0.5 * slots, 20)), dpi=110)
    cmap = plt.get_cmap("viridis")
    seen: dict[str, bool] = {}
    for e in lineage:
        if e["parent_id"] is None or e["parent_id"] not in where:
            continue
        pg, ps = where[e["parent_id"]]
        kind = mutation_kind(e["mutation"])
        _, colour, style = EDGE_KINDS.get(kind, (kind, "0.3", ":"))
        seen[kind] = True
        ax.plot([pg, e["generation"]], [ps, e["slot"]], style, color=colour, lw=1.4, zorder=1)
        other = e.get("other_parent_id")
        if other is not None and other in where:  # a crossover child: an edge from its second parent too
            og, os_ = where[other]
            ax.plot([og, e["generation"]], [os_, e["slot"]], "--", color=colour, lw=1.4, zorder=1)
        if e["member_id"] in path and e["parent_id"] in path:
            ax.plot([pg, e["generation"]], [ps, e["slot"]], "-", color="red", lw=3.5, alpha=0.45, zorder=0)
    xs = [e["generation"] for e in lineage]
    ys = [e["slot"] for e in lineage]
    colours = [cmap((f - lo) / (hi - lo) if hi > lo else 1.0) if f is not None else (0.8, 0.8, 0.8, 1) for f in fits]
    edges = ["red" if e["member_id"] in path else "black" for e in lineage]
    widths = [2.0 if e["member_id"] in path else 0.5 for e in lineage]
    ax.scatter(xs, ys, c=colours, s=90, edgecolors=edges, linewidths=widths, zorder=2)
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(lo, hi))
    fig.colorbar(sm, ax=ax, label="fitness")
    handles = [Line2D([], [], color=EDGE_KINDS.get(k, (k, "0.3", ":"))[1], ls=EDGE_KINDS.get(k, (k, "0.3", ":"))[2],
                      lw=1.4, label=EDGE_KINDS.get(k, (k,))[0]) for k in EDGE_KINDS if k in seen]
    handles += [Line2D([], [], color=EDGE_KINDS.get(k, (k, "0.3", ":"))[1], ls=":", lw=1.4, label=k)
                for k in seen if k not in EDGE_KINDS]
    handles.append(Line2D([], [], color="red", lw=3.5, alpha=0.45, label="the elite's line"))
    ax.legend(handles=handles, title="child made by", fontsize="small", loc="upper left",
              bbox_to_anchor=(1.22, 1.0), borderaxespad=0.0)
    ax.set_xlabel("generation")
    ax.set_ylabel("slot")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(-0.5, gens - 0.5)
    ax.set_yticks(range(slots))
    ax.invert_yaxis()
    ax.set_title(f"{title}: family tree", loc="left", wrap=True)
    return _save(fig, out)


def unchanged_hyperparameters(lineage: list[dict[str, Any]], names: list[str]) -> list[str]:
    """The hyperparameters in `names` that kept one value in every member of every generation."""
    return [n for n in names if len({e["hyperparameters"].get(n) for e in lineage}) <= 1]


def plot_hp_schedules(lineage: list[dict[str, Any]], names: list[str], out: str | Path, title: str = "") -> Path:
    """One panel per mutable hyperparameter: its value in each slot across generations. A panel whose value
    never changed says so (no hyperparameter mutation was applied to it)."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    if not names and lineage:
        names = sorted(lineage[0]["hyperparameters"])
    if not names:
        fig, ax = plt.subplots(figsize=(8, 1.6), dpi=110)
        ax.axis("off")
        ax.text(0.5, 0.5, "no mutable hyperparameters in this run (hp_space is empty)", ha="center", va="center")
        ax.set_title(f"{title}: evolved hyperparameters".strip(": "), loc="left")
        return _save(fig, out)
    slots = sorted({e["slot"] for e in lineage})
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 2.2 * max(len(names), 1)), dpi=110, squeeze=False)
    unchanged = unchanged_hyperparameters(lineage, names)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for s in slots:
            pts = sorted((e["generation"], e["hyperparameters"].get(name)) for e in lineage if e["slot"] == s)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=f"slot {s}")
        ax.set_ylabel(name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if name in unchanged:
            ax.text(0.5, 0.5, f"{name} never changed in this run", transform=ax.transAxes, ha="center",
                    va="center", fontsize="medium", color="0.3", bbox={"facecolor": "white", "edgecolor": "0.7"})
    axes[-1, 0].set_xlabel("generation")
    if len(slots) > 1:
        axes[0, 0].legend(fontsize="small", ncol=min(len(slots), 6))
    heading = f"{title}: evolved hyperparameters".strip(": ")
    if len(unchanged) == len(names):
        heading += " (none changed: no hyperparameter mutation was applied)"
    axes[0, 0].set_title(heading, loc="left", wrap=True)
    return _save(fig, out)


def render_lineage(lineage: list[dict[str, Any]], hp_names: list[str], out_dir: str | Path, title: str
                   ) -> tuple[Path, Path]:
    """Both pictures into `out_dir`: (family_tree.png, hp_schedules.png)."""
    out_dir = Path(out_dir)
    return (plot_family_tree(lineage, out_dir / "family_tree.png", title),
            plot_hp_schedules(lineage, hp_names, out_dir / "hp_schedules.png", title))
