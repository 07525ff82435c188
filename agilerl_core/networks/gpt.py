"""An evolvable GPT (decoder-only transformer) for character-level language agents.

Architecture mutations act on :class:`GPTSpec` (pure data); :meth:`EvolvableGPT.rebuilt` turns a new spec into a
network that keeps every weight that still exists, and growth (a layer, a head, MLP units) keeps the function
exactly: what is added writes into the residual stream through zero output weights. The attention width is
``n_head * head_dim``, independent of ``n_embd``, so a head can be added without touching the stream's width.

A population's members each run their own forward (see ``agilerl_core.language.agent.group_outputs``
for why: a batched pass over stacked parameters measured no faster on CPU at these sizes).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from agilerl_core.networks.transfer import overlap_slices

_LIMIT_OF = {"vocab_size": "discrete_n", "block_size": "space_elements", "n_layer": "layer_count",
             "n_embd": "layer_width", "n_head": "layer_width", "head_dim": "layer_width", "mlp_hidden": "layer_width"}
_FIXED = ("vocab_size", "block_size", "n_embd", "head_dim")  # never mutated: the rebuild would lose the function
_ZERO_GROWN = (".attn_out.", ".mlp_out.")  # output projections into the residual stream: what grows there is zero


@dataclass(frozen=True)
class GPTSpec:
    """Architecture of an :class:`EvolvableGPT`."""

    vocab_size: int  # tokens the embedding reads and the head scores
    block_size: int  # longest context (learned positions)
    n_layer: int  # transformer blocks
    n_embd: int  # width of the residual stream
    n_head: int  # attention heads per block
    head_dim: int  # width of one head (attention width = n_head * head_dim)
    mlp_hidden: int  # hidden units of each block's MLP

    @property
    def attn_width(self) -> int:
        return self.n_head * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: object, where: str = "arch", error: type[Exception] = ValueError) -> GPTSpec:
        """A spec from untrusted JSON: every field a whole positive number within the limits table, and the total
        parameter count (from the data, before anything is allocated) within ``limits.network_params``."""
        from agilerl_core.errors import AgileRLError
        from agilerl_core.limits import check

        def num(value: object, at: str, limit: str) -> int:
            try:
                if issubclass(error, AgileRLError):
                    return check(limit, value, f"{where}.{at}", error)
                return check(limit, value, f"{where}.{at}")
            except AgileRLError as e:
                if isinstance(e, error):
                    raise
                raise error(str(e)) from None

        if not isinstance(d, dict):
            raise error(f"{where}: expected an object, found {type(d).__name__}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(map(str, d)) - set(names))
        missing = [n for n in names if n not in d]
        if unknown or missing:
            raise error(f"{where}: unknown fields {unknown}, missing fields {missing}; a GPT arch has exactly {names}")
        values = {}
        for n in names:
            v = d[n]
            if isinstance(v, bool) or not isinstance(v, int):
                raise error(f"{where}.{n}: expected a whole number, found {type(v).__name__} {v!r}")
            if v < 1:
                raise error(f"{where}.{n}: {v} must be at least 1")
            values[n] = num(v, n, _LIMIT_OF[n])
        spec = cls(**values)
        num(spec.attn_width, "n_head*head_dim (attention width)", "layer_width")
        num(spec.param_count(), "(parameters counted from the arch)", "network_params")
        return spec

    def param_count(self) -> int:
        """Parameters an :class:`EvolvableGPT` of this spec holds, from the data alone."""
        e, a, m, v = self.n_embd, self.attn_width, self.mlp_hidden, self.vocab_size
        block = 2 * e + (e * 3 * a + 3 * a) + (a * e + e) + 2 * e + (e * m + m) + (m * e + e)
        return (v + self.block_size) * e + self.n_layer * block + 2 * e + (e * v + v)

    def describe(self) -> str:
        return f"gpt L{self.n_layer} E{self.n_embd} H{self.n_head}x{self.head_dim} M{self.mlp_hidden}"


@dataclass(frozen=True)
class GPTBounds:
    """Limits every GPT architecture mutation respects."""

    min_layers: int = 1  # fewest blocks
    max_layers: int = 8  # most blocks
    min_heads: int = 1  # fewest attention heads per block
    max_heads: int = 8  # most attention heads per block
    min_mlp_hidden: int = 32  # narrowest block MLP
    max_mlp_hidden: int = 1024  # widest block MLP
    mlp_step: int = 32  # units one MLP mutation adds or removes


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        e, a = spec.n_embd, spec.attn_width
        self.n_head, self.head_dim = spec.n_head, spec.head_dim
        self.ln1, self.ln2 = nn.LayerNorm(e), nn.LayerNorm(e)
        self.qkv = nn.Linear(e, 3 * a)  # rows [q | k | v], each head_dim rows per head in head order
        self.attn_out = nn.Linear(a, e)
        self.mlp_in = nn.Linear(e, spec.mlp_hidden)
        self.mlp_out = nn.Linear(spec.mlp_hidden, e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(y.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.ln2(x))))


class EvolvableGPT(nn.Module):
    """GPT-2-style decoder (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): token and
    position embeddings, pre-LN blocks, final LN, untied ``lm_head``.

    There is no padding mask: sequences are right-padded and the caller masks the loss; attention is causal, so
    padding at the end never changes the outputs at earlier positions."""

    def __init__(self, spec: GPTSpec, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.wte = nn.Embedding(spec.vocab_size, spec.n_embd)
        self.wpe = nn.Embedding(spec.block_size, spec.n_embd)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layer))
        self.ln_f = nn.LayerNorm(spec.n_embd)
        self.lm_head = nn.Linear(spec.n_embd, spec.vocab_size)
        self._init(generator)

    @torch.no_grad()
    def _init(self, generator: torch.Generator | None) -> None:
        """Normal(0, 0.02) weights (residual output projections scaled by 1/sqrt(2 n_layer)), zero biases,
        LayerNorms at identity; drawn in module order from `generator` (reproducible)."""
        for name, p in self.named_parameters():
            if ".ln" in f".{name}":  # LayerNorms: identity
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                std = 0.02 / math.sqrt(2 * self.spec.n_layer) if any(z in name for z in _ZERO_GROWN) else 0.02
                p.normal_(0.0, std, generator=generator)

    def _check_len(self, t: int) -> None:
        if t > self.spec.block_size:
            raise ValueError(f"sequence length {t} is over the context length block_size = {self.spec.block_size}")

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Final-LayerNorm features [B, T, n_embd] of token ids `idx` [B, T]."""
        self._check_len(idx.shape[-1])
        x = self.wte(idx) + self.wpe.weight[: idx.shape[-1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, T, vocab_size] of token ids `idx` [B, T]."""
        return self.lm_head(self.hidden(idx))

    @torch.no_grad()
    def rebuilt(self, spec: GPTSpec, generator: torch.Generator | None = None) -> EvolvableGPT:
        """A network of `spec` holding every weight of this one that still exists (the last blocks, heads and MLP
        units are the ones dropped); what grows into the residual stream starts at zero, so growth keeps the
        function exactly."""
        changed = [n for n in _FIXED if getattr(spec, n) != getattr(self.spec, n)]
        if changed:
            raise ValueError(f"a rebuild cannot change {changed} ({self.spec.describe()} -> {spec.describe()})")
        new = EvolvableGPT(spec, generator).to(self.wte.weight.device)
        old = dict(self.named_parameters())
        for name, p in new.named_parameters():
            if any(z in name for z in _ZERO_GROWN):
                p.zero_()  # new blocks, new heads' and new units' columns: the stream sees nothing new
            if name not in old:
                continue
            dst, src = p, old[name]
            if name.endswith(".qkv.weight") or name.endswith(".qkv.bias"):  # q, k and v keep their first heads each
                dst, src = p.view(3, -1, *p.shape[1:]), src.view(3, -1, *src.shape[1:])
            s_new, s_old = overlap_slices(dst.shape, src.shape)
            dst[s_new] = src[s_old]
        return new


def propose_gpt_mutation(spec: GPTSpec, bounds: GPTBounds, rng: np.random.Generator) -> tuple[GPTSpec, str] | None:
    """One of add/remove layer, add/remove head, grow/shrink the MLP, drawn among those the bounds and the limits
    table allow; None when none is."""
    step = bounds.mlp_step
    options = [
        ("add_layer", "n_layer", spec.n_layer + 1, bounds.min_layers, bounds.max_layers),
        ("remove_layer", "n_layer", spec.n_layer - 1, bounds.min_layers, bounds.max_layers),
        ("add_head", "n_head", spec.n_head + 1, bounds.min_heads, bounds.max_heads),
        ("remove_head", "n_head", spec.n_head - 1, bounds.min_heads, bounds.max_heads),
        ("grow_mlp", "mlp_hidden", spec.mlp_hidden + step, bounds.min_mlp_hidden, bounds.max_mlp_hidden),
        ("shrink_mlp", "mlp_hidden", spec.mlp_hidden - step, bounds.min_mlp_hidden, bounds.max_mlp_hidden),
    ]
    allowed = []
    for name, field, value, lo, hi in options:
        if step > 0 and lo <= value <= hi:
            new = replace(spec, **{field: value})
            try:
                GPTSpec.from_dict(new.to_dict())  # within the limits table, so its checkpoint will load
            except ValueError:
                continue
            allowed.append((new, name))
    return None if not allowed else allowed[int(rng.integers(len(allowed)))]
