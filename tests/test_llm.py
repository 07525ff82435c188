"""The LLM arena: GRPO and DPO maths, LoRA adapters on one shared base, rank mutations, checkpoints, the flow.

Every model here is a tiny GPT-2 built from a config with a character-level tokenizer (no downloads)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agilerl_core.algorithms.registry import get_algorithm
from agilerl_core.errors import AgileRLError, CheckpointError, ConfigError, DatasetError
from agilerl_core.experiment import build_evolution
from agilerl_core.hpo.evolvable import MutationSettings
from agilerl_core.llm.adapter import LoraAdapter
from tasks.config import validate_config
from tests.conftest import cli_summary, with_overrides

TINY_MODEL = {"config": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32,
                         "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0},
              "tokenizer_chars": "0123456789+=",
              "lora": {"rank": 4, "alpha": 8, "targets": ["c_attn", "c_proj", "c_fc", "lm_head"]}}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return llm_data(tmp_path_factory)


def llm_data(tmp_path_factory):
    """A folder of tiny prompt and preference sets (a constant target, preferences for it, prompts alone)."""
    d = tmp_path_factory.mktemp("llm-data")
    rows = [{"prompt": f"{a}+{b}=", "answer": "7"} for a in range(10) for b in range(10)]  # a constant target
    (d / "const.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prefs = [{"prompt": f"{a}+{b}=", "chosen": "7", "rejected": str(a)} for a in range(10) for b in range(10) if a != 7]
    (d / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prefs))
    (d / "no_answers.jsonl").write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    return d


def llm_config(data_dir, **overrides):
    data = {"name": "llm-test", "kind": "llm", "algorithm": "grpo", "population_size": 2, "seed": 0,
            "model": json.loads(json.dumps(TINY_MODEL)),
            "dataset": {"uri": str(data_dir / "const.jsonl"), "held_out": 20},
            "hyperparameters": {"lr": 0.01, "batch_size": 16, "beta": 0.0, "group_size": 8, "max_new_tokens": 1,
                                "micro_batch_size": 128},
            "evo_steps": 512, "max_env_steps": 2048}
    if overrides.get("algorithm") == "dpo":
        data["dataset"]["uri"] = str(data_dir / "prefs.jsonl")
        data["hyperparameters"] = {"lr": 0.01, "batch_size": 16, "beta": 0.5}
        data["evo_steps"], data["max_env_steps"] = 128, 512
    return validate_config(with_overrides(data, overrides))


# ---- adapters on one shared base ------------------------------------------------------------------------------
def _logits(member, prompts=("1+2=", "3+4=")):
    ids, mask = member.prompt_batch(member.base.encode(list(prompts), False))
    with torch.no_grad(), member.base.bound(member.adapter) as model:
        return model(input_ids=ids, attention_mask=mask).logits


def test_members_share_one_base_and_own_their_adapters(data_dir):
    evo = build_evolution(llm_config(data_dir, population_size=3))
    members = [m.agent for m in evo.population.members]
    base = members[0].base
    assert all(m.base is base for m in members)
    ptrs = {p.data_ptr() for n, p in base.model.named_parameters() if "lora_" not in n}
    for m in members:  # binding a member swaps only the LoRA slot: the base weights stay where they are
        with base.bound(m.adapter) as model:
            assert {p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n} == ptrs
            assert model.base_model.model.lm_head.lora_A["member"].weight is m.adapter.a["lm_head"]
    a0, a1 = members[0].adapter, members[1].adapter
    assert not torch.equal(a0.a["lm_head"], a1.a["lm_head"])  # members are seeded apart
    evo.run_generation()
    assert not torch.equal(a0.b["lm_head"], a1.b["lm_head"])  # and learned apart
    assert not torch.allclose(_logits(members[0]), _logits(members[1]))
    # the reference policy is the base itself: a member's adapter disabled
    with base.bound(a0), base.reference() as model:
        ids, mask = members[0].prompt_batch(base.encode(["1+2="], False))
        ref0 = model(input_ids=ids, attention_mask=mask).logits
    with base.bound(a1), base.reference() as model:
        ref1 = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(ref0, ref1)


def test_rank_growth_keeps_outputs_and_shrinking_keeps_the_largest_components(data_dir):
    evo = build_evolution(llm_config(data_dir, population_size=1))
    member = evo.population.members[0].agent
    evo.run_generation()  # a trained adapter (B != 0)
    before, step = _logits(member), member._adam_state()[0]
    member.set_rank(8, seed=1)
    assert member.adapter.rank == 8
    assert torch.allclose(_logits(member), before, atol=1e-6)
    s, moments = member._adam_state()
    assert s == step and torch.count_nonzero(moments["lm_head.lora_B"][0][:, 4:]) == 0  # old moments kept
    # shrinking: every module's B @ A becomes its best rank-2 approximation (Eckart-Young)
    delta = {n: member.adapter.delta(n) for n in member.adapter.names}
    member.set_rank(2, seed=2)
    for n, d in delta.items():
        u, sv, vh = torch.linalg.svd(d.double())
        best = (u[:, :2] * sv[:2]) @ vh[:2]
        assert torch.allclose(member.adapter.delta(n).double(), best, atol=1e-5), n
    # a mutation doubles or halves within the bounds
    msg = member.mutate("adapter_rank", np.random.default_rng(0), MutationSettings(0, 0, evo.arena.arch_bounds))
    assert msg in ("rank:2->4", "rank:2->1") and member.adapter.rank in (1, 4)
    with pytest.raises(ValueError, match="base model is frozen"):
        member.mutate("architecture", np.random.default_rng(0), MutationSettings(0, 0, evo.arena.arch_bounds))


def test_adapter_svd_shrink_of_a_known_product():
    a = {"m": torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])}
    b = {"m": torch.tensor([[3.0, 0.0], [0.0, 0.5]])}
    small = LoraAdapter(a, b, 2.0).shrunk(1)
    assert torch.allclose(small.delta("m"), torch.tensor([[6.0, 0.0, 0.0], [0.0, 0.0, 0.0]]), atol=1e-6)


# ---- learning -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("algorithm", "dtype"), [("grpo", "float32"), ("grpo", "bfloat16"), ("reinforce", "float32"),
                                                 ("llm_ppo", "float32"), ("gspo", "float32"), ("cispo", "float32")])
def test_a_tiny_model_learns_a_constant_target_probe(data_dir, algorithm, dtype):
    """Sampled completions (temperature 1) reach >= 95% reward within a few thousand completions (GRPO, REINFORCE
    with its leave-one-out baseline, LLM-PPO, GSPO, CISPO). With a bfloat16 base (the GPU default, `model.dtype:
    auto`) the adapters and their Adam moments stay float32."""
    evo = build_evolution(llm_config(data_dir, algorithm=algorithm, population_size=1, max_env_steps=4096,
                                     **{"model.dtype": dtype}))
    base = {p.dtype for n, p in evo.arena.base.model.named_parameters() if "lora_" not in n}
    assert base == {getattr(torch, dtype)}
    member = evo.population.members[0].agent
    assert {t.dtype for t in member.adapter.tensors().values()} == {torch.float32}
    first = evo.arena.train(member, 0, 0, 256).mean_return
    for g in range(1, 16):
        last = evo.arena.train(member, 0, g, 256).mean_return
    assert first < 0.5 and last >= 0.95, (first, last)
    assert evo.arena.evaluate(member, 0) == 1.0  # greedy, on held-out prompts
    assert member.samples and member.samples[0]["completion"] == "7"


def test_dpo_learns_preferences_and_its_fitness_is_held_out_accuracy(data_dir):
    evo = build_evolution(llm_config(data_dir, algorithm="dpo", population_size=1))
    member = evo.population.members[0].agent
    assert evo.arena.evaluate(member, 0) == 0.5  # B = 0: the policy is the reference, every margin a tie
    for g in range(6):
        evo.arena.train(member, 0, g, 128)
    assert evo.arena.evaluate(member, 0) >= 0.9
    held = set(evo.arena.eval_data.prompts)
    assert held and not held & set(evo.arena.train_data.prompts)  # fitness never sees a training prompt


@pytest.mark.parametrize("algorithm", ["grpo", "llm_ppo"])
def test_same_seed_same_result_and_checkpoint_round_trip(data_dir, tmp_path, algorithm):
    def run():
        evo = build_evolution(llm_config(data_dir, algorithm=algorithm, **{"mutation.adapter_rank": 0.5}))
        for _ in range(3):
            if evo.history:
                evo.evolve()
            evo.run_generation()
        return evo

    a, b = run(), run()
    assert [h.fitnesses for h in a.history] == [h.fitnesses for h in b.history]
    assert [h.train_metrics for h in a.history] == [h.train_metrics for h in b.history]
    for ma, mb in zip(a.population.members, b.population.members, strict=True):
        ta, tb = ma.agent.state()[0], mb.agent.state()[0]
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    a.save(tmp_path / "pop")
    c = build_evolution(llm_config(data_dir, algorithm=algorithm, **{"mutation.adapter_rank": 0.5}))
    c.restore(tmp_path / "pop")
    if algorithm == "llm_ppo":  # the value head travels with the adapter
        assert any(float(m.agent.head["value.weight"].detach().abs().sum()) > 0 for m in c.population.members)
    for ma, mc in zip(a.population.members, c.population.members, strict=True):
        ta, tc = ma.agent.state(), mc.agent.state()
        assert ta[1] == tc[1] and all(torch.equal(ta[0][k], tc[0][k]) for k in ta[0])
    # the restored population continues exactly as the original
    a.evolve()
    c.evolve()
    assert a.run_generation().fitnesses == c.run_generation().fitnesses
    assert a.history[-1].train_metrics == c.history[-1].train_metrics


# ---- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, error, match", [
    ({"model": {"path": "/nonexistent/model"}}, ConfigError, r"model.path '/nonexistent/model': no such file"),
    ({"model": {"path": "package:surely_not_installed_pkg"}}, ConfigError, "is not installed"),
    ({"dataset.uri": "/nonexistent/prompts.jsonl"}, DatasetError, "make-arithmetic"),
    ({"dataset.uri": "NO_ANSWERS"}, DatasetError, "exact_answer reward needs answers"),
    ({"rewards": [{"kind": "python", "function": "tests.test_llm:no_such_reward"}]}, ConfigError,
     r"rewards\[0\].function: module 'tests.test_llm' has no function 'no_such_reward'"),
    ({"rewards": [{"kind": "python", "function": "not_a_module_xyz:f"}]}, ConfigError, "cannot import module"),
    ({"rewards": [{"kind": "regex", "pattern": "("}]}, ConfigError, r"rewards\[0\].pattern"),
    ({"model.sha256": "0" * 64}, ConfigError, "model.sha256: the base model's weights hash to"),
    ({"model.lora.targets": ["no_such_module"]}, ConfigError, "model.lora.targets"),
    ({"dataset.held_out": 100}, DatasetError, "dataset.held_out"),
])
def test_bad_input_is_refused_before_any_work(data_dir, overrides, error, match):
    if overrides.get("dataset.uri") == "NO_ANSWERS":
        overrides = {"dataset.uri": str(data_dir / "no_answers.jsonl")}
    with pytest.raises(error, match=match):
        build_evolution(llm_config(data_dir, **overrides))


def test_config_refuses_what_llm_members_cannot_do(data_dir):
    with pytest.raises(ConfigError, match="mutation.architecture: LLM members take no architecture mutations"):
        llm_config(data_dir, **{"mutation.architecture": 0.2})
    with pytest.raises(ConfigError, match="mutation.parameters: LLM members take no weight-noise"):
        llm_config(data_dir, **{"mutation.parameters": 0.1})
    with pytest.raises(ConfigError, match="algorithm: ppo does not train in llm experiments; use one of grpo, reinforce, "
                                          "llm_ppo, dpo"):
        llm_config(data_dir, algorithm="ppo")
    with pytest.raises(ConfigError, match="tokenizer_chars"):
        llm_config(data_dir, **{"model.tokenizer_chars": None})
    with pytest.raises(ConfigError, match="dataset.*no 'chosen' field"):  # DPO on a prompt set
        build_evolution(llm_config(data_dir, algorithm="dpo", **{"dataset.uri": str(data_dir / "const.jsonl")}))


def test_a_member_is_refused_on_another_base(data_dir, tmp_path):
    evo = build_evolution(llm_config(data_dir, population_size=1))
    evo.save(tmp_path / "pop")
    other = build_evolution(llm_config(data_dir, population_size=1, **{"model.init_seed": 1}))
    with pytest.raises(CheckpointError, match="trained on base model"):
        other.restore(tmp_path / "pop")
    assert issubclass(CheckpointError, AgileRLError)


# ---- through the flow ---------------------------------------------------------------------------------------------
def test_an_llm_run_through_the_cli_tracks_what_members_say(data_dir, tmp_path, cli):
    """Through the CLI and the flow on the embedded default: MLflow has every member's reward, KL and completion
    length, a table of held-out completions per generation, and the champion (base by reference + adapter)
    generates text. (Resuming is proven in process for every kind: tests/test_tasks.py.)"""
    import yaml

    cfg = tmp_path / "llm.yaml"
    data = llm_config(data_dir, max_env_steps=10240, **{"mutation.adapter_rank": 0.3}).model_dump(mode="json")
    data.update(name="llm-flow")
    data["hyperparameters"]["beta"] = 0.02
    cfg.write_text(yaml.safe_dump(data))
    storage = str(tmp_path / "store")
    straight = cli_summary(cli.run("run", cfg, "--run-id", "straight", "--storage", storage, "--no-progress",
                                   "--set", f"output_dir={tmp_path / 'out'}"))
    assert straight["generations"] == 10

    from agilerl_core.io.run_store import RunStore
    from agilerl_core.io.storage import open_storage

    store = RunStore(open_storage(storage), "straight")
    run = json.loads(store.storage.get_bytes(store.key("run.json")))
    assert len(run["config"]["model"]["sha256"]) == 64  # the base is pinned in the run's record

    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("llm-flow").experiment_id
    children = client.search_runs([exp], filter_string=f"tags.`agilerl.parent` = '{straight['mlflow_run_id']}'")
    assert len(children) == 2
    for child in children:
        assert {"fitness", "train.reward", "train.kl", "train.completion_length", "hp.lr", "hp.beta",
                "hp.group_size", "hp.temperature"} <= set(child.data.metrics)
    parent = client.get_run(straight["mlflow_run_id"])
    assert parent.data.tags["agilerl.base_model"] == "config:gpt2"
    tables = [a.path for a in client.list_artifacts(parent.info.run_id, "samples")]
    assert len(tables) == 10
    from pathlib import Path

    table = json.loads(Path(client.download_artifacts(parent.info.run_id, tables[-1], str(tmp_path))).read_text())
    assert {"prompt", "completion", "reward", "slot", "generation"} <= set(table["columns"])
    mlflow.set_tracking_uri(uri)
    champion = mlflow.pyfunc.load_model(straight["champion_uri"])
    import pandas as pd

    out = champion.predict(pd.DataFrame({"prompt": ["1+2=", "5+5="]}))
    assert len(out["completion"]) == 2 and all(isinstance(c, str) for c in out["completion"])


# ---- data ------------------------------------------------------------------------------------------------------------
def test_prompt_sets_read_as_jsonl_or_parquet_and_split_by_seed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agilerl_core.data.prompts import load_text_records, make_arithmetic, split_indices, write_jsonl

    rows = make_arithmetic(50, 2, seed=3, preferences=True)
    assert len({r["prompt"] for r in rows}) == 50
    assert all(int(r["answer"]) == eval(r["prompt"][8:].split("?")[0]) for r in rows)  # "What is A + B?"
    assert all(r["chosen"] == r["answer"] != r["rejected"] for r in rows)
    write_jsonl(tmp_path / "s.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet")
    fields = {"prompt": "prompt", "answer": "answer", "chosen": "chosen", "rejected": "rejected"}
    a = load_text_records(str(tmp_path / "s.jsonl"), fields, ("prompt",))
    b = load_text_records(str(tmp_path / "s.parquet"), fields, ("prompt",))
    assert a.prompts == b.prompts and a.answers == b.answers and a.rejected == b.rejected
    train, held = split_indices(50, 0.2, seed=7)
    assert len(held) == 10 and not set(train) & set(held) and sorted([*train, *held]) == list(range(50))
    assert all((x == y).all() for x, y in zip(split_indices(50, 0.2, 7), (train, held), strict=True))
    assert not (split_indices(50, 0.2, 8)[1] == held).all()
    with pytest.raises(DatasetError, match="record 0 has no 'question' field"):
        load_text_records(str(tmp_path / "s.jsonl"), {**fields, "prompt": "question"}, ("prompt",))
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\nnot json\n')
    with pytest.raises(DatasetError, match="line 2 is not JSON"):
        load_text_records(str(tmp_path / "bad.jsonl"), fields, ("prompt",))


@pytest.mark.integration
def test_a_prompt_set_on_s3_is_read_through_the_verified_cache(s3, data_dir, tmp_path, monkeypatch):
    """dataset.uri s3://...: fetched once into the content-addressed cache with the storage section's endpoint
    and the environment's credentials, the same records as the local file, and pinned by dataset.sha256."""
    from agilerl_core.arenas.llm import LLMArena
    from agilerl_core.data.prompts import load_text_records
    from agilerl_core.io.storage import S3Options, open_storage

    c = s3.credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", c["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", c["secret_access_key"])
    opts = S3Options(s3.s3_url, None, c["access_key_id"], c["secret_access_key"])
    open_storage("s3://agilerl/prompts", opts).put_bytes("const.jsonl", (data_dir / "const.jsonl").read_bytes())
    over = {"dataset.uri": "s3://agilerl/prompts/const.jsonl", "dataset.cache_dir": str(tmp_path / "cache"),
            "storage.endpoint_url": s3.s3_url}
    cfg = llm_config(data_dir, **over)
    arena = LLMArena(cfg, get_algorithm("grpo"))
    local = load_text_records(str(data_dir / "const.jsonl"), {"prompt": "prompt", "answer": "answer",
                                                              "chosen": "chosen", "rejected": "rejected"}, ("prompt",))
    assert arena.dataset.prompts == local.prompts and arena.dataset.answers == local.answers
    assert arena.dataset.sha256 == local.sha256
    cached = list((tmp_path / "cache").rglob("const.jsonl"))
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    assert LLMArena(llm_config(data_dir, **over, **{"dataset.sha256": local.sha256}), get_algorithm("grpo"))
    assert cached[0].stat().st_mtime_ns == stamp  # served from the cache, not fetched again
    with pytest.raises(DatasetError, match="differs from dataset.sha256"):
        LLMArena(llm_config(data_dir, **over, **{"dataset.sha256": "0" * 64}), get_algorithm("grpo"))


