"""Safe checkpoints: tensors as safetensors, everything else as JSON. Loading never unpickles.

Layout of a member directory::

    member.json          format tag, env (a label: never imported or called), spec (the observation
                         and action spaces as data: what rebuilding the member needs), agent metadata
                         (arch, hyperparameters, optimiser scalars, RNG state, counters), record (id,
                         parent, mutation, fitness history), and the SHA-256 of every tensor file
    weights.safetensors  network weights, optimiser moments, torch RNG state

A population directory holds ``population.json`` (generation, evolution RNG, lineage, history,
config) and ``members/<slot>/``, plus ``buffer.safetensors`` when the replay buffer is saved. Every
file is verified (format tag, version, checksum) before use; a truncated, tampered or foreign file
raises :class:`CheckpointError` naming it.

A checkpoint is data: nothing it names (an env id, a module, an entry point, a path) is imported, registered
or called to load it. A member is rebuilt from its recorded spaces, or from the spec the caller supplies (a
run resuming from its own config); a member written before spaces were recorded loads only the second way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from agilerl_core.buffers.replay import ReplayBuffer
from agilerl_core.envs.space_records import obs_spec_from_dict, obs_spec_to_dict
from agilerl_core.envs.spaces import MultiAgentSpec, ObsSpec
from agilerl_core.errors import CheckpointError
from agilerl_core.hpo.population import LineageEvent, Member, Population
from agilerl_core.io.digest import sha256_file
from agilerl_core.io.files import quote
from agilerl_core.io.history import generation_history
from agilerl_core.io.records import check_type, field, guarded, read_format, sized
from agilerl_core.io.storage import fsync_path

Rebuild = Callable[[dict[str, torch.Tensor], dict[str, Any]], Any]  # (tensors, meta) -> member
Algorithms = Callable[[str], Any]  # a fixed registry's lookup: algorithm name -> class (KeyError when unknown)
MEMBER_FORMAT = "agilerl-flow/member"
POPULATION_FORMAT = "agilerl-flow/population"
VERSION = 1


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, allow_nan=True))


def _read_json(path: Path, fmt: str, root: Path | None = None) -> dict:
    """A checkpoint's JSON record through the one safe parser (size, depth, digits, duplicate keys; NaN allowed:
    fitness histories may hold it), checked for its format tag and version; a regular file inside `root` (the
    member or population folder) only."""
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{path}: file not found; is this a {fmt} checkpoint directory?")
    return read_format(path, fmt, VERSION, str(path), allow_nan=True, root=root)


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path))
    return sha256_file(path)


def _load_tensors(path: Path, expected_sha: str | None, root: Path | None = None) -> dict[str, torch.Tensor]:
    """The tensors of safetensors file `path` (a regular file inside `root`), after its checksum matched, each
    floating tensor checked finite as stored and as float32 (:func:`check_tensors`): a NaN or inf weight, moment or
    buffer row, or a float64 one beyond float32's range, is refused naming the tensor."""
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{path}: file not found")
    if expected_sha is None:
        raise CheckpointError(f"{path}: no checksum recorded for this file; refusing to load it")
    if sha256_file(path, CheckpointError, root) != expected_sha:
        raise CheckpointError(f"{path}: checksum mismatch; the file was truncated or modified after saving")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({quote(str(err))})") from None
    check_tensors(tensors, str(path))
    return tensors


# A wider floating dtype and the one members compute in: a value is checked finite after the cast, where it is used.
_NARROWED = {torch.float64: torch.float32, torch.complex128: torch.complex64}
_CHUNK = 1 << 22  # elements cast at a time: the check's memory stays bounded whatever the tensor's size


