"""An experiment config made into an Evolution, and the plain in-process loop that runs one.

``build_evolution`` is the one place that reads a config's kind and algorithm: the registry names the
arena, the arena checks the config against the env (and dataset) while it builds, the Evolution drives it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agilerl_core.arenas import build_arena
from agilerl_core.champion import choose_champion, eval_rounds
from agilerl_core.config import ExperimentConfig
from agilerl_core.errors import CheckpointError, ConfigError
from agilerl_core.evolution import Evolution, EvolutionSettings, RunResult
from agilerl_core.hpo.found import config_data, found_hyperparameters, rerun_yaml
from agilerl_core.hpo.population import Member
from agilerl_core.io.checkpoint import save_member
from agilerl_core.limits import applied
from agilerl_core.progress import reporting as progress_reporting
from agilerl_core.progress import show_generation
from agilerl_core.train_metrics import headline

log = logging.getLogger(__name__)


def build_evolution(cfg: ExperimentConfig, batch_members: bool = True, group_cap: int | None = None) -> Evolution:
    """The Evolution of `cfg` in its arena: every check (device, env id, spaces, hyperparameter bounds,
    dataset) happens here, before anything trains or is written. Members of one batch key learn as one group
    (`batch_members`; False: each alone), at most `group_cap` members per group (None: no limit)."""
    with applied(getattr(cfg, "limits", None)):  # sizes the build reads (a dataset, an LLM base) under the config's
        arena = build_arena(cfg)
        return Evolution(arena, EvolutionSettings.from_config(cfg, arena.space, arena.arch_bounds, batch_members,
                                                              group_cap))


def new_run_id(cfg: ExperimentConfig) -> str:
    """A new run's id: NAME-sSEED-YYYYmmdd-HHMMSS-ffffff (UTC), as every run of the pipeline is named."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S-%f")
    return f"{cfg.name}-s{cfg.seed}-{stamp}"


def default_run_dir(cfg: ExperimentConfig) -> Path:
    """OUTPUT_DIR/RUN_ID (:func:`new_run_id`, a directory of its own, so a run never overwrites another), where a
    run keeps its elite, best member and population; a ConfigError naming `name` when that directory would not be
    one directory inside output_dir (the name is validated already: this is the second check, on the joined
    path). :func:`latest_link` points at the newest finished run of a name."""
    root = Path(cfg.output_dir)
    run_dir = root / new_run_id(cfg)
    while run_dir.exists():  # two runs started in one microsecond
        run_dir = root / new_run_id(cfg)
    if Path(os.path.abspath(run_dir)).parent != Path(os.path.abspath(root)):
        raise ConfigError(f"name: {cfg.name!r} would put the run's directory at {os.path.abspath(run_dir)}, outside "
                          f"output_dir {os.path.abspath(root)}; give a plain name (letters, digits, _, -, .), "
                          f"e.g. cartpole-dqn")
    return run_dir


def latest_link(cfg: ExperimentConfig) -> Path:
    """OUTPUT_DIR/NAME-latest: a symbolic link to the newest finished run of the config's name (so
    ``runs/cartpole-dqn-latest/elite`` is the last run's elite)."""
    return Path(cfg.output_dir) / f"{cfg.name}-latest"


def point_latest(cfg: ExperimentConfig, run_dir: Path) -> Path | None:
    """Move :func:`latest_link` to `run_dir` when that is a run directory inside output_dir (atomically: a new
    link renamed over the old one). Returns the link, or None where none was made (a run directory elsewhere, a
    file system without symbolic links, or a non-link already at that name, which is left alone)."""
    link = latest_link(cfg)
    if Path(os.path.abspath(run_dir)).parent != Path(os.path.abspath(link)).parent:
        return None
    if link.exists() and not link.is_symlink():
        log.warning("%s exists and is not a link: the latest-run pointer is not updated", link)
        return None
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    try:
        if tmp.is_symlink():
            tmp.unlink()
        os.symlink(run_dir.name, tmp, target_is_directory=True)  # relative: the output directory may move
        os.replace(tmp, link)
    except OSError as err:
        log.warning("could not point %s at %s: %s", link, run_dir, err)
        return None
    return link


