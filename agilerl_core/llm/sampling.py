"""Batched sampling with a KV cache, and the log-probabilities of completions.

Prompts are left-padded (``pad_prompts``) and completions right-padded after their EOS, so one batch holds
prompts and completions of any lengths; positions follow the attention mask, so padding never shifts a
token's position. Sampling draws from an explicit ``torch.Generator``: the same seed gives the same
completions whatever else runs in the process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu",
                width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of token-id lists, left-padded to the longest (or to `width`)."""
    width = max(len(p) for p in prompts) if width is None else width
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count only real tokens (left padding sits at position 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


@dataclass(frozen=True)
class RowBlock:
    """Consecutive rows of a batch that one population member samples: at its own temperature, from its own
    generator (drawn exactly as when the member samples these rows alone). `adjust`, when given, maps the rows'
    next-token logits [n, V] and the last layer's hidden states [n, H] to the logits drawn from (ILQL's
    ``logits + beta * (Q - V)``)."""

    rows: slice
    temperature: float
    generator: torch.Generator | None = None
    adjust: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def _draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: greedy at temperature 0, else drawn from softmax(logits / temperature)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if generator is not None and probs.device != generator.device:
        return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(1).to(logits.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


@torch.no_grad()
def sample(model, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, temperature: float, eos_id: int,
           pad_id: int, generator: torch.Generator | None = None, rows: list[tuple[int, int]] | None = None,
           blocks: Sequence[RowBlock] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Complete every prompt: (completion ids, completion mask), both [batch, T] with T <= max_new_tokens.

    `temperature` 0 is greedy. A completion ends with its EOS token (kept, masked 1: the policy chose it);
    what follows is `pad_id`, masked 0. `rows` ([(member, row count), ...]) runs each member's block of rows
    through its own LoRA adapter in one batch (:meth:`~agilerl_core.llm.base_model.SharedBase.bound_many`);
    `blocks` (replacing
    `temperature` and `generator`) gives each member's rows their own temperature and generator. A block
    whose rows have all ended draws nothing more, so each generator is drawn from as if its rows were
    sampled alone."""
    batch = ids.shape[0]
    blocks = [RowBlock(slice(0, batch), temperature, generator)] if blocks is None else list(blocks)
    extra = {} if rows is None else {"rows": rows}
    if any(b.adjust is not None for b in blocks):
        extra["output_hidden_states"] = True

    def adjusted(out, b: RowBlock) -> torch.Tensor:
        logits = out.logits[b.rows, -1]
        return logits if b.adjust is None else b.adjust(logits, out.hidden_states[-1][b.rows, -1].float())

    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True, logits_to_keep=1,
                **extra)
    past = out.past_key_values
    next_pos = positions(mask)[:, -1] + 1
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device)
    tokens, live = [], []
    for t in range(max_new_tokens):
        if len(blocks) == 1:
            tok = _draw(adjusted(out, blocks[0]), blocks[0].temperature, blocks[0].generator)
        else:
            tok = torch.full((batch,), pad_id, dtype=torch.long, device=ids.device)
            for b in blocks:
                if not bool(done[b.rows].all()):
                    tok[b.rows] = _draw(adjusted(out, b), b.temperature, b.generator)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens.append(tok)
        live.append(~done)
        done = done | (tok == eos_id)
        if t == max_new_tokens - 1 or bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=mask.device)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], past_key_values=past,
                    use_cache=True, **extra)
        past = out.past_key_values
        next_pos = next_pos + 1
    return torch.stack(tokens, dim=1), torch.stack(live, dim=1).long()


def completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, comp_ids: torch.Tensor,
                        comp_mask: torch.Tensor, temperature: float | torch.Tensor = 1.0,
                        rows: list[tuple[int, int]] | None = None, hidden: bool = False
                        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of every completion token under `model` at `temperature` ([batch, T]; padding positions
    hold garbage, weigh them with `comp_mask`). Only the completion's logits are computed (``logits_to_keep``).
    Score at the temperature the completions were sampled at: that is the policy whose ratio, KL and gradient
    GRPO takes (0, greedy, scores at 1). A tensor `temperature` holds one per row (0 scores at 1);
    `rows` runs each member's block of rows through its own adapter, as in :func:`sample`. With `hidden`, also
    the last layer's hidden state at the same positions (the state each completion token is predicted from,
    [batch, T, H], float32): (log-probs, hidden states)."""
    ids = torch.cat([prompt_ids, comp_ids], dim=1)
    mask = torch.cat([prompt_mask, comp_mask], dim=1)
    width = comp_ids.shape[1]
    extra = {} if rows is None else {"rows": rows}
    if hidden:
        extra["output_hidden_states"] = True
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False,
                logits_to_keep=width + 1, **extra)
    logits = out.logits[:, :-1].float()
    if isinstance(temperature, torch.Tensor):
        t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
        logits = logits / t.to(logits.device)[:, None, None]
    elif temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.gather(logits, -1, comp_ids[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if hidden:
        return logp, out.hidden_states[-1][:, -(width + 1):-1].float()
    return logp