# ---- one member across processes (Accelerate, CPU) -------------------------------------------------------------
@pytest.mark.slow  # two `accelerate launch` processes per case
@pytest.mark.parametrize("algorithm", ["grpo", "dpo"])
def test_two_process_data_parallel_phase_equals_one_process(data_dir, algorithm):
    """`model.data_parallel: 2` trains a member's phase in two processes (accelerate launch --multi_gpu with
    Accelerator(cpu=True)): micro-batches shared out, gradients summed. The trained adapter, its Adam state
    and the phase's metrics equal the one-process phase's (float tolerance)."""
    from agilerl_core.arenas import build_arena

    over = {"algorithm": algorithm, "population_size": 1}
    if algorithm == "grpo":
        over["hyperparameters.micro_batch_size"] = 32  # 16 prompts x 8 completions: four micro-batches
    else:
        over["hyperparameters.micro_batch_size"] = 8
    one = build_arena(llm_config(data_dir, **over))
    two = build_arena(llm_config(data_dir, **{**over, "model.data_parallel": 2}))
    m1 = one.build_members([5])[0]
    m2 = two.member_from_state(*m1.state())
    r1 = one.train(m1, 0, seed=11, steps=256)
    r2 = two.train(m2, 0, seed=11, steps=256)
    t1, meta1 = m1.state()
    t2, meta2 = m2.state()
    assert t1.keys() == t2.keys() and meta1["adam_step"] == meta2["adam_step"] > 1
    for k in t1:
        torch.testing.assert_close(t1[k], t2[k], atol=1e-5, rtol=1e-4, msg=k)
    assert (r1.env_steps, r1.learn_steps) == (r2.env_steps, r2.learn_steps)
    for k, v in r1.metrics.items():
        assert r2.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert m2.parallel is None  # the parent keeps training in-process afterwards


