"""Trust, third round (issue 49, cases 5 and 8): a model folder's chat template is data, rendered within bounds;
an LLM member's checkpoint is checked tensor by tensor and field by field before anything is built from it.

Every model here is a tiny GPT-2 built from a config (or saved from one) with a character-level tokenizer; the
attacks on the template run in a subprocess (a refusal that came too late would cost gigabytes there, not here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import agilerl_core
from agilerl_core.config import LLMModelConfig
from agilerl_core.errors import AgileRLError, CheckpointError, ConfigError
from agilerl_core.experiment import build_evolution
from agilerl_core.io.digest import sha256_file
from agilerl_core.llm.base_loading import load_model_and_tokenizer
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.chat_template import render
from tests.test_chat_templates import QWEN25
from tests.test_llm import TINY_MODEL, llm_config

ROOT = Path(__file__).resolve().parents[1]
TARGETS = TINY_MODEL["lora"]["targets"]
WHERE = "tokenizer_config.json: field chat_template"

# ---- case 5: a model folder's chat template renders within bounds --------------------------------------------
@pytest.fixture(scope="module")
def saved_elite(tmp_path_factory):
    """A saved LLM elite (tiny GPT-2 built from a config), and a model folder holding that same base saved with
    save_pretrained (so the elite's adapter fits a base read from the folder)."""
    tmp = tmp_path_factory.mktemp("llm-round3")
    data = tmp / "data"
    data.mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": "7"} for a in range(10) for b in range(10)]
    (data / "const.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evo = build_evolution(llm_config(data, population_size=1))
    evo.population.record_fitness([0.5])
    elite = evo.save_elite(tmp / "elite")
    spec = LLMModelConfig(dtype="float32", config=TINY_MODEL["config"], tokenizer_chars=TINY_MODEL["tokenizer_chars"],
                          lora={"targets": TARGETS, "rank": 1})
    model, tok, _, _ = load_model_and_tokenizer(spec, "cpu")
    folder = tmp / "hf"
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return elite, folder


def _folder_with_template(folder: Path, dest: Path, template: str) -> Path:
    """A copy of `folder` whose tokenizer_config.json holds `template` (no chat_template.jinja beside it)."""
    d = Path(shutil.copytree(folder, dest))
    (d / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def _elite_on_folder(elite: Path, folder: Path, dest: Path) -> Path:
    """A copy of `elite` whose recorded base is `folder` (its own hash) and whose prompts go through the chat
    template: what a checkpoint shipped with a model folder beside it can say."""
    e = Path(shutil.copytree(elite, dest))
    sha = load_model_and_tokenizer(LLMModelConfig(path=str(folder), dtype="float32", lora={"targets": TARGETS}),
                                   "cpu")[2]
    meta = json.loads((e / "member.json").read_text())
    base = meta["agent"]["base"]
    for key in ("config", "tokenizer_chars", "init_seed"):
        base.pop(key, None)
    base.update(path=str(folder), gguf_file=None, sha256=sha)
    meta["env"]["chat_template"] = True
    (e / "member.json").write_text(json.dumps(meta))
    return e


_PROBE = textwrap.dedent("""\
    import json, resource, sys, time
    def peak_mb():
        # VmHWM (KiB): this process's own peak; ru_maxrss would keep the forking parent's over exec
        return int([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]) / 1024
    import agilerl_core
    from agilerl_core.config import LLMModelConfig
    from agilerl_core.errors import AgileRLError
    from agilerl_core.llm.base_model import SharedBase
    results = {}
    for name, mode, target in json.loads(sys.argv[1]):
        if mode == "encode":  # SharedBase.encode of a base read from the folder
            base = SharedBase.load(LLMModelConfig(path=target, dtype="float32", lora={"targets": ["c_attn"]}), "cpu")
            base.encode(["1+2="], False)
            call = lambda: base.encode(["1+2="], True)
        else:  # a checkpoint naming the folder: agilerl_core.load, then generate
            policy = agilerl_core.load(target)
            call = lambda: policy.generate("1+2=", max_new_tokens=1)
        before = peak_mb()  # the peak so far: imports, the base, earlier attacks (each one checked in turn)
        start = time.perf_counter()
        try:
            call()
            error = None
        except AgileRLError as err:
            error = f"{type(err).__name__}: {err}"
        results[name] = {"error": error, "seconds": time.perf_counter() - start, "peak_mb": peak_mb(),
                         "growth_mb": peak_mb() - before}
    print(json.dumps(results))
    """)

ATTACKS = {
    "the issue's": "{{ 'ab' * 1000000000 }}",
    "nested loops": "{% for i in range(20000) %}{% for j in range(20000) %}{{ i }}{% endfor %}{% endfor %}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                "{{ ns.s }}",
    "macro bomb": "{% macro d(n) %}{% if n %}{{ d(n - 1) }}{{ d(n - 1) }}{% else %}ab{% endif %}{% endmacro %}"
                  "{{ d(40) }}",
    "padding": "{{ 'a'|center(2000000000) }}{{ '%2000000000s' % 'a' }}",
    "method": "{{ 'a'.ljust(2000000000) }}",
}
CHECKPOINT = "a checkpoint naming the folder"


@pytest.fixture(scope="module")
def probed(saved_elite, tmp_path_factory):
    """Every attack tried in one subprocess (each through its own folder; the issue's also through a checkpoint
    naming its folder): {name: (the folder, what the probe measured)}."""
    elite, folder = saved_elite
    tmp = tmp_path_factory.mktemp("attacks")
    runs, folders = [], {}
    for i, (name, template) in enumerate(ATTACKS.items()):
        folders[name] = _folder_with_template(folder, tmp / f"evil{i}", template)
        runs.append((name, "encode", str(folders[name])))
    folders[CHECKPOINT] = folders["the issue's"]
    runs.append((CHECKPOINT, "load", str(_elite_on_folder(elite, folders[CHECKPOINT], tmp / "elite"))))
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(runs)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: (folders[name], results[name]) for name in folders}


def _bounded(result: dict, label: str) -> None:
    """Refused naming the folder's file and field, in under 10 s, with under 500 MB more memory at its peak."""
    assert result["error"] is not None and "ConfigError: " in result["error"], result
    assert label in result["error"] and WHERE in result["error"], result["error"]
    assert "the chat template " in result["error"], result["error"]
    assert result["seconds"] < 10, result
    assert result["growth_mb"] < 500, result
    print(f"{label}{result['seconds']:.3f} s, peak RSS {result['peak_mb']:.0f} MB (+{result['growth_mb']:.1f} MB)")


@pytest.mark.parametrize("name", list(ATTACKS))
def test_the_issue_attack_a_folders_chat_template_is_refused_within_bounds(probed, name):
    """SharedBase.encode of a base read from a folder whose tokenizer_config.json holds the template."""
    folder, result = probed[name]
    _bounded(result, f"model.path '{folder}': ")


def test_the_issue_attack_a_checkpoint_naming_a_folder_with_such_a_template_is_refused(probed, saved_elite,
                                                                                       tmp_path):
    """A checkpoint alone: its agent.base.path names the folder shipped beside it, env.chat_template is on."""
    folder, result = probed[CHECKPOINT]
    _bounded(result, f"agent.base.path '{folder}': ")
    # the same checkpoint on a folder with a genuine template: loads and generates
    elite, folder = saved_elite
    good = _folder_with_template(folder, tmp_path / "good", "{{ messages[0]['content'] }}")
    policy = agilerl_core.load(_elite_on_folder(elite, good, tmp_path / "good-elite"))
    assert isinstance(policy.generate("1+2=", max_new_tokens=1), str)


def test_shared_base_encode_matches_apply_chat_template_and_names_the_folder_file(saved_elite, tmp_path):
    _, folder = saved_elite
    good = _folder_with_template(folder, tmp_path / "good", QWEN25)
    base = SharedBase.load(LLMModelConfig(path=str(good), dtype="float32", lora={"targets": ["c_attn"]}), "cpu")
    texts = ["1+2=", "9+9="]
    want = [list(base.tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)) for t in texts]
    assert base.encode(texts, True) == want
    assert base.template_where() == f"model.path '{good}': {WHERE}"
    # a template saved as chat_template.jinja (transformers reads it first) is named as that file
    jinja = Path(shutil.copytree(good, tmp_path / "jinja"))
    (jinja / "chat_template.jinja").write_text("{{ raise_exception('no user messages here') }}")
    base = SharedBase.load(LLMModelConfig(path=str(jinja), dtype="float32", lora={"targets": ["c_attn"]}), "cpu")
    with pytest.raises(ConfigError, match=r"^model\.path '.*jinja': chat_template\.jinja: the chat template cannot "
                                          r"render a user message \(TemplateError: 'no user messages here'\)"):
        base.encode(texts, True)


@pytest.mark.parametrize("template, message", [
    ("{% for %}", r"not a Jinja template this sandbox compiles \(TemplateSyntaxError"),
    ("x" * 300_000, r"300,000 characters, over the 262,144 a chat template may have"),
    ("{{ 'abc'.translate({97: 'x' * 1000}) }}", r"calls str\.translate\(\), which a chat template may not call"),
    ("{{ (7).to_bytes(10 ** 9, 'big') }}", r"calls int\.to_bytes\(\), which a chat template may not call"),
    ("{{ lipsum(10 ** 6) }}", r"calls lipsum for more text"),
    ("{{ [[1]] * 10 ** 9 }}", r"builds the result of '\*' of more than"),
    ("{{ '{:>2000000000}'.format(1) }}", r"formats with a width or precision of '2000000000'"),
    ("{{ 'a'|indent(10 ** 9) }}{{ ('a\n' * 100000)|indent(100) }}", r"builds an indent result of more than"),
    ("{{ 'aaaa'|replace('', 'b' * 999999) }}", r"builds a replace result of more than"),
    ("{{ (range(100000)|list|map('string')|list)|sum(start=[]) }}", r"builds the output of filter 'list'|sums with"),
    ("{{ [[1], [2]]|sum(start=[]) }}", r"sums with a start that is not a number"),
    ("{{ 2 ** 100000 }}", r"raises an integer to a power of more than 65,536 bits"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", r"cannot render a user message \(RecursionError"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", r"builds an output of more than|more than .* in all"),
    ("{{ 'x'|urlize }}", r"uses the filter 'urlize'"),
    ("{{ ['a']|map('center', 2000000000)|list }}", r"builds a center result of more than"),
    ("{{ '{0:{1}}'.format('a', 2000000000) }}", r"formats with a nested field in a format spec"),
    ("{{ ('ab' * 500000)|wordwrap(1) }}", r"builds a wordwrap result of more than"),
    ("{{ 2 ** 70000 }}{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
     r"raises an integer to a power of more than"),
    ("{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
     r"multiplies integers into one of more than 65,536 bits"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s|replace('a', ns.s) %}{% endfor %}",
     r"builds a replace result of more than"),
])
def test_each_way_past_the_bounds_is_refused_naming_the_field(template, message):
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"^{WHERE}: .*{message}"):
        render(template, WHERE, messages=[{"role": "user", "content": "1+2="}], add_generation_prompt=True)
    assert time.perf_counter() - start < 10


