"""Which flow runs which kind of experiment (the config's ``kind``): the CLI starts it, deployments/build.py
writes it as a deployment's entrypoint. A new kind of training adds one line here."""

from __future__ import annotations

import importlib

FLOW_ENTRYPOINTS = {
    "gym": "flows/online.py:online_evolution",
    "offline": "flows/offline.py:offline_evolution",
    "multi_agent": "flows/multi_agent.py:multi_agent_evolution",
    "llm": "flows/llm.py:llm_evolution",
    "language": "flows/language.py:language_evolution",
    "bandit": "flows/bandit.py:bandit_evolution",
}


def flow_for(kind: str):
    """The Prefect flow of experiments of `kind` (imports its module)."""
    path, _, name = FLOW_ENTRYPOINTS[kind].partition(":")
    return getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
