"""Issue 49 (trust, third round), the checkpoint and config attacks: a symbolic link cannot skip a generation's
manifest or lead a checkpoint out of its folder (4), a committed run loads under another folder name (11),
non-finite or mis-shaped weights are refused at load naming the tensor (8, RL members), an error message never
costs more than its input (10: a YAML alias bomb), and a FIFO where a checkpoint file should be is refused at once.
Each attack is built as a hostile author would, then tried through the public entry point."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import agilerl_core
from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.errors import CheckpointError
from agilerl_core.experiment import build_evolution
from agilerl_core.io.files import open_regular, quote
from agilerl_core.io.run_store import RunStore
from agilerl_core.io.storage import LocalStorage
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[1]
GEN0 = Path("r/generations/000000")
MEMBER0 = GEN0 / "population/members/0"


@pytest.fixture(scope="module")
def committed_run(tmp_path_factory):
    """A run `r` under `store/` with generation 0 committed (a pristine copy: each test copies it first)."""
    root = tmp_path_factory.mktemp("pristine")
    store = RunStore(LocalStorage(root), "r")
    exp = build_evolution(tiny_config(population_size=2))
    exp.population.record_fitness([1.0, 2.0])
    exp.commit(store, [])
    return root


@pytest.fixture
def run(committed_run, tmp_path):
    root = tmp_path / "store"
    shutil.copytree(committed_run, root)
    return root


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _forge(member: Path) -> None:
    """Forged weights that are consistent with their own member.json (its checksum updated): what an attacker
    who cannot edit the manifest can make. Loaded, the member would act on the attacker's weights."""
    weights = member / "weights.safetensors"
    tensors = load_file(str(weights))
    tensors = {k: (torch.full_like(v, 0.5) if v.is_floating_point() else v) for k, v in tensors.items()}
    save_file(tensors, str(weights))
    meta = json.loads((member / "member.json").read_text())
    meta["files"]["weights.safetensors"] = _sha(weights)
    (member / "member.json").write_text(json.dumps(meta))


def test_forged_member_edited_in_place_is_caught_by_the_manifest(run):
    _forge(run / MEMBER0)
    with pytest.raises(CheckpointError, match="checksum mismatch with the generation manifest"):
        agilerl_core.load(run / MEMBER0)


def test_a_member_folder_linked_to_a_forged_copy_elsewhere_is_refused(run, tmp_path):
    """Attack 4: `members/0` a symbolic link to a tampered copy. verify_committed resolved the path first, found
    no generations/NNNNNN/population in it and skipped the manifest: the forged weights loaded."""
    forged = tmp_path / "elsewhere" / "0"
    shutil.copytree(run / MEMBER0, forged)
    _forge(forged)
    shutil.rmtree(run / MEMBER0)
    (run / MEMBER0).symlink_to(forged, target_is_directory=True)
    with pytest.raises(CheckpointError, match="symbolic link leads to .*outside"):
        agilerl_core.load(run / MEMBER0)


def test_a_whole_generation_linked_to_a_forged_copy_is_refused(run, tmp_path):
    forged = tmp_path / "elsewhere" / "000000"
    shutil.copytree(run / GEN0, forged)
    _forge(forged / "population/members/0")
    man = forged / "MANIFEST.json"  # the forger rewrites the copy's manifest too
    data = json.loads(man.read_text())
    for rel in ("population/members/0/member.json", "population/members/0/weights.safetensors"):
        data["files"][f"generations/000000/{rel}"] = _sha(forged / rel)
    man.write_text(json.dumps(data))
    shutil.rmtree(run / GEN0)
    (run / GEN0).symlink_to(forged, target_is_directory=True)
    with pytest.raises(CheckpointError, match="MANIFEST.json: a symbolic link leads to .*outside"):
        agilerl_core.load(run / MEMBER0)


@pytest.mark.parametrize("name", ["member.json", "weights.safetensors"])
def test_a_file_linked_out_of_the_checkpoint_is_refused_even_with_the_same_bytes(run, tmp_path, name):
    """A member.json or weights file that is itself a symbolic link out of the run is not read, even when the
    bytes it points at are the genuine ones (the link could as well point at /proc or another user's file)."""
    outside = tmp_path / "outside" / name
    outside.parent.mkdir()
    shutil.copy(run / MEMBER0 / name, outside)
    (run / MEMBER0 / name).unlink()
    (run / MEMBER0 / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"{name}: a symbolic link leads to .*outside"):
        agilerl_core.load(run / MEMBER0)


@pytest.mark.parametrize("name", ["member.json", "weights.safetensors"])
def test_a_saved_member_outside_any_run_does_not_follow_a_link_out_of_its_folder(run, tmp_path, name):
    member = tmp_path / "member"
    shutil.copytree(run / MEMBER0, member)
    outside = tmp_path / name
    shutil.move(member / name, outside)
    (member / name).symlink_to(outside)
    with pytest.raises(CheckpointError, match=f"{name}: a symbolic link leads to .*outside"):
        agilerl_core.load(member)


@pytest.mark.parametrize("name", ["member.json", "weights.safetensors", "MANIFEST.json"])
def test_a_fifo_in_place_of_a_checkpoint_file_is_refused_at_once(run, name):
    """A FIFO would block `open()` forever (an unpacked archive can hold one): refused naming its kind."""
    target = run / GEN0 / name if name == "MANIFEST.json" else run / MEMBER0 / name
    target.unlink()
    os.mkfifo(target)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match=f"{name}: is a FIFO"):
        agilerl_core.load(run / MEMBER0)
    assert time.monotonic() - start < 10