# ---- case 8: an LLM member's checkpoint is checked before anything is built ---------------------------------
def _tampered(elite: Path, dest: Path, meta_change=None, tensors_change=None) -> Path:
    """A copy of `elite` with member.json's agent meta and/or its tensors changed (the weights' recorded hash
    updated: the forger controls every byte)."""
    e = Path(shutil.copytree(elite, dest))
    meta = json.loads((e / "member.json").read_text())
    if tensors_change is not None:
        tensors = load_file(str(e / "weights.safetensors"))
        tensors_change(tensors)
        save_file(tensors, str(e / "weights.safetensors"))
        meta["files"]["weights.safetensors"] = sha256_file(e / "weights.safetensors")
    if meta_change is not None:
        meta_change(meta["agent"])
    (e / "member.json").write_text(json.dumps(meta))
    return e


A = "adapter.transformer.h.0.attn.c_attn.lora_A"
B = "adapter.transformer.h.0.attn.c_attn.lora_B"


def test_the_issue_attack_an_adapter_tensor_of_the_wrong_input_size_is_refused_naming_it(saved_elite, tmp_path):
    elite, _ = saved_elite
    policy = agilerl_core.load(elite)
    assert isinstance(policy.generate("1+2=", max_new_tokens=1), str)  # as saved: loads and generates
    rank, fan_in = load_file(str(elite / "weights.safetensors"))[A].shape

    def wider(t):
        t[A] = torch.randn(rank, fan_in + 3)
    bad = _tampered(elite, tmp_path / "wider", tensors_change=wider)
    with pytest.raises(CheckpointError, match=rf"^weights\.safetensors: tensor {A} has shape \({rank}, {fan_in + 3}\), "
                                              rf"but the base's LoRA target .*needs \({rank}, {fan_in}\)"):
        agilerl_core.load(bad)


