"""How a config names code, parsed exactly the way the code that imports it resolves the name.

A reference that the importer would read differently from the allowlist check (``allowedenv:evil:Corridor-v0``:
the check saw ``allowedenv``, Gymnasium imports ``evil``) is refused instead of guessed at:

- an env id (``gymnasium.make``): ``EnvId`` or ``module:EnvId``, at most one colon; Gymnasium imports the
  module before the colon, then looks the rest up as a registered id (``[namespace/]name[-vN]``);
- an entry point (``env_entry_point``), a python reward (``rewards[i].function``), a multi-agent env
  (``module:env``): ``module:attr``, exactly one colon, ``attr`` one identifier (``getattr(module, attr)``);
- a wrapper: ``module.Name`` or ``module:Name``.

A module is a dotted identifier (``my_pkg.envs``): no empty part, no relative import, no path.

The fields of a config that name code (:func:`code_references`) are trusted in the user's own files and checked
against an allowlist when a config arrives as a flow-run parameter (:func:`check_code_allowed`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from agilerl_core.errors import ConfigError

if TYPE_CHECKING:
    from agilerl_core.config import ExperimentConfig

_GYM_NAME = re.compile(r"(?:[\w-]+/)?[\w.-]+")  # gymnasium's ENV_ID_RE without the colons it lets through


def is_module(text: str) -> bool:
    """Whether `text` is a dotted module name (``a``, ``a.b_c``)."""
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _module_why(module: str) -> str | None:
    if not module:
        return "the module before the colon is empty"
    if not is_module(module):
        return f"{module!r} is not a module name (dotted identifiers, e.g. my_pkg.envs)"
    return None


def env_id_problem(env_id: str) -> str | None:
    """Why Gymnasium could not be trusted to resolve `env_id` the way it reads (None: it can)."""
    if ":" not in env_id:
        return None
    if env_id.count(":") > 1:
        return (f"{env_id!r} has {env_id.count(':')} colons; Gymnasium imports the module before the colon and "
                f"looks the rest up as the env id, so give exactly one: module:EnvId (e.g. my_pkg.envs:GridWorld-v0)")
    module, _, name = env_id.partition(":")
    why = _module_why(module)
    if why is None and not _GYM_NAME.fullmatch(name):
        why = f"{name!r} is not a Gymnasium env id ([namespace/]Name[-vN])"
    return None if why is None else f"{env_id!r}: {why}; name it as module:EnvId, e.g. my_pkg.envs:GridWorld-v0"


def ref_problem(ref: str, example: str) -> str | None:
    """Why `ref` is not ``module:attr`` with exactly one colon and `attr` one identifier (None: it is)."""
    if ref.count(":") != 1:
        return f"{ref!r} has {ref.count(':')} colons; name it as module:Name with exactly one, e.g. {example}"
    module, _, attr = ref.partition(":")
    why = _module_why(module) or (None if attr.isidentifier() else f"{attr!r} after the colon is not an identifier")
    return None if why is None else f"{ref!r}: {why}; name it as module:Name, e.g. {example}"


def wrapper_problem(name: str) -> str | None:
    """Why `name` is not ``module.Name`` or ``module:Name`` (None: it is)."""
    if ":" in name:
        return ref_problem(name, "gymnasium.wrappers:FrameStackObservation")
    module, _, attr = name.rpartition(".")
    if not (is_module(module) and attr.isidentifier()):
        return f"{name!r}: name the wrapper class as module.Name, e.g. gymnasium.wrappers.FrameStackObservation"
    return None


def split_env_id(env_id: str, field: str = "env_id") -> tuple[str | None, str]:
    """(module or None, the registered id) of a Gymnasium env id; a ConfigError naming `field` when the
    id is not one Gymnasium resolves the way it reads."""
    why = env_id_problem(env_id)
    if why is not None:
        raise ConfigError(f"{field}: {why}")
    if ":" not in env_id:
        return None, env_id
    module, _, name = env_id.partition(":")
    return module, name


def split_ref(ref: str, field: str, example: str = "my_pkg.envs:GridWorld") -> tuple[str, str]:
    """(module, attr) of ``module:attr``; a ConfigError naming `field` otherwise."""
    why = ref_problem(ref, example)
    if why is not None:
        raise ConfigError(f"{field}: {why}")
    module, _, attr = ref.partition(":")
    return module, attr


def split_wrapper(name: str, field: str) -> tuple[str, str]:
    """(module, class name) of a wrapper named ``module.Name`` or ``module:Name``; a ConfigError naming
    `field` otherwise."""
    why = wrapper_problem(name)
    if why is not None:
        raise ConfigError(f"{field}: {why}")
    module, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
    return module, attr


# ---- config fields that name code ---------------------------------------------------------------------------
TRUSTED_MODULES_ENV = "AGILERL_TRUSTED_MODULES"  # comma-separated modules a worker also allows in parameters


def code_references(cfg: ExperimentConfig) -> dict[str, str]:
    """The config fields that make the pipeline import code, as {field: module}: an env id's module
    (``module:EnvId``, a multi-agent ``module:env``), ``env_entry_point`` and python rewards. Code by design:
    trusted in the user's own files, checked against an allowlist when a config arrives as a flow-run
    parameter (:func:`check_code_allowed`)."""
    refs: dict[str, str] = {}
    env_id = getattr(cfg, "env_id", None)  # parsed as its importer reads it (a ConfigError for what it cannot)
    if env_id and ":" in env_id:
        refs["env_id"] = (split_ref(env_id, "env_id") if getattr(cfg, "kind", None) == "multi_agent"
                          else split_env_id(env_id))[0]
    entry = getattr(cfg, "env_entry_point", None)
    if entry:
        refs["env_entry_point"] = split_ref(entry, "env_entry_point")[0]
    for name in ("env_wrappers", "vector_wrappers"):
        for i, w in enumerate(getattr(cfg, name, None) or []):
            refs[f"{name}[{i}].wrapper"] = split_wrapper(w.wrapper, f"{name}[{i}].wrapper")[0]
    for i, reward in enumerate(getattr(cfg, "rewards", None) or []):
        if reward.function and reward.kind == "python":
            refs[f"rewards[{i}].function"] = split_ref(reward.function, f"rewards[{i}].function")[0]
    return refs


def module_allowed(module: str, allowed: set[str]) -> bool:
    """Whether `module` is in `allowed` or inside an allowed package (``a.b`` is inside ``a``)."""
    parts = module.split(".")
    return any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1))


def trusted_modules_from_env() -> set[str]:
    """The modules ``$AGILERL_TRUSTED_MODULES`` allows (comma-separated)."""
    return {m.strip() for m in os.environ.get(TRUSTED_MODULES_ENV, "").split(",") if m.strip()}


def check_code_allowed(cfg: ExperimentConfig, allowed: set[str], source: str = "the flow run's config") -> None:
    """A ConfigError naming the first field of `cfg` that names a module outside `allowed`."""
    for field, module in code_references(cfg).items():
        if not module_allowed(module, allowed):
            raise ConfigError(
                f"{field}: {source} names module {module!r}, which is not allowed in a parameter: a flow run's "
                f"parameters come from anyone who can reach the Prefect API, so only modules the deployed config "
                f"itself names, or those in ${TRUSTED_MODULES_ENV} on the worker, may be imported (allowed: "
                f"{', '.join(sorted(allowed)) or 'none'}). Name it in the deployment's config, or add it to "
                f"{TRUSTED_MODULES_ENV} in the worker's environment")


_LINK_FOLDERS: dict[str, Path] = {}  # working directory -> the folder of links this process made for it


def _remove_links(folder: Path) -> None:
    """Remove a folder of links made by :func:`import_from_working_directory` (the links, never their targets)."""
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            if entry.is_symlink():
                entry.unlink()
            elif entry.name == "__pycache__":  # compiled top-level modules imported through the links
                shutil.rmtree(entry, ignore_errors=True)
        folder.rmdir()


def import_from_working_directory(modules: Iterable[str]) -> str | None:
    """Let the modules a user's config names (`modules`: dotted names, e.g. ``code_references(cfg).values()``) be
    found in the working directory, as ``python -m`` finds them (``env_entry_point: myenvs.keyenv:CueBandit``
    beside ``myenvs/``), and nothing else there: a folder holding links to only those top-level names (``myenvs/``,
    ``myenvs.py``, whatever the importer would consider for them) is added at the end of ``sys.path``, so an
    installed package of the same name still wins, and a stray ``opt_einsum.py`` or ``dill.py`` in the working
    directory is never imported by a library that probes for it. For the user's own configs run from their
    shell or Python (the CLI, ``evolve``); a config arriving as a flow-run parameter is still checked against the
    allowlist (:func:`check_code_allowed`). Returns the folder of links (None: nothing to link, or the working
    directory is already on ``sys.path``, as under ``python -m`` or an interactive interpreter); worker processes
    find it through ``PYTHONPATH``."""
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        return None
    tops = sorted({m.split(".")[0] for m in modules if is_module(m)})
    entries = [e for e in _listing(cwd) if e.split(".")[0] in tops and e != "__pycache__"]
    if not entries:
        return None
    folder = _LINK_FOLDERS.get(cwd)
    if folder is None or not folder.is_dir():
        folder = Path(tempfile.mkdtemp(prefix="agilerl-workdir-"))
        _LINK_FOLDERS[cwd] = folder
        atexit.register(_remove_links, folder)
    for name in entries:
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(Path(cwd) / name)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
        importlib.invalidate_caches()
    if str(folder) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # worker processes find them too
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(folder)) if p)
    return str(folder)


def import_config_modules(*configs: ExperimentConfig) -> str | None:
    """:func:`import_from_working_directory` for the modules `configs` name (:func:`code_references`)."""
    return import_from_working_directory({m for cfg in configs for m in code_references(cfg).values()})


def _listing(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []
