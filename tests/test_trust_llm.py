"""Trust (issue 38, cases 1, 4 and 5): an LLM base is data. A base recorded in a checkpoint (or given in a config)
never makes transformers run or look for code, a model directory's hash covers every file transformers reads
(pickled weights refused), and the parameters a base declares are counted before any tensor is built.

Every model here is a tiny GPT-2 built from a config (or saved from one) with a character-level tokenizer."""

from __future__ import annotations

import builtins
import json
import resource
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import agilerl_core
from agilerl_core import limits
from agilerl_core.config import LLMModelConfig
from agilerl_core.errors import CheckpointError, ConfigError
from agilerl_core.experiment import build_evolution
from agilerl_core.llm.base_loading import char_tokenizer, load_model_and_tokenizer
from tests.test_llm import TINY_MODEL, llm_config

# A module that leaves a marker when it is imported, and a class that leaves one when built.
EVIL = '''
import pathlib, os
pathlib.Path(os.environ["AGILERL_TEST_MARKER"]).write_text("imported")

class EvilLM:
    def __init__(self, *args, **kwargs):
        pathlib.Path(os.environ["AGILERL_TEST_MARKER"]).write_text("called")
'''
CHARS = TINY_MODEL["tokenizer_chars"]


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """A directory holding `evilmodel.py` (what transformers would import for an ``auto_map`` naming
    ``evilmodel.EvilLM``), which writes `path` when imported; also fails the test at any prompt (``input``)."""
    code = tmp_path / "evil"
    code.mkdir()
    (code / "evilmodel.py").write_text(EVIL)
    path = tmp_path / "marker"
    monkeypatch.setenv("AGILERL_TEST_MARKER", str(path))

    def no_prompt(*args, **kwargs):
        raise AssertionError(f"prompted: {args}")

    monkeypatch.setattr(builtins, "input", no_prompt)
    return SimpleNamespace(path=path, dir=code)