def test_a_run_copied_under_another_folder_name_loads_and_resumes(run):
    """Attack 11: the manifest's keys named the run's folder, so a genuine run copied elsewhere was reported as
    modified. Keys are relative to the run now; a manifest written before (keys `r/generations/...`) loads too."""
    shutil.copytree(run / "r", run / "copied")
    copied = run / "copied" / "generations/000000/population/members/0"
    assert agilerl_core.load(copied).member_id == 0
    store = RunStore(LocalStorage(run), "copied")
    pop, _ = store.load_generation(0, algorithms=get_algorithm)
    assert [m.member_id for m in pop.members] == [0, 1]
    assert len(store.lineage(0)) == len(RunStore(LocalStorage(run), "r").lineage(0))

    man = run / "copied" / "generations/000000/MANIFEST.json"  # the older layout: keys name the old folder
    data = json.loads(man.read_text())
    data["files"] = {f"r/{k}": v for k, v in data["files"].items()}
    man.write_text(json.dumps(data))
    assert agilerl_core.load(copied).member_id == 0
    assert [m.member_id for m in store.load_generation(0, algorithms=get_algorithm)[0].members] == [0, 1]
    _forge(copied)  # and the copy is still verified
    with pytest.raises(CheckpointError, match="checksum mismatch with the generation manifest"):
        agilerl_core.load(copied)


def _rewrite_weights(member: Path, fn) -> None:
    weights = member / "weights.safetensors"
    tensors = fn(load_file(str(weights)))
    save_file(tensors, str(weights))
    meta = json.loads((member / "member.json").read_text())
    meta["files"]["weights.safetensors"] = _sha(weights)
    (member / "member.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_of_an_rl_member_are_refused_naming_the_tensor(run, tmp_path, bad):
    """Attack 8 (RL): NaN weights in a DQN member loaded, and its predict returned an action."""
    member = tmp_path / "member"
    shutil.copytree(run / MEMBER0, member)
    name = {}

    def poison(tensors):
        key = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)
        name["key"] = key
        tensors[key] = tensors[key].clone()
        tensors[key].view(-1)[1] = bad
        return tensors

    _rewrite_weights(member, poison)
    with pytest.raises(CheckpointError, match=rf"weights.safetensors: tensor '{name['key']}' holds 1 non-finite"):
        agilerl_core.load(member)


def test_weights_of_another_shape_are_refused_naming_the_file(run, tmp_path):
    member = tmp_path / "member"
    shutil.copytree(run / MEMBER0, member)

    def reshape(tensors):
        key = next(k for k, v in tensors.items() if v.is_floating_point() and v.ndim == 2)
        tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] + 3)
        return tensors

    _rewrite_weights(member, reshape)
    with pytest.raises(CheckpointError, match="weights.safetensors: does not match .*member.json"):
        agilerl_core.load(member)


def _bounded_run(code: str, timeout: float = 60) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON line. Adds the wall time and peak RSS (MB)."""
    wrapper = ("import json, resource, time\nstart = time.monotonic()\n" + code +
               "\nout['peak_mb'] = int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) / 1024\n"
               "out['wall_s'] = time.monotonic() - start\nprint(json.dumps(out))")
    proc = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_yaml_alias_bomb_in_a_config_costs_no_more_than_the_file(tmp_path):
    """Attack 10: nine levels of 10x aliases in hyperparameters.lr (10^10 leaves in a 700-byte file) took 15 GB
    while the validation error was formatted (the value's repr expanded). The error now quotes a few hundred
    characters of it, naming the field, through the CLI a user runs."""
    items = ["&a0 [1,1,1,1,1,1,1,1,1,1]"] + [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("algorithm: dqn\nenv_id: CartPole-v1\nhyperparameters:\n  lr: [" + ", ".join(items) + "]\n")
    out = _bounded_run(f"""
import contextlib, io, sys
from flows.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    try:
        rc = main(["run", {str(bomb)!r}, "--local"])
    except SystemExit as e:
        rc = e.code
out = {{"rc": rc, "err": err.getvalue()}}""")
    assert out["rc"] not in (0, None), out
    assert "hyperparameters.lr" in out["err"] and "valid number" in out["err"]
    assert len(out["err"]) < 2000
    assert out["wall_s"] < 10 and out["peak_mb"] < 500, out


def test_quote_bounds_strings_containers_and_shared_structures():
    shared: list = [1] * 10
    for _ in range(9):
        shared = [shared] * 10  # 10^10 leaves, 100 list objects
    start = time.monotonic()
    assert len(quote(shared)) < 400 and time.monotonic() - start < 1
    loop: list = []
    loop.append(loop)
    assert len(quote(loop)) < 400
    assert quote("x" * 10**7).endswith("(10,000,000 in all)") and len(quote("x" * 10**7)) < 300
    assert quote(3.5) == "3.5"


def test_the_opener_refuses_kinds_and_links_it_does_not_read(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_text("s")
    (tmp_path / "root" / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(CheckpointError, match="outside"):
        open_regular(tmp_path / "root" / "link", root=tmp_path / "root")
    with open_regular(tmp_path / "root" / "link") as f:  # no root: the caller named it, links are fine
        assert f.read() == b"s"
    with pytest.raises(CheckpointError, match="is a folder"):
        open_regular(tmp_path / "root")
    with pytest.raises(CheckpointError, match="is a character device"):
        open_regular("/dev/zero")
    with pytest.raises(CheckpointError, match="file not found"):
        open_regular(tmp_path / "nope")


def test_a_fifo_config_file_is_refused_at_once(tmp_path):
    from agilerl_core.config import read_config_file
    from agilerl_core.errors import ConfigError

    os.mkfifo(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="c.yaml'?: is a FIFO"):
        read_config_file(tmp_path / "c.yaml")
