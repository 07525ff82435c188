"""Every peer runner a benchmark names is there to run: the project's own (benchmarks/peers) or the shared ones
(../shared/bench, where this machine has them), so the peer figures in docs/benchmarks.md can be re-measured."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
_peer = load_benchmark("peer")
OWN_PEERS, PEER_DIR, peer_script = _peer.OWN_PEERS, _peer.PEER_DIR, _peer.peer_script

NAMED = re.compile(r"\b((?:peer_)?agilerl_[a-z_]+\.py)\b")


def _named_runners() -> dict[str, set[str]]:
    """Runner file name -> the benchmarks whose code (string literals) names it."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for name in NAMED.findall(node.value):
                    out.setdefault(name, set()).add(path.name)
    return out


def test_the_bandit_peer_runner_ships_with_the_project():
    assert peer_script("agilerl_bandit.py") == OWN_PEERS / "agilerl_bandit.py"
    with pytest.raises(FileNotFoundError, match="peer runner nowhere.py is in neither"):
        peer_script("nowhere.py")


def test_every_peer_runner_a_benchmark_names_is_found():
    named = _named_runners()
    assert "agilerl_bandit.py" in named and "peer_agilerl_dqn.py" in named  # the scan sees both homes' names
    missing = []
    for name, users in sorted(named.items()):
        if (OWN_PEERS / name).is_file():
            continue
        if not PEER_DIR.is_dir():  # a machine without the shared folder: only the project's own can be checked
            continue
        if not (PEER_DIR / name).is_file():
            missing.append(f"{name} (named by {', '.join(sorted(users))})")
    assert not missing, f"peer runners named but not found in {OWN_PEERS} or {PEER_DIR}: {missing}"