@pytest.mark.parametrize("value", ['"nan"', '"1e999"', "NaN", "Infinity", "1e999", "-1", "0", "1e6", "true", "null",
                                   '"2"'])
def test_the_issue_attack_a_non_finite_or_absurd_scale_is_refused(saved_elite, tmp_path, value):
    elite, _ = saved_elite
    bad = Path(shutil.copytree(elite, tmp_path / "scale"))
    text = (bad / "member.json").read_text()
    meta = json.loads(text)
    meta["agent"]["scale"] = "__SCALE__"
    (bad / "member.json").write_text(json.dumps(meta).replace('"__SCALE__"', value))
    with pytest.raises(CheckpointError, match=r"member\.json: (field agent\.scale is .*, not a finite number in "
                                              r"\(0, 10000\]|.*scale)"):
        agilerl_core.load(bad)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.__setitem__(A, torch.full_like(t[A], float("nan"))), rf"tensor '?{A}'? holds .* non-finite|NaN"),
    (lambda t: t.__setitem__(B, t[B][:, :-1].contiguous()), rf"tensor {B} has shape"),
    (lambda t: t.__setitem__(A, t[A].to(torch.int32)), rf"tensor {A} is torch\.int32, not floating point"),
    (lambda t: t.pop(B), rf"tensor {B} is missing"),
    (lambda t: t.__setitem__("adapter.transformer.h.0.attn.c_attn.lora_C", torch.zeros(1)),
     r"tensor 'adapter\.transformer\.h\.0\.attn\.c_attn\.lora_C' is not one of this grpo member's"),
    (lambda t: t.__setitem__("adam.exp_avg." + A[len("adapter."):], torch.zeros(1)),
     r"tensor 'adam\.exp_avg\..*' is not one of this grpo member's .* Adam moments when agent\.adam_step > 0"),
])
def test_every_adapter_tensor_is_checked_for_shape_dtype_and_finiteness(saved_elite, tmp_path, change, message):
    elite, _ = saved_elite
    bad = _tampered(elite, tmp_path / "bad", tensors_change=change)
    with pytest.raises(CheckpointError, match=rf"weights\.safetensors: .*{message}"):
        agilerl_core.load(bad)


