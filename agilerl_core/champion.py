"""Which member a finished run offers as its champion.

The final elite is whoever won the last generation's evaluation; an elite that keeps training can collapse, so
the best member the run ever evaluated (the elite of its best generation: every generation's elite is kept in
storage, see :meth:`RunStore.prune`) is a candidate too. Both are re-scored on seeds no generation evaluated on
(:meth:`Evolution.fresh_fitness`) and the higher fresh score wins (the final elite on a tie), so a lucky
evaluation during the run does not decide.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from agilerl_core.errors import CheckpointError
from agilerl_core.evolution import Evolution
from agilerl_core.hpo.population import Member
from agilerl_core.io.run_store import RunStore

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    role: str  # "final_elite" or "best_ever"
    member_id: int
    generation: int  # the generation whose evaluation it is a candidate for
    fitness: float  # that evaluation's score
    fresh_fitness: float  # its score on the champion's fresh seeds


@dataclass
class ChampionChoice:
    member: Member
    chosen: Candidate
    candidates: list[Candidate]
    input_fitness: float | None = None  # what the run started from, on the same fresh seeds (champion gating)

    def summary(self) -> dict[str, Any]:
        return {"chosen": self.chosen.role, "member_id": self.chosen.member_id,
                "generation": self.chosen.generation, "fitness": _json_number(self.chosen.fresh_fitness),
                "candidates": [{k: _json_number(v) for k, v in asdict(c).items()} for c in self.candidates],
                **({"input_fitness": _json_number(self.input_fitness)} if self.input_fitness is not None else {})}


def input_fitness(evo: Evolution, rounds: int) -> float:
    """The fresh-seed fitness of what the run started from: a member as the arena builds it before any training
    (an LLM run's seeded adapter, ``model.init_adapter``, or the bare base; an RL run's untrained network). The
    bar a gated champion (``champion.promote: if_beats_input``) must clear."""
    return evo.fresh_fitness(evo.arena.build_members([evo.settings.seed])[0], rounds)


def _json_number(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def eval_rounds(cfg) -> int:
    """How many evaluations each candidate is re-scored on (``champion.eval_episodes``, in evaluations)."""
    per_round = getattr(cfg, "eval_episodes", None)  # RL kinds: episodes per evaluation; LLM: one pass
    wanted = cfg.champion.eval_episodes
    if per_round is None:
        return wanted or 1
    return max(1, -(-(wanted or per_round) // per_round))


def choose_champion(evo: Evolution, store: RunStore | None, rounds: int) -> ChampionChoice:
    """The final elite or the best member ever evaluated, whichever scores higher on fresh seeds. `store`:
    where the best generation's elite is read back (None: the final elite is the only candidate)."""
    final = evo.elite()
    last = evo.history[-1].generation if evo.history else 0
    members = {"final_elite": (final, last, final.fitness)}
    best_gen = evo.best_generation()
    if store is not None and best_gen is not None and best_gen != last:
        try:
            best = store.load_elite(best_gen, rebuild=evo.arena.member_from_state)
        except CheckpointError as err:  # a run stored before every generation's elite was kept
            log.warning("the best generation's elite (generation %d) cannot be read back (%s); the final elite is "
                        "the only champion candidate", best_gen, err)
        else:
            if best.member_id != final.member_id or best.fitness != final.fitness:
                members["best_ever"] = (best, best_gen, evo.best_fitness())
    candidates = [Candidate(role, m.member_id, g, float("nan") if f is None else float(f),
                            evo.fresh_fitness(m.agent, rounds)) for role, (m, g, f) in members.items()]
    chosen = candidates[0]
    for c in candidates[1:]:
        if math.isfinite(c.fresh_fitness) and not (c.fresh_fitness <= chosen.fresh_fitness):
            chosen = c
    evo.check_finite(members[chosen.role][0], "before registering it as the champion")  # never a NaN champion
    return ChampionChoice(members[chosen.role][0], chosen, candidates)
