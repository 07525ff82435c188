"""Trust, flow-run parameters (issue 38, cases 2 and 9): a code reference is parsed the way its importer reads
it (``allowed:evil:Env-v0`` would import ``evil``), a deployment run's parameters cannot point the cluster,
tracking or storage elsewhere nor raise a limit, and a run's name cannot put its directory outside
``output_dir``. Each attack is tried as written, then the refusal's message is checked."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from agilerl_core.errors import ConfigError
from tests.test_trust import EVIL


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """`evil`: a module that writes `path` when imported (tests.test_trust's pattern); `allowed`: a harmless
    module the deployment's own config names."""
    code = tmp_path / "code"
    code.mkdir()
    tag = tmp_path.name.replace("-", "_").replace(".", "_")
    (code / f"evil_{tag}.py").write_text(EVIL)
    (code / f"allowedenv_{tag}.py").write_text("class Corridor:\n    pass\n")
    monkeypatch.syspath_prepend(str(code))
    path = tmp_path / "marker"
    monkeypatch.setenv("AGILERL_TEST_MARKER", str(path))
    return SimpleNamespace(path=path, evil=f"evil_{tag}", allowed=f"allowedenv_{tag}")


def _deployed(marker, **extra) -> dict:
    data = {"name": "corridor", "env_id": "Corridor-v0", "env_entry_point": f"{marker.allowed}:Corridor",
            "population_size": 2, "tracking": {"enabled": False}}
    data.update(extra)
    return data


def _as_deployment_run(monkeypatch, deployed: dict | None) -> None:
    """Make tasks.trust see a deployment run whose own `config` parameter is `deployed` (the Prefect lookup
    itself is covered by tests/test_trust.py's integration test)."""
    import tasks.trust

    params = {} if deployed is None else {"config": copy.deepcopy(deployed)}
    monkeypatch.setattr(tasks.trust, "_deployment", lambda: ("deployment-id", params))


# ---- case 2: a second colon ----------------------------------------------------------------------------------
def test_a_second_colon_in_a_parameter_env_id_is_refused_before_anything_is_imported(marker, monkeypatch):
    from agilerl_core.config import code_references
    from agilerl_core.envs.make import resolve_env_id
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_code

    deployed = _deployed(marker)
    _as_deployment_run(monkeypatch, deployed)
    attack = {**deployed, "env_id": f"{marker.allowed}:{marker.evil}:Corridor-v0"}  # the parameter
    # the flow's parameter is validated into a config first: refused there, naming env_id
    with pytest.raises(ConfigError, match=r"env_id: '.*' has 2 colons; Gymnasium imports the module before the colon"):
        validate_config(attack, "flow run parameters")
    # a config that reached the check unvalidated is refused there too, and so is the id by the resolver
    ok = validate_config(deployed)
    check_flow_run_code(ok)  # the deployment's own config passes
    smuggled = ok.model_copy(update={"env_id": attack["env_id"]})
    with pytest.raises(ConfigError, match=r"^env_id: .*has 2 colons.*exactly one: module:EnvId"):
        code_references(smuggled)
    with pytest.raises(ConfigError, match=r"^env_id: .*has 2 colons"):
        check_flow_run_code(smuggled)
    with pytest.raises(ConfigError, match=r"^env_id: .*has 2 colons"):
        resolve_env_id(attack["env_id"], f"{marker.allowed}:Corridor")
    assert not marker.path.exists(), f"{marker.evil} was imported"


@pytest.mark.parametrize("field, value, message", [
    ("env_id", ":Corridor-v0", "the module before the colon is empty"),
    ("env_id", "../evil:Corridor-v0", "is not a module name"),
    ("env_id", "ALLOWED:Corri dor-v0", "is not a Gymnasium env id"),
    ("env_entry_point", "ALLOWED:EVIL:Corridor", "has 2 colons"),
    ("env_entry_point", "ALLOWED:Corridor.__init__", "after the colon is not an identifier"),
    ("env_entry_point", "ALLOWED", "has 0 colons"),
    ("env_wrappers", [{"wrapper": "ALLOWED:EVIL:Wrapper"}], "has 2 colons"),
    ("env_wrappers", [{"wrapper": "ALLOWED..EVIL.Wrapper"}], "name the wrapper class as module.Name"),
])
def test_malformed_code_references_are_refused_in_any_config_naming_the_field(marker, field, value, message):
    from tasks.config import validate_config

    def fill(v):
        if isinstance(v, list):
            return [{k: fill(x) for k, x in d.items()} for d in v]
        return v.replace("ALLOWED", marker.allowed).replace("EVIL", marker.evil)

    data = {**_deployed(marker), field: fill(value)}
    with pytest.raises(ConfigError, match=rf"- {field}(\.0\.wrapper)?: .*{message}") as err:
        validate_config(data, "my.yaml")
    assert "my.yaml" in str(err.value)
    assert not marker.path.exists()


def test_multi_agent_envs_and_python_rewards_take_exactly_one_colon(marker):
    from pydantic import ValidationError

    from agilerl_core.config import RewardConfig
    from agilerl_core.envs.multi_agent import resolve_env_fn
    from agilerl_core.llm.rewards import import_function
    from tests.test_multi_agent import ma_config

    two = f"{marker.evil}:run:x"  # the old parsers imported the module before the first colon
    with pytest.raises(ConfigError, match=r"- env_id: .*has 2 colons; name it as module:Name.*mpe2:"):
        ma_config(env_id=two)
    with pytest.raises(ConfigError, match=r"- env_id: .*'run\.x' after the colon is not an identifier"):
        ma_config(env_id=f"{marker.evil}:run.x")
    with pytest.raises(ConfigError, match=r"^env_id: .*must name a PettingZoo parallel env as module:env"):
        resolve_env_fn(two)
    with pytest.raises(ConfigError, match=r"^rewards\[0\]\.function: .*is not module:function"):
        import_function(two, "rewards[0].function")
    with pytest.raises(ValidationError, match=r"function: .*has 2 colons; name it as module:Name"):
        RewardConfig(kind="python", function=two)
    assert not marker.path.exists()


# ---- case 2: where a parameter sends work, data and credentials ----------------------------------------------
TARGETS = [
    ("runner.address", "tcp://10.0.0.5:8786", "tcp://attacker.example:8786", "AGILERL_TRUSTED_ADDRESSES"),
    ("tracking.uri", "http://mlflow.internal:5000", "http://attacker.example:5000", "AGILERL_TRUSTED_URIS"),
    ("storage.uri", "s3://runs/team", "s3://attacker-bucket/x", "AGILERL_TRUSTED_URIS"),
    ("storage.endpoint_url", "http://seaweed.internal:8333", "http://attacker.example:9000", "AGILERL_TRUSTED_URIS"),
]


def _with(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    section, _, name = dotted.partition(".")
    data.setdefault(section, {})[name] = value
    return data


@pytest.mark.parametrize("field, own, elsewhere, env", TARGETS)
def test_a_parameter_may_not_point_the_cluster_tracking_or_storage_elsewhere(marker, monkeypatch, field, own,
                                                                             elsewhere, env):
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_code

    monkeypatch.delenv("AGILERL_TRUSTED_ADDRESSES", raising=False)
    monkeypatch.delenv("AGILERL_TRUSTED_URIS", raising=False)
    deployed = _with(_deployed(marker), field, own)
    _as_deployment_run(monkeypatch, deployed)
    check_flow_run_code(validate_config(deployed))  # the deployment's own value
    check_flow_run_code(validate_config(_with(deployed, field, None)))  # the worker's default
    attack = validate_config(_with(deployed, field, elsewhere))
    with pytest.raises(ConfigError, match=rf"^{field}: the flow run's config sets '{elsewhere}', which is not allowed "
                                          rf"in a parameter: .*deployment's own value or one listed in \${env} on "
                                          rf"the worker.*Set it in the deployment's config, or add it to {env}"):
        check_flow_run_code(attack)
    monkeypatch.setenv(env, f"something-else, {elsewhere}")  # the operator's allowlist
    check_flow_run_code(attack)
    monkeypatch.delenv(env)
    other = "AGILERL_TRUSTED_URIS" if env == "AGILERL_TRUSTED_ADDRESSES" else "AGILERL_TRUSTED_ADDRESSES"
    monkeypatch.setenv(other, elsewhere)
    monkeypatch.setenv("AGILERL_TRUSTED_MODULES", f"{elsewhere},{marker.allowed}")  # its env module: allowed
    with pytest.raises(ConfigError, match=rf"^{field}: "):  # another variable's list does not count
        check_flow_run_code(attack)
    _as_deployment_run(monkeypatch, None)  # a deployment without a config of its own allows only the default
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        check_flow_run_code(validate_config(_with(deployed, field, own)))
    _as_deployment_run(monkeypatch, {"env_id": "CartPole-v1", "name": "../bad"})  # an unusable one: the same
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        check_flow_run_code(validate_config(_with(deployed, field, own)))


def test_an_allowlist_entry_ending_in_a_slash_allows_what_is_below_it_never_a_dotdot(marker, monkeypatch):
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_code, value_allowed

    allowed = {"s3://runs/", "http://mlflow:5000"}
    assert value_allowed("s3://runs/team-b/x", allowed) and value_allowed("http://mlflow:5000", allowed)
    for bad in ("s3://runs/../other", "s3://runs/a/../../other", "s3://runsx/a", "http://mlflow:5000.evil",
                "http://mlflow:5000/", "s3://runs"):
        assert not value_allowed(bad, allowed), bad
    deployed = _deployed(marker)
    _as_deployment_run(monkeypatch, deployed)
    monkeypatch.setenv("AGILERL_TRUSTED_URIS", "s3://runs/")
    check_flow_run_code(validate_config(_with(deployed, "storage.uri", "s3://runs/team-b")))
    with pytest.raises(ConfigError, match=r"^storage\.uri: .*'s3://runs/\.\./secrets'"):
        check_flow_run_code(validate_config(_with(deployed, "storage.uri", "s3://runs/../secrets")))


def test_a_parameter_may_not_write_or_read_outside_the_deployments_own_paths(marker, monkeypatch, tmp_path):
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_code

    monkeypatch.delenv("AGILERL_TRUSTED_URIS", raising=False)
    deployed = {**_deployed(marker), "output_dir": "/srv/runs"}
    _as_deployment_run(monkeypatch, deployed)
    check_flow_run_code(validate_config(deployed))
    with pytest.raises(ConfigError, match=r"^output_dir: the flow run's config sets '/etc/cron.d', .*written there on "
                                          r"the worker's disk.*AGILERL_TRUSTED_URIS"):
        check_flow_run_code(validate_config({**deployed, "output_dir": "/etc/cron.d"}))
    monkeypatch.setenv("AGILERL_TRUSTED_URIS", "/srv/")
    check_flow_run_code(validate_config({**deployed, "output_dir": "/srv/other-team"}))
    monkeypatch.delenv("AGILERL_TRUSTED_URIS")
    _as_deployment_run(monkeypatch, None)  # no config of its own: the default output_dir (and name) only
    monkeypatch.setenv("AGILERL_TRUSTED_MODULES", marker.allowed)
    check_flow_run_code(validate_config({**_deployed(marker), "name": "experiment"}))
    with pytest.raises(ConfigError, match=r"^output_dir: "):
        check_flow_run_code(validate_config({**_deployed(marker), "output_dir": "/srv/runs"}))
    offline = {"kind": "offline", "name": "off", "env_id": "CartPole-v1", "algorithm": "cqn",
               "dataset": {"uri": "s3://datasets/cartpole.h5"}, "tracking": {"enabled": False}}
    _as_deployment_run(monkeypatch, offline)
    check_flow_run_code(validate_config(offline))
    for field, value in (("uri", "s3://other-team-secrets/x.h5"), ("cache_dir", "/root/.ssh")):
        with pytest.raises(ConfigError, match=rf"^dataset\.{field}: the flow run's config sets '{value}'"):
            check_flow_run_code(validate_config({**offline, "dataset": {**offline["dataset"], field: value}}))


def test_a_parameter_may_not_register_its_champion_as_another_model(marker, monkeypatch):
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_code

    deployed = {**_deployed(marker), "tracking": {"enabled": True}}  # registers as 'corridor' (its name)
    _as_deployment_run(monkeypatch, deployed)
    check_flow_run_code(validate_config(deployed))
    check_flow_run_code(validate_config({**deployed, "tracking": {"enabled": True, "model_name": "corridor"}}))
    for attack in ({"tracking": {"enabled": True, "model_name": "prod-policy"}, "champion": {"promote": "always"}},
                   {"name": "prod-policy"}):
        with pytest.raises(ConfigError, match=r"^tracking\.model_name: the flow run's config would register its "
                                              r"champion as model 'prod-policy', not the deployment's own 'corridor'"):
            check_flow_run_code(validate_config({**deployed, **attack}))
    with pytest.raises(ConfigError, match=r"^name: .*'prod-policy', not the deployment's own 'corridor'"):
        check_flow_run_code(validate_config({**deployed, "name": "prod-policy",  # registering nothing: still
                                             "tracking": {"enabled": True, "register_model": False}}))  # its name
    _as_deployment_run(monkeypatch, None)  # a deployment without a config: no model may be registered
    monkeypatch.setenv("AGILERL_TRUSTED_MODULES", marker.allowed)
    with pytest.raises(ConfigError, match=r"^tracking\.model_name: .*as model 'corridor' \(set through"):
        check_flow_run_code(validate_config(deployed))


def test_a_parameter_may_lower_a_limit_but_not_raise_it_above_the_deployments(marker, monkeypatch):
    from agilerl_core.limits import Limits
    from tasks.config import validate_config
    from tasks.trust import check_flow_run_code

    deployed = {**_deployed(marker), "limits": {"layer_width": 16384}}
    _as_deployment_run(monkeypatch, deployed)
    check_flow_run_code(validate_config(deployed))
    check_flow_run_code(validate_config({**deployed, "limits": {"layer_width": 4096, "num_envs": 8}}))  # lowered
    with pytest.raises(ConfigError, match=r"^limits\.layer_width: the flow run's config raises it to 16385, above "
                                          r"the deployment's 16384: .*Raise it in the deployment's own config "
                                          r"\(limits\.layer_width\)"):
        check_flow_run_code(validate_config({**deployed, "limits": {"layer_width": 16385}}))
    big = Limits().population_size * 2  # not set by the deployment: its default is the cap
    with pytest.raises(ConfigError, match=rf"^limits\.population_size: .*raises it to {big}, above the "
                                          rf"deployment's {Limits().population_size}"):
        check_flow_run_code(validate_config({**deployed, "limits": {"layer_width": 16384, "population_size": big}}))


def test_a_run_from_the_users_own_files_is_not_checked(marker, monkeypatch):
    import tasks.trust
    from tasks.config import validate_config

    monkeypatch.setattr(tasks.trust, "_deployment", lambda: (None, {}))
    mine = _with(_deployed(marker), "runner.address", "tcp://my-cluster:8786")
    mine.update(limits={"layer_width": 20000}, env_entry_point=f"{marker.evil}:Env")
    tasks.trust.check_flow_run_code(validate_config(mine))
    assert not marker.path.exists()


# ---- case 9: a run's name ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../x", "a/b", "a\\b", "/abs", "..", "a\x00b", "a\nb", "x" * 129, ".hidden",
                                  "-flag", "trailing "])