def test_the_rank_and_counters_are_checked_against_the_tensors(saved_elite, tmp_path):
    elite, _ = saved_elite
    for i, (key, value, message) in enumerate([
            ("rank", 5, r"tensor adapter\..*\.lora_A has shape \(4, 32\), but .* at rank 5: rank x in_features "
                         r"needs \(5, 32\)"),
            ("rank", "4", r"member\.json: field agent\.rank is '4', not a whole number"),
            ("rank", 10**9, r"member\.json: field agent\.rank is 1,000,000,000, outside \[1, 65,536\]"),
            ("adam_step", -1, r"member\.json: field agent\.adam_step is -1, outside \[0, "),
            ("learn_steps", 1.5, r"member\.json: field agent\.learn_steps is 1\.5, not a whole number"),
            ("train_metrics", {"loss": "x"}, r"member\.json: field agent\.train_metrics is .*not an object of numbers"),
            ("samples", "x", r"member\.json: field agent\.samples is 'x', not a list of objects"),
            ("hp", {"lr": -1}, r"member\.json: field agent\.hp does not hold grpo's hyperparameters"),
            ("hp", None, r"member\.json: field agent\.hp does not hold grpo's hyperparameters")]):
        bad = _tampered(elite, tmp_path / str(i), meta_change=lambda m, k=key, v=value: m.__setitem__(k, v))
        with pytest.raises(CheckpointError, match=message):
            agilerl_core.load(bad)


def test_adam_moments_are_checked_when_the_member_has_stepped(saved_elite, tmp_path):
    elite, _ = saved_elite
    names = [k[len("adapter."):] for k in load_file(str(elite / "weights.safetensors")) if k.startswith("adapter.")]

    def moments(t, bad=None):
        for n in names:
            for part in ("exp_avg", "exp_avg_sq"):
                t[f"adam.{part}.{n}"] = torch.full_like(t[f"adapter.{n}"], 1e-3)
        if bad is not None:
            bad(t)

    def step(m):
        m["adam_step"] = 3
    good = _tampered(elite, tmp_path / "good", step, moments)
    policy = agilerl_core.load(good)  # a stepped member: loads, with its moments
    assert isinstance(policy.generate("1+2=", max_new_tokens=1), str)
    sq = "adam.exp_avg_sq." + A[len("adapter."):]
    for i, (bad, message) in enumerate([
            (lambda t: t.__setitem__(sq, -t[sq]), rf"tensor {sq} holds negative second moments"),
            (lambda t: t.__setitem__(sq, t[sq][:1].contiguous()), rf"tensor {sq} has shape"),
            (lambda t: t.pop(sq), rf"tensor {sq} is missing \(Adam's moment of"),
            (lambda t: t.__setitem__(sq, torch.full_like(t[sq], float("inf"))), r"non-finite|NaN or infinite")]):
        forged = _tampered(elite, tmp_path / str(i), step, lambda t, b=bad: moments(t, b))
        with pytest.raises(CheckpointError, match=rf"weights\.safetensors: .*{message}"):
            agilerl_core.load(forged)