def _fits(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether every value of `t` stays finite cast to `dtype` (piece by piece)."""
    return all(bool(torch.isfinite(piece.to(dtype)).all()) for piece in t.reshape(-1).split(_CHUNK))


def check_tensors(tensors: dict[str, torch.Tensor], label: str) -> None:
    """Every floating tensor of `tensors` (read from `label`) finite, in its stored dtype and in the float32 members
    compute in: a NaN or inf, or a float64 value beyond float32's range (a 1e300 that loads as inf), is refused
    with a CheckpointError naming `label`, the tensor and its dtype."""
    for name, t in tensors.items():
        if not (t.is_floating_point() or t.is_complex()):
            continue
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"{label}: tensor {quote(name)} holds {bad:,} non-finite value(s) (NaN or inf); a "
                                  f"member with non-finite weights is never saved by a run, so the file was damaged "
                                  f"or forged: load an earlier generation or the run's elite/")
        narrow = _NARROWED.get(t.dtype)
        if narrow is not None and not _fits(t, narrow):
            largest = float(t.abs().max())
            raise CheckpointError(f"{label}: tensor {quote(name)} is {str(t.dtype).removeprefix('torch.')} and holds "
                                  f"a value of magnitude {largest:.3g}, beyond float32's range "
                                  f"({torch.finfo(torch.float32).max:.3g}): members compute in float32, where it "
                                  f"would be inf, and a run never saves such a value, so the file was damaged or "
                                  f"forged: load an earlier generation or the run's elite/")


def _atomic_dir(target: Path):
    """A temp dir next to `target`; call the returned commit() to move it into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))

    def commit() -> None:
        for p in [*tmp.rglob("*"), tmp]:  # every file and folder on disk before the directory is swapped in
            fsync_path(p)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
        fsync_path(target.parent)  # ... and the swap itself

    return tmp, commit