@pytest.fixture(scope="module")
def saved_elite(tmp_path_factory):
    """A saved LLM elite (tiny GPT-2 built from a config): each test tampers a copy."""
    tmp = tmp_path_factory.mktemp("llm-elite")
    data = tmp / "data"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": "7"} for a in range(10) for b in range(10)]
    (data / "const.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evo = build_evolution(llm_config(data, population_size=1))
    evo.population.record_fitness([0.5])
    return evo.save_elite(tmp / "elite")


def _elite_with_base_config(saved_elite: Path, tmp_path: Path, config: dict) -> Path:
    elite = Path(shutil.copytree(saved_elite, tmp_path / "elite"))
    meta = json.loads((elite / "member.json").read_text())
    meta["agent"]["base"]["config"] = config
    (elite / "member.json").write_text(json.dumps(meta))
    return elite


def _spec(**fields) -> LLMModelConfig:
    return LLMModelConfig(dtype="float32", lora={"targets": ["c_attn"], "rank": 1}, **fields)


# ---- case 1: a base config naming code ------------------------------------------------------------------------
def test_the_issue_attack_a_checkpoint_base_config_with_auto_map_is_refused_without_a_prompt(saved_elite, tmp_path,
                                                                                          marker):
    assert agilerl_core.load(saved_elite).kind == "llm"  # as saved: loads
    attack = {"model_type": "vit", "name_or_path": str(marker.dir),
              "auto_map": {"AutoModelForCausalLM": "evilmodel.EvilLM"}}
    elite = _elite_with_base_config(saved_elite, tmp_path, attack)
    with pytest.raises(CheckpointError, match=r"member\.json: field agent\.base does not name a loadable base "
                                              r"\(agent\.base\.config\.(name_or_path|auto_map): "):
        agilerl_core.load(elite)
    assert not marker.path.exists()


@pytest.mark.parametrize("config, field", [
    ({"auto_map": {"AutoModelForCausalLM": "evilmodel.EvilLM"}}, r"agent\.base\.config\.auto_map: names code"),
    ({"auto_map": {"AutoModelForCausalLM": "x--evilmodel.EvilLM"}}, r"agent\.base\.config\.auto_map: names code"),
    ({"_name_or_path": "EVIL"}, r"agent\.base\.config\._name_or_path: .* points transformers at another place"),
    ({"model_type": "vit"}, r"agent\.base\.config\.model_type: 'vit' is not a causal language model"),
    ({"model_type": "evil"}, r"agent\.base\.config\.model_type: 'evil' is not a causal language model"),
    ({"text_config": {"auto_map": {"AutoModelForCausalLM": "evilmodel.EvilLM"}}},
     r"agent\.base\.config\.text_config\.auto_map: names code"),
    ({"trust_remote_code": True}, r"agent\.base\.config\.trust_remote_code: names code"),
    ({"attn_implementation": "kernels-community/evil"}, r"agent\.base\.config\.attn_implementation: .* Hub kernel"),
])
def test_every_field_that_makes_transformers_look_for_code_is_named(saved_elite, tmp_path, marker, config, field):
    config = {**TINY_MODEL["config"], **config}
    config = {k: (str(marker.dir) if v == "EVIL" else v) for k, v in config.items()}
    elite = _elite_with_base_config(saved_elite, tmp_path, config)
    with pytest.raises(CheckpointError, match=r"member\.json: field agent\.base .*" + field):
        agilerl_core.load(elite)
    assert not marker.path.exists()


def test_a_user_config_naming_code_is_refused_before_any_work(saved_elite, tmp_path, marker):
    data = saved_elite.parent / "data"
    bad = {**TINY_MODEL["config"], "name_or_path": str(marker.dir),
           "auto_map": {"AutoModelForCausalLM": "evilmodel.EvilLM"}}
    with pytest.raises(ConfigError, match=r"^model\.config\.(name_or_path|auto_map): "):
        build_evolution(llm_config(data, **{"model.config": bad}))
    with pytest.raises(ConfigError, match=r"^model\.config\.model_type: 'vit' is not a causal language model"):
        build_evolution(llm_config(data, **{"model.config": {"model_type": "vit"}}))
    assert not marker.path.exists()


# ---- case 4: a model directory is data, and its hash covers every file transformers reads ---------------------
@pytest.fixture
def hf_dir(tmp_path):
    """A tiny GPT-2 saved with save_pretrained(safe_serialization=True), with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = char_tokenizer(CHARS)
    cfg = AutoConfig.for_model("gpt2", n_embd=16, n_layer=1, n_head=2, n_positions=16, vocab_size=len(tok),
                               eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
    d = tmp_path / "hf"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return d


def _sha(d: Path) -> str:
    return load_model_and_tokenizer(_spec(path=str(d)), "cpu")[2]


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_the_issue_attack_an_index_pointing_at_pickled_weights_is_refused(hf_dir, tmp_path):
    from safetensors.torch import load_file

    sha = _sha(hf_dir)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    torch.save({k: v + 1 for k, v in tensors.items()}, hf_dir / "weights.bin")  # changed weights, pickled
    index = {"metadata": {}, "weight_map": {k: "weights.bin" for k in tensors}}
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=r"model\.path '.*': holds weights\.bin, a pickle"):
        load_model_and_tokenizer(_spec(path=str(hf_dir), sha256=sha), "cpu")
    # the index alone may name nothing but plain safetensors files of the directory
    (hf_dir / "weights.bin").unlink()
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(hf_dir / "config.json", outside / "model.safetensors")
    for target in ("weights.bin", "../outside/model.safetensors", str(outside / "model.safetensors"),
                   "sub/model.safetensors", "missing.safetensors"):
        index["weight_map"] = {k: target for k in tensors}
        (hf_dir / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(ConfigError, match=r"model\.safetensors\.index\.json: field weight_map\['.*'\]: "
                                              r".* is not a safetensors file of this directory"):
            load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "training_args.bin", "model.pt", "sub/weights.pth",
                                  "pytorch_model.bin.index.json"])
def test_a_pickle_anywhere_in_the_directory_is_refused(hf_dir, name):
    (hf_dir / name).parent.mkdir(exist_ok=True)
    (hf_dir / name).write_bytes(b"\x80\x04N.")
    with pytest.raises(ConfigError, match=rf"holds {name}, a pickle"):
        load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")


@pytest.mark.parametrize("file, change", [
    ("tokenizer.json", lambda d: d["model"]["vocab"].update({"0": d["model"]["vocab"]["1"], "1": d["model"]["vocab"]["0"]})),
    ("config.json", lambda d: d.__setitem__("layer_norm_epsilon", 0.5)),
    ("generation_config.json", lambda d: d.__setitem__("max_length", 3)),
    ("tokenizer_config.json", lambda d: d.__setitem__("eos_token", "<pad>")),
])
def test_changing_any_file_transformers_reads_changes_the_recorded_sha(hf_dir, file, change):
    sha = _sha(hf_dir)
    _edit_json(hf_dir / file, change)
    assert _sha(hf_dir) != sha
    with pytest.raises(ConfigError, match=r"model\.sha256: the base model's weights hash to [0-9a-f]{64}, not " + sha):
        load_model_and_tokenizer(_spec(path=str(hf_dir), sha256=sha), "cpu")


def test_a_directory_holding_code_or_naming_it_is_refused(hf_dir, marker):
    shutil.copy(marker.dir / "evilmodel.py", hf_dir / "evilmodel.py")
    with pytest.raises(ConfigError, match=r"holds Python code \(evilmodel\.py\)"):
        load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")
    (hf_dir / "evilmodel.py").unlink()
    auto = {"AutoModelForCausalLM": "evilmodel.EvilLM", "AutoTokenizer": ["evilmodel.EvilLM", None]}
    for file in ("config.json", "tokenizer_config.json", "generation_config.json"):
        before = (hf_dir / file).read_text()
        _edit_json(hf_dir / file, lambda d: d.__setitem__("auto_map", auto))
        with pytest.raises(ConfigError, match=rf"{file}: field\.auto_map: names code"):
            load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")
        (hf_dir / file).write_text(before)
    _edit_json(hf_dir / "config.json", lambda d: d.__setitem__("model_type", "vit"))
    with pytest.raises(ConfigError, match=r"config\.json: field model_type: 'vit' is not a causal language model"):
        load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")
    _edit_json(hf_dir / "config.json", lambda d: d.__setitem__("model_type", "gpt2"))
    (hf_dir / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(marker.dir)}))
    with pytest.raises(ConfigError, match=r"holds adapter_config\.json"):
        load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")
    (hf_dir / "adapter_config.json").unlink()
    load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")  # restored: loads
    assert not marker.path.exists()


def test_a_checkpoint_naming_a_tampered_directory_is_refused_naming_agent_base(saved_elite, hf_dir, tmp_path):
    elite = Path(shutil.copytree(saved_elite, tmp_path / "elite"))
    (hf_dir / "training_args.bin").write_bytes(b"\x80\x04N.")

    def point(d):
        d["agent"]["base"].pop("config")
        d["agent"]["base"].update(path=str(hf_dir), tokenizer_chars=None)
    _edit_json(elite / "member.json", point)
    with pytest.raises(CheckpointError, match=r"field agent\.base .*agent\.base\.path '.*': holds training_args\.bin"):
        agilerl_core.load(elite)


# ---- case 5 (LLM): declared sizes are checked before any tensor is built --------------------------------------
def _grown_by_mb(before: int) -> float:
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024  # ru_maxrss: KiB on Linux


def test_the_issue_attack_a_large_declared_base_is_refused_before_it_is_built(saved_elite, tmp_path):
    big = {**TINY_MODEL["config"], "n_embd": 2048, "n_head": 16, "n_layer": 48, "n_positions": 2048}  # ~2.5e9
    elite = _elite_with_base_config(saved_elite, tmp_path, big)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(CheckpointError, match=r"member\.json: field agent\.base .*agent\.base\.config \(parameters "
                                              r"and buffers of the gpt2 model it declares\): [\d,]+ is over the limit "
                                              r"limits\.llm_config_params = 200,000,000"):
        agilerl_core.load(elite)
    assert _grown_by_mb(rss) < 1000  # 2.5e9 float32 parameters would be 10 GB
    elite = _elite_with_base_config(saved_elite, tmp_path / "deep", {**TINY_MODEL["config"], "n_layer": 10**7})
    with pytest.raises(CheckpointError, match=r"agent\.base\.config\.n_layer: 10,000,000 is over the limit "
                                              r"limits\.llm_layers"):
        agilerl_core.load(elite)
    assert _grown_by_mb(rss) < 1000


def test_the_count_is_the_model_s_and_limits_apply_to_configs_and_directories(hf_dir):
    spec = _spec(config=TINY_MODEL["config"], tokenizer_chars=CHARS)
    model = load_model_and_tokenizer(spec, "cpu")[0]
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    with limits.applied({"llm_config_params": n}):
        load_model_and_tokenizer(spec, "cpu")  # exactly at the limit: loads
    with limits.applied({"llm_config_params": n - 1}), \
            pytest.raises(ConfigError, match=rf"^model\.config \(parameters .*\): {n:,} is over the limit "
                                             rf"limits\.llm_config_params = {n - 1:,}"):
        load_model_and_tokenizer(spec, "cpu")
    # a directory whose config.json declares far more than its weights hold: refused by what it declares
    _edit_json(hf_dir / "config.json", lambda d: d.update(n_embd=8192, n_head=64, n_layer=64))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match=r"model\.path '.*': config\.json \(parameters .*\): [\d,]+ is over the "
                                          r"limit limits\.llm_params = 2,000,000,000"):
        load_model_and_tokenizer(_spec(path=str(hf_dir)), "cpu")
    assert _grown_by_mb(rss) < 1000


def test_a_gguf_base_is_hashed_with_its_side_files_and_its_directory_may_not_hold_code(tmp_path, marker):
    """The GGUF branch's checks run before transformers parses the file (a stand-in file is enough): its own hash
    when it stands alone (what checkpoints and pins recorded before), the side files transformers reads with it
    in the hash, and no code beside it."""
    from agilerl_core.io.digest import sha256_file

    d = tmp_path / "gguf"
    d.mkdir()
    (d / "m.gguf").write_bytes(b"GGUF" + bytes(60))
    alone = sha256_file(d / "m.gguf")
    wrong = "0" * 64
    with pytest.raises(ConfigError, match=rf"model\.sha256: the base model's weights hash to {alone}, not {wrong}"):
        load_model_and_tokenizer(_spec(path=str(d), gguf_file="m.gguf", sha256=wrong), "cpu")
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    with pytest.raises(ConfigError, match=r"hash to [0-9a-f]{64}, not " + alone) as err:
        load_model_and_tokenizer(_spec(path=str(d), gguf_file="m.gguf", sha256=alone), "cpu")
    with_side = str(err.value).split("hash to ")[1][:64]
    assert with_side != alone
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<pad>"}))  # a side file changed
    with pytest.raises(ConfigError, match=r"hash to [0-9a-f]{64}, not " + with_side):
        load_model_and_tokenizer(_spec(path=str(d), gguf_file="m.gguf", sha256=with_side), "cpu")
    (d / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["evilmodel.EvilLM", None]}}))
    with pytest.raises(ConfigError, match=r"gguf_file 'm\.gguf': tokenizer_config\.json: field\.auto_map: names code"):
        load_model_and_tokenizer(_spec(path=str(d), gguf_file="m.gguf"), "cpu")
    (d / "tokenizer_config.json").unlink()
    shutil.copy(marker.dir / "evilmodel.py", d / "evilmodel.py")
    with pytest.raises(ConfigError, match=r"its directory holds evilmodel\.py"):
        load_model_and_tokenizer(_spec(path=str(d), gguf_file="m.gguf"), "cpu")
    assert not marker.path.exists()