def test_a_group_evaluates_with_every_adapter_in_one_batch_as_each_alone(data_dir):
    """Three members with other adapters (one of another rank): their greedy held-out completions generated
    together (each row through its own adapter, one base pass per chunk) score and read exactly as each
    member's own evaluation; the base's single slot is untouched afterwards."""
    evo = build_evolution(llm_config(data_dir, population_size=3, sample_completions=20,  # every held-out one
                                     **{"hyperparameters.max_new_tokens": 3,
                                        "hyperparameters.generation_batch_size": 8}))
    members = [m.agent for m in evo.population.members]
    g = torch.Generator().manual_seed(4)
    members[2].set_rank(8, 5)
    for m in members:  # adapters that change the completions (fresh ones keep the base's function)
        for n in m.adapter.names:
            m.adapter.b[n].data.normal_(0, 0.3, generator=g)
    arena = evo.arena
    clones = [m.clone() for m in members]
    alone = [arena.evaluate(c, 0) for c in clones]
    alone_samples = [c.samples for c in clones]
    assert evo.arena.batch_key(members[0]) == evo.arena.batch_key(members[2]) is not None
    together = arena.evaluate_group(members, 0, [0, 1, 2])
    assert together == alone
    assert [m.samples for m in members] == alone_samples
    texts = [[s["completion"] for s in m.samples] for m in members]
    assert texts[0] != texts[1]  # the rows really went through different adapters
    fresh = members[0].clone()
    for n in fresh.adapter.names:
        fresh.adapter.b[n].data.zero_()
    with fresh.base.reference() as model:  # the base alone is still the base: no adapter left bound
        ref = _logits_of(model, fresh)
    with fresh.base.bound(fresh.adapter) as model:
        torch.testing.assert_close(_logits_of(model, fresh), ref)
    assert "evaluation" in evo.batching_note()


