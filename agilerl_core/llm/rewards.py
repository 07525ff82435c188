"""Verifiable rewards declared in config, summed with weights.

Kinds:

* ``exact_answer``: 1 when the completion's answer equals the prompt's ``answer``. For a numeric answer the
  completion's last number is compared (``What is 12 + 30?`` -> ``The answer is 42.`` scores 1); otherwise the
  stripped text, case-insensitively.
* ``regex``: 1 when ``pattern`` matches the completion (``re.search``; ``fullmatch: true`` for the whole text):
  a format reward.
* ``reasoning_gym``: the dataset's reasoning-gym task scores the completion against the record's entry
  (:class:`TaskScorer`; needs ``dataset.source: reasoning_gym``).
* ``python``: ``module:function`` called as ``function(completion: str, answer: str | None, prompt: str)`` and
  returning a number; the module is imported when the experiment is built, so a typo fails before any work.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from agilerl_core.code_refs import ref_problem
from agilerl_core.errors import ConfigError

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

RewardFn = Callable[[str, str | None, str], float]


def last_number(text: str) -> float | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None


def exact_answer(completion: str, answer: str | None, prompt: str = "") -> float:
    """1.0 when the completion's answer equals `answer` (numbers: the completion's last number)."""
    if answer is None:
        return 0.0
    try:
        target = float(answer)
    except ValueError:
        return float(completion.strip().lower() == str(answer).strip().lower())
    got = last_number(completion)
    return float(got is not None and math.isclose(got, target, rel_tol=0, abs_tol=1e-9))


def _regex(pattern: str, fullmatch: bool) -> RewardFn:
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.fullmatch if fullmatch else compiled.search
    return lambda completion, answer, prompt: float(match(completion.strip() if fullmatch else completion)
                                                    is not None)


def import_function(ref: str, field: str) -> Callable:
    """The callable named by ``module:function`` (a ConfigError naming `field` when it cannot be found)."""
    if ref_problem(ref, "my_rewards:brevity") is not None:  # exactly one colon, module:identifier
        raise ConfigError(f"{field}: {ref!r} is not module:function (e.g. my_rewards:brevity)")
    module, _, name = ref.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as err:
        raise ConfigError(f"{field}: cannot import module {module!r} ({err}); is it on PYTHONPATH?") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise ConfigError(f"{field}: module {module!r} has no function {name!r}")
    return fn


class TaskScorer:
    """The ``reasoning_gym`` reward: each completion scored in [0, 1] by its record's task scorer (reasoning-gym's
    ``score_answer``) against the record's entry (found by its prompt, metadata included). The candidate answer:
    the one inside ``<answer>...</answer>`` when the completion has one, else the whole stripped completion and its
    last number (whichever scores best)."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        from agilerl_core.data.reasoning import reasoning_gym

        rg = reasoning_gym()
        self.by_prompt = {str(e["question"]): e for e in entries}
        self.scorers = {name: rg.get_score_answer_fn(name)
                        for name in {e["metadata"]["source_dataset"] for e in entries}}

    def __call__(self, completion: str, answer: str | None, prompt: str) -> float:
        from reasoning_gym.utils import extract_answer

        entry = self.by_prompt.get(prompt)
        if entry is None:
            return 0.0
        score = self.scorers[entry["metadata"]["source_dataset"]]
        tagged = extract_answer(completion)
        candidates = [tagged] if tagged is not None else [completion.strip()]
        number = last_number(completion)
        if tagged is None and number is not None:
            candidates.append(str(int(number)) if number == int(number) else str(number))
        best = 0.0
        for c in candidates:
            try:
                best = max(best, float(score(c, entry)))
            except Exception:  # a scorer failing on a malformed answer scores it 0
                continue
        return best


class Rewards:
    """The weighted sum of the declared reward functions."""

    def __init__(self, specs: Sequence[Any], entries: list[dict[str, Any]] | None = None) -> None:
        """`entries`: a reasoning-gym dataset's records (what the ``reasoning_gym`` kind scores against)."""
        if not specs:
            raise ConfigError("rewards: GRPO needs at least one reward (e.g. - kind: exact_answer)")
        self.terms: list[tuple[str, float, RewardFn]] = []
        for i, spec in enumerate(specs):
            if spec.kind == "exact_answer":
                fn: RewardFn = exact_answer
            elif spec.kind == "regex":
                try:
                    fn = _regex(spec.pattern, spec.fullmatch)
                except re.error as err:
                    raise ConfigError(f"rewards[{i}].pattern: not a valid regular expression ({err})") from None
            elif spec.kind == "reasoning_gym":
                if entries is None:
                    raise ConfigError(f"rewards[{i}].kind: reasoning_gym scores with the dataset's reasoning-gym task; "
                                      f"set dataset.source: reasoning_gym (or use exact_answer/regex/python)")
                fn = TaskScorer(entries)
            else:
                fn = import_function(spec.function, f"rewards[{i}].function")
            self.terms.append((spec.name or spec.kind, float(spec.weight), fn))
        self.needs_answers = any(s.kind == "exact_answer" for s in specs)

    def __call__(self, completions: Sequence[str], answers: Sequence[str | None], prompts: Sequence[str]
                 ) -> np.ndarray:
        """One reward per completion."""
        out = np.zeros(len(completions))
        for _, weight, fn in self.terms:
            out += weight * np.array([float(fn(c, a, p))
                                      for c, a, p in zip(completions, answers, prompts, strict=True)])
        return out