def test_a_name_that_is_not_one_plain_directory_name_is_refused(name):
    from tests.conftest import tiny_config

    with pytest.raises(ConfigError, match=r"- name: .* is not a run name: .*letters, digits and _, then also spaces, "
                                          r"- and \..*at most 128 bytes"):
        tiny_config(name=name)


@pytest.mark.parametrize("name", ["cartpole-dqn", "smollm2-chain-sum-grpo", "spread_matd3", "my run 2", "v1.2",
                                  "x" * 128, "expérience"])
def test_names_in_use_stay_valid(name):
    from tests.conftest import tiny_config

    assert tiny_config(name=name).name == name


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_a_local_run_named_to_escape_output_dir_writes_nothing_outside(tmp_path, monkeypatch):
    import yaml

    import agilerl_core
    from agilerl_core.experiment import train_local
    from flows.cli import main
    from tests.conftest import tiny_config

    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    cfg_file = work / "exp.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_config(output_dir=str(work / "runs")).model_dump(mode="json")))
    before = _files(tmp_path)
    # the CLI's --local run, as in the issue
    assert main(["run", str(cfg_file), "--local", "--no-progress", "--set", "name=../../x"]) != 0
    # the Python API with a dict, and with config objects that skipped validation (defence in depth)
    with pytest.raises(ConfigError, match=r"- name: '\.\./\.\./x' is not a run name"):
        agilerl_core.evolve({**tiny_config().model_dump(mode="json"), "name": "../../x"}, progress=False)
    bypassed = tiny_config(output_dir=str(work / "runs")).model_copy(update={"name": "../../x"})
    with pytest.raises(ConfigError, match=r"^name: '\.\./\.\./x' would put the run's directory at .*, outside "
                                          r"output_dir .*runs; give a plain name"):
        agilerl_core.evolve(bypassed, progress=False)
    with pytest.raises(ConfigError, match=r"^name: '\.\./\.\./x' would put the run's directory"):
        train_local(bypassed, progress=False)
    assert _files(tmp_path) == before, "something was written"
    assert not list(tmp_path.glob("x-*")) and not os.path.exists(work / "runs")