def _logits_of(model, member):
    ids, mask = member.prompt_batch(member.base.encode(["1+2=", "3+4="], False))
    return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("algorithm", ["grpo", "reinforce", "llm_ppo", "dpo", "gspo", "cispo"])
def test_a_group_trains_in_shared_forwards_as_each_member_alone(data_dir, algorithm):
    """Three members with other adapters, ranks and hyperparameters (GRPO: temperature, group size, beta, update
    epochs; DPO: beta, NLL weight) train their phases as one group, every learn step's rows through one forward of
    the base (each row through its member's adapter, micro-batches cutting across members). Each member's samples
    (drawn from its own generator), metrics, adapter and Adam state equal its phase alone (float tolerance); the
    group's fitness equals each member's own."""
    over = {"algorithm": algorithm, "population_size": 3, "hyperparameters.micro_batch_size": 24}
    if algorithm != "dpo":
        over.update({"hyperparameters.max_new_tokens": 3, "hyperparameters.generation_batch_size": 40,
                     "hyperparameters.beta": 0.1})
    evo = build_evolution(llm_config(data_dir, **over))
    arena, members = evo.arena, [m.agent for m in evo.population.members]
    members[2].set_rank(8, 5)
    g = torch.Generator().manual_seed(4)
    for m in members:  # adapters that change the completions
        for n in m.adapter.names:
            m.adapter.b[n].data.normal_(0, 0.3, generator=g)
    if algorithm != "dpo":
        for m, (temp, size, beta, epochs) in zip(members, [(1.0, 8, 0.1, 1), (0.7, 5, 0.0, 2), (1.3, 8, 0.3, 1)], strict=True):
            m.hp.temperature, m.hp.group_size, m.hp.beta, m.hp.update_epochs = temp, size, beta, epochs
    else:
        for m, (beta, nll) in zip(members, [(0.5, 0.0), (0.1, 0.2), (1.0, 0.0)], strict=True):
            m.hp.beta, m.hp.nll_weight = beta, nll
    assert len({arena.batch_key(m) for m in members}) == 1
    alone = [m.clone() for m in members]
    seeds, budget = [11, 12, 13], 64 if algorithm == "dpo" else 200
    one_by_one = [arena.train(c, s, seed, budget) for s, (c, seed) in enumerate(zip(alone, seeds, strict=True))]
    together = arena.train_group(members, [0, 1, 2], seeds, budget)
    for a, t, ma, mt in zip(one_by_one, together, alone, members, strict=True):
        assert (a.env_steps, a.learn_steps) == (t.env_steps, t.learn_steps)
        for k, v in a.metrics.items():
            assert t.metrics[k] == pytest.approx(v, rel=1e-4, abs=1e-5), k
        (ta, meta_a), (tt, meta_t) = ma.state(), mt.state()
        assert meta_a["adam_step"] == meta_t["adam_step"] > 1
        for k in ta:
            # Adam divides by sqrt(v): a rounding-sized gradient difference shows as up to ~2e-5 in a weight
            torch.testing.assert_close(tt[k], ta[k], atol=5e-5, rtol=1e-4, msg=k)
    assert not torch.allclose(members[0].adapter.b["lm_head"], members[1].adapter.b["lm_head"][:, :4])
    assert arena.evaluate_group(members, 0, [0, 1, 2]) == [arena.evaluate(c, 0) for c in alone]
    assert "training and evaluation" in evo.batching_note()


