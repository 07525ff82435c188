"""The population's one frozen base model, and how members borrow it.

The base is loaded and checked (a base is data: it never runs code) in :mod:`agilerl_core.llm.base_loading`;
its SHA-256 names it in every checkpoint, so a member is never loaded on another base. Its chat template is
rendered in a bounded sandbox (:mod:`agilerl_core.llm.chat_template`), never by transformers' own renderer.

peft injects one LoRA slot into the target modules. Whichever member works binds its own adapter tensors into
that slot (:meth:`SharedBase.bound`: a pointer swap, no copy), so the base exists once in memory whatever the
population size; the reference policy is the same model with the slot disabled (:meth:`SharedBase.reference`).
Several members run in one batch (:meth:`SharedBase.bound_many`): one base pass for every row, each member's
block of rows gaining its own LoRA term through batched matmuls over the members' stacked A and B.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from agilerl_core.errors import ConfigError
from agilerl_core.llm.adapter import LoraAdapter
from agilerl_core.llm.base_loading import chat_template_where, load_model_and_tokenizer
from agilerl_core.llm.chat_template import chat_prompt

SLOT = "member"  # the peft adapter name every member binds into


class GroupLora:
    """The LoRA terms of K members' adapters over one batch whose rows come in member blocks.

    A forward hook on every LoRA target adds, to each block's rows, ``scale * (x @ A.T) @ B.T`` of the block's
    member. Blocks of equal size (the usual case: members step on equal batches) take two batched matmuls over
    the members' A and B stacked (ranks zero-padded to the largest: a padded row of A and column of B add nothing
    and get no gradient); unequal blocks take one pair of matmuls per block. The stacks are rebuilt for each
    forward, so gradients reach every member's own tensors and an optimiser step is seen at the next call."""

    def __init__(self, adapters: list[LoraAdapter], base: SharedBase) -> None:
        self.adapters = adapters
        self.base = base
        self.rows: list[tuple[int, int]] | None = None
        self._stacks: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear(self) -> None:
        self.rows, self._stacks = None, {}

    def _stacked(self, name: str, members: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """(A [n, r, in], scale * B transposed [n, r, out]) of the `members`, ranks zero-padded to the largest."""
        key = (name, members)
        if key not in self._stacks:
            adapters = [self.adapters[i] for i in members]
            rank = max(a.rank for a in adapters)
            a = torch.stack([F.pad(ad.a[name], (0, 0, 0, rank - ad.rank)) for ad in adapters])
            b = torch.stack([F.pad(ad.b[name] * ad.scale, (0, rank - ad.rank)).T for ad in adapters])
            self._stacks[key] = (a, b)
        return self._stacks[key]

    def added(self, name: str, x: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """`output` (the base module's, rows in member blocks) plus each block's LoRA term of input `x`."""
        rows = self.rows
        if rows is None:
            raise RuntimeError("a forward through several members' adapters needs rows=[(member, count), ...]")
        members = tuple(i for i, _ in rows)
        x = x.to(self.adapters[0].a[name].dtype)
        if len(rows) > 1 and len({c for _, c in rows}) == 1:
            a, b = self._stacked(name, members)
            k = len(members)
            xa = torch.bmm(x.reshape(k, -1, x.shape[-1]), a.transpose(1, 2))
            out = torch.baddbmm(output.reshape(k, -1, output.shape[-1]), xa.to(b.dtype), b.to(output.dtype)
                                if output.dtype != b.dtype else b)
            return out.reshape(output.shape)
        parts, start = [], 0
        for i, count in rows:
            ad = self.adapters[i]
            lora = (x[start:start + count] @ ad.a[name].T) @ ad.b[name].T * ad.scale
            parts.append(lora.to(output.dtype))
            start += count
        return output + (parts[0] if len(parts) == 1 else torch.cat(parts))

    def hook(self, name: str):
        def add_lora(module, args, output):
            if self.base._reference:  # the reference policy: the base alone
                return None
            return self.added(name, args[0], output)
        return add_lora


class MemberRows:
    """A model for :meth:`SharedBase.bound_many`: ``model(..., rows=[(member, count), ...])`` runs each block of
    rows through its member's adapter (the rows are ignored when one adapter is bound)."""

    def __init__(self, model: Any, lora: GroupLora | None) -> None:
        self.model = model
        self.lora = lora

    def __call__(self, *args: Any, rows: list[tuple[int, int]] | None = None, **kwargs: Any) -> Any:
        if self.lora is None:
            return self.model(*args, **kwargs)
        if rows is None or sum(c for _, c in rows) != kwargs["input_ids"].shape[0]:
            raise ValueError(f"rows {rows} must cover the batch's {kwargs['input_ids'].shape[0]} rows in member blocks")
        self.lora.rows, self.lora._stacks = rows, {}
        try:
            return self.model(*args, **kwargs)
        finally:
            self.lora.rows, self.lora._stacks = None, {}


class SharedBase:
    """One frozen causal LM with a LoRA slot that members' adapters are bound into in turn."""

    def __init__(self, model: Any, tokenizer: Any, sha256: str, source: dict[str, Any], targets: list[str] | None,
                 device: str, field: str = "model") -> None:
        from peft import LoraConfig, get_peft_model
        from peft.tuners.lora import LoraLayer

        for p in model.parameters():
            p.requires_grad_(False)
        targets_field = "model.lora.targets" if field == "model" else f"{field}.targets"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # peft's note that GPT-2's Conv1D needs fan_in_fan_out (it sets it)
                self.model = get_peft_model(model, LoraConfig(r=1, lora_alpha=1, lora_dropout=0.0,
                                                              target_modules=targets), adapter_name=SLOT)
        except ValueError as err:
            raise ConfigError(f"{targets_field}: {str(err)[:300]}") from None
        self.model.eval()
        self.tokenizer = tokenizer
        self.sha256 = sha256
        self.source = source
        self.device = device
        self.field = field  # model (a config's base) or agent.base (a checkpoint's): what refusals name
        self._template_where: str | None = None
        prefix = "base_model.model."
        self.layers = {n.removeprefix(prefix): m for n, m in self.model.named_modules() if isinstance(m, LoraLayer)}
        if not self.layers:
            raise ConfigError(f"{targets_field}: no module of the model matched; name its linear layers "
                              f"(e.g. q_proj, v_proj for Llama, c_attn for GPT-2)")
        for n, m in self.layers.items():
            if SLOT not in getattr(m, "lora_A", {}):
                kind = type(m.get_base_layer()).__name__
                raise ConfigError(f"{targets_field}: {n} is a {kind}, not a linear layer; a member's LoRA adapter "
                                  f"adapts linear layers (e.g. q_proj, v_proj for Llama, c_attn for GPT-2)")
        self.shapes = {n: (m.in_features, m.out_features) for n, m in self.layers.items()}
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self._lock = threading.RLock()
        self._empty = {n: (m.lora_A[SLOT].weight, m.lora_B[SLOT].weight) for n, m in self.layers.items()}
        for pair in self._empty.values():  # the unbound slot (B = 0) takes no gradient
            for p in pair:
                p.requires_grad_(False)
        self._reference = 0  # > 0 while the reference policy runs: a group's LoRA terms stay out

    @classmethod
    def load(cls, spec: Any, device: str, field: str = "model") -> SharedBase:
        model, tokenizer, sha, source = load_model_and_tokenizer(spec, device, field)
        return cls(model, tokenizer, sha, source, spec.lora.targets, device, field)

    def describe(self) -> dict[str, Any]:
        """What a checkpoint records about the base (the member is refused on any other)."""
        return {**self.source, "sha256": self.sha256, "model_type": self.model.config.model_type}

    def base_param_count(self) -> int:
        return sum(p.numel() for n, p in self.model.named_parameters() if "lora_" not in n)

    @contextlib.contextmanager
    def bound(self, adapter: LoraAdapter):
        """The model with `adapter` in its LoRA slot (one member at a time: other threads wait)."""
        with self._lock:
            for n, layer in self.layers.items():
                layer.lora_A[SLOT].weight = adapter.a[n]
                layer.lora_B[SLOT].weight = adapter.b[n]
                layer.scaling[SLOT] = adapter.scale
            try:
                yield self.model
            finally:  # never keep a member's tensors alive through the base
                for n, layer in self.layers.items():
                    layer.lora_A[SLOT].weight, layer.lora_B[SLOT].weight = self._empty[n]

    @contextlib.contextmanager
    def bound_many(self, adapters: list[LoraAdapter]):
        """A model that runs a batch whose rows come in member blocks, each block through its own member's
        adapter, in one forward of the base: call it with ``rows=[(member, row count), ...]`` (members index
        `adapters`, blocks in row order; :func:`~agilerl_core.llm.sampling.sample` and
        :func:`~agilerl_core.llm.sampling.completion_logprobs` pass it on). One adapter binds into the LoRA
        slot as :meth:`bound` does (`rows` is then ignored); several add their LoRA terms as batched matmuls
        over their stacked A and B (:class:`GroupLora`), differentiable to every member's own tensors."""
        if len(adapters) == 1:
            with self.bound(adapters[0]) as model:
                yield MemberRows(model, None)
            return
        with self._lock, self._slot_off():  # the members' terms come from the hooks alone
            lora = GroupLora(adapters, self)
            hooks = [layer.register_forward_hook(lora.hook(name)) for name, layer in self.layers.items()]
            try:
                yield MemberRows(self.model, lora)
            finally:  # never keep the members' tensors alive through the base
                for h in hooks:
                    h.remove()
                lora.clear()

    @contextlib.contextmanager
    def _slot_off(self):
        """peft's LoRA slot switched off in every target (the base layers alone). peft's own switch
        (``disable_adapter``) also flips the slot tensors' ``requires_grad`` and back on only for the active
        slot; this sets the layers' flag alone, so every member's tensors keep theirs."""
        before = {name: layer._disable_adapters for name, layer in self.layers.items()}
        for layer in self.layers.values():
            layer._disable_adapters = True
        try:
            yield
        finally:
            for name, layer in self.layers.items():
                layer._disable_adapters = before[name]

    @contextlib.contextmanager
    def reference(self):
        """The base model alone (no member's LoRA term): the reference policy (inside :meth:`bound` and
        :meth:`bound_many` too)."""
        with self._lock, self._slot_off():
            self._reference += 1
            try:
                yield self.model
            finally:
                self._reference -= 1

    def encode(self, texts: list[str], chat_template: bool) -> list[list[int]]:
        """Token ids of prompts (through the tokenizer's chat template when `chat_template`: rendered in a bounded
        sandbox, :mod:`agilerl_core.llm.chat_template`; a template past its bounds is a ConfigError naming the
        model folder's file and field)."""
        tok = self.tokenizer
        if chat_template:
            where = self.template_where()
            return [chat_prompt(tok, t, where) for t in texts]
        return [tok.encode(t, add_special_tokens=False) for t in texts]

    def template_where(self) -> str:
        """The file and field the tokenizer's chat template came from (what a refusal names), e.g.
        ``agent.base.path '/models/x': tokenizer_config.json: field chat_template``."""
        if self._template_where is None:  # the folder as it was loaded (looked at once)
            self._template_where = chat_template_where(self.source, self.field)
        return self._template_where

    def decode(self, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True)
                for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]