def train_local(cfg: ExperimentConfig, progress: bool = True, run_dir: str | Path | None = None,
                evolution: Evolution | None = None, batch_members: bool = True, hooks: Any = None) -> RunResult:
    """Evolve a population until the target fitness (held ``target_generations`` in a row) or the budget, in
    this process, with a progress bar on a terminal's stderr (else, or with `progress` False, a line per
    generation); save the final elite, the run's best member and the population under `run_dir` (default: a
    new directory OUTPUT_DIR/RUN_ID, see
    :func:`default_run_dir`; OUTPUT_DIR/NAME-latest then points at it). The best member is the flow's champion:
    the final elite or the best generation's elite, whichever scores higher on fresh seeds
    (:func:`~agilerl_core.champion.choose_champion`). `batch_members`: see :func:`build_evolution`.
    `hooks`: the run's callbacks (:class:`agilerl_core.api.callbacks.CallbackHooks`); one may stop the run early."""
    progress = progress and sys.stderr.isatty()  # a bar's \r updates only where a terminal draws them
    default_dir = run_dir is None
    run_dir = Path(run_dir or default_run_dir(cfg))  # checked before anything trains or is written
    evo = evolution or build_evolution(cfg, batch_members)
    on_trained = (lambda r: hooks.member_trained(evo.population.members, r)) if hooks else None
    t0 = time.perf_counter()
    steps0 = evo.global_steps
    best = KeptElite()
    bar = tqdm(total=cfg.max_env_steps, initial=evo.global_steps, unit="step", file=sys.stderr,
               disable=not progress, dynamic_ncols=True, desc="evolution")
    bar.set_postfix(gen=evo.generation)
    try:
        with progress_reporting(bar.update), _printing_above(bar):  # the bar moves as members step
            while not evo.finished():
                if evo.history:  # the population was evaluated: select and mutate before training again
                    evo.evolve()
                stats = evo.run_generation(on_trained)
                best.keep(evo)
                elapsed = time.perf_counter() - t0
                sps = (evo.global_steps - steps0) / max(elapsed, 1e-9)
                show_generation(bar, stats.global_steps, stats.generation, evo.best_fitness(),
                                stats.best_fitness, stats.mean_fitness)
                if not progress:  # one line per generation instead of the bar
                    print(generation_line(stats, evo.best_fitness(), cfg.max_env_steps, sps), file=sys.stderr,
                          flush=True)
                if hooks and hooks.generation(stats, evo.population.members):
                    break
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    elite_path = evo.save_elite(run_dir / "elite")
    choice = choose_champion(evo, best, eval_rounds(cfg))
    best_path = save_member(run_dir / "best", choice.member, evo.arena.env_desc)
    evo.save(run_dir / "population", config=cfg.model_dump(mode="json"))
    if default_dir:
        point_latest(cfg, run_dir)
    result = evo.result(wall, evo.global_steps - steps0, str(elite_path.resolve()))
    result.best_uri, result.champion, result.best_member = str(best_path.resolve()), choice.summary(), choice.member
    result.found = found_hyperparameters([e.to_dict() for e in evo.population.lineage], choice.member.member_id,
                                         sorted(evo.arena.space))
    found_path = run_dir / "found_config.yaml"
    found_path.write_text(rerun_yaml(config_data(cfg), result.found["values"], run_dir.name))
    result.found_config_uri = str(found_path.resolve())
    return result


def generation_line(stats: Any, run_best: float, budget: int, steps_per_s: float) -> str:
    """One line on a finished generation (what --no-progress prints): its best and mean, the run's best so far,
    the budget spent, and the best member's training in two numbers (:func:`headline`)."""
    training = headline(stats.fitnesses, stats.train_metrics)
    return (f"generation {stats.generation}: best {stats.best_fitness:.2f}, mean {stats.mean_fitness:.2f}, run best "
            f"{run_best:.2f}; {stats.global_steps:,}/{budget:,} steps, {steps_per_s:,.0f} steps/s"
            + (f"; best member's training: {training}" if training else ""))


@contextlib.contextmanager
def _printing_above(bar: tqdm) -> Any:
    """While the bar shows, what callbacks (or anything else) print goes above it, not into it."""
    if bar.disable:
        yield
        return

    class Above(io.TextIOBase):
        def write(self, text: str) -> int:
            if text.strip():
                bar.write(text.rstrip("\n"), file=out)
            return len(text)

    out = sys.stdout
    with contextlib.redirect_stdout(Above()):
        yield


class KeptElite:
    """The elite of the run's best generation so far, kept in memory (a clone taken when that generation was
    evaluated: the member itself trains on and may get worse), read back as a run store's ``load_elite`` is."""

    def __init__(self) -> None:
        self.generation: int | None = None
        self.member: Member | None = None

    def keep(self, evo: Evolution) -> None:
        """After a generation's evaluation: clone its elite when that generation is now the run's best."""
        gen = evo.best_generation()
        if gen is not None and gen == evo.history[-1].generation and gen != self.generation:
            elite = evo.elite()
            self.generation = gen
            self.member = replace(elite, agent=elite.agent.clone(), fitness_history=list(elite.fitness_history))

    def load_elite(self, generation: int, rebuild: Any = None) -> Member:
        if self.member is None or generation != self.generation:
            raise CheckpointError(f"generation {generation}'s elite was not kept in memory")
        return self.member