def test_from_state_checks_tensors_itself_and_heads_too(saved_elite):
    """from_state (what a run resuming its own members calls too) checks every tensor itself, finiteness included,
    and an LLM-PPO value head of the wrong shape is refused naming it."""
    from agilerl_core.llm.ppo import LLMPPO

    elite, _ = saved_elite
    policy = agilerl_core.load(elite)
    agent = policy.agent
    tensors, meta = agent.state()
    tensors = {k: v.clone() for k, v in tensors.items()}
    tensors[A][0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=rf"^weights\.safetensors: tensor {A} holds 1 NaN or infinite value"):
        type(agent).from_state(agent.base, tensors, json.loads(json.dumps(meta)))
    ppo = LLMPPO.create(agent.base, LLMPPO.hp_model(), 2, 4.0, 0)
    tensors, meta = ppo.state()
    tensors["head.value.weight"] = tensors["head.value.weight"][:-1]
    with pytest.raises(CheckpointError, match=r"tensor head\.value\.weight has shape \(31,\), but the llm_ppo member's "
                                              r"head tensors needs \(32,\)"):
        LLMPPO.from_state(agent.base, tensors, json.loads(json.dumps(meta)))


# ---- the fuzz: any field of an LLM member's record loads (and generates) or names the field --------------------
_HUGE = "1" + "0" * 5000
REPLACEMENTS = ["null", '"x"', _HUGE, "1e400", "Infinity", "-Infinity", "NaN", "-1", "0", "1.5", "12000", '"nan"',
                "[" * 100 + "]" * 100, "[]", "{}", '{"a": [1, 2]}', "true", '["x"]', '"1e999"', "DELETE"]
_MARK = "__mutated_leaf__"


def _leaves(data, path=()):
    if isinstance(data, dict) and data:
        for k, v in data.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(data, list) and data:
        for i, v in enumerate(data):
            yield from _leaves(v, (*path, i))
    else:
        yield path


def _mutated(original: dict, path: tuple, replacement: str) -> str:
    data = json.loads(json.dumps(original))
    parent = data
    for p in path[:-1]:
        parent = parent[p]
    if replacement == "DELETE":
        del parent[path[-1]]
        return json.dumps(data)
    parent[path[-1]] = _MARK
    return json.dumps(data).replace(f'"{_MARK}"', replacement)


def test_every_field_of_an_llm_member_loads_and_generates_or_names_the_field(saved_elite, tmp_path):
    """Every leaf of member.json's agent and env once (the replacement rotating through the list), then
    hypothesis' picks: agilerl_core.load either loads a member that generates, or raises the project's error."""
    elite, _ = saved_elite
    copy = Path(shutil.copytree(elite, tmp_path / "fuzz"))
    file = copy / "member.json"
    original = json.loads(file.read_text())
    leaves = [p for p in _leaves(original) if p and p[0] in ("agent", "env")]
    assert len(leaves) >= 20
    start = time.perf_counter()

    def attempt(path: tuple, replacement: str) -> None:
        file.write_text(_mutated(original, path, replacement))
        try:
            policy = agilerl_core.load(copy)
            policy.generate("1+2=", max_new_tokens=1)
        except AgileRLError:
            pass
        except Exception as err:  # the point of the test: nothing but our errors
            raise AssertionError(f"member.json {'.'.join(map(str, path))} = {replacement[:20]}: "
                                 f"{type(err).__name__}: {err}") from err
        finally:
            file.write_text(json.dumps(original))

    fields = {}
    for path in leaves:
        fields.setdefault(tuple("#" if isinstance(p, int) and p > 0 else p for p in path), path)
    for i, path in enumerate(fields.values()):
        attempt(path, REPLACEMENTS[i % len(REPLACEMENTS)])

    @settings(max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(leaves) - 1), st.sampled_from(REPLACEMENTS))
    def check(index, replacement):
        attempt(leaves[index], replacement)

    check()
    print(f"fuzz: {len(fields)} fields + 30 examples in {time.perf_counter() - start:.1f} s")