def test_the_cli_names_the_field(tmp_path, capsys):
    import yaml

    from flows.cli import main
    from tests.conftest import tiny_config

    cfg_file = tmp_path / "exp.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_config(output_dir=str(tmp_path / "runs")).model_dump(mode="json")))
    assert main(["run", str(cfg_file), "--local", "--no-progress", "--set", "name=../../x"]) != 0
    err = capsys.readouterr().err
    assert "name: '../../x' is not a run name" in err and str(cfg_file) in err, err[-2000:]


def test_a_train_group_run_reads_only_storage_the_worker_trusts(monkeypatch):
    """A train-group run's `storage_uri` parameter names where its config and members are read from: only the
    worker's own storage (or below it), the deployment's default or an allowlisted URI."""
    import tasks.trust
    from tasks.generation import train_stored_group
    from tasks.trust import storage_parameter_allowed

    monkeypatch.setenv("AGILERL_STORAGE_URI", "s3://stack/runs")
    monkeypatch.delenv("AGILERL_TRUSTED_URIS", raising=False)
    for ok in ("s3://stack/runs", "s3://stack/runs/team-a"):
        storage_parameter_allowed(ok, {})
    storage_parameter_allowed("s3://elsewhere/x", {"storage_uri": "s3://elsewhere/x"})  # the deployment's default
    for bad in ("s3://attacker/runs", "s3://stack/runs/../secrets", "s3://stack/runsx", "/tmp/attacker"):
        with pytest.raises(ConfigError, match=r"^storage_uri: the train-group run's parameter names .*not storage this "
                                              r"worker trusts.*\$AGILERL_STORAGE_URI.*AGILERL_TRUSTED_URIS"):
            storage_parameter_allowed(bad, {})
    monkeypatch.setenv("AGILERL_TRUSTED_URIS", "s3://attacker/")
    storage_parameter_allowed("s3://attacker/runs", {})
    monkeypatch.delenv("AGILERL_TRUSTED_URIS")
    monkeypatch.setattr(tasks.trust, "_deployment", lambda: ("deployment-id", {}))
    with pytest.raises(ConfigError, match=r"^storage_uri: "):  # refused before the store is opened
        train_stored_group("r", "s3://attacker/runs", 0, 10, [0])