# ---- crossover of adapters --------------------------------------------------------------------------------------
def test_a_crossover_child_takes_each_module_from_one_parent_and_the_lineage_names_both(data_dir, tmp_path):
    evo = build_evolution(llm_config(data_dir, population_size=3, **{
        "mutation": {"no_mutation": 0.0, "rl_hp": 0.0, "adapter_rank": 0.0, "adapter_crossover": 1.0}}))
    members = [m.agent for m in evo.population.members]
    g = torch.Generator().manual_seed(9)
    for m in members:  # parents whose modules differ
        for n in m.adapter.names:
            m.adapter.b[n].data.normal_(0, 0.3, generator=g)
    members[1].set_rank(8, 3)  # a second parent of another rank is brought to the child's first
    evo.arena.train(members[0], 0, 0, 64)  # Adam moments to keep
    child, other = members[0].clone(), members[1]
    before = {n: members[0].adapter.delta(n) for n in child.adapter.names}
    theirs = {n: other.adapter.shrunk(4).delta(n) for n in child.adapter.names}
    desc = child.crossover(other, np.random.default_rng(0))
    taken = [n for n in child.adapter.names if not torch.allclose(child.adapter.delta(n), before[n])]
    assert desc == f"crossover:{len(taken)}/{len(child.adapter.names)} modules" and 0 < len(taken) < 4
    for n in child.adapter.names:
        torch.testing.assert_close(child.adapter.delta(n), theirs[n] if n in taken else before[n])
    assert child.adapter.rank == 4
    step, moments = child._adam_state()
    kept = next(n for n in child.adapter.names if n not in taken)
    assert step > 0 and moments[f"{kept}.lora_A"][0].abs().sum() > 0 and moments[f"{taken[0]}.lora_B"][0].abs().sum() == 0
    # in a run: every non-elite child is a crossover of two members of the previous generation, both recorded
    for m in evo.population.members:
        m.fitness_history.append(0.5)
    evo.evolve()
    events = [e for e in evo.population.lineage if e.generation == 1 and e.slot > 0]
    assert events and all(e.mutation.startswith("crossover:") and e.other_parent_id is not None
                          and e.other_parent_id != e.parent_id for e in events)
    from tasks.reports import lineage_table, plot_family_tree

    table = lineage_table([e.to_dict() for e in evo.population.lineage])
    assert table["other_parent_id"][-1] == events[-1].other_parent_id
    assert plot_family_tree([e.to_dict() for e in evo.population.lineage], tmp_path / "tree.png").stat().st_size > 0
    evo.save(tmp_path / "pop")
    again = build_evolution(llm_config(data_dir, population_size=3))
    again.restore(tmp_path / "pop")
    assert [e.other_parent_id for e in again.population.lineage] == [e.other_parent_id for e in evo.population.lineage]
