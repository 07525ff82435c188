"""Offline learning from recorded games for LoRA members on the shared base: behaviour cloning (``llm_bc``) and
Implicit Language Q-Learning (``llm_ilql``, Snell et al. 2022, "Offline RL for Natural Language Generation with
Implicit Language Q Learning").

A recorded game becomes the token sequence the member would have produced playing it (:mod:`~agilerl_core.llm.games`): the
instruction prompt, then per turn the guess's tokens and EOS (the member's tokens) and the env's answer
`` -> FEEDBACK\\n`` (context). The losses weigh only the member's tokens:

- ``llm_bc``: their cross-entropy.
- ``llm_ilql``: Q heads ``Q(s, .) = E (W h / H + b)`` (E the base's output embedding, frozen; W, b the head's, zero
  at first so Q starts at 0) and a V head ``V(s) = w.h / sqrt(H) + c`` on the adapted model's last hidden state h
  (width H) before each of the member's tokens. The scalings keep one Adam step's change of Q and V small whatever
  H is (unscaled, one step of a 576-wide head moved Q by about 10 on SmolLM2).
  - V by expectile regression on the minimum of two soft-target Q heads at the data's token.
  - Each Q by TD to ``r + gamma V(s')``, s' the state before the member's next token: the env's tokens between are
    context, the game's last token is terminal, and each turn's reward sits on its last token.
  - A conservative term ``logsumexp_a Q(s, a) - Q(s, a_data)``, plus the BC cross-entropy.
  - Acting (evaluation, the champion) takes the model's logits plus ``beta * (min Q'(s, .) - V(s))`` at every
    generated token.

The heads and their targets are checkpointed, cloned and mutated with the adapter (rank mutations and crossovers
leave them); Adam steps the adapter and the Q and V heads, never the targets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from agilerl_core.algorithms.hyperparameters.llm import LLMBCHyperparameters, LLMILQLHyperparameters
from agilerl_core.language.ilql import expectile_loss
from agilerl_core.language.players import GameRecord
from agilerl_core.llm.algorithm import LLMAlgorithm
from agilerl_core.llm.base_model import SharedBase
from agilerl_core.llm.games import GameData, evaluate_games
from agilerl_core.llm.learning import PhaseMetrics, row_pieces
from agilerl_core.llm.sampling import completion_logprobs, pad_prompts


@dataclass
class GameTranscripts:
    """Recorded games as the member's token sequences: each game's prompt ids, its continuation (the guesses'
    tokens with EOS, and the env's answers), which continuation tokens are the member's, and each turn's
    (last token's index, reward)."""

    prompt_ids: list[list[int]]
    tokens: list[list[int]]
    own: list[list[bool]]
    turn_ends: list[list[tuple[int, float]]]
    pad_id: int

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def of_games(cls, games: Sequence[GameRecord], prompt_ids: list[int], data: GameData, guess_ids: Callable[[str], list[int]],
                 pad_id: int) -> GameTranscripts:
        """The sequences of `games` after the prompt `prompt_ids`, the env's answers as `data` encodes them in
        play, each guess as `guess_ids` encodes it (its tokens and EOS)."""
        tokens, own, ends = [], [], []
        for g in games:
            seq: list[int] = []
            mine: list[bool] = []
            turns: list[tuple[int, float]] = []
            for guess, marks, reward in zip(g.guesses, g.feedbacks, g.rewards, strict=True):
                ids = guess_ids(guess)
                seq += ids
                mine += [True] * len(ids)
                turns.append((len(seq) - 1, float(reward)))
                answer = data.env_ids(marks)
                seq += answer
                mine += [False] * len(answer)
            tokens.append(seq)
            own.append(mine)
            ends.append(turns)
        return cls([prompt_ids] * len(games), tokens, own, ends, pad_id)

    def longest(self) -> int:
        """Tokens of the longest game, prompt included."""
        return max(len(p) + len(t) for p, t in zip(self.prompt_ids, self.tokens, strict=True))

    def own_tokens(self, idx: Sequence[int]) -> int:
        return sum(sum(self.own[i]) for i in idx)

    def most_own(self, idx: Sequence[int]) -> int:
        """The most member's tokens of any of the games `idx` (at least 1)."""
        return max(1, *(sum(self.own[i]) for i in idx))

    def batch(self, idx: Sequence[int], device: str
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Games `idx` as (prompt ids, prompt mask) left-padded, (continuation ids, attention mask, member's-token
        mask, token rewards) right-padded."""
        ids, mask = pad_prompts([self.prompt_ids[i] for i in idx], self.pad_id, device)
        width = max(1, max(len(self.tokens[i]) for i in idx))
        comp = torch.full((len(idx), width), self.pad_id, dtype=torch.long)
        cmask = torch.zeros((len(idx), width), dtype=torch.long)
        own = torch.zeros((len(idx), width))
        reward = torch.zeros((len(idx), width))
        for row, i in enumerate(idx):
            n = len(self.tokens[i])
            comp[row, :n] = torch.as_tensor(self.tokens[i], dtype=torch.long)
            cmask[row, :n] = 1
            own[row, :n] = torch.as_tensor(self.own[i], dtype=torch.float32)
            for pos, r in self.turn_ends[i]:
                reward[row, pos] += r
        return ids, mask, comp.to(device), cmask.to(device), own.to(device), reward.to(device)


def own_first(own: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, mask) [n, width]: each row's member's tokens' positions in order, then padding (mask 0); `width`
    is at least the most member's tokens of any row (known on the host from the games: no device read)."""
    order = torch.sort((~own.bool()).long(), dim=1, stable=True).indices[:, :width]
    return order, own.gather(1, order)


def ilql_token_terms(qs: Sequence[torch.Tensor], v: torch.Tensor, target_qs: Sequence[torch.Tensor],
                     action: torch.Tensor, reward: torch.Tensor, mask: torch.Tensor, gamma: float, expectile: float
                     ) -> dict[str, torch.Tensor]:
    """ILQL's Q, V and conservative losses summed over a batch's member tokens, in order per row (`mask` [n, L]: 1
    on a row's first tokens, 0 after): `qs`, `target_qs` [n, L, A], `v` [n, L], `action` and `reward` [n, L]. Each
    token's TD target is its reward plus `gamma` times V (detached) at the row's next token; the row's last token
    is terminal."""
    q_target = torch.stack([t.gather(-1, action[..., None]).squeeze(-1) for t in target_qs]).amin(0).detach()
    v_loss = (expectile_loss(q_target - v, expectile) * mask).sum()
    v_next = torch.cat([v.detach()[:, 1:] * mask[:, 1:], torch.zeros_like(v[:, :1])], dim=1)
    td_target = reward + gamma * v_next
    q_loss, cql = v.new_zeros(()), v.new_zeros(())
    for q in qs:
        q_taken = q.gather(-1, action[..., None]).squeeze(-1)
        q_loss = q_loss + ((q_taken - td_target).square() * mask).sum()
        cql = cql + ((torch.logsumexp(q, -1) - q_taken) * mask).sum()
    return {"q": q_loss, "v": v_loss, "cql": cql}


class LLMBC(LLMAlgorithm):
    """A LoRA member imitating recorded games' guesses."""

    hp_model = LLMBCHyperparameters
    algorithm_name = "llm_bc"
    data_kind = "games"

    def batch_key(self) -> tuple | None:
        return (self.algorithm_name, self.hp.max_new_tokens)  # one play loop for the group's evaluation

    def game_loss(self, logp: torch.Tensor, hidden: torch.Tensor, comp: torch.Tensor, own: torch.Tensor,
                  reward: torch.Tensor, ntok: int, width: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The member's loss on its games' rows (a share of its step's `ntok` member tokens; `width`: the most
        member's tokens of a row) and its parts, detached (read on the host once per learn step)."""
        bc = -(logp * own).sum() / ntok
        return bc, {"bc": bc.detach()}

    def after_step(self) -> None:
        """What follows the member's Adam step (ILQL: the targets' soft update)."""

    # ---- training -------------------------------------------------------------------------------------------
    @classmethod
    def train_group(cls, members: list[LLMBC], data: GameTranscripts, budget: int, seeds: list[int]
                    ) -> list[PhaseMetrics]:
        """Every member's training phase, their learn steps taken together (:meth:`learn_group`); member i's
        batches of games come from seeds[i] alone."""
        return cls.train_on_records(members, data, budget, seeds)

    @staticmethod
    def learn_group(members: list[LLMBC], data: GameTranscripts, batches: list[list[int]]) -> list[dict[str, float]]:
        """One learn step of each member on its own batch of games: the group's rows in micro-batches of
        ``micro_batch_size`` through one forward of the base (each row through its member's adapter), each
        member's loss normalised by its own batch's member tokens, then each member's Adam step."""
        base = members[0].base
        ntok = [max(data.own_tokens(b), 1) for b in batches]
        sums: list[dict[str, torch.Tensor]] = [{} for _ in members]  # on the device until the step's one read
        size = members[0].hp.micro_batch_size
        with base.bound_many([m.adapter for m in members]) as model:
            for piece in LLMAlgorithm.group_parts(members, row_pieces([len(b) for b in batches], size)):
                idx = [g for i, s in piece for g in batches[i][s]]
                ids, mask, comp, cmask, own, reward = data.batch(idx, base.device)
                logp, hidden = completion_logprobs(model, ids, mask, comp, cmask, 1.0,
                                                   [(i, s.stop - s.start) for i, s in piece], hidden=True)
                losses, start = [], 0
                for i, s in piece:  # each member's loss is its own (its heads and hyperparameters)
                    rows = slice(start, start + s.stop - s.start)
                    start = rows.stop
                    loss, parts = members[i].game_loss(logp[rows], hidden[rows], comp[rows], own[rows], reward[rows],
                                                       ntok[i], data.most_own(batches[i][s]))
                    losses.append(loss)
                    for k, v in {"loss": loss.detach(), **parts}.items():
                        sums[i][k] = sums[i][k] + v if k in sums[i] else v
                (losses[0] if len(losses) == 1 else torch.stack(losses).sum()).backward()
            norms = [m._step() for m in members]
        names = sorted(sums[0])
        read = torch.stack([torch.stack([total[k] for k in names]) for total in sums]).tolist()  # one host read
        out = []
        for m, values, norm in zip(members, read, norms, strict=True):
            m.after_step()
            out.append({**dict(zip(names, values, strict=True)), "grad_norm": norm})
        return out

    # ---- fitness ----------------------------------------------------------------------------------------------
    def evaluate(self, data: GameData, n_samples: int = 0) -> float:
        """Mean return of greedy games on the held-out secrets."""
        return evaluate_games([self], data, n_samples)[0]

    @staticmethod
    def evaluate_many(members: list[LLMBC], data: GameData, n_samples: int = 0) -> list[float]:
        """:meth:`evaluate` of several members, their games played in shared batches."""
        return evaluate_games(members, data, n_samples)


class LLMILQL(LLMBC):
    """A LoRA member with ILQL's Q, target Q and V heads on the adapted model's hidden states."""

    hp_model = LLMILQLHyperparameters
    algorithm_name = "llm_ilql"
    Q_HEADS: ClassVar[tuple[str, ...]] = ("q1", "q2")

    @classmethod
    def new_head(cls, base: SharedBase) -> dict[str, torch.Tensor]:
        """Zero Q heads (both, and their targets) and a zero V head on the base's hidden size: Q = V = 0 at first."""
        width = int(base.model.config.hidden_size)
        head = {}
        for q in cls.Q_HEADS:
            for prefix in ("", "target."):
                head[f"{prefix}{q}.weight"] = torch.zeros(width, width, device=base.device)
                head[f"{prefix}{q}.bias"] = torch.zeros(width, device=base.device)
        head["v.weight"] = torch.zeros(width, device=base.device)
        head["v.bias"] = torch.zeros(1, device=base.device)
        return head

    def _q_names(self) -> tuple[str, ...]:
        return self.Q_HEADS if self.hp.two_q else self.Q_HEADS[:1]

    def _learnt(self, name: str) -> bool:
        """Whether Adam steps head tensor `name`: the Q heads in use and V (the targets follow by soft updates; a
        second Q head kept with ``two_q: false`` only so every checkpoint has one shape)."""
        return name.split(".")[0] in {*self._q_names(), "v"}

    def trainable(self) -> list[torch.nn.Parameter]:
        """The adapter's tensors, then the Q heads' in use and V's."""
        return [*self.adapter.parameters(), *(t for n, t in self.head.items() if self._learnt(n))]

    def trainable_names(self) -> list[str]:
        return [*self.adapter.param_names(), *(f"head.{n}" for n in self.head if self._learnt(n))]

    def q_values(self, hidden: torch.Tensor, name: str) -> torch.Tensor:
        """Q(s, .) over the vocabulary [..., V] of hidden states [..., H] by head `name` (e.g. q1, target.q1)."""
        emb = self.base.model.get_output_embeddings().weight.detach()
        z = hidden @ self.head[f"{name}.weight"].T / hidden.shape[-1] + self.head[f"{name}.bias"]
        return z @ emb.float().T

    def value(self, hidden: torch.Tensor) -> torch.Tensor:
        """V(s) [...] of hidden states [..., H]."""
        return hidden @ self.head["v.weight"] / hidden.shape[-1] ** 0.5 + self.head["v.bias"]

    def game_loss(self, logp: torch.Tensor, hidden: torch.Tensor, comp: torch.Tensor, own: torch.Tensor,
                  reward: torch.Tensor, ntok: int, width: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        hp = self.hp
        bc = -(logp * own).sum() / ntok
        order, mask = own_first(own, width)
        h = hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))
        names = self._q_names()
        qs = [self.q_values(h, n) for n in names]
        with torch.no_grad():
            targets = [self.q_values(h, f"target.{n}") for n in names]
        terms = ilql_token_terms(qs, self.value(h), targets, comp.gather(1, order), reward.gather(1, order) * mask,
                                 mask, hp.gamma, hp.expectile)
        q, v, cql = (terms[k] / ntok for k in ("q", "v", "cql"))
        loss = q + v + hp.cql_weight * cql + hp.bc_weight * bc
        return loss, {"bc": bc.detach(), "q": q.detach(), "v": v.detach(), "cql": cql.detach()}

    @torch.no_grad()
    def after_step(self) -> None:
        """Soft-update the target Q heads towards the Q heads by ``tau``."""
        for name in self._q_names():
            for part in ("weight", "bias"):
                self.head[f"target.{name}.{part}"].lerp_(self.head[f"{name}.{part}"], self.hp.tau)

    def logit_adjust(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
        """The acting policy: logits [B, V] plus ``beta * (min Q'(s, .) - V(s))`` from the hidden states [B, H]."""
        beta = self.hp.beta
        if beta == 0:
            return None

        def adjust(logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
            q = torch.stack([self.q_values(hidden, f"target.{n}") for n in self._q_names()]).amin(0)
            return logits.float() + beta * (q - self.value(hidden)[:, None])

        return adjust