# ---- members ---------------------------------------------------------------------------------------------
def _write_member(path: Path, member: Member, env: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    tensors, meta = member.agent.state()
    sha = _save_tensors(path / "weights.safetensors", tensors)
    spec = getattr(member.agent, "env_spec", None)
    _write_json(path / "member.json", {
        "format": MEMBER_FORMAT, "version": VERSION, "env": env, "agent": meta,
        **({"spec": obs_spec_to_dict(spec)} if spec is not None else {}),
        "record": {"member_id": member.member_id, "parent_id": member.parent_id, "mutation": member.mutation,
                   "born": member.born, "fitness_history": member.fitness_history,
                   **({"other_parent_id": member.other_parent_id} if member.other_parent_id is not None else {})},
        "files": {"weights.safetensors": sha},
    })


def save_member(path: str | Path, member: Member, env: dict[str, Any]) -> Path:
    """Save one member (atomically) to directory `path`. `env` holds env_id, env_kwargs, channels_last."""
    path = Path(path)
    tmp, commit = _atomic_dir(path)
    _write_member(tmp, member, env)
    commit()
    return path


def load_member(path: str | Path, obs_spec: ObsSpec | MultiAgentSpec | None = None, device: str = "cpu",
                rebuild: Rebuild | None = None, root: str | Path | None = None, *,
                algorithms: Algorithms | None = None) -> tuple[Member, dict]:
    """Load a member directory; returns (member, env description: a label, never used to build anything).

    `rebuild` (an arena's ``member_from_state``) turns the stored state into a member; without it, an RL
    agent of the algorithm the checkpoint names is looked up in `algorithms` (the registry the caller hands in,
    :func:`agilerl_core.algorithms.registry.get_algorithm`; this layer imports none) and built on `obs_spec`,
    or else on the spaces the checkpoint records as data. Nothing the checkpoint names is imported, registered
    or called. Every file read is a regular file inside `root` (default: the member folder), symlinks resolved."""
    if rebuild is None and algorithms is None:
        raise TypeError("load_member: pass rebuild= (an arena's member_from_state) or algorithms= (a registry "
                        "lookup, e.g. agilerl_core.algorithms.registry.get_algorithm)")
    path = Path(path)
    root = Path(root) if root is not None else path
    meta = _read_json(path / "member.json", MEMBER_FORMAT, root)
    file = str(path / "member.json")
    env, agent_meta = field(meta, "env", dict, file), field(meta, "agent", dict, file)
    files = field(meta, "files", dict, file)
    member_record = _member_record(meta, file)  # every field checked before anything is built
    check_agent_sizes(agent_meta, file)
    weights = _weights_name(path, files)
    tensors = _load_tensors(path / weights, files.get(weights), root)
    if rebuild is None and obs_spec is None:
        obs_spec = recorded_spec(path, meta)
    try:
        if rebuild is None:
            name = agent_meta.get("algorithm") if isinstance(agent_meta, dict) else None
            try:
                algo = algorithms(str(name))  # a name in the fixed registry, never a module path
            except KeyError:
                raise CheckpointError(f"{path / 'member.json'}: field agent.algorithm {name!r} is not a known "
                                      f"algorithm") from None
            agent = algo.from_state(obs_spec, tensors, agent_meta, device)
        else:
            agent = rebuild(tensors, agent_meta)
    except CheckpointError:
        raise
    except (KeyError, ValueError, RuntimeError, TypeError, OverflowError, IndexError, AttributeError,
            AssertionError) as err:
        raise CheckpointError(f"{path / 'weights.safetensors'}: does not match {path / 'member.json'} "
                              f"({type(err).__name__}: {str(err)[:300]})") from None
    return Member(member_record["member_id"], agent, *member_record["rest"]), env


def _member_record(meta: dict[str, Any], file: str) -> dict[str, Any]:
    """member.json's ``record`` checked field by field (ids within limits.member_id)."""
    def ident(name: str, optional: bool) -> int | None:
        value = field(meta, f"record.{name}", (int, None), file, None) if optional else \
            field(meta, f"record.{name}", int, file)
        return None if value is None else sized(meta, f"record.{name}", "member_id", file)

    history = field(meta, "record.fitness_history", list, file)
    fitness = [check_type(f, float, f"record.fitness_history[{i}]", file) for i, f in enumerate(history)]
    born = field(meta, "record.born", int, file)
    if born < 0:
        raise CheckpointError(f"{file}: field record.born is {born}, not a generation number")
    return {"member_id": ident("member_id", False),
            "rest": (ident("parent_id", True), field(meta, "record.mutation", str, file), born, fitness,
                     ident("other_parent_id", True))}


def check_agent_sizes(agent_meta: Any, file: str) -> None:
    """Every architecture an agent's metadata records (``agent.arch``, a team's ``agent.units.<u>.arch`` ...),
    checked against the limit table before any network is built: layer widths and counts, and the parameters
    of all of them together against limits.network_params. A CheckpointError names the file and field."""
    from agilerl_core.limits import check
    from agilerl_core.networks.evolvable import arch_params

    total, stack = 0, [(agent_meta, "agent")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "arch" and isinstance(v, dict) and "mlp" in v:
                    total += arch_params(v, f"{file}: field {at}.arch", CheckpointError)
                elif isinstance(v, (dict, list)):
                    stack.append((v, f"{at}.{k}"))
        elif isinstance(node, list):
            stack += [(v, f"{at}[{i}]") for i, v in enumerate(node) if isinstance(v, (dict, list))]
    check("network_params", total, f"{file}: field agent (parameters of all its networks)", CheckpointError)


_WEIGHTS = re.compile(r"^weights(-[0-9a-f]{16})?\.safetensors$")


def _weights_name(path: Path, files: Any) -> str:
    """The member's weights file as member.json names it: ``weights.safetensors``, or
    ``weights-<sha256[:16]>.safetensors`` where a store writes new weights beside the old before the JSON
    switches to them (an atomic swap on S3). Never a path."""
    names = [n for n in files if isinstance(n, str) and _WEIGHTS.match(n)] if isinstance(files, dict) else []
    if len(names) != 1:
        raise CheckpointError(f"{path / 'member.json'}: field files must name one weights file "
                              f"(weights.safetensors), found {sorted(files) if isinstance(files, dict) else files!r}")
    return names[0]


def recorded_spec(path: Path, meta: dict[str, Any]) -> ObsSpec | MultiAgentSpec:
    """The spaces `path`'s member.json records (data only); a CheckpointError naming the file and the fix
    when it records none (written before spaces were recorded) or they are malformed."""
    if "spec" not in meta:
        raise CheckpointError(
            f"{path / 'member.json'}: records no observation/action spaces (field 'spec'; written by an older "
            f"version, which rebuilt the env the file names, and a checkpoint is never allowed to run code). "
            f"Load it with the spec of its env from a config you trust (load_member(path, obs_spec=...), or "
            f"resume the run that wrote it, which builds members from its own config), then save it again")
    try:
        return obs_spec_from_dict(meta["spec"], "spec")
    except ValueError as err:
        raise CheckpointError(f"{path / 'member.json'}: field {err}") from None


def member_spec(path: str | Path) -> ObsSpec | MultiAgentSpec | None:
    """The spaces a member directory records (None for one written before spaces were recorded)."""
    path = Path(path)
    meta = _read_json(path / "member.json", MEMBER_FORMAT, path)
    return recorded_spec(path, meta) if "spec" in meta else None


def same_spec(a: ObsSpec | MultiAgentSpec, b: ObsSpec | MultiAgentSpec) -> bool:
    """Whether two specs describe the same spaces (what a caller's env must match a checkpoint's)."""
    return obs_spec_to_dict(a) == obs_spec_to_dict(b)


# ---- populations -----------------------------------------------------------------------------------------
def save_population(path: str | Path, population: Population, env: dict[str, Any],
                    buffer: ReplayBuffer | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Save a whole population atomically: members, evolution state, lineage, optionally the buffer."""
    path = Path(path)
    tmp, commit = _atomic_dir(path)
    files = {}
    for slot, m in enumerate(population.members):
        _write_member(tmp / "members" / str(slot), m, env)
    if buffer is not None:
        data = buffer.committed()
        files["buffer.safetensors"] = _save_tensors(tmp / "buffer.safetensors", data)
        extra = {**(extra or {}), "buffer_pos": buffer.pos}
    _write_json(tmp / "population.json", {
        "format": POPULATION_FORMAT, "version": VERSION, "env": env,
        "generation": population.generation, "next_id": population.next_id,
        "rng": population.rng.bit_generator.state,
        "members": [str(i) for i in range(len(population.members))],
        "lineage": [e.to_dict() for e in population.lineage],
        "files": files, "extra": extra or {},
    })
    commit()
    return path


def load_population(path: str | Path, obs_spec: ObsSpec | None = None, buffer: ReplayBuffer | None = None,
                    device: str = "cpu", rebuild: Rebuild | None = None, *,
                    algorithms: Algorithms | None = None) -> tuple[Population, dict]:
    """Load a population directory (and the buffer contents into `buffer`, when given); `rebuild` and
    `algorithms` as for :func:`load_member`."""
    path = Path(path)
    meta = _read_json(path / "population.json", POPULATION_FORMAT, path)
    file = str(path / "population.json")
    names = population_fields(meta, file)
    members = []
    for name in names:
        member, _ = load_member(path / "members" / name, obs_spec, device, rebuild, root=path, algorithms=algorithms)
        if obs_spec is None and rebuild is None:
            obs_spec = member.agent.env_spec
        members.append(member)
    rng = np.random.default_rng()
    state = rng_state(meta, file)
    guarded(file, "rng", lambda: setattr(rng.bit_generator, "state", state))
    lineage = lineage_events(field(meta, "lineage", list, file), file)
    pop = Population(members, rng, meta["generation"], meta["next_id"], lineage)
    if buffer is not None:
        data = _load_tensors(path / "buffer.safetensors", meta.get("files", {}).get("buffer.safetensors"), path)
        try:
            buffer.load_committed(data, meta.get("extra", {}).get("buffer_pos"))
        except (ValueError, RuntimeError) as err:
            raise CheckpointError(f"{path / 'buffer.safetensors'}: does not fit this buffer ({err})") from None
    return pop, meta


def population_fields(meta: dict[str, Any], file: str) -> list[str]:
    """population.json's scalar fields and member list checked (members within limits.population_size,
    each a slot number, never a path), and the run's counters and history when it holds them
    (:func:`generation_history`); returns the member slot names."""
    names = field(meta, "members", list, file)
    from agilerl_core.limits import check

    check("population_size", len(names), f"{file}: field members (count)", CheckpointError)
    for i, name in enumerate(names):
        if not (isinstance(name, str) and name.isdigit() and name.isascii() and len(name) <= 12):
            raise CheckpointError(f"{file}: field members lists {str(name)[:40]!r} (item {i}), not a slot number")
    if not names:
        raise CheckpointError(f"{file}: lists no members")
    sized(meta, "generation", "member_id", file)
    sized(meta, "next_id", "member_id", file)
    field(meta, "env", dict, file)
    files = field(meta, "files", dict, file, {})
    extra = field(meta, "extra", dict, file, {})
    if "buffer_pos" in extra:
        sized(meta, "extra.buffer_pos", "buffer_size", file)
    for k, v in files.items():
        check_type(v, str, f"files.{k}", file)
    if "global_steps" in extra or "history" in extra:  # a run's counters and history: checked before any member loads
        generation_history(meta, file, len(names))
    return names


def rng_state(meta: dict[str, Any], file: str) -> dict[str, Any]:
    """population.json's ``rng``: the evolution generator's PCG64 state, every field a whole number in its range
    (numpy would take ``1.5`` as 1 and fail on a string with a TypeError)."""
    state = field(meta, "rng", dict, file)
    if sorted(state) != ["bit_generator", "has_uint32", "state", "uinteger"] or \
            state["bit_generator"] != "PCG64" or not isinstance(state["state"], dict) or \
            sorted(state["state"]) != ["inc", "state"]:
        raise CheckpointError(f"{file}: field rng is {quote(state)}, not a PCG64 generator's state (bit_generator, "
                              f"state.state, state.inc, has_uint32, uinteger)")
    for name, top in (("state.state", 2**128), ("state.inc", 2**128), ("has_uint32", 2), ("uinteger", 2**32)):
        value = field(meta, f"rng.{name}", int, file)
        if not 0 <= value < top:
            raise CheckpointError(f"{file}: field rng.{name} is {quote(value)}, not a whole number in [0, {top:,})")
    return state


def lineage_events(events: list[Any], file: str, limits: Any = None) -> list[LineageEvent]:
    """A lineage record's events as :class:`LineageEvent`, every field checked (slot within
    limits.population_size, ids within limits.member_id, generation a counter) before anything is built from
    them; a CheckpointError naming the file and the field (``lineage[3].slot``) otherwise."""
    out = []
    record = {"lineage": events}
    for i, e in enumerate(events):
        at = f"lineage.{i}"
        if not isinstance(e, dict):
            raise CheckpointError(f"{file}: field {at} is {type(e).__name__}, expected an object")
        unknown = sorted(set(e) - _EVENT_FIELDS)
        if unknown:
            raise CheckpointError(f"{file}: field {at} has unknown keys {unknown[:5]}")
        def ident(name: str, limit: str, optional: bool = False, e: dict = e, i: int = i) -> int | None:
            if optional and e.get(name) is None:
                return None
            return sized(record, f"lineage.{i}.{name}", limit, file, limits=limits)

        fitness = field(record, f"{at}.fitness", (float, None), file, None)
        out.append(LineageEvent(
            generation=ident("generation", "member_id"), slot=ident("slot", "population_size"),
            member_id=ident("member_id", "member_id"), parent_id=ident("parent_id", "member_id", True),
            mutation=check_type(e.get("mutation"), str, f"{at}.mutation", file),
            hyperparameters=check_type(e.get("hyperparameters"), dict, f"{at}.hyperparameters", file),
            architecture=check_type(e.get("architecture"), str, f"{at}.architecture", file),
            fitness=fitness, other_parent_id=ident("other_parent_id", "member_id", True)))
    return out


_EVENT_FIELDS = {"generation", "slot", "member_id", "parent_id", "mutation", "hyperparameters", "architecture",
                 "fitness", "other_parent_id"}
