"""A member's checkpoint state, checked: its adapter and Adam moments (``weights.safetensors``) and the JSON
naming its base by SHA-256, hyperparameters and counters (``member.json``). :func:`checked_state` and
:func:`checked_moments` refuse, with a CheckpointError naming the field or tensor, anything
:meth:`~agilerl_core.llm.algorithm.LLMAlgorithm.from_state` should not build a member from (another base,
a damaged or forged file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from agilerl_core.algorithms.hyperparameters.llm import LLMHyperparameters
from agilerl_core.errors import CheckpointError
from agilerl_core.io.files import quote
from agilerl_core.llm.base_model import SharedBase

if TYPE_CHECKING:
    from agilerl_core.llm.algorithm import LLMAlgorithm

MEMBER = "member.json"
WEIGHTS = "weights.safetensors"
MAX_SCALE = 1e4  # LoRA scale (alpha / rank): a larger one is a damaged or forged member (LLMAlgorithm.create too)
MAX_RANK = 65_536
MAX_COUNT = 2**53  # counters (steps, samples): exact in JSON and float64


@dataclass
class CheckedState:
    """What :func:`checked_state` found sound in a member's checkpoint: its adapter's A and B per target, head
    tensors, scale, hyperparameters and counters."""

    a: dict[str, torch.Tensor]
    b: dict[str, torch.Tensor]
    head: dict[str, torch.Tensor]
    scale: float
    hp: LLMHyperparameters
    step: int
    learn_steps: int
    samples_seen: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    samples: list[dict[str, Any]]


def _meta_whole(meta: dict[str, Any], name: str, low: int, high: int) -> int:
    value = meta.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{MEMBER}: field agent.{name} is {quote(value)}, not a whole number")
    if not low <= value <= high:
        raise CheckpointError(f"{MEMBER}: field agent.{name} is {value:,}, outside [{low:,}, {high:,}]")
    return value


def _meta_scale(meta: dict[str, Any]) -> float:
    value = meta.get("scale")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 < value <= MAX_SCALE:
        raise CheckpointError(f"{MEMBER}: field agent.scale is {quote(value)}, not a finite number in (0, "
                              f"{MAX_SCALE:g}] (the LoRA scale alpha / rank)")
    return float(value)


def _meta_metrics(meta: dict[str, Any], name: str) -> dict[str, float]:
    value = meta.get(name, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                              and not isinstance(v, bool) for k, v in value.items()):
        raise CheckpointError(f"{MEMBER}: field agent.{name} is {quote(value)}, not an object of numbers")
    return {k: float(v) for k, v in value.items()}


def _tensor(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """Tensor `name`, refused unless it is there, floating point, of `shape` and finite."""
    t = tensors.get(name)
    if t is None:
        raise CheckpointError(f"{WEIGHTS}: tensor {name} is missing ({what})")
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise CheckpointError(f"{WEIGHTS}: tensor {name} is {getattr(t, 'dtype', type(t).__name__)}, not floating "
                              f"point ({what})")
    if tuple(t.shape) != shape:
        raise CheckpointError(f"{WEIGHTS}: tensor {name} has shape {tuple(t.shape)}, but {what} needs {shape}; the "
                              f"member does not fit this base (or the file was changed)")
    if not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"{WEIGHTS}: tensor {name} holds {int((~torch.isfinite(t)).sum()):,} NaN or infinite "
                              f"value(s); a run never saves such a member: the file was damaged or forged")
    return t


def checked_state(cls: type[LLMAlgorithm], base: SharedBase, tensors: dict[str, torch.Tensor],
                  meta: dict[str, Any]) -> CheckedState:
    """A member's checkpoint state checked against `base` before anything is built from it: the base's hash; the
    rank (a whole number) and scale (finite, in (0, MAX_SCALE]); one A (rank x in_features) and B (out_features
    x rank) per LoRA target of the base and no other adapter tensor; the head tensors the algorithm has, of their
    shapes; every tensor floating point and finite; no tensor the member does not have; hyperparameters the
    algorithm's (finite, max_new_tokens within the base's context); counters whole and non-negative. A
    CheckpointError names member.json's field or weights.safetensors' tensor."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{MEMBER}: field agent is {quote(meta)}, not an object")
    recorded = meta.get("base")
    want = recorded.get("sha256") if isinstance(recorded, dict) else None
    if want != base.sha256:
        raise CheckpointError(f"this {quote(meta.get('algorithm'))} member was trained on base model {quote(want)} "
                              f"({quote(recorded)}), not on the loaded base {base.sha256} ({base.describe()}): an "
                              f"adapter only means something on its own base; load that base (model.path / "
                              f"model.sha256)")
    rank = _meta_whole(meta, "rank", 1, MAX_RANK)
    scale = _meta_scale(meta)
    a, b = {}, {}
    for name, (fan_in, fan_out) in sorted(base.shapes.items()):
        what = f"the base's LoRA target {name} ({fan_in} in, {fan_out} out) at rank {rank}"
        a[name] = _tensor(tensors, f"adapter.{name}.lora_A", (rank, fan_in), what + ": rank x in_features")
        b[name] = _tensor(tensors, f"adapter.{name}.lora_B", (fan_out, rank), what + ": out_features x rank")
    fresh = cls.new_head(base)
    head = {k: _tensor(tensors, f"head.{k}", tuple(t.shape), f"the {cls.algorithm_name} member's head tensors")
            for k, t in sorted(fresh.items())}
    try:
        hp = cls.hp_model(**meta["hp"])
    except (KeyError, TypeError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        raise CheckpointError(f"{MEMBER}: field agent.hp does not hold {cls.algorithm_name}'s hyperparameters "
                              f"({type(err).__name__}: {quote(str(err))})") from None
    for key, value in hp.model_dump().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise CheckpointError(f"{MEMBER}: field agent.hp.{key} is {value}, not a finite number")
    context = getattr(base.model.config, "max_position_embeddings", None)
    new_tokens = getattr(hp, "max_new_tokens", None)
    if isinstance(context, int) and isinstance(new_tokens, int) and new_tokens > context:
        raise CheckpointError(f"{MEMBER}: field agent.hp.max_new_tokens is {new_tokens:,}, more than the base's "
                              f"context of {context:,} positions")
    step = _meta_whole(meta, "adam_step", 0, MAX_COUNT)
    known = {f"adapter.{n}.{part}" for n in a for part in ("lora_A", "lora_B")} | {f"head.{k}" for k in head}
    for name in tensors:
        if name not in known and not (step and name.startswith(("adam.exp_avg.", "adam.exp_avg_sq."))):
            raise CheckpointError(f"{WEIGHTS}: tensor {quote(name)} is not one of this {cls.algorithm_name} member's "
                                  f"(its adapter on the base's LoRA targets {sorted(a)}, its head, and Adam moments "
                                  f"when agent.adam_step > 0)")
    samples = meta.get("samples", [])
    if not isinstance(samples, list) or not all(isinstance(x, dict) for x in samples):
        raise CheckpointError(f"{MEMBER}: field agent.samples is {quote(samples)}, not a list of objects")
    return CheckedState(a, b, head, scale, hp, step, _meta_whole(meta, "learn_steps", 0, MAX_COUNT),
                        _meta_whole(meta, "samples_seen", 0, MAX_COUNT), _meta_metrics(meta, "train_metrics"),
                        _meta_metrics(meta, "eval_metrics"), list(samples))


def checked_moments(member: LLMAlgorithm, tensors: dict[str, torch.Tensor]
                    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Adam's first and second moments of every tensor `member` trains, each of its tensor's shape and finite,
    the second non-negative (a CheckpointError naming the tensor)."""
    moments = {}
    for name, p in zip(member.trainable_names(), member.trainable(), strict=True):
        what = f"Adam's moment of {name}"
        m = _tensor(tensors, f"adam.exp_avg.{name}", tuple(p.shape), what)
        v = _tensor(tensors, f"adam.exp_avg_sq.{name}", tuple(p.shape), what)
        if bool((v < 0).any()):
            raise CheckpointError(f"{WEIGHTS}: tensor adam.exp_avg_sq.{name} holds negative second moments")
        moments[name] = (m, v)
    extra = {k for k in tensors if k.startswith("adam.")} - {f"adam.{part}.{n}" for n in moments
                                                              for part in ("exp_avg", "exp_avg_sq")}
    if extra:
        raise CheckpointError(f"{WEIGHTS}: tensor {quote(sorted(extra)[0])} is not an Adam moment of a tensor this "
                              f"{type(member).algorithm_name} member trains")
    return moments
